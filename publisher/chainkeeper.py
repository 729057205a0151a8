"""Keep netclaim chained into the node's primary CNI conflist, for as long as it is installed.

The primary CNI owns its conflist and rewrites it when it likes: Calico's
install-cni rewrites the file in place (without foreign entries) whenever
calico-node restarts; Cilium (cni.exclusive, its default) writes its own
conflist and moves every other one away. A one-shot edit at install time is
therefore lost sooner or later, and netclaim silently drops out of the chain.

The keeper runs beside the publisher in the DaemonSet. It:
- installs the self-contained plugin executable into the CNI bin dir (temp
  file + rename, so a runtime never executes half a file);
- chains the netclaim entry last into the primary conflist (the one named, or
  the first network file by name, the file libcni-based runtimes use) and
  re-chains it within one poll interval after any rewrite; every write is
  atomic (publisher/conflist.py) and a file that does not parse (say, read
  while a careless writer is halfway through) is left alone and retried;
- on SIGTERM tells an uninstall from an upgrade or a restart: only when its
  DaemonSet is gone, being deleted, or its credentials were revoked (the
  release's RBAC is deleted with it) does it put the node back as it was:
  conflists restored, plugin removed, spool and journal removed. A
  `helm upgrade` (the DaemonSet still there) keeps everything, so the journal
  and every pod's status survive the new pod.

A short poll of the directory's (name, inode, mtime, size) list costs one
listdir and a few stats a second and also notices rewrites that inotify
watches on a replaced directory would miss; the files are only parsed when
that list changes.
"""

from __future__ import annotations

import os
import shutil
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from . import logs
from .conflist import (
    BACKUP_SUFFIX,
    NETWORK_EXTENSIONS,
    Refused,
    has_entry,
    install,
    network_files,
    uninstall,
)

PLUGIN_NAME = "netclaim"
# Seconds to keep asking for the DaemonSet on SIGTERM (the chart's grace period is 30).
DECIDE_WITHIN = 15.0
Snapshot = tuple[tuple[str, int, int, int], ...]


@dataclass
class KeeperConfig:
    """Container paths (the node's dirs are mounted) and the entry to keep chained."""

    conf_dir: Path
    bin_dir: Path
    plugin_binary: Path
    entry: dict[str, Any]
    conflist: str = ""  # a file name in conf_dir; empty: the first network file by name
    cleanup_dirs: list[Path] = field(default_factory=list)  # emptied on uninstall (spool, journal)
    poll_interval: float = 1.0


def snapshot(conf_dir: Path) -> Snapshot:
    """What changes when anyone writes, renames or removes a file in the directory."""
    out = []
    try:
        names = sorted(os.listdir(conf_dir))
    except FileNotFoundError:
        return ()
    for name in names:
        try:
            st = os.stat(conf_dir / name)
        except FileNotFoundError:
            continue
        out.append((name, st.st_ino, st.st_mtime_ns, st.st_size))
    return tuple(out)


