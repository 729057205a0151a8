"""live: what the live-interface watch (publisher/live/) costs at rest, how fast a change shows, flapping.

Against the real local API server (scripts/control-plane.sh up), with real network
namespaces and the real plugin binary; pods, claims and publishers come from the
publisher suite's Bench (benchlib/publisher.py).

1. At rest: --attachments sandboxes (default 110, the kubelet's pod limit) are
   created as bridge + host-local would leave them (a netns, a veth whose host
   side is up and whose pod side `eth0` carries the addresses of the result), and
   each gets an ADD through the real plugin with a prevResult naming that address,
   twice: to a publisher started with --no-live-watch (the reference) and to one
   with the watch on, each in an API namespace of its own. Both run side by side
   through the same rest window (--rest s). Figures: VmRSS and CPU
   (utime+stime delta / window) watch-on minus watch-off, and the API requests each
   publisher made in the window (its own netclaim_api_requests_total; target 0).
2. Change to visible: on --changes attachments (default 40) one at a time, the
   carrier (host-side veth down) or the link (`ip -n NS link set eth0 down`),
   alternately; the time from the `ip` command's return to the claim showing
   Ready=False, polled with a plain client every --poll s, and back (each "up" is
   sent at least one write hold after that attachment's "down" became visible, so
   the hold, by design, is not measured). Next to it: the same run's bare
   server-side apply of one status patch (node_costs.bare_apply_latency).
3. Flapping: one untouched attachment's link down/up --flaps times in --flap-seconds;
   interface writes (netclaim_interface_changes_total) and status applies counted
   until the hold after the flapping has run out. Allowed: one per hold, plus the
   trailing one.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import subprocess
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from . import node_costs
from . import publisher as pub
from .stats import percentile

TARGETS = {"rss_delta_mib": 10.0, "cpu_delta_percent": 0.2, "rest_api_requests": 0, "change_visible_p99_s": 2.0,
           "flap_writes": "ceil(flap seconds / hold) + 1"}
CHANGES = "netclaim_interface_changes_total"
HELD = "netclaim_interface_changes_held_total"
WATCHED = "netclaim_interface_watched_attachments"
SPACES = "netclaim_interface_watched_namespaces"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--attachments", type=int, default=110, help="sandboxes (netns + veth + claimed pod)")
    parser.add_argument("--rest", type=float, default=30.0, help="seconds of the rest window")
    parser.add_argument("--changes", type=int, default=40, help="attachments whose interface goes down and up")
    parser.add_argument("--poll", type=float, default=0.02, help="seconds between reads of the claim")
    parser.add_argument("--flaps", type=int, default=20, help="down/up cycles of the flapping attachment")
    parser.add_argument("--flap-seconds", type=float, default=2.0, help="seconds the flapping lasts")
    parser.add_argument("--workers", type=int, default=4, help="publisher --workers")


def _progress(text: str) -> None:
    print(f"[bench live] {text}", file=sys.stderr, flush=True)


def _ip(*args: str, stdin: str | None = None) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True, input=stdin, timeout=30)


@dataclass
class Sandbox:
    """One pod sandbox as bridge + host-local leave it: a netns whose `eth0` is a veth peer
    (host side up, so the pod side has carrier) with the result's addresses on it."""

    index: int
    tag: str

    @property
    def netns(self) -> str:
        return f"ncl-{self.tag}-{self.index}"

    @property
    def path(self) -> str:
        return f"/var/run/netns/{self.netns}"

    @property
    def host(self) -> str:
        return f"nl{self.tag}{self.index:03d}"  # 15 characters at most (IFNAMSIZ)

    @property
    def ips(self) -> tuple[str, str]:
        return f"10.81.{self.index // 250}.{self.index % 250 + 2}/16", f"fd00:81::{self.index + 2:x}/64"

    def create(self) -> None:
        _ip("netns", "add", self.netns)
        _ip("link", "add", self.host, "type", "veth", "peer", "name", "eth0", "netns", self.netns)
        _ip("link", "set", self.host, "up")
        # The kernel drops an interface's IPv6 addresses when it is set down (keep_addr_on_down=0), which
        # the watch rightly shows as AddressLost after the "up"; the bench times down and up, so it keeps them.
        _ip("netns", "exec", self.netns, "sysctl", "-qw", "net.ipv6.conf.eth0.keep_addr_on_down=1")
        v4, v6 = self.ips
        _ip("-n", self.netns, "-batch", "-", stdin=f"addr add {v4} dev eth0\naddr add {v6} dev eth0 nodad\n"
                                                  "link set eth0 up\nlink set lo up\n")

    def prev_result(self) -> dict[str, Any]:
        """What the plugins before netclaim hand on: no MAC/MTU (the plugin reads them from the netns)."""
        v4, v6 = self.ips
        return {"cniVersion": "1.1.0", "interfaces": [{"name": self.host}, {"name": "eth0", "sandbox": self.path}],
                "ips": [{"address": v4, "gateway": "10.81.0.1", "interface": 1}, {"address": v6, "interface": 1}],
                "routes": [], "dns": {}}

    def set(self, how: str, up: bool) -> None:
        """`carrier`: the host-side veth (the pod side loses its carrier); `link`: eth0 in the netns."""
        state = "up" if up else "down"
        if how == "carrier":
            _ip("link", "set", self.host, state)
        else:
            _ip("-n", self.netns, "link", "set", "eth0", state)

    def destroy(self) -> None:
        subprocess.run(["ip", "netns", "del", self.netns], capture_output=True)  # takes the veth pair with it
        subprocess.run(["ip", "link", "del", self.host], capture_output=True)  # a half-made one


