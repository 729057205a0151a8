"""The node's heartbeat: one Lease per node that says how the node stands, for `netclaim-publisher fleet`.

`status` answers for one node, over its root-only socket; nothing showed which of 5,000 nodes are
chained, contested or behind. So each publisher keeps a `coordination.k8s.io/v1` Lease named
`<prefix><node>` in the release namespace: `holderIdentity` is the node, `renewTime` and
`leaseDurationSeconds` tell whether the publisher still runs (a renewal older than the duration:
it is down), and the annotation `netclaim.dev/node-state` carries a small JSON document of what
the node's parts already know:

- chained, conflist, contested: the chain keeper's status line (publisher/keeper/keeper.py
  KeeperStatus.line, the body of its /readyz), read over the keeper's unix socket and believed only
  when root listens there (a TCP port on the loopback is anyone's to take: an answer over TCP is
  never believed); `unknown` when no keeper is configured (a systemd install) or it does not answer, which
  `keeper` tells apart (`none`, `answered`, `silent` for under a minute, `unreachable` after
  that: `fleet` fails on the last);
- podsUnchained: pods found started while netclaim was not chained (publisher/repair/unchained.py,
  the NetclaimNotChained Warnings);
- backlog and oldestPendingSeconds: events journaled or spooled and not yet applied (the same
  figures as netclaim_journal_depth, netclaim_spool_depth, netclaim_oldest_pending_event_age_seconds);
- claims, attachments: what the journal tracks;
- applyErrors, lastApplyError: claims whose apply the API refused (`status`'s claim state `error`);
- ready: /readyz; version: the publisher's.

Cost: one PUT per node per period (600 s: 8.3 writes/s for 5,000 nodes; the fleet at rest stays
under docs/scale.md's 20 requests/s), through the process's
token bucket and the chart's APF priority level like every other request. A change of state
(chained, contested, a backlog appearing or gone, an apply error, readiness) is written sooner,
but never within limits.NODE_LEASE_MIN_GAP of the last write, after a random wait, so a change
seen by every node at once is spread out. The state itself is read every limits.NODE_LEASE_LOOK
seconds from memory, the journal's read connection and one loopback GET. A failed write is
counted (netclaim_node_lease_write_failures_total), logged when failures start and end, and
tried again at the next look; it never touches the event path or readiness.

Least privilege: the Role grants create, get and update on leases of the release namespace only;
a ValidatingAdmissionPolicy (the chart's 15-node-lease.yaml) lets the service account write only
the Lease named for the node in its token, so a stolen token cannot fake another node's heartbeat.
"""

from __future__ import annotations

import json
import os
import random
import re
import threading
import urllib.error
import urllib.request
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Callable

import click

from cni_plugin.wire.version import __version__
from publisher import limits, logs
from publisher.clock import node_seconds, wall
from publisher.observe import localprobe

if TYPE_CHECKING:  # the API client is imported where it is used: `run --help` and `status` stay light
    from publisher.kube.calls import Kube

ANNOTATION = "netclaim.dev/node-state"
COMPONENT = "node-heartbeat"
LABELS = {"app.kubernetes.io/name": "netclaim", "app.kubernetes.io/component": COMPONENT,
          "app.kubernetes.io/managed-by": "netclaim-publisher"}
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


# ---------------------------------------------------------------- what the chain keeper says


# Whether a keeper was asked and answered: the Lease's `keeper`. `silent`: configured, and has not
# answered for less than limits.KEEPER_SILENT_GRACE (the publisher's container often starts before
# the keeper's listener, and a keeper restart takes a few seconds); `unreachable` after that.
KEEPER_NONE, KEEPER_ANSWERED, KEEPER_SILENT, KEEPER_UNREACHABLE = "none", "answered", "silent", "unreachable"


@dataclass(frozen=True)
class ChainView:
    """The keeper's view of the chain: chained is yes, no or unknown (no keeper, or no answer)."""

    chained: str = "unknown"
    conflist: str = ""
    contested: tuple[str, ...] = ()
    detail: str = ""  # the keeper's line, or why it is unknown
    keeper: str = KEEPER_NONE  # none configured, it answered, or it was configured and did not answer


