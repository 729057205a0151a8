"""What the soak observes on the node, and the rules that turn observations into violations.

Observation is the user's view: the API (pods, claims, Events), the runtime's
view of sandboxes (crictl), and the pod's own network namespace (nsenter into
the sandbox's pause process, `ip -j addr`). Nothing reads netclaim's journal.

A condition (a claim that does not show its pod's sandbox, an entry naming a
sandbox that is gone) becomes a violation only when it has been seen
continuously for more than GRACE seconds counted from the later of its first
sighting and the end of the last fault, and never while a fault is going on.
An entry whose `data` breaks the schema netclaim ships has no grace: it is
recorded at the first look that sees it (SchemaRecord), fault or not.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Hashable

from runtime.dataschema import SCHEMA_NAME, data_errors, is_netclaims, schema

GRACE = 10.0
REPORTING_CONTROLLER = "netclaim.dev/publisher"
ORDINARY, CLAIMED = "ordinary", "claimed"


# ---------------------------------------------------------------- persistence rule


@dataclass
class Violation:
    invariant: str
    key: str
    first_seen: float  # the condition was first seen (wall time)
    counted_at: float  # it had lasted past its grace at this moment
    last_seen: float
    detail: str
    open: bool = True  # still there at the last look


@dataclass
class FaultWindow:
    """Is a fault going on, and when did the last one end (the grace counts from there)."""

    active: bool = False
    last_end: float = 0.0


class Persistence:
    """Bad conditions by key; one Violation per continuous bad stretch that outlives its grace."""

    def __init__(self, invariant: str, grace: float = GRACE) -> None:
        self.invariant = invariant
        self.grace = grace
        self.first: dict[Hashable, float] = {}
        self.current: dict[Hashable, Violation] = {}
        self.violations: list[Violation] = []

    def observe(self, now: float, bad: dict[Hashable, str], window: FaultWindow) -> None:
        """`bad` holds every key that is bad in this complete look; keys absent from it are good again."""
        for key in list(self.first):
            if key not in bad:
                del self.first[key]
                violation = self.current.pop(key, None)
                if violation is not None:
                    violation.open = False
        for key, detail in bad.items():
            first = self.first.setdefault(key, now)
            violation = self.current.get(key)
            if violation is not None:
                violation.last_seen, violation.detail = now, detail
                continue
            if window.active or now - max(first, window.last_end) <= self.grace:
                continue
            violation = Violation(self.invariant, str(key), first, now, now, detail)
            self.current[key] = violation
            self.violations.append(violation)


# ---------------------------------------------------------------- the node's view


@dataclass
class Sandbox:
    id: str
    pod_uid: str
    pod: str  # namespace/name
    kind: str  # ordinary / claimed (from the pod's labels), "" for other pods
    ready: bool
    created: float


@dataclass
class Look:
    """One complete look at pods, claims and sandboxes (or why it could not be complete)."""

    at: float
    pods: list[dict[str, Any]] = field(default_factory=list)
    claims: list[dict[str, Any]] = field(default_factory=list)
    sandboxes: dict[str, Sandbox] = field(default_factory=dict)
    error: str = ""


def entries_of(claim: dict[str, Any], driver: str) -> list[dict[str, Any]]:
    return [d for d in (claim.get("status") or {}).get("devices") or [] if d.get("driver") == driver]


def entry_sandbox(entry: dict[str, Any]) -> str:
    data = entry.get("data") or {}
    return str(data.get("containerID") or "") if isinstance(data, dict) else ""


def ready_of(entry: dict[str, Any]) -> str:
    return next((c.get("status", "") for c in entry.get("conditions") or [] if c.get("type") == "Ready"), "")


def pod_kind(labels: dict[str, str] | None) -> str:
    return (labels or {}).get("soak", "")


def pod_running(pod: dict[str, Any]) -> bool:
    status = pod.get("status") or {}
    return status.get("phase") == "Running" and not (pod.get("metadata") or {}).get("deletionTimestamp")


def pod_claim_names(pod: dict[str, Any]) -> list[str]:
    """The pod's claims: generated ones from its status, claims made beforehand from its spec."""
    generated = [s.get("resourceClaimName") for s in (pod.get("status") or {}).get("resourceClaimStatuses") or []
                 if s.get("resourceClaimName")]
    made = [c["resourceClaimName"] for c in (pod.get("spec") or {}).get("resourceClaims") or []
            if c.get("resourceClaimName")]
    return generated + made


@dataclass
class NetnsView:
    cidrs: list[str]
    mac: str