def _plugin_class() -> Any:
    """The publisher tests' runner of the real plugin (it takes a netns and a prevResult)."""
    sys.path.insert(0, str(pub.REPO / "tests" / "publisher"))
    try:
        from publisher_testkit import Plugin
    finally:
        sys.path.pop(0)
    return Plugin


def _publish(bench: pub.Bench, pods: list[tuple[str, str, str]], sandboxes: list[Sandbox], prefix: str) -> None:
    """The ADD of every sandbox through the real plugin, as the runtime's chain would send it."""
    from cni_plugin.wire.event import PodRef

    plugin = _plugin_class()(str(bench.dir / "run" / "p.sock"), str(bench.dir / "spool"), bench.dir,
                             network="benchnet")

    def one(i: int) -> None:
        pod, _claim, uid = pods[i]
        out = plugin.run("ADD", f"{prefix}{i}-{uuid.uuid4().hex[:8]}", PodRef(bench.ns, pod, uid),
                         prev_result=sandboxes[i].prev_result(), netns=sandboxes[i].path)
        if out.returncode != 0:
            raise RuntimeError(f"plugin ADD failed: {out.stdout} {out.stderr}")

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(one, range(len(pods))))


def _ready(bench: pub.Bench, claim: str) -> tuple[str, str]:
    """(status, reason) of our entry's Ready condition; ("", "") while there is no entry."""
    resp = bench.res.read_namespaced_resource_claim(claim, bench.ns, _preload_content=False)
    for dev in (json.loads(resp.data).get("status") or {}).get("devices") or []:
        if dev.get("driver") == pub.DRIVER:
            cond = next((c for c in dev.get("conditions") or [] if c.get("type") == "Ready"), {})
            return cond.get("status", ""), cond.get("reason", "")
    return "", ""


def _sum(m: dict[str, float], prefix: str) -> float:
    return sum(v for k, v in m.items() if k.startswith(prefix))


def _wait(what: str, probe: Any, timeout: float = 120.0) -> None:
    deadline = time.time() + timeout
    while not probe():
        if time.time() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.1)