def chain_view(line: str) -> ChainView:
    """Read the keeper's status line (publisher/keeper/keeper.py KeeperStatus.line, its /readyz body).

    `chained conflist=X`, `not chained conflist=X contested=A,B (...) problem=...`, `starting: ...`."""
    line = line.strip()
    head = line.split(" problem=", 1)[0]
    if head.startswith("chained "):
        chained = "yes"
    elif head.startswith("not chained"):
        chained = "no"
    else:
        return ChainView(detail=line[:limits.NODE_LEASE_CHAIN_CHARS])
    conflist = re.search(r"\bconflist=(\S+)", head)
    contested = re.search(r"\bcontested=(\S+)", head)
    name = conflist.group(1) if conflist else ""
    return ChainView(chained, "" if name == "-" else name,
                     tuple(contested.group(1).split(",")) if contested else (), line[:limits.NODE_LEASE_CHAIN_CHARS])


# The keeper listens on this node: its probe never goes through the HTTP_PROXY / http_proxy a
# publisher may have in its environment (a chart's extraEnv, an injecting webhook, an
# EnvironmentFile), whatever NO_PROXY says. urlopen() would take those.
_NODE_LOCAL = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def ask_keeper(address: str, timeout: float = limits.KEEPER_ASK_TIMEOUT) -> ChainView:
    """GET the keeper's /readyz (200 when chained or the contest is reported, 503 otherwise: both say the line).

    `address` is the keeper's unix socket (--keeper-socket), whose answer counts only from root (or our own
    uid), or a TCP host:port (--keeper-address, kept for old configurations), whose answer is never believed:
    any local account can bind the port first and answer `chained`. Its line shows in the detail only."""
    if not address:
        return ChainView(detail="no chain keeper configured (--keeper-socket)")
    if address.startswith("/"):
        return _ask_socket(address, timeout)
    host, _, port = address.rpartition(":")
    url = f"http://{host or '127.0.0.1'}:{port}/readyz"
    try:
        with _NODE_LOCAL.open(url, timeout=timeout) as resp:
            said = resp.read(512)
    except urllib.error.HTTPError as exc:
        said = exc.read(512)
    except (OSError, ValueError) as exc:
        return ChainView(detail=f"chain keeper unreachable at {address}: {type(exc).__name__}",
                         keeper=KEEPER_UNREACHABLE)
    line = said.decode("utf-8", "replace").strip()
    detail = f"not believed: {address} is a TCP port any local account can answer on (give --keeper-socket); it said: "
    return ChainView(detail=(detail + line)[:limits.NODE_LEASE_CHAIN_CHARS], keeper=KEEPER_ANSWERED)


def _ask_socket(path: str, timeout: float) -> ChainView:
    """The keeper's /readyz over its unix socket; an answer from another uid is no answer of the keeper."""
    try:
        answer = localprobe.ask(path, "/readyz", timeout)
    except OSError as exc:
        return ChainView(detail=f"chain keeper unreachable at {path}: {type(exc).__name__}", keeper=KEEPER_UNREACHABLE)
    if not answer.trusted:
        return ChainView(detail=f"chain keeper unreachable at {path}: served by uid {answer.uid}, not root "
                                "(not believed)", keeper=KEEPER_UNREACHABLE)
    if not answer.status:
        return ChainView(detail=f"chain keeper unreachable at {path}: no HTTP answer", keeper=KEEPER_UNREACHABLE)
    return _answered(answer.body.encode())


def _answered(body: bytes) -> ChainView:
    return replace(chain_view(body.decode("utf-8", "replace")), keeper=KEEPER_ANSWERED)