def copy_atomic(src: Path, dst: Path, mode: int = 0o755) -> bool:
    """Install `src` as `dst` unless it is already identical; True when written."""
    data = src.read_bytes()
    try:
        if dst.read_bytes() == data and (dst.stat().st_mode & 0o7777) == mode:
            return False
    except FileNotFoundError:
        pass
    tmp = dst.with_name(f".{dst.name}.{os.getpid()}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o700)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            os.fchmod(fh.fileno(), mode)
            os.fsync(fh.fileno())
        os.replace(tmp, dst)
    finally:
        tmp.unlink(missing_ok=True)
    return True


class ChainKeeper:
    """One node's chaining state; `reconcile()` is idempotent and cheap when nothing changed."""

    def __init__(self, cfg: KeeperConfig) -> None:
        self.cfg = cfg
        self.log = logs.get()
        self._seen: Snapshot | None = None
        self._plugin_stat: tuple[int, int] | None = None
        self.stop = threading.Event()

    def primary(self) -> Path | None:
        if self.cfg.conflist:
            path = self.cfg.conf_dir / self.cfg.conflist
            return path if path.is_file() else None
        files = network_files(self.cfg.conf_dir)
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
        self.cfg.bin_dir.mkdir(parents=True, exist_ok=True)
        if copy_atomic(self.cfg.plugin_binary, target):
            self.log.info("plugin installed", extra={"path": str(target)})
        st = target.stat()
        self._plugin_stat = (st.st_ino, st.st_mtime_ns)

    def reconcile(self) -> bool:
        """Chain into the primary, unchain elsewhere; True when the node is as wanted."""
        self.ensure_plugin()
        seen = snapshot(self.cfg.conf_dir)
        if seen == self._seen:
            return True
        primary = self.primary()
        if primary is None:
            self.log.warning("no conflist to chain into yet", extra={"conf_dir": str(self.cfg.conf_dir),
                                                                     "conflist": self.cfg.conflist or "(first)"})
            return False
        try:
            outcome = install(primary, self.cfg.entry)
        except (Refused, OSError) as exc:
            # Not recorded as seen: retried on the next poll.
            self.log.warning("conflist not chained, will retry", extra={"conflist": primary.name,
                                                                        "error": str(exc)})
            return False
        if outcome != "unchanged":
            self.log.info("netclaim chained", extra={"conflist": primary.name, "outcome": outcome})
        for other in network_files(self.cfg.conf_dir):
            if other != primary and has_entry(other):
                self.log.info("netclaim unchained from a conflist that is no longer primary",
                              extra={"conflist": other.name, "outcome": uninstall(other)})
        # The backup of a conflist that was removed (Cilium's exclusive mode moves foreign files
        # away) is kept: when the file is moved back, still chained, its original bytes are what
        # uninstall must give back. Backups are not network files (the runtime ignores them) and
        # remove_everything() deletes every one of them.
        self._seen = snapshot(self.cfg.conf_dir)
        return True

    def run(self) -> None:
        """Reconcile every poll interval until `stop` is set."""
        while not self.stop.is_set():
            try:
                self.reconcile()
            except OSError as exc:
                self.log.warning("reconcile failed, will retry", extra={"error": str(exc)})
            self.stop.wait(self.cfg.poll_interval)

    def remove_everything(self) -> None:
        """Put the node back: conflists restored, plugin gone, spool and journal emptied."""
        conf_dir = self.cfg.conf_dir
        names = set(os.listdir(conf_dir)) if conf_dir.is_dir() else set()
        targets = {conf_dir / n for n in names if n.endswith(NETWORK_EXTENSIONS)}
        targets |= {conf_dir / n[: -len(BACKUP_SUFFIX)] for n in names if n.endswith(BACKUP_SUFFIX)}
        for path in sorted(targets):
            try:
                outcome = uninstall(path)
            except Refused as exc:
                self.log.warning("conflist left as it is", extra={"conflist": path.name, "error": str(exc)})
                continue
            if outcome != "unchanged":
                self.log.info("netclaim unchained", extra={"conflist": path.name, "outcome": outcome})
        (self.cfg.bin_dir / PLUGIN_NAME).unlink(missing_ok=True)
        for directory in self.cfg.cleanup_dirs:
            empty_dir(directory)
        self.log.info("node cleaned up", extra={"removed": [str(d) for d in self.cfg.cleanup_dirs]})


def empty_dir(directory: Path) -> None:
    """Remove what is inside (the directory itself may be a mount point)."""
    try:
        entries = list(directory.iterdir())
    except FileNotFoundError:
        return
    for entry in entries:
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)


# ---------------------------------------------------------------- uninstall or upgrade?


def owner_state(get_daemonset: Callable[[], dict[str, Any]]) -> str:
    """'present', 'gone' (uninstall) or 'unknown', from one GET of the keeper's DaemonSet.

    401/403 mean the release's ServiceAccount or RBAC was deleted, which an
    upgrade never does; no answer at all is 'unknown', and unknown keeps the
    node chained (a stale entry with failurePolicy Ignore harms no pod; a
    wrongly removed one loses every later pod's status).
    """
    from .kube import ApiError, NotFound

    log = logs.get()
    try:
        ds = get_daemonset()
    except NotFound:
        return "gone"
    except ApiError as exc:
        log.info("DaemonSet lookup", extra={"code": exc.code, "error": exc.message[:300]})
        return "gone" if exc.code in (401, 403) else "unknown"
    return "gone" if ds.get("metadata", {}).get("deletionTimestamp") else "present"


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


def run_keeper(cfg: KeeperConfig, once: bool, decide: Callable[[], str] | None,
               stop: StopSignal | None = None) -> int:
    """The keeper's life: chain, keep chained, and on SIGTERM clean up if uninstalled."""
    log = logs.get()
    keeper = ChainKeeper(cfg)
    if once:
        # Best effort: a node whose primary CNI is not installed yet still gets
        # the plugin now; the long-running keeper chains it when the file comes.
        keeper.reconcile()
        return 0
    stop = stop or StopSignal.install()
    keeper.stop = stop.event
    signalled = stop.signals
    log.info("chain keeper started", extra={"conf_dir": str(cfg.conf_dir), "conflist": cfg.conflist or "(first)",
                                            "poll_interval": cfg.poll_interval})
    keeper.run()
    log.info("chain keeper signalled: uninstall or upgrade?", extra={"signal": signalled[-1] if signalled else 0})
    state = "unknown"
    deadline = time.monotonic() + DECIDE_WITHIN
    while decide is not None and state == "unknown" and time.monotonic() < deadline:
        state = decide()
        if state == "unknown":
            time.sleep(1.0)
    log.info("chain keeper stopping", extra={"owner": state})
    if state == "gone":
        keeper.remove_everything()
    return 0


def uninstall_now(cfg: KeeperConfig) -> int:
    ChainKeeper(cfg).remove_everything()
    return 0