def _at_rest(benches: dict[str, pub.Bench], pods: dict[str, list[tuple[str, str, str]]], n: int,
             window: float) -> dict[str, Any]:
    """Both publishers through the same rest window, every attachment published and Ready."""
    for b in benches.values():
        b.wait_drained()
    on = benches["on"]
    _wait(f"{n} watched attachments", lambda: on.metrics().get(WATCHED) == n and on.metrics().get(SPACES) == n)
    on.wait_drained()  # the first read of every netns done
    ready = {k: sum(1 for _, claim, _ in pods[k] if _ready(b, claim)[0] == "True") for k, b in benches.items()}
    time.sleep(3.0)  # log lines, gauges and the last reconcile settle
    before = {k: (b.cpu_seconds(), b.rss_mib(), b.metrics()) for k, b in benches.items()}
    t0 = time.time()
    time.sleep(window)
    elapsed = time.time() - t0
    out: dict[str, Any] = {"attachments": n, "window_s": round(elapsed, 1)}
    for k, b in benches.items():
        cpu0, rss0, m0 = before[k]
        m1 = b.metrics()
        out[k] = {"rss_mib": round(b.rss_mib(), 2), "rss_mib_at_window_start": round(rss0, 2),
                  "cpu_percent": round((b.cpu_seconds() - cpu0) / elapsed * 100, 3),
                  "api_requests_in_window": int(pub._api(m1) - pub._api(m0)),
                  "entries_ready": ready[k], "interface_writes_after_add": int(_sum(m1, CHANGES)),
                  "watched_attachments": int(m1.get(WATCHED, 0)), "watched_namespaces": int(m1.get(SPACES, 0))}
    out["rss_delta_mib"] = round(out["on"]["rss_mib"] - out["off"]["rss_mib"], 2)
    out["cpu_delta_percent"] = round(out["on"]["cpu_percent"] - out["off"]["cpu_percent"], 3)
    return out


def _until(bench: pub.Bench, claim: str, want: str, t0: float, poll: float, timeout: float = 30.0
           ) -> tuple[float, str]:
    """Seconds from t0 (monotonic) until the entry's Ready is `want` (math.inf: never), and its reason."""
    while True:
        status, reason = _ready(bench, claim)
        now = time.monotonic()
        if status == want:
            return now - t0, reason
        if now - t0 > timeout:
            return math.inf, reason
        time.sleep(poll)


def _changes(bench: pub.Bench, pods: list[tuple[str, str, str]], sandboxes: list[Sandbox], poll: float,
             hold: float) -> dict[str, Any]:
    """Down on each attachment one at a time, then up on each, timing ip-return -> visible."""
    down: list[float] = []
    up: list[float] = []
    wrong: list[str] = []
    visible_at: list[float] = []
    for i, sb in enumerate(sandboxes):
        how = "carrier" if i % 2 == 0 else "link"
        sb.set(how, up=False)
        t0 = time.monotonic()
        took, reason = _until(bench, pods[i][1], "False", t0, poll)
        down.append(took)
        visible_at.append(time.monotonic())
        if reason != ("NoCarrier" if how == "carrier" else "LinkDown"):
            wrong.append(f"{sb.netns} {how}: {reason}")
    for i, sb in enumerate(sandboxes):
        wait = visible_at[i] + hold + 0.5 - time.monotonic()
        if wait > 0:  # the hold after the "down" write: the "up" would wait for it by design
            time.sleep(wait)
        sb.set("carrier" if i % 2 == 0 else "link", up=True)
        up.append(_until(bench, pods[i][1], "True", time.monotonic(), poll)[0])
    both = down + up
    return {"changes": len(sandboxes), "down_s": _summary_s(down), "up_s": _summary_s(up),
            "all_s": _summary_s(both), "never_visible": sum(1 for v in both if v == math.inf),
            "over_2s": sum(1 for v in both if v > 2.0), "wrong_reason": wrong, "poll_s": poll}