def netns_view(pid: int, ifname: str = "eth0") -> NetnsView:
    """The interface as the pod sees it: `ip -j addr` inside the sandbox's network namespace."""
    out = subprocess.run(["nsenter", "-t", str(pid), "-n", "ip", "-j", "addr", "show", "dev", ifname],
                         capture_output=True, text=True, check=True, timeout=10).stdout
    (link,) = json.loads(out)
    cidrs = [f"{a['local']}/{a['prefixlen']}" for a in link.get("addr_info", []) if a.get("scope") == "global"]
    return NetnsView(sorted(cidrs), link.get("address", "").lower())


def claimed_views(look: Look, crictl: Any, pids: dict[str, int]) -> dict[str, NetnsView]:
    """eth0 as each ready claimed sandbox sees it; `pids` caches each sandbox's pid (crictl inspectp)."""
    out = {}
    for sb in look.sandboxes.values():
        if not sb.ready or sb.kind != CLAIMED:
            continue
        try:
            if sb.id not in pids:
                pids[sb.id] = int(json.loads(crictl("inspectp", "-o", "json", sb.id))["info"]["pid"])
            out[sb.id] = netns_view(pids[sb.id])
        except Exception:  # noqa: BLE001 - a sandbox going away: reported by the rule if it lasts
            pids.pop(sb.id, None)
    return out


def own_sandbox_problems(look: Look, driver: str, views: dict[str, NetnsView],
                         unchained: list[tuple[float, float]] = ()) -> dict[Hashable, str]:
    """Every Running claimed pod whose claim does not show its ready sandbox's eth0 (IPs, MAC, containerID).

    A sandbox created while the runtime ran a chain without netclaim (`unchained` spans) is not
    judged: netclaim never ran for it, and the product reports such a pod by a Warning Event
    (tests/deploy/test_unchained_cluster.py), not by a status it cannot know."""
    claims = {(c["metadata"]["namespace"], c["metadata"]["name"]): c for c in look.claims}
    ready_by_pod: dict[str, list[Sandbox]] = {}
    for sb in look.sandboxes.values():
        if sb.ready:
            ready_by_pod.setdefault(sb.pod_uid, []).append(sb)
    bad: dict[Hashable, str] = {}
    for pod in look.pods:
        meta = pod["metadata"]
        if pod_kind(meta.get("labels")) != CLAIMED or not pod_running(pod):
            continue
        name = f"{meta['namespace']}/{meta['name']}"
        sandboxes = sorted(ready_by_pod.get(meta["uid"], []), key=lambda s: s.created)
        if not sandboxes:
            continue  # Running in the API but no ready sandbox: the runtime is between sandboxes
        sb = sandboxes[-1]
        if any(start <= sb.created <= until for start, until in unchained):
            continue
        key = (meta["uid"], sb.id)
        names = pod_claim_names(pod)
        if not names:
            bad[key] = f"pod {name}: no generated claim in its status"
            continue
        claim = claims.get((meta["namespace"], names[0]))
        view = views.get(sb.id)
        if claim is None or view is None:
            bad[key] = f"pod {name}: claim {names[0]} or the sandbox's netns not readable"
            continue
        want = {"interfaceName": "eth0", "ips": view.cidrs, "hardwareAddress": view.mac}
        mine = entries_of(claim, driver)
        shown = [{"sandbox": entry_sandbox(e)[:12], "ready": ready_of(e), "networkData": e.get("networkData")}
                 for e in mine]
        ok = [e for e in mine if entry_sandbox(e) == sb.id and ready_of(e) == "True"
              and {**(e.get("networkData") or {}), "ips": sorted((e.get("networkData") or {}).get("ips") or [])} == want]
        if not ok:
            bad[key] = (f"pod {name} sandbox {sb.id[:12]} has eth0 {view.cidrs} {view.mac}; claim {names[0]} shows "
                        f"{json.dumps(shown)}")
    return bad


def stale_entries(look: Look, driver: str) -> dict[Hashable, str]:
    """Every netclaim entry whose sandbox (data.containerID) is no longer a ready sandbox of this node."""
    bad: dict[Hashable, str] = {}
    for claim in look.claims:
        meta = claim["metadata"]
        for entry in entries_of(claim, driver):
            sandbox = entry_sandbox(entry)
            sb = look.sandboxes.get(sandbox)
            if sb is not None and sb.ready:
                continue
            state = "not ready" if sb is not None else "gone"
            key = (meta["uid"], entry.get("device", ""), sandbox)
            bad[key] = (f"claim {meta['namespace']}/{meta['name']} device {entry.get('device')} names sandbox "
                        f"{sandbox[:12] or '(none)'} ({state}); ips {(entry.get('networkData') or {}).get('ips')}")
    return bad


# ---------------------------------------------------------------- entries' data against its schema


@dataclass
class SchemaError:
    """One thing wrong with one entry's `data`, as first seen."""

    claim: str  # namespace/name
    device: str
    sandbox: str  # data.containerID as written (the first 12 characters)
    error: str  # the schema's complaint (runtime/dataschema.py's data_errors), cut to ERROR_CHARS
    first_seen: float


