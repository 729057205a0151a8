"""Keep netclaim chained into the node's primary CNI conflist, for as long as it is installed.

The primary CNI owns its conflist and rewrites it when it likes: Calico's
install-cni rewrites the file in place (without foreign entries) whenever
calico-node restarts; Cilium (cni.exclusive, its default) writes its own
conflist and moves every other one away. A one-shot edit at install time is
therefore lost sooner or later, and netclaim silently drops out of the chain.

The keeper runs beside the publisher in the DaemonSet. It:
- installs the self-contained plugin executable into the CNI bin dir (temp
  file + rename, so a runtime never executes half a file);
- chains the netclaim entry into the primary conflist (the one named, or
  the first network file by name, the file libcni-based runtimes use) and
  re-chains it within one poll interval after any rewrite; every write is
  atomic and compared before it replaces anything (publisher/keeper/conflist.py), a
  file that does not parse (say, read while a careless writer is halfway
  through) is left alone and retried, and a single-plugin .conf is converted;
- never edits a primary that is a symlink (config management links it in):
  it says why the node is not chained (status, log line, a Warning Event on
  the Node, asked for once), and counts the node chained when the operator put
  netclaim's entry into the file where it is maintained;
- leaves an entry that is after the primary plugin where it is and inserts a
  missing one last (the rule is in publisher/keeper/conflist.py), so a chainer that
  moves itself last (istio-cni, linkerd-cni) and the keeper never fight; a
  writer that undoes every keeper write (Cilium's exclusive mode) is detected,
  backed off from and reported (publisher/keeper/guard.py);
- records a state as handled only after re-reading the file and finding the
  entry there, so a rewrite right after its own write is never taken for done;
- says how the node stands: /readyz and /metrics on --metrics-address, a
  `chain status` log line on every change, a Warning Event on the Node;
- says whether it can still do that: /healthz fails when its loop has not
  turned for many poll intervals (publisher/keeper/heartbeat.py), and never
  while it waits for the node lock, which is how a new install waits its turn;
- on SIGTERM tells an uninstall from an upgrade or a restart, on positive
  evidence only (publisher/keeper/ownerwatch.py): its DaemonSet answered 404, showed
  a deletionTimestamp, or was seen DELETED by the watch the keeper keeps on
  it while it runs (the watch survives the revocation of the release's RBAC,
  which `helm uninstall` deletes with the DaemonSet). Then it puts the node
  back as it was: conflists restored first, then the plugin removed unless a
  runtime still holds a cached config that runs it (see remove_plugin), then
  spool and journal removed. 401, 403 and no answer keep everything, as does
  a `helm upgrade` (the DaemonSet still there), so the journal and every
  pod's status survive the new pod.

A short poll of the directory's (name, inode, mtime, size) list costs one
listdir and a few stats a second and also notices rewrites that inotify
watches on a replaced directory would miss; the files are only parsed when
that list changes.
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from cni_plugin.config import RETIRED_MARKER  # beside the executable: its DEL and GC do nothing
from cni_plugin.retire import RETIRED_DIR, cached_attachments, marker_document, still_used
from publisher import limits, logs
from publisher.clock import node_seconds
from publisher.keeper.conflist import (
    BACKUP_SUFFIX,
    NETWORK_EXTENSIONS,
    Changed,
    MaintainedElsewhere,
    Refused,
    backup_of,
    converted_name,
    install,
    is_multus,
    is_network_file,
    network_files,
    uninstall,
    write_atomic,
)
from publisher.keeper.guard import ChainGuard, KeeperMetrics
from publisher.keeper.heartbeat import KEEPING, STEPPED_DOWN, STOPPING, Heartbeat, stall_after
from publisher.keeper.nodefiles import (
    Snapshot,
    another_networks_file,
    chained_in_place,
    copy_atomic,
    empty_dir,
    holds_entry_of,
    plugin_platform_problem,
    snapshot,
)
from publisher.nodelock import LOCK_NAME, OWNER_NAME

PLUGIN_NAME = "netclaim"
LOCK_FILES = frozenset({LOCK_NAME, OWNER_NAME})  # released (and removed) last, by the lock itself
# Seconds to keep asking for the DaemonSet on SIGTERM (the chart's grace period is 30).
DECIDE_WITHIN = 15.0
# Seconds between unchaining and removing the plugin: the runtimes reload the conf dir on an
# inotify event, and a DEL that starts before the reload still runs the chain it had loaded.
RELOAD_SETTLE = 2.0
# Seconds the final pass waits for teardowns in flight to drop their libcni cache entries before it
# keeps the executable (within the grace period: DECIDE_WITHIN + RELOAD_SETTLE + this < 30).
TEARDOWN_WAIT = 8.0
HOLD_MAX = 120.0  # seconds a test hold can stop the keeper


@dataclass
class KeeperConfig:
    """Container paths (the node's dirs are mounted) and the entry to keep chained."""

    conf_dir: Path
    bin_dir: Path
    plugin_binary: Path
    entry: dict[str, Any]
    conflist: str = ""  # a file name in conf_dir; empty: the first network file by name
    cleanup_dirs: list[Path] = field(default_factory=list)  # emptied on uninstall (spool, journal)
    cache_dir: Path | None = None  # the runtimes' libcni cache dir (results/), read on uninstall
    node_cache_dir: str = ""  # the same dir as the plugin on the node sees it (empty: cache_dir)
    poll_interval: float = 1.0
    # The node dir (the state dir) of the keeper's lock and claim (publisher/nodelock.py): an uninstall's
    # cleanup and a new install's keeper never overlap. None: no lock.
    lock_dir: Path | None = None
    # Seconds without a turn of the loop after which /healthz fails; 0: many poll intervals
    # (publisher/keeper/heartbeat.py `stall_after`).
    stall_after: float = 0.0
    # How the runtime runs DEL (publisher/keeper/runtime.py); None: with the cached config (the cautious rule).
    teardown: Any = None
    # Tests only: seconds to stop at a point of an edit ("before-replace", "after-write"), to land a
    # write of another process exactly there.
    test_pauses: dict[str, float] = field(default_factory=dict)
    # Tests only: at a point of the uninstall ("before-cleanup", "after-unchain"), create FILE.reached
    # and wait until FILE is removed, to land another process's steps exactly there.
    test_holds: dict[str, Path] = field(default_factory=dict)


@dataclass
class KeeperStatus:
    """How the node stands, for /readyz, the `chain status` log line and the metrics."""

    conflist: str = ""  # the primary network file, as the runtime picks it
    chained: bool = False
    contested: tuple[str, ...] = ()  # conflists another writer keeps undoing (reported)
    problem: str = ""  # why not chained, when not
    looked: bool = True  # False until the keeper's first look at the conf dir
    elsewhere: bool = False  # the primary is a symlink netclaim does not edit (reported)

    def ready(self) -> tuple[bool, str]:
        """Ready when chained, or when what keeps it out is reported (Event, metric, log) and only the
        operator can change it: a contest, or a primary maintained elsewhere. A pod held not ready for
        either would stall the DaemonSet's rollout on every other node."""
        return self.chained or bool(self.contested) or self.elsewhere, self.line()

    def line(self) -> str:
        if not self.looked:
            return "starting: the CNI conf dir is not read yet"
        state = "chained" if self.chained else "not chained"
        out = f"{state} conflist={self.conflist or '-'}"
        if self.contested:
            out += f" contested={','.join(self.contested)} (another writer keeps undoing netclaim's entry; " \
                   "the keeper backs off)"
        if self.problem and not self.chained:
            out += f" problem={self.problem}"
        return out


class ChainKeeper:
    """One node's chaining state; `reconcile()` is idempotent and cheap when nothing changed."""

    def __init__(self, cfg: KeeperConfig, metrics: KeeperMetrics | None = None,
                 report: Callable[[str, str], None] | None = None) -> None:
        self.cfg = cfg
        self.log = logs.get()
        self.metrics = metrics or KeeperMetrics()
        self.report = report or (lambda conflist, note: None)  # a Warning Event on the Node, if possible
        self.guard = ChainGuard()
        self.status = KeeperStatus(looked=False)
        self._seen: Snapshot | None = None
        self._plugin_stat: tuple[int, int] | None = None
        self._warned: dict[str, float] = {}
        self._labels: set[str] = set()
        self.stop = threading.Event()
        # A newer keeper claimed the node (publisher/nodelock.py): this one steps down.
        self.superseded: Callable[[], bool] = lambda: False
        self.stepped_down = False
        # Liveness (/healthz): the loop beats once per turn; waiting for the node lock is alive.
        self.heartbeat = Heartbeat(stall_after(cfg.poll_interval, cfg.stall_after))

    def primary(self) -> Path | None:
        if self.cfg.conflist:
            path = self.cfg.conf_dir / self.cfg.conflist
            if not is_network_file(path) and backup_of(path).exists() and converted_name(path).is_file():
                return converted_name(path)  # a named .conf the keeper converted
            return path if is_network_file(path) else None
        files = [f for f in network_files(self.cfg.conf_dir) if not is_multus(f)]
        return files[0] if files else None

    def ensure_plugin(self) -> None:
        target = self.cfg.bin_dir / PLUGIN_NAME
        try:
            st = target.stat()
            current: tuple[int, int] | None = (st.st_ino, st.st_mtime_ns)
        except FileNotFoundError:
            current = None
        if current is not None and current == self._plugin_stat:
            return
        problem = plugin_platform_problem(self.cfg.plugin_binary)
        if problem is not None:
            raise SystemExit(f"netclaim: {problem}")  # one clear line; nothing installed
        self.cfg.bin_dir.mkdir(parents=True, exist_ok=True)
        if copy_atomic(self.cfg.plugin_binary, target):
            self.log.info("plugin installed", extra={"path": str(target)})
        (self.cfg.bin_dir / RETIRED_MARKER).unlink(missing_ok=True)  # installed again: the plugin works again
        shutil.rmtree(self.cfg.bin_dir / RETIRED_DIR, ignore_errors=True)
        st = target.stat()
        self._plugin_stat = (st.st_ino, st.st_mtime_ns)

    def pause(self, point: str, path: Path) -> None:
        seconds = self.cfg.test_pauses.get(point, 0.0)
        if seconds > 0:
            self.log.info("test pause", extra={"point": point, "conflist": path.name, "seconds": seconds})
            time.sleep(seconds)

    def hold(self, point: str) -> None:
        """Tests only: stay at `point` until the test removes the hold file (at most HOLD_MAX seconds)."""
        gate = self.cfg.test_holds.get(point)
        if gate is None:
            return
        self.log.info("test hold", extra={"point": point})
        gate.with_name(gate.name + ".reached").touch()
        deadline = time.monotonic() + HOLD_MAX
        while gate.exists() and time.monotonic() < deadline:
            time.sleep(0.05)

    def reconcile(self) -> bool:
        """Chain into the primary, unchain elsewhere; True when netclaim is in the primary's chain."""
        self.ensure_plugin()
        now = node_seconds()
        seen = snapshot(self.cfg.conf_dir)
        primary = self.primary()
        if seen == self._seen and not (primary and self.guard.retry_due(primary.name, now)):
            return self.status.chained
        self._seen = None  # recorded again only once the entry is seen in place
        if primary is None:
            self.set_status("", False, "no network config in the conf dir yet")
            return False
        if not self.guard.may_write(primary.name, now):
            # Contested and backing off: look, do not write; the retry comes when the backoff ends.
            chained = chained_in_place(primary)
            self._seen = seen
            self.set_status(primary.name, chained, "" if chained else "contested, backing off")
            return chained
        target = self.chain(primary, now)
        if target is None:
            return False
        self.pause("after-write", target)
        self.unchain_others(target)
        # Only a snapshot taken before every check that calls the pass done may be recorded as seen: a
        # file written before it is in the checks below, one written after it changes the next poll's
        # snapshot. (A new primary renamed in after primary() was read, but recorded here, was never chained.)
        settled = snapshot(self.cfg.conf_dir)
        chained = chained_in_place(target)  # re-read: a rewrite right after ours must not count as done
        if chained and self.primary() == target:
            self._seen = settled
            if self.guard.settle(primary.name, now):
                self.log.info("chain contest over: netclaim stayed chained", extra={"conflist": primary.name})
        self.set_status(target.name, chained, "" if chained else "rewritten right after the keeper's write")
        return chained

    def chain(self, primary: Path, now: float) -> Path | None:
        """One compare-before-replace edit of the primary; the file netclaim is now chained in, or None."""
        try:
            outcome = install(primary, self.cfg.entry, keep_position=True, hook=self.pause)
        except Changed as exc:
            self.metrics.aborted.inc()
            self.log.info("conflist changed while being edited; looking again", extra={"conflist": primary.name,
                                                                                       "detail": str(exc)})
            return None
        except MaintainedElsewhere as exc:
            return self.maintained_elsewhere(primary, exc)
        except (Refused, OSError) as exc:
            # Not recorded as seen: retried on the next poll; logged when it changes, then now and then.
            self.set_status(primary.name, False, str(exc))
            return None
        if outcome == "unchanged":
            return primary
        self.metrics.rewrites.labels(primary.name).inc()
        self.log.info("netclaim chained", extra={"conflist": primary.name, "outcome": outcome})
        if self.guard.wrote(primary.name, now):
            self.contest_started(primary.name)
        return converted_name(primary) if outcome == "converted" else primary

    def maintained_elsewhere(self, primary: Path, exc: MaintainedElsewhere) -> Path | None:
        """A symlinked primary: chained when the operator put the keeper's entry where the file is maintained
        (nothing to write), else not chained, said once in a Warning Event (the status line repeats it)."""
        if chained_in_place(primary) and holds_entry_of(primary, self.cfg.entry):
            return primary
        problem = str(exc)
        if self.status.problem != problem:
            self.report(primary.name, f"netclaim is not chained into {primary.name}: {problem}. Pods started "
                                      "on this node get no network status until it is.")
        self.set_status(primary.name, False, problem, elsewhere=True)
        return None

    def contest_started(self, name: str) -> None:
        note = (f"netclaim's chain entry in {name} was removed again after each of the chain keeper's last "
                f"{limits.CHAIN_WRITES_MAX + 1} writes within {limits.CHAIN_WRITES_WINDOW:.0f}s: another writer "
                f"(the primary CNI, e.g. Cilium with cni.exclusive) owns {name}. The keeper stops rewriting it "
                f"and retries with a backoff; pods created while netclaim is out of the chain get no network "
                f"status. Make the primary CNI keep foreign entries (or chain netclaim through its own config).")
        self.log.warning("chain contested: backing off", extra={"conflist": name,
                                                                "backoff": limits.CHAIN_BACKOFF_FIRST})
        self.report(name, note)

    def unchain_others(self, primary: Path) -> None:
        """Take the keeper's entry out of conflists that are no longer primary; other networks' entries stay."""
        for other in network_files(self.cfg.conf_dir):
            if other == primary or not holds_entry_of(other, self.cfg.entry):
                continue
            try:
                outcome = uninstall(other)
            except (Refused, OSError) as exc:
                self.log.warning("netclaim left in a conflist that is no longer primary",
                                 extra={"conflist": other.name, "error": str(exc)})
                continue
            self.log.info("netclaim unchained from a conflist that is no longer primary",
                          extra={"conflist": other.name, "outcome": outcome})
        # The backup of a conflist that was removed (Cilium's exclusive mode moves foreign files
        # away) is kept: when the file is moved back, still chained, its original bytes are what
        # uninstall must give back. Backups are not network files (the runtime ignores them) and
        # remove_everything() deletes every one of them.

    def set_status(self, conflist: str, chained: bool, problem: str, elsewhere: bool = False) -> None:
        """Update status and metrics; log a `chain status` line when it changed (problems now and then)."""
        new = KeeperStatus(conflist, chained, tuple(self.guard.contested()), problem, elsewhere=elsewhere)
        for name in self._labels - {conflist}:
            self.metrics.chained.labels(name).set(0)
        if conflist:
            self._labels.add(conflist)
            self.metrics.chained.labels(conflist).set(1 if chained else 0)
        for name in self.guard.contests:
            self.metrics.contested.labels(name).set(1 if name in new.contested else 0)
        self.metrics.ready.set(1 if new.ready()[0] else 0)
        changed = new != self.status
        self.status = new
        now = node_seconds()
        if not changed and (chained or now - self._warned.get(new.line(), -1e9) < limits.CHAIN_WARN_EVERY):
            return
        self._warned = {new.line(): now}
        if chained:
            self.log.info("chain status", extra={"status": new.line()})
        else:
            self.log.warning("chain status", extra={"status": new.line()})

    def run(self) -> None:
        """Reconcile every poll interval until `stop` is set, or until a newer keeper claims the node.

        The newer keeper is a surge rollout's new pod (its init container waits for the node lock):
        two keepers must never both write the chain, and the old one's pod is only deleted once the
        new one is ready, so the old one gives way.

        Every turn beats the heartbeat: a pass that never ends (a hung file system) fails /healthz."""
        self.heartbeat.enter(KEEPING)
        while not self.stop.is_set():
            self.heartbeat.beat()
            if self.superseded():
                self.stepped_down = True
                self.heartbeat.enter(STEPPED_DOWN)
                return
            try:
                self.reconcile()
            except OSError as exc:
                self.log.warning("reconcile failed, will retry", extra={"error": str(exc)})
            self.stop.wait(self.cfg.poll_interval)
        self.heartbeat.enter(STOPPING)

    def remove_everything(self, teardown_wait: float = 0.0) -> None:
        """Put the node back: conflists restored first, then the plugin (see remove_plugin), spool and journal.

        Only what the keeper manages is unchained: a conflist whose netclaim entries are all of another
        driver or request (another network's, by the rule of holds_entry_of) stays byte for byte.

        `teardown_wait`: seconds to give teardowns in flight (helm uninstall deletes the pods with the
        DaemonSet) to finish before the plugin is kept for them."""
        conf_dir = self.cfg.conf_dir
        names = set(os.listdir(conf_dir)) if conf_dir.is_dir() else set()
        targets = {conf_dir / n for n in names if n.endswith(NETWORK_EXTENSIONS)}
        targets |= {conf_dir / n[: -len(BACKUP_SUFFIX)] for n in names if n.endswith(BACKUP_SUFFIX)}
        unchained = False
        for path in sorted(targets):
            if another_networks_file(path, self.cfg.entry):
                self.log.info("conflist left as it is: its netclaim entry is another network's",
                              extra={"conflist": path.name})
                continue
            try:
                outcome = uninstall(path)
            except Refused as exc:
                self.log.warning("conflist left as it is", extra={"conflist": path.name, "error": str(exc)})
                continue
            if outcome != "unchanged":
                unchained = True
                self.log.info("netclaim unchained", extra={"conflist": path.name, "outcome": outcome})
        self.hold("after-unchain")
        self.remove_plugin(settle=RELOAD_SETTLE if unchained else 0.0, wait=teardown_wait)
        emptied = [str(d) for d in self.cfg.cleanup_dirs if empty_dir(d, keep=LOCK_FILES)]
        self.log.info("node cleaned up", extra={"removed": emptied})

    def remove_plugin(self, settle: float, wait: float = 0.0) -> bool:
        """Remove the plugin executable unless a runtime may still run it; True when removed.

        Unchaining stops new sandboxes from running netclaim, not old ones:
        CRI-O tears a sandbox down with the config libcni cached at its ADD
        (results/<network>-<containerID>-<ifname> in the cache dir), and a
        missing executable fails that DEL, so the runtime retries the teardown
        for good. containerd uses the config it has loaded, which follows the
        conf dir on inotify, so it stops running netclaim once it has reloaded
        (`settle`). So the executable is kept while any cached config chains
        this install's netclaim (same socketPath as this keeper's entry), after
        waiting up to `wait` seconds for teardowns in flight. Then a marker
        beside it (RETIRED_MARKER, naming the cache dir as the node sees it)
        makes its DEL and GC do nothing and exit 0 (cni_plugin/main.py): nobody
        would read a spooled event, and the node must not grow files. The last
        of those DELs removes marker and executable (cni_plugin/retire.py), by
        the same rule as this pass; `chain-keeper --uninstall` does too, and a
        new install removes the marker.
        """
        target, marker = self.cfg.bin_dir / PLUGIN_NAME, self.cfg.bin_dir / RETIRED_MARKER
        if not target.exists():
            self.forget_retirement()
            return False
        if settle > 0:
            time.sleep(settle)
        users = self.wait_for_teardowns(wait)
        if users:
            self.write_marker()
            self.log.warning("plugin kept (its DEL now does nothing): a runtime still holds a cached config that "
                             "runs it; the last of those sandboxes' teardown removes it",
                             extra={"path": str(target), "sandboxes": len(users), "containerIDs": users[:20],
                                    "cache_dir": str(self.cfg.cache_dir), "marker": str(marker)})
            return False
        target.unlink(missing_ok=True)
        self.forget_retirement()
        self.log.info("plugin removed", extra={"path": str(target)})
        return True

    def cached_users(self) -> list[str]:
        """ContainerIDs whose cached config still runs this install's netclaim (the plugin's own rule).

        None on a runtime that tears down with the config it has loaded (containerd): no cached config is
        ever run again once the unchained conflist is loaded."""
        if self.cfg.cache_dir is None:
            return []
        if self.cfg.teardown is not None and not self.cfg.teardown.uses_cached_config():
            return []
        socket_path = str(self.cfg.entry.get("socketPath") or "")
        if not still_used(str(self.cfg.bin_dir), str(self.cfg.cache_dir), socket_path, ("", "")):
            return []
        return [cid for cid, _ifname in cached_attachments(str(self.cfg.cache_dir), socket_path)]

    def wait_for_teardowns(self, wait: float) -> list[str]:
        """The cached users once none is left or `wait` seconds passed (teardowns in flight finish)."""
        deadline = time.monotonic() + wait
        users = self.cached_users()
        while users and time.monotonic() < deadline:
            time.sleep(0.2)
            users = self.cached_users()
        return users

    def write_marker(self) -> None:
        """The marker, atomically and 0644: the plugin on the node reads the cache dir from it. Its temp
        file has a random name created O_EXCL|O_NOFOLLOW (write_atomic): the bin dir is shared."""
        node_cache_dir = self.cfg.node_cache_dir or str(self.cfg.cache_dir or "")
        data = marker_document(node_cache_dir, str(self.cfg.entry.get("socketPath") or ""))
        write_atomic(self.cfg.bin_dir / RETIRED_MARKER, data, 0o644)

    def forget_retirement(self) -> None:
        """No retired executable any more: neither its marker nor its DELs' records stay."""
        (self.cfg.bin_dir / RETIRED_MARKER).unlink(missing_ok=True)
        shutil.rmtree(self.cfg.bin_dir / RETIRED_DIR, ignore_errors=True)