def _summary_s(values: list[float]) -> dict[str, float]:
    return {"p50": round(percentile(values, .5), 3), "p99": round(percentile(values, .99), 3),
            "max": round(max(values), 3)}


def _bare_reference(bench: pub.Bench, pods: list[tuple[str, str, str]], n: int) -> dict[str, float]:
    """The same run's bare server-side apply of one claim's status (a plain client, its own field
    manager), on the reference publisher's claims after it stopped: the API server's share."""
    bodies = []
    for _, claim, _ in pods[:n]:
        resp = bench.res.read_namespaced_resource_claim(claim, bench.ns, _preload_content=False)
        bodies.append((claim, [d for d in json.loads(resp.data)["status"].get("devices", [])
                               if d["driver"] == pub.DRIVER]))
    ms = node_costs.bare_apply_latency(bench, bodies, 5.0,
                                       lambda claim, devs: pub._bare_apply(bench, claim, devs, "bench-bare-live"))
    return node_costs.summary(ms)


def _flapping(bench: pub.Bench, claim: str, sb: Sandbox, flaps: int, seconds: float, hold: float
              ) -> dict[str, Any]:
    """Link down/up `flaps` times in `seconds`; writes counted until the hold after it ran out."""
    m0 = bench.metrics()
    start = time.monotonic()
    period = seconds / flaps
    for i in range(flaps):
        time.sleep(max(0.0, start + i * period - time.monotonic()))
        sb.set("link", up=False)
        time.sleep(max(0.0, start + (i + 0.5) * period - time.monotonic()))
        sb.set("link", up=True)
    took = time.monotonic() - start
    time.sleep(hold + 1.0)  # the trailing write lands at the end of the hold that the flapping started
    bench.wait_drained()
    m1 = bench.metrics()
    writes = int(_sum(m1, CHANGES) - _sum(m0, CHANGES))
    allowed = math.ceil(took / hold) + 1
    return {"flaps": flaps, "flap_s": round(took, 2), "interface_writes": writes,
            "by_reason": {k.split('"')[1]: int(v - m0.get(k, 0)) for k, v in m1.items()
                          if k.startswith(CHANGES + "{") and v - m0.get(k, 0)},
            "held": int(_sum(m1, HELD) - _sum(m0, HELD)),
            "status_applies": int(pub._api(m1, "apply") - pub._api(m0, "apply")),
            "api_requests": int(pub._api(m1) - pub._api(m0)), "allowed_writes": allowed,
            "final_ready": _ready(bench, claim)[0], "met": writes <= allowed}


def _hold_s() -> float:
    """The product's write hold (publisher/live/watcher.py), so the bench follows a change of it."""
    from publisher.live.watcher import LiveSettings

    return LiveSettings().hold


