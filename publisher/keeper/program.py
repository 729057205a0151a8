"""The chain keeper as a process: signals, its probe and metrics listeners, the node lock, one life.

publisher/keeper/keeper.py is what the keeper does to a node (chain, keep chained, put back); this
module is how the program around it lives on the node: SIGTERM caught from the first moment (a
PID 1 without a handler ignores it), probes answering while it waits its turn on the node lock
(so a new install that waits is alive, not dead), the lock taken before anything is written, and
on SIGTERM the uninstall-or-upgrade decision (publisher/keeper/ownerwatch.py) that says whether
the node is put back.
"""

from __future__ import annotations

import signal
import threading
from dataclasses import dataclass, field
from typing import Any, Callable

from publisher import logs
from publisher.keeper.guard import KeeperMetrics
from publisher.keeper.heartbeat import STARTING, WAITING, Heartbeat
from publisher.keeper.keeper import TEARDOWN_WAIT, ChainKeeper, KeeperConfig
from publisher.nodelock import LockBusy, NodeLock

# ---------------------------------------------------------------- uninstall or upgrade?


@dataclass
class StopSignal:
    """SIGTERM/SIGINT caught from the first moment: a PID 1 without a handler ignores SIGTERM."""

    event: threading.Event = field(default_factory=threading.Event)
    signals: list[int] = field(default_factory=list)

    @classmethod
    def install(cls) -> "StopSignal":
        stop = cls()

        def on_signal(signum: int, _frame: Any) -> None:
            stop.signals.append(signum)
            stop.event.set()

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        return stop


@dataclass
class Reporting:
    """Where the keeper says how the node stands, besides its log: all optional."""

    metrics_address: str = ""  # host:port for /metrics, /readyz, /healthz; empty: none
    probe_address: str = ""  # host:port for /readyz, /healthz only, on their own threads (the kubelet's); empty: none
    # A unix socket for /readyz, /healthz only (exec probes, and the publisher's heartbeat, which believes no
    # other answer); empty: none.
    probe_socket: str = ""
    # Given the outcome counter, the (conflist, note) warner that posts a Warning Event on the Node.
    events: Callable[[Callable[[str], None]], Callable[[str, str], None]] | None = None
    # Whether the owner watch has seen the keeper's DaemonSet yet (None: no DaemonSet is watched).
    owner_looked: Callable[[], bool] | None = None


OWNER_NOT_LOOKED = (" owner=not-looked-yet (the keeper's DaemonSet is not read yet: an uninstall now would keep the"
                    " node chained)")


def readiness(keeper: ChainKeeper, owner_looked: Callable[[], bool] | None) -> tuple[bool, str]:
    """/readyz: the node's chain state and, where the keeper watches its own DaemonSet, that it has looked.

    Until the owner watch's first answer, a SIGTERM cannot tell an uninstall from an upgrade and keeps the
    node chained (publisher/keeper/ownerwatch.py). Not ready until then, so a rollout, and with it `helm
    upgrade --wait`, counts this pod ready only once an uninstall would be recognised. The line keeps its
    form (the publisher's heartbeat reads `chained conflist=X` from it); the note goes at its end.
    """
    ready, line = keeper.status.ready()
    if owner_looked is not None and not owner_looked():
        return False, line + OWNER_NOT_LOOKED
    return ready, line


def start_health(address: str, keeper: ChainKeeper, probes_only: bool = False,
                 owner_looked: Callable[[], bool] | None = None) -> Any:
    """The publisher's bounded server (publisher/observe/metrics.py) with the keeper's registry, readiness
    and liveness (its heartbeat); with `probes_only` the probe listener (no /metrics, threads of its own).
    `address` is host:port, or the path of a unix socket."""
    from publisher.observe.metrics import HealthServer

    # The status object is replaced on every change: read it at request time.
    server = HealthServer(address, keeper.metrics, lambda: readiness(keeper, owner_looked),
                          live=keeper.heartbeat.live, probes_only=probes_only)
    server.start()
    what = "probe socket" if address.startswith("/") else "probes" if probes_only else "metrics"
    logs.get().info(f"chain keeper {what}", extra={"address": address, "port": server.port})
    return server


def keep_health(listener: str, address: str, keeper: ChainKeeper, probes_only: bool = True,
                owner_looked: Callable[[], bool] | None = None) -> Any:
    """start_health now, or as soon as `address` is free (publisher/observe/listeners.py): the keeper that held
    the node lock before this one (the pods share the host's network and run dir) closes its listeners just
    after letting the lock go, and a port a local account took must not stop the keeper from keeping the
    chain. None without an address."""
    from publisher.observe.listeners import keep_listening

    return keep_listening(listener, address, lambda: start_health(address, keeper, probes_only, owner_looked),
                          lambda name: keeper.metrics.listen_taken.labels(name).inc())