ERROR_CHARS = 300  # a complaint may quote the whole data (up to 10 KiB): the start says what is wrong


def schema_problems(look: Look, driver: str) -> dict[Hashable, SchemaError]:
    """Every error of every netclaim entry's `data` in this look, by (claim uid, device, sandbox, error).

    The entries of `driver` whose data is netclaim's (dataschema.is_netclaims: its apiVersion, or the
    unversioned shape of before, which is itself the error to catch); another driver's entries and
    another writer's data are not looked at, as in every other reader of the suite."""
    found: dict[Hashable, SchemaError] = {}
    for claim in look.claims:
        meta = claim.get("metadata") or {}
        for entry in entries_of(claim, driver):
            data = entry.get("data")
            if not is_netclaims(data):
                continue
            device, sandbox = str(entry.get("device", "")), entry_sandbox(entry)[:12]
            for error in data_errors(data):
                error = error[:ERROR_CHARS]
                found[(meta.get("uid", ""), device, sandbox, error)] = SchemaError(
                    f"{meta.get('namespace')}/{meta.get('name')}", device, sandbox, error, look.at)
    return found


class SchemaRecord:
    """The distinct schema errors the looks saw: the first `keep` in full, and how many there were.

    No grace and no fault window: netclaim never writes data its schema refuses, whatever state it is
    in. An error is one (claim, device, sandbox, complaint); it counts once while it stays on the
    claim and again if it comes back after it was gone (the entry was written again). Memory is
    the first `keep` errors plus the errors of the last look, whatever the length of the run."""

    def __init__(self, keep: int = 20) -> None:
        schema()  # the validator loads now (the test extra's jsonschema): a soak that cannot check fails at setup
        self.keep = keep
        self.first: list[SchemaError] = []
        self.count = 0
        self.current: set[Hashable] = set()

    def observe(self, look: Look, driver: str) -> None:
        """One complete look; the errors absent from it are gone."""
        found = schema_problems(look, driver)
        for key, error in found.items():
            if key in self.current:
                continue
            self.count += 1
            if len(self.first) < self.keep:
                self.first.append(error)
        self.current = set(found)

    def lines(self, t0: float = 0.0) -> list[str]:
        """The recorded errors as a reader wants them (times in seconds after `t0`)."""
        return [f"claim {e.claim} device {e.device} sandbox {e.sandbox or '(none)'} at {e.first_seen - t0:.1f}s: "
                f"{e.error}" for e in self.first]

    def verdict(self, t0: float = 0.0) -> dict[str, Any]:
        return {"ok": self.count == 0, "detail": {"schema": SCHEMA_NAME, "distinct_errors": self.count,
                                                  "first": self.lines(t0)}}


# ---------------------------------------------------------------- the publisher's side


@dataclass
class Sample:
    """Every ~2 s: the publisher's /readyz and its process's RSS, threads and open fds."""

    t: float
    pid: int | None
    ready: str  # "ready", "not-ready: <reason>", "down"
    rss_kib: int | None = None
    threads: int | None = None
    fds: int | None = None


def proc_figures(pid: int) -> tuple[int, int, int] | None:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        fds = len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    return int(fields["VmRSS"].split()[0]), int(fields["Threads"]), fds


def readyz(port: int | None) -> str:
    if port is None:
        return "down"
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as resp:
            return "ready" if resp.status == 200 else f"not-ready: {resp.read().decode()[:200].strip()}"
    except urllib.error.HTTPError as exc:
        return f"not-ready: {exc.read().decode(errors='replace')[:200].strip()}"
    except (OSError, ValueError):
        return "down"


def metric_values(text: str, names: tuple[str, ...]) -> dict[str, float]:
    """Sum each named series over its labels (`name` or `name{op="ADD"}` as written)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        m = re.match(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? ([0-9.eE+-]+|NaN)$", line)
        if not m:
            continue
        for name in names:
            if m.group(1) == name or f"{m.group(1)}{m.group(2) or ''}" == name:
                out[name] = out.get(name, 0.0) + float(m.group(3))
    return out


class Counters:
    """Counters summed over publisher restarts: a new pid (or a value that went down) starts a new base."""

    def __init__(self) -> None:
        self.total: dict[str, float] = {}
        self.last: dict[str, float] = {}
        self.pid: int | None = None

    def update(self, pid: int, values: dict[str, float]) -> None:
        if pid != self.pid:
            self.pid, self.last = pid, {}
        for name, value in values.items():
            prev = self.last.get(name, 0.0)
            delta = value - prev if value >= prev else value
            self.total[name] = self.total.get(name, 0.0) + delta
            self.last[name] = value


class PluginLog:
    """Reads new lines of the plugin's log: ADDs by hand-off outcome, and when they were read."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = path.stat().st_size if path.exists() else 0
        self.adds: list[dict[str, Any]] = []  # {"read": t, "handoff": ..., "pod": ..., "containerID": ...}
        self.previous_read = time.time()

    def poll(self) -> None:
        now = time.time()
        try:
            with open(self.path, "rb") as fh:
                fh.seek(self.offset)
                chunk = fh.read()
        except OSError:
            return
        end = chunk.rfind(b"\n") + 1
        self.offset += end
        for raw in chunk[:end].splitlines():
            try:
                line = json.loads(raw)
            except ValueError:
                continue
            if line.get("msg") == "ADD done":
                self.adds.append({"after": self.previous_read, "read": now, "handoff": line.get("handoff"),
                                  "pod": line.get("pod"), "containerID": str(line.get("containerID", ""))[:12]})
        self.previous_read = now