def run(args: argparse.Namespace) -> dict[str, Any]:
    n = args.attachments
    if not 0 < args.changes < n:
        raise SystemExit("--changes must be at least 1 and fewer than --attachments (one is kept for flapping)")
    hold = _hold_s()
    env = pub._control_plane()
    # A SIGTERM runs the finally below like ^C does: no netns, veth or publisher is left behind.
    previous = signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    benches = {"off": pub.Bench(env["KUBECONFIG"], args.workers), "on": pub.Bench(env["KUBECONFIG"], args.workers)}
    tag = uuid.uuid4().hex[:4]
    sandboxes: list[Sandbox] = []
    load = {"start": pub._loadavg()}
    try:
        pods = {}
        for k, b in benches.items():
            b.setup()
            _progress(f"{k}: {n} pods with allocated claims in {b.ns}")
            pods[k] = b.pods(0, n)
        _progress(f"{n} sandboxes (netns + veth)")
        for i in range(n):
            sandboxes.append(Sandbox(i, tag))
            sandboxes[-1].create()
        benches["off"].start(["--no-live-watch"])
        benches["on"].start()
        for k, b in benches.items():
            _progress(f"{k}: {n} ADDs through the real plugin")
            _publish(b, pods[k], sandboxes, k)
        _progress(f"rest window, {args.rest} s, both publishers")
        rest = _at_rest(benches, pods, n, args.rest)
        load["rest"] = pub._loadavg()
        benches["off"].stop()
        _progress(f"bare apply reference, {args.changes} applies")
        bare = _bare_reference(benches["off"], pods["off"], args.changes)
        _progress(f"{args.changes} interface changes, one at a time")
        on = benches["on"]
        changes = _changes(on, pods["on"], sandboxes[:args.changes], args.poll, hold)
        changes["bare_apply_ms"] = bare
        changes["p99_ratio_vs_bare_apply"] = round(changes["all_s"]["p99"] * 1000 / max(0.1, bare["p99"]), 1)
        load["changes"] = pub._loadavg()
        on.wait_drained()
        _progress(f"flapping: {args.flaps} down/up in {args.flap_seconds} s")
        flapping = _flapping(on, pods["on"][n - 1][1], sandboxes[n - 1], args.flaps, args.flap_seconds, hold)
        load["flapping"] = pub._loadavg()
    finally:
        for b in benches.values():
            try:
                b.teardown()  # the publisher first: its sockets would keep the netns alive
            except Exception as exc:  # still free the rest
                _progress(f"teardown of {b.ns}: {exc}")
                if b.proc is not None and b.proc.poll() is None:
                    b.proc.kill()
                    b.proc.wait(10)
        for sb in sandboxes:
            sb.destroy()
        signal.signal(signal.SIGTERM, previous)
    figures = {"rest": rest, "changes": changes, "flapping": flapping, "hold_s": hold, "targets": TARGETS,
               "cpus": os.cpu_count(), "load_average": load}
    _table(figures)
    return figures


def _table(f: dict[str, Any]) -> None:
    r, c, fl = f["rest"], f["changes"], f["flapping"]
    pub._print_rows([
        (f"RSS watch on / off, {r['attachments']} attachments (MiB)", f"{r['on']['rss_mib']} / {r['off']['rss_mib']}", ""),
        ("RSS delta (MiB)", r["rss_delta_mib"], "<= 10"),
        (f"CPU at rest on / off ({r['window_s']} s, % core)", f"{r['on']['cpu_percent']} / {r['off']['cpu_percent']}", ""),
        ("CPU delta (% of a core)", r["cpu_delta_percent"], "<= 0.2"),
        ("API requests at rest, on / off", f"{r['on']['api_requests_in_window']} / {r['off']['api_requests_in_window']}",
         "0"),
        ("entries Ready, on / off", f"{r['on']['entries_ready']} / {r['off']['entries_ready']}", ""),
        ("interface writes after the ADDs (watch on)", r["on"]["interface_writes_after_add"], "0"),
        (f"change -> visible p50 / p99 / max (s), {c['changes']} x2", f"{c['all_s']['p50']} / {c['all_s']['p99']} / "
         f"{c['all_s']['max']}", "p99 <= 2"),
        ("  down p50 / p99 / max (s)", f"{c['down_s']['p50']} / {c['down_s']['p99']} / {c['down_s']['max']}", ""),
        ("  up p50 / p99 / max (s)", f"{c['up_s']['p50']} / {c['up_s']['p99']} / {c['up_s']['max']}", ""),
        ("  bare apply p50 / p99 (ms)", f"{c['bare_apply_ms']['p50']} / {c['bare_apply_ms']['p99']}", ""),
        ("  wrong reasons / never visible", f"{len(c['wrong_reason'])} / {c['never_visible']}", "0 / 0"),
        (f"flapping: interface writes ({fl['flaps']} in {fl['flap_s']} s)", fl["interface_writes"],
         f"<= {fl['allowed_writes']}"),
        ("  status applies / held / final Ready", f"{fl['status_applies']} / {fl['held']} / {fl['final_ready']}", ""),
    ])
    print(f"load average (1, 5, 15 min) by part: {f['load_average']}")