def run_keeper(cfg: KeeperConfig, once: bool, decide: Callable[[], str] | None,
               stop: StopSignal | None = None, reporting: Reporting | None = None) -> int:
    """The keeper's life: chain, keep chained, and on SIGTERM clean up if uninstalled."""
    log = logs.get()
    reporting = reporting or Reporting()
    metrics = KeeperMetrics()
    warn = reporting.events(lambda result: metrics.k8s_events.labels(result).inc()) if reporting.events else None
    keeper = ChainKeeper(cfg, metrics, warn)
    lock = NodeLock(cfg.lock_dir) if cfg.lock_dir is not None else None
    if once:
        # Best effort: a node whose primary CNI is not installed yet still gets
        # the plugin now; the long-running keeper chains it when the file comes.
        if lock is not None and not take_node(lock, None):
            return 0
        try:
            keeper.reconcile()
        finally:
            if lock is not None:
                lock.release()
        log.info("chain status", extra={"status": keeper.status.line()})
        return 0
    stop = stop or StopSignal.install()
    keeper.stop = stop.event
    signalled = stop.signals
    # The probe listeners first: waiting for the node lock is alive (/healthz), not ready (/readyz). While the
    # keeper holding the lock still listens there, they open once it lets go (its probes answer meanwhile).
    looked = reporting.owner_looked
    probes = (keep_health("probe", reporting.probe_address, keeper, owner_looked=looked),
              keep_health("probe-socket", reporting.probe_socket, keeper, owner_looked=looked))
    if lock is not None and not take_node(lock, stop.event, keeper.heartbeat):
        log.info("chain keeper stopped while waiting for the node lock: nothing done")
        stop_all(probes)
        return 0
    keeper.heartbeat.enter(STARTING)
    listeners = (keep_health("metrics", reporting.metrics_address, keeper, probes_only=False, owner_looked=looked),
                 *probes)
    log.info("chain keeper started", extra={"conf_dir": str(cfg.conf_dir), "conflist": cfg.conflist or "(first)",
                                            "poll_interval": cfg.poll_interval})
    if lock is not None:
        keeper.superseded = lock.superseded
    keeper.run()
    if keeper.stepped_down:
        return step_down(lock, stop.event, listeners)
    log.info("chain keeper signalled: uninstall or upgrade?", extra={"signal": signalled[-1] if signalled else 0})
    # Positive evidence only (publisher/keeper/ownerwatch.py): 'gone' cleans the node; 'present' and 'unknown' keep it.
    state = decide() if decide is not None else "unknown"
    log.info("chain keeper stopping", extra={"owner": state})
    keeper.hold("before-cleanup")
    cleaned = False
    if state == "gone":
        if lock is not None and lock.superseded():
            # Under the lock: a newer install's keeper claimed the node since this one started (it waits
            # for the lock). Its plugin, chain, socket and journal are its own now: nothing is removed.
            log.warning("uninstall: a newer install has claimed this node; leaving it everything",
                        extra={"lock": str(lock.path)})
        else:
            keeper.remove_everything(teardown_wait=TEARDOWN_WAIT)
            cleaned = True
    if lock is not None:
        lock.release(remove=cleaned)
    stop_all(listeners)
    return 0


def stop_all(listeners: tuple[Any, ...]) -> None:
    for listener in listeners:
        if listener is not None:
            listener.stop()


def step_down(lock: NodeLock | None, stopped: threading.Event, servers: tuple[Any, ...]) -> int:
    """A newer keeper claimed the node: let it have the lock and the listeners (the pods share the host's
    network), touch nothing more, and wait for the end (this pod is deleted once the new one is ready)."""
    log = logs.get()
    log.info("a newer chain keeper claimed this node (a rollout's new pod): stepping down; the chain, plugin and "
             "state are its now", extra={"lock": str(lock.path) if lock else ""})
    stop_all(servers)
    if lock is not None:
        lock.release()
    stopped.wait()
    log.info("chain keeper stopped after stepping down: nothing removed")
    return 0


def take_node(lock: NodeLock, stop: threading.Event | None, heartbeat: Heartbeat | None = None) -> bool:
    """Claim the node, then hold its lock (waiting while an older keeper, say one cleaning up after an
    uninstall, still holds it); False when stopped while waiting. The wait is a phase of the `heartbeat`
    that is alive however long it lasts."""
    log = logs.get()
    lock.claim()

    def waiting() -> None:
        if heartbeat is not None:
            heartbeat.enter(WAITING)
        log.info("waiting for the node lock: another chain keeper (an uninstall finishing?) holds it",
                 extra={"lock": str(lock.path)})

    return lock.acquire(stop, on_wait=waiting, on_poll=heartbeat.beat if heartbeat is not None else lambda: None)


def uninstall_now(cfg: KeeperConfig) -> int:
    """The hand uninstall: refused while a chain keeper runs (it would chain netclaim back in)."""
    lock = NodeLock(cfg.lock_dir) if cfg.lock_dir is not None else None
    if lock is not None:
        try:
            lock.acquire(wait=False)
        except LockBusy:
            logs.get().error("a chain keeper runs on this node (it holds the node lock): stop it first",
                             extra={"lock": str(lock.path)})
            return 1
        lock.claim()  # under the lock: the claim of a keeper that is gone is ours now, and goes with it
    try:
        ChainKeeper(cfg).remove_everything()
    finally:
        if lock is not None:
            lock.release(remove=True)
    return 0