def spool_share(adds: list[dict[str, Any]], windows: list[tuple[float, float]], slack: float) -> dict[str, Any]:
    """Share of ADDs the plugin had to spool, and those spooled outside every fault window (+ slack)."""
    def in_fault(add: dict[str, Any]) -> bool:
        return any(add["after"] <= end + slack and add["read"] >= start for start, end in windows)
    spooled = [a for a in adds if a["handoff"] != "acked"]
    outside = [a for a in spooled if not in_fault(a)]
    return {
        "adds": len(adds),
        "adds_not_acked": len(spooled),
        "share_not_acked": round(len(spooled) / len(adds), 4) if adds else 0.0,
        "not_acked_outside_faults": len(outside),
        "outside_detail": outside[:20],
        "by_outcome": {k: sum(1 for a in adds if a["handoff"] == k) for k in sorted({a["handoff"] for a in adds})},
    }


# ---------------------------------------------------------------- verdicts over the samples


def flatness(samples: list[Sample], since: float, until: float, span: float = 60.0) -> dict[str, Any]:
    """Growth of RSS, threads and fds of the last publisher process: median of the first `span` seconds of
    [since, until] against the median of its last `span` seconds. Threads and fds may grow by 5 % or 2,
    whichever is larger (5 % of 15 threads is less than one thread); RSS by 5 %."""
    last_pid = next((s.pid for s in reversed(samples) if s.pid and s.rss_kib), None)
    mine = [s for s in samples if s.pid == last_pid and s.rss_kib is not None and since <= s.t <= until]
    out: dict[str, Any] = {"pid": last_pid, "since": since, "until": until, "samples": len(mine)}
    if len(mine) < 4 or mine[-1].t - mine[0].t < 2 * span:
        out["judged"] = False
        out["why"] = f"the last publisher process has {len(mine)} samples over less than {2 * span:.0f}s in the window"
        return out
    head = [s for s in mine if s.t <= mine[0].t + span]
    tail_ = [s for s in mine if s.t >= mine[-1].t - span]
    out["judged"], out["ok"] = True, True
    for name, allowance in (("rss_kib", 0), ("threads", 2), ("fds", 2)):
        a = median([getattr(s, name) for s in head])
        b = median([getattr(s, name) for s in tail_])
        limit = max(a * 1.05, a + allowance)
        out[name] = {"start": a, "end": b, "growth_pct": round((b - a) / a * 100, 2) if a else 0.0, "limit": limit,
                     "ok": b <= limit}
        out["ok"] = out["ok"] and b <= limit
    return out


def median(values: list[float]) -> float:
    ordered = sorted(values)
    n = len(ordered)
    return float(ordered[n // 2]) if n % 2 else (ordered[n // 2 - 1] + ordered[n // 2]) / 2


def readiness_verdict(fault: dict[str, Any], samples: list[Sample], interval: float,
                      blocked: bool) -> dict[str, Any]:
    """/readyz not ready while the fault blocked the publisher; ready within GRACE s (+ one sample) after it."""
    during = [s for s in samples if fault["start"] <= s.t <= fault["end"]]
    after = [s for s in samples if fault["end"] <= s.t <= fault["end"] + GRACE + interval]
    ready_after = next((s.t - fault["end"] for s in after if s.ready == "ready"), None)
    not_ready_during = sum(1 for s in during if s.ready != "ready")
    out = {"samples_during": len(during), "not_ready_during": not_ready_during,
           "ready_after_s": None if ready_after is None else round(ready_after, 1), "blocked": blocked,
           "reasons": sorted({s.ready for s in during if s.ready != "ready"})[:5]}
    out["ok_after"] = ready_after is not None
    out["ok_during"] = not blocked or not_ready_during > 0
    return out


def as_dicts(items: list[Any]) -> list[dict[str, Any]]:
    return [asdict(i) for i in items]