class KeeperWatch:
    """The heartbeat's question to the keeper, with the time it has gone unanswered.

    One unanswered look is not a node problem: right after an install or a restart the keeper's
    listener is not up yet, and a Lease written then would fail `fleet` until the next write.
    Only a keeper silent for `grace` seconds in a row is `unreachable`."""

    def __init__(self, address: str, grace: float = limits.KEEPER_SILENT_GRACE,
                 clock: Callable[[], float] = node_seconds) -> None:
        self.address = address
        self.grace = grace
        self.clock = clock
        self._silent_since: float | None = None

    def __call__(self) -> ChainView:
        view = ask_keeper(self.address)
        if view.keeper != KEEPER_UNREACHABLE:
            self._silent_since = None
            return view
        now = self.clock()
        if self._silent_since is None:
            self._silent_since = now
        return view if now - self._silent_since >= self.grace else replace(view, keeper=KEEPER_SILENT)


# ---------------------------------------------------------------- the node's state


@dataclass(frozen=True)
class NodeState:
    """What the Lease's annotation says; every field is read from a part that keeps it already."""

    chain: ChainView
    pods_unchained: int
    backlog: int
    oldest_pending_seconds: float
    claims: int
    attachments: int
    apply_errors: int
    last_apply_error: dict[str, Any] | None
    ready: bool
    not_ready_reason: str
    version: str = __version__

    def document(self) -> dict[str, Any]:
        return {"chained": self.chain.chained, "conflist": self.chain.conflist,
                "contested": list(self.chain.contested), "chain": self.chain.detail, "keeper": self.chain.keeper,
                "podsUnchained": self.pods_unchained, "backlog": self.backlog,
                "oldestPendingSeconds": round(self.oldest_pending_seconds, 1), "claims": self.claims,
                "attachments": self.attachments, "applyErrors": self.apply_errors,
                "lastApplyError": self.last_apply_error, "ready": self.ready,
                "notReadyReason": self.not_ready_reason[:limits.NODE_LEASE_ERROR_CHARS], "version": self.version}

    def signature(self) -> tuple[Any, ...]:
        """The parts whose change is written before the period ends (counts and ages wait for it)."""
        error = (self.last_apply_error or {}).get("claim", "")
        return (self.chain.chained, self.chain.keeper, self.chain.contested, self.pods_unchained > 0,
                self.backlog > 0, self.apply_errors, error, self.ready, self.version)


@dataclass
class Sources:
    """Where each part of the state lives (the service's parts), so this module imports none of them."""

    journal_depth: Callable[[], int]
    oldest_journaled_age: Callable[[], float | None]
    spool_times: Callable[[], list[float]]
    claims: Callable[[], int]
    attachments: Callable[[], int]
    claim_states: Callable[[], dict[str, dict[str, Any]]]
    pods_unchained: Callable[[], int]
    ready: Callable[[], tuple[bool, str]]
    keeper: Callable[[], ChainView]


def read_state(src: Sources) -> NodeState:
    """The node's state now; the oldest pending event counts the journal and the spool, as the metric does."""
    spooled = src.spool_times()
    ages = [max(0.0, wall() - min(spooled))] if spooled else []
    journaled = src.oldest_journaled_age()
    if journaled is not None:
        ages.append(journaled)
    errors = {k: v for k, v in src.claim_states().items() if v.get("state") == "error"}
    last = None
    if errors:
        key = max(errors, key=lambda k: errors[k].get("updated") or 0)
        last = {"claim": key, "error": one_line(str(errors[key].get("error", ""))),
                "time": errors[key].get("updated")}
    ready, why = src.ready()
    return NodeState(chain=src.keeper(), pods_unchained=src.pods_unchained(),
                     backlog=src.journal_depth() + len(spooled), oldest_pending_seconds=max(ages, default=0.0),
                     claims=src.claims(), attachments=src.attachments(), apply_errors=len(errors),
                     last_apply_error=last, ready=ready, not_ready_reason="" if ready else one_line(why))


def one_line(text: str) -> str:
    """An API message or reason as one line, cut: `fleet` flags a Lease whose text holds control characters
    (a line break included) as forged, so the publisher never writes one."""
    return " ".join(text.split())[:limits.NODE_LEASE_ERROR_CHARS]


# ---------------------------------------------------------------- the Lease


@dataclass(frozen=True)
class LeaseSettings:
    namespace: str
    node: str
    prefix: str = limits.NODE_LEASE_PREFIX
    period: float = limits.NODE_LEASE_PERIOD
    keeper_address: str = ""  # TCP (--keeper-address): asked, never believed
    keeper_socket: str = ""  # the keeper's unix socket (--keeper-socket): believed from root
    # The publisher's pod (name, uid) when the Lease is in the pod's own namespace: the Lease's
    # owner, so the garbage collector deletes it with the pod (a deleted node's pods are deleted,
    # an uninstall deletes the DaemonSet's), and no Lease outlives what it reports on.
    owner: tuple[str, str] | None = None

    @property
    def name(self) -> str:
        return f"{self.prefix}{self.node}"

    @property
    def keeper(self) -> str:
        """Where the keeper is asked: its socket when given (the only answer believed), else the TCP address."""
        return self.keeper_socket or self.keeper_address

    @property
    def duration(self) -> int:
        return int(round(self.period * limits.NODE_LEASE_PERIODS))


def micro_time(seconds: float) -> str:
    """A Kubernetes MicroTime (RFC 3339, microseconds, UTC)."""
    return datetime.fromtimestamp(seconds, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def lease_body(cfg: LeaseSettings, state: NodeState, now: float, acquired: float,
               current: dict[str, Any] | None = None) -> dict[str, Any]:
    """The Lease to write: the last answer (whatever others added stays) with our labels, annotation and spec."""
    lease: dict[str, Any] = json.loads(json.dumps(current)) if current else {
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": cfg.name, "namespace": cfg.namespace}, "spec": {}}
    meta = lease.setdefault("metadata", {})
    meta.pop("managedFields", None)  # left out, the server keeps them: the body stays small
    meta["labels"] = {**(meta.get("labels") or {}), **LABELS}
    meta["annotations"] = {**(meta.get("annotations") or {}),
                           ANNOTATION: json.dumps(state.document(), separators=(",", ":"), sort_keys=True)}
    if cfg.owner:
        others = [r for r in meta.get("ownerReferences") or [] if r.get("kind") != "Pod"]
        meta["ownerReferences"] = others + [{"apiVersion": "v1", "kind": "Pod", "name": cfg.owner[0],
                                             "uid": cfg.owner[1]}]
    spec = lease.setdefault("spec", {})
    spec.update(holderIdentity=cfg.node, leaseDurationSeconds=cfg.duration, renewTime=micro_time(now),
                acquireTime=spec.get("acquireTime") or micro_time(acquired))
    return lease


@dataclass
class NodeLease:
    """Keeps the node's Lease: looks at the state every few seconds, writes when it is due."""

    kube: "Kube"
    cfg: LeaseSettings
    sources: Sources
    failed: Callable[[], None] = lambda: None  # netclaim_node_lease_write_failures_total
    stopping: threading.Event = field(default_factory=threading.Event)
    current: dict[str, Any] | None = None  # the Lease as the server last answered it
    last_write: float | None = None  # node_seconds() of the last successful write
    written: tuple[Any, ...] = ()  # the signature that write carried
    change_due: float | None = None
    retry_at: float = 0.0
    failures: int = 0
    # This renewal's period: the configured one, jittered by up to 10 % each time, so renewals that a
    # fleet-wide change lined up drift apart again instead of coming as one burst every period.
    period: float = 0.0
    acquired: float = field(default_factory=wall)

    def run(self) -> None:
        log = logs.get()
        log.info("node lease", extra={"namespace": self.cfg.namespace, "lease": self.cfg.name,
                                      "period": self.cfg.period, "keeper": self.cfg.keeper or "-"})
        broken = False
        while True:
            try:
                self.step()
                broken = False
            except Exception as exc:  # noqa: BLE001 - journal busy, or a bug: the heartbeat waits, not the node
                if not broken:
                    log.warning("node state not readable", extra={"error": f"{type(exc).__name__}: {exc}"[:300]})
                broken = True
            if self.stopping.wait(min(limits.NODE_LEASE_LOOK, self.cfg.period)):
                return

    def step(self) -> bool:
        """One look; True when the Lease was written."""
        now = node_seconds()
        if now < self.retry_at:
            return False
        state = read_state(self.sources)
        if not self.due(now, state):
            return False
        return self.write(state, now)

    def due(self, now: float, state: NodeState) -> bool:
        if self.last_write is None or now - self.last_write >= (self.period or self.cfg.period):
            return True
        if state.signature() == self.written:
            self.change_due = None
            return False
        if self.change_due is None:  # spread: a change every node sees at once must not be one burst
            self.change_due = max(now, self.last_write + limits.NODE_LEASE_MIN_GAP) + \
                random.uniform(0.0, limits.NODE_LEASE_SPREAD)
        return now >= self.change_due

    def write(self, state: NodeState, now: float) -> bool:
        from publisher.kube.calls import ApiError

        try:
            with self.kube.purpose("node-lease"):
                self.current = self.put(state)
        except ApiError as exc:
            self.current = None if exc.code in (404, 409) else self.current
            if exc.code == 403 and self.cfg.owner and "ownerref" in str(exc).lower().replace(" ", ""):
                # A cluster that enforces owner-reference permissions (delete on the object) refuses
                # the owner; a heartbeat without one beats none: write it plain from now on.
                logs.get().warning("node lease written without its pod as owner", extra={
                    "lease": self.cfg.name, "error": str(exc)[:300]})
                self.cfg = replace(self.cfg, owner=None)
                return self.write(state, now)
            self.failed()
            self.failures += 1
            self.retry_at = now + min(self.cfg.period, limits.NODE_LEASE_LOOK * 2 ** min(self.failures, 6))
            if self.failures == 1:
                logs.get().warning("node lease not written", extra={"lease": self.cfg.name, "code": exc.code,
                                                                    "error": str(exc)[:300]})
            return False
        if self.failures:
            logs.get().info("node lease written again", extra={"lease": self.cfg.name, "failures": self.failures})
        self.failures, self.retry_at = 0, 0.0
        self.last_write, self.written, self.change_due = now, state.signature(), None
        self.period = self.cfg.period * random.uniform(0.9, 1.1)
        return True

    def put(self, state: NodeState) -> dict[str, Any]:
        """Create the Lease on first use, else replace it; one re-read after a conflict or a deletion."""
        from publisher.kube.calls import ApiError, NotFound

        ns, name = self.cfg.namespace, self.cfg.name
        if self.current is None:
            try:
                self.current = self.kube.get_lease(ns, name)
            except NotFound:
                return self.kube.create_lease(ns, lease_body(self.cfg, state, wall(), self.acquired))
        try:
            return self.kube.update_lease(ns, name, lease_body(self.cfg, state, wall(), self.acquired, self.current))
        except NotFound:  # deleted meanwhile (by hand): it comes back at once
            return self.kube.create_lease(ns, lease_body(self.cfg, state, wall(), self.acquired))
        except ApiError as exc:
            if exc.code != 409:
                raise
            self.current = self.kube.get_lease(ns, name)  # someone else wrote it: their copy, our fields
            return self.kube.update_lease(ns, name, lease_body(self.cfg, state, wall(), self.acquired, self.current))


# ---------------------------------------------------------------- `run` options


def _address(_ctx: Any, _param: Any, value: str) -> str:
    host, sep, port = (value or "").rpartition(":")
    if value and (not sep or not port.isdigit()):
        raise click.BadParameter(f"{value!r} is not HOST:PORT")
    return value


def options(command: Callable[..., Any]) -> Callable[..., Any]:
    """The `run` options of the node heartbeat; `run` hands them to settings_from() as they come."""
    opts = [
        click.option("--node-lease/--no-node-lease", "node_lease", envvar="NETCLAIM_NODE_LEASE", show_envvar=True,
                     default=True, show_default=True,
                     help="Keep this node's heartbeat Lease (<prefix><node>) in --node-lease-namespace: chained, "
                          "contested, backlog, version, for `netclaim-publisher fleet`."),
        click.option("--node-lease-namespace", envvar="NETCLAIM_NODE_LEASE_NAMESPACE", show_envvar=True,
                     default="", help="Namespace of the Lease (the release's). Default: the pod's own, in a pod; "
                                      "none (a kubeconfig and no namespace): no Lease."),
        click.option("--node-lease-period", envvar="NETCLAIM_NODE_LEASE_PERIOD", show_envvar=True,
                     default=limits.NODE_LEASE_PERIOD, show_default=True,
                     type=click.FloatRange(1, limits.NODE_LEASE_PERIOD_MAX),
                     help="Seconds between renewals (a change of state is written sooner); the Lease's "
                          f"duration is {limits.NODE_LEASE_PERIODS} periods."),
        click.option("--node-lease-prefix", envvar="NETCLAIM_NODE_LEASE_PREFIX", show_envvar=True,
                     default=limits.NODE_LEASE_PREFIX, show_default=True,
                     help="The Lease's name is this followed by the node name (the chart: <release>-node-)."),
        click.option("--pod-name", "pod_name", envvar="NETCLAIM_POD_NAME", show_envvar=True, default="",
                     help="This publisher's pod (the chart: the downward API); with --pod-uid it owns the Lease, "
                          "so the Lease goes with the pod (a deleted node, an uninstall)."),
        click.option("--pod-uid", "pod_uid", envvar="NETCLAIM_POD_UID", show_envvar=True, default="",
                     help="The uid of --pod-name."),
        click.option("--keeper-socket", envvar="NETCLAIM_KEEPER_SOCKET", show_envvar=True, default="",
                     type=click.Path(dir_okay=False),
                     help="The chain keeper's unix socket on this node (its --probe-socket; the chart: in the run "
                          "dir), whose /readyz is the Lease's chained and contested; believed only when root (or "
                          "this process's uid) listens there. Empty: unknown."),
        click.option("--keeper-address", envvar="NETCLAIM_KEEPER_ADDRESS", show_envvar=True, default="",
                     callback=_address, help="Deprecated: HOST:PORT of the keeper's TCP /readyz. Any local account "
                                             "can answer on a TCP port, so its answer is never believed: the "
                                             "Lease says chained unknown and shows the line in its detail."),
    ]
    for opt in reversed(opts):
        command = opt(command)
    return command


def pod_namespace(directory: str = "") -> str:
    """The pod's namespace (the projected volume's `namespace` file), or "" outside a pod."""
    from publisher.kube.apiclient import IN_CLUSTER_DIR

    directory = directory or IN_CLUSTER_DIR
    try:
        with open(os.path.join(directory, "namespace"), encoding="utf-8") as fh:
            return fh.read().strip()
    except OSError:
        return ""


def owner_of(given: dict[str, Any], namespace: str) -> tuple[str, str] | None:
    """The pod that owns the Lease, only when it is in the Lease's namespace: an owner reference
    to an object of another namespace reads as an owner that does not exist, and the garbage
    collector would delete the Lease at once."""
    name, uid = given.get("pod_name") or "", given.get("pod_uid") or ""
    if not (name and uid):
        return None
    if pod_namespace() != namespace:
        logs.get().info("node lease has no owner: the pod is not in the Lease's namespace",
                        extra={"lease_namespace": namespace})
        return None
    return name, uid


def settings_from(given: dict[str, Any], node: str, kubeconfig: str | None) -> LeaseSettings | None:
    """The heartbeat's settings from `run`'s options, or None (off, said once in the log)."""
    log = logs.get()
    if not given.get("node_lease", True):
        log.info("node lease off (--no-node-lease)")
        return None
    namespace = given.get("node_lease_namespace") or ("" if kubeconfig else pod_namespace())
    if not namespace:
        log.info("node lease off: no namespace (give --node-lease-namespace)")
        return None
    cfg = LeaseSettings(namespace, node, given.get("node_lease_prefix") or limits.NODE_LEASE_PREFIX,
                        float(given.get("node_lease_period") or limits.NODE_LEASE_PERIOD),
                        given.get("keeper_address") or "", given.get("keeper_socket") or "",
                        owner_of(given, namespace))
    if len(cfg.name) > 253 or not _DNS_SUBDOMAIN.match(cfg.name):
        log.warning("node lease off: its name is no valid object name", extra={"lease": cfg.name[:300]})
        return None
    return cfg
