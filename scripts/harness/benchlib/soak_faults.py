"""The soak's node and the faults it injects into it, one at a time.

`Node` is the soak's view of one scripts/cluster.sh node: the pid files of
its services, signals to exactly those pids, `cluster.sh <component>-start`
to bring one back, and the "boot" the node is in. Each fault records when it
began and when the condition it made was undone (its `end`: the restarted
service answers, the lock is released, the disk has room again); the soak's
invariants give the node 10 s from that moment.

A simulated reboot (soak_boot.py) gives the node's netclaim processes a new
boot id and clocks without touching the host. A token rotation (soak_tokens.py)
replaces the publisher's and the keeper's token files and revokes the old
tokens without restarting either.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from runtime.procs import pid_alive, wait_gone
from runtime.realcluster import CLUSTER_SH, RealCluster, cluster_sh

from .soak_boot import kill_pods, new_boot, wipe_run_state, write_boot
from .soak_tokens import Tokens

REPO = Path(__file__).resolve().parents[3]
SUPERVISED = ("publisher", "kubelet", "containerd", "chain-keeper", "kube-apiserver")


@dataclass
class FaultRecord:
    """One injected fault: what, when, and what the injector saw."""

    name: str
    start: float
    end: float = 0.0
    blocks: str = "no"  # "always": the publisher cannot progress; "maybe": it may not; "no"
    restarts_publisher: bool = False
    notes: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # the injector could not do what it should


@dataclass
class Crash:
    """A supervised service found dead while no fault held it down."""

    component: str
    at: float
    log_tail: str
    restarted: bool = False
    restart_error: str = ""


def tail(path: Path, n: int = 8) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return ""


class Node:
    """Pid files, signals and restarts of one cluster.sh node; `held` names services a fault keeps down."""

    def __init__(self, cluster: RealCluster, soak_dir: Path) -> None:
        self.cluster = cluster
        self.dir = Path(cluster.dir)
        self.soak_dir = soak_dir
        self.nc = self.dir / "nc"
        self.held: set[str] = set()
        self.lock = threading.Lock()
        self.crashes: list[Crash] = []
        # (from, until): spans in which the runtime ran a chain without netclaim (a conflist rewrite
        # until containerd loaded the re-chained file); a sandbox created then sends no ADD, by design.
        self.unchained: list[tuple[float, float]] = []
        self.publisher_wrapper: Path | None = None  # set by the first simulated reboot
        self.tokens: Tokens | None = None  # the agents' rotating tokens (soak set-up)
        self.keeper_env: dict[str, str] = {}  # the keeper's kubeconfig, node, DaemonSet: given to its start only
        self.claimed_start: Callable[[], str] = lambda: ""  # a claimed pod started now (the soak's workload)
        self.stopping = threading.Event()  # teardown: nothing is started again

    # ------------------------------------------------------------ cluster.sh

    def env(self, component: str = "") -> dict[str, str]:
        env = dict(self.cluster.env)
        if self.publisher_wrapper is not None:
            env["NETCLAIM_PUBLISHER_WRAPPER"] = str(self.publisher_wrapper)
        if component == "chain-keeper":  # never the others': containerd would hand them on to the plugin
            env.update(self.keeper_env)
        return env

    def sh(self, *args: str, timeout: float = 300, component: str = "") -> str:
        return cluster_sh(*args, env=self.env(component), timeout=timeout)

    def pidfile(self, component: str) -> Path:
        if component == "kube-apiserver":
            return self.dir / "cp" / "kube-apiserver.pid"
        return self.dir / f"{component}.pid"

    def pid(self, component: str) -> int | None:
        try:
            return int(self.pidfile(component).read_text().strip())
        except (OSError, ValueError):
            return None

    def alive(self, component: str) -> bool:
        pid = self.pid(component)
        return pid is not None and pid_alive(pid)

    def log_of(self, component: str) -> Path:
        return self.dir / "cp" / "kube-apiserver.log" if component == "kube-apiserver" else self.dir / f"{component}.log"

    def start(self, component: str, timeout: float = 300) -> None:
        if component == "kube-apiserver":
            self.sh("apiserver-start", timeout=timeout)
        else:
            self.sh(f"{component}-start", timeout=timeout, component=component)

    def signal(self, component: str, sig: signal.Signals, timeout: float = 30) -> str:
        """Send `sig` to the service's pid and wait for it to exit (SIGKILL after `timeout`)."""
        pid = self.pid(component)
        if pid is None or not pid_alive(pid):
            return f"{component} was not running"
        os.kill(pid, sig)
        if wait_gone(pid, timeout):
            outcome = f"{component} (pid {pid}) exited after {sig.name}"
        else:
            os.kill(pid, signal.SIGKILL)
            wait_gone(pid, 10)
            outcome = f"{component} (pid {pid}) ignored {sig.name} for {timeout:.0f}s: SIGKILLed"
        self.forget(component)
        return outcome

    def forget(self, component: str) -> None:
        """Remove a dead service's pid file, as `cluster.sh <service>-stop` does: until its parent reaps it, a
        dead process is a zombie that still answers `kill -0`, and `<service>-start` would think it runs."""
        self.pidfile(component).unlink(missing_ok=True)

    # ------------------------------------------------------------ supervision

    def hold(self, *components: str) -> None:
        with self.lock:
            self.held.update(components)

    def release(self, *components: str) -> None:
        with self.lock:
            self.held.difference_update(components)

    def supervise(self) -> None:
        """Like systemd's Restart=always: a service that died on its own is recorded and started again."""
        for component in SUPERVISED:
            with self.lock:
                if component in self.held or self.stopping.is_set():
                    continue
            if self.alive(component) or (component == "chain-keeper" and self.pid(component) is None):
                continue
            crash = Crash(component, time.time(), tail(self.log_of(component)))
            self.crashes.append(crash)
            self.forget(component)
            try:
                self.start(component)
                crash.restarted = True
            except Exception as exc:  # noqa: BLE001 - recorded; tried again on the next round
                crash.restart_error = str(exc)[-600:]


# ---------------------------------------------------------------- the faults


class Fault:
    """One kind of fault; `inject` returns once the condition is undone (the record's `end`)."""

    name = "fault"
    blocks = "no"
    restarts_publisher = False

    def inject(self, node: Node, nudge: Callable[[], None]) -> FaultRecord:
        record = FaultRecord(self.name, time.time(), blocks=self.blocks, restarts_publisher=self.restarts_publisher)
        try:
            self.run(node, nudge, record)
        except Exception as exc:  # noqa: BLE001 - the soak goes on; the record says what failed
            record.errors.append(f"{type(exc).__name__}: {str(exc)[-800:]}")
        finally:
            self.cleanup(node, record)
            record.end = time.time()
        return record

    def run(self, node: Node, nudge: Callable[[], None], record: FaultRecord) -> None:
        raise NotImplementedError

    def cleanup(self, node: Node, record: FaultRecord) -> None:
        """Undo whatever `run` left behind, also after an error."""


class Restart(Fault):
    """SIGKILL or SIGTERM to one node service, then `cluster.sh <service>-start` (which waits until it serves)."""

    def __init__(self, component: str, sig: signal.Signals) -> None:
        self.component, self.sig = component, sig
        self.name = f"{component}-{sig.name.lower()}"
        self.restarts_publisher = component == "publisher"

    def run(self, node: Node, nudge: Callable[[], None], record: FaultRecord) -> None:
        node.hold(self.component)
        record.notes.append(node.signal(self.component, self.sig))
        nudge()  # a pod start while it is down
        time.sleep(2)
        node.start(self.component)

    def cleanup(self, node: Node, record: FaultRecord) -> None:
        node.release(self.component)


class ApiserverRestart(Fault):
    name = "apiserver-restart"

    def run(self, node: Node, nudge: Callable[[], None], record: FaultRecord) -> None:
        node.hold("kube-apiserver")
        node.sh("apiserver-stop")
        time.sleep(3)
        node.sh("apiserver-start")

    def cleanup(self, node: Node, record: FaultRecord) -> None:
        node.release("kube-apiserver")


HOLDER = """
import sqlite3, sys, time
db = sqlite3.connect(sys.argv[1], timeout=60, isolation_level=None)
db.execute("BEGIN IMMEDIATE")
print("locked", flush=True)
time.sleep(float(sys.argv[2]))
db.execute("ROLLBACK")
print("released", flush=True)
"""


class JournalLock(Fault):
    """Another process takes the journal's write lock (BEGIN IMMEDIATE) and holds it for 10 s."""

    name = "journal-lock"
    blocks = "always"

    def __init__(self, hold: float = 10.0) -> None:
        self.hold = hold

    def run(self, node: Node, nudge: Callable[[], None], record: FaultRecord) -> None:
        db = node.nc / "state" / "journal.db"
        proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(db), str(self.hold)], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        first = proc.stdout.readline().strip() if proc.stdout else ""
        if first != "locked":
            proc.wait(timeout=30)
            raise RuntimeError(f"lock holder did not get the lock: {first!r} {proc.stderr.read() if proc.stderr else ''}")
        record.start = time.time()
        record.notes.append(f"write lock on {db.name} held by pid {proc.pid} for {self.hold:.0f}s")
        nudge()
        out, err = proc.communicate(timeout=self.hold + 60)
        if "released" not in out:
            raise RuntimeError(f"lock holder failed: {err[-400:]}")


class SpoolReadOnly(Fault):
    """The spool's file system goes read-only; the publisher is restarted meanwhile (a node booting with a
    read-only /var), then the file system is made writable again."""

    name = "spool-readonly"
    blocks = "no"  # the publisher journals from its socket; only the plugin's fallback is gone
    restarts_publisher = True

    def __init__(self, hold: float = 10.0) -> None:
        self.hold = hold

    def run(self, node: Node, nudge: Callable[[], None], record: FaultRecord) -> None:
        spool = node.nc / "spool"
        subprocess.run(["mount", "-o", "remount,ro", str(spool)], check=True, capture_output=True, text=True)
        node.hold("publisher")
        record.notes.append(node.signal("publisher", signal.SIGTERM))
        starter = subprocess.Popen([str(CLUSTER_SH), "publisher-start"], env=node.env(),
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        nudge()
        deadline, died = time.time() + self.hold, False
        while time.time() < deadline and not died:
            time.sleep(0.5)
            pid = node.pid("publisher")
            died = pid is not None and not pid_alive(pid)
        if died:
            record.notes.append("the publisher exited while the spool was read-only: "
                                + tail(node.log_of("publisher"), 2)[-400:])
            node.crashes.append(Crash("publisher", time.time(), tail(node.log_of("publisher"))))
        elif starter.poll() is None:
            record.notes.append(f"the publisher did not answer within {self.hold:.0f}s with the spool read-only")
        subprocess.run(["mount", "-o", "remount,rw", str(spool)], check=True, capture_output=True, text=True)
        try:
            starter.wait(timeout=60)
        except subprocess.TimeoutExpired:
            starter.kill()
        self._writable_where_the_publisher_runs(node, spool, record)
        if not node.alive("publisher"):
            node.forget("publisher")
            node.start("publisher")
            record.notes.append("publisher started again after the spool became writable")

    @staticmethod
    def _writable_where_the_publisher_runs(node: Node, spool: Path, record: FaultRecord) -> None:
        """After a simulated reboot the publisher runs in a mount namespace of its own, and one
        started while the spool was read-only holds a copy of that mount with the read-only flag:
        the remount above does not reach it (found by the 60-minute soak: readiness stayed false
        for the rest of that process). On a node the file system comes back for everyone, so the
        fault makes it writable there too."""
        pid = node.pid("publisher")
        if pid is None or not pid_alive(pid):
            return
        try:
            if os.readlink(f"/proc/{pid}/ns/mnt") == os.readlink("/proc/self/ns/mnt"):
                return
        except OSError:
            return
        out = subprocess.run(["nsenter", "-t", str(pid), "-m", "mount", "-o", "remount,rw", str(spool)],
                             capture_output=True, text=True)
        if out.returncode:
            record.errors.append(f"spool not made writable in the publisher's mount namespace: {out.stderr[-300:]}")

    def cleanup(self, node: Node, record: FaultRecord) -> None:
        subprocess.run(["mount", "-o", "remount,rw", str(node.nc / "spool")], capture_output=True)
        self._writable_where_the_publisher_runs(node, node.nc / "spool", record)
        node.release("publisher")


class StateDiskFull(Fault):
    """The publisher's state file system (its journal) is filled to the last byte for 10 s."""

    name = "state-disk-full"
    blocks = "maybe"

    def __init__(self, hold: float = 10.0) -> None:
        self.hold = hold

    def filler(self, node: Node) -> Path:
        return node.nc / "state" / "soak-filler"

    def run(self, node: Node, nudge: Callable[[], None], record: FaultRecord) -> None:
        written = 0
        fd = os.open(self.filler(node), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:  # unbuffered: the last short write is where the file system says ENOSPC
            for chunk in (1 << 20, 4096, 512):
                block = b"\0" * chunk
                while True:
                    try:
                        written += os.write(fd, block)
                    except OSError:
                        break
        finally:
            os.close(fd)
        record.start = time.time()
        st = os.statvfs(node.nc / "state")
        record.notes.append(f"filled with {written >> 20} MiB; {st.f_bavail * st.f_frsize} bytes left")
        nudge()
        time.sleep(self.hold)

    def cleanup(self, node: Node, record: FaultRecord) -> None:
        self.filler(node).unlink(missing_ok=True)


class ConflistRewrite(Fault):
    """The primary CNI rewrites its conflist as its installer would: its own plugins only, keys in its own order."""

    name = "conflist-rewrite"

    def run(self, node: Node, nudge: Callable[[], None], record: FaultRecord) -> None:
        path = Path(node.cluster.values["NETCLAIM_CONFLIST"])
        doc = json.loads(path.read_text())
        plugins = [dict(reversed(list(p.items()))) for p in doc["plugins"] if p.get("type") != "netclaim"]
        for p in plugins:
            if p.get("type") == "bridge":
                p["mtu"] = 1500  # the default, said explicitly: other bytes, same network
        rewritten = {"plugins": plugins, "name": doc["name"], "cniVersion": doc["cniVersion"]}
        tmp = path.with_name(f".{path.name}.soak")
        tmp.write_text(json.dumps(rewritten, indent=4) + "\n")
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
        record.start = time.time()
        nudge()
        deadline = time.time() + 30
        while time.time() < deadline:
            if '"netclaim"' in path.read_text():
                record.notes.append(f"re-chained after {time.time() - record.start:.1f}s")
                break
            time.sleep(0.1)
        else:
            record.notes.append("NOT re-chained within 30s")
            node.unchained.append((record.start, time.time()))
            return
        # The runtime reloads the conf dir on its own schedule: until it has, new sandboxes still
        # get the chain without netclaim. The span ends when containerd reports netclaim loaded.
        while time.time() < deadline and not _runtime_runs_netclaim(node):
            time.sleep(0.1)
        node.unchained.append((record.start, time.time()))
        record.notes.append(f"containerd runs netclaim again after {time.time() - record.start:.1f}s")


def _runtime_runs_netclaim(node: Node) -> bool:
    """containerd's loaded CNI config has a netclaim plugin (False while crictl cannot tell)."""
    try:
        return "netclaim" in node.cluster.loaded_cni_types()
    except (subprocess.SubprocessError, ValueError, KeyError, OSError):
        return False


class Reboot(Fault):
    """Power-cycle the node without touching the host: services stopped, every pod process killed, the runtime's
    /run-like state wiped (netns mounts, shim and runc state), then the services start in a new boot (new boot id,
    CLOCK_BOOTTIME near zero) whose wall clock is `behind` seconds late."""

    name = "reboot-clock-behind"
    restarts_publisher = True

    def __init__(self, behind: float = 3600.0) -> None:
        self.behind = behind

    def run(self, node: Node, nudge: Callable[[], None], record: FaultRecord) -> None:
        node.hold("publisher", "kubelet", "containerd", "chain-keeper")
        for component in ("kubelet", "publisher", "containerd"):
            record.notes.append(node.signal(component, signal.SIGTERM))
        record.notes.append(f"killed {kill_pods(node)} pod and shim processes")
        record.notes.append(f"wiped runtime state ({wipe_run_state(node)} mounts released)")
        boot = new_boot(node.soak_dir)
        write_boot(node, boot, self.behind)
        record.notes.append(f"boot id {boot.boot_id}, CLOCK_BOOTTIME offset {boot.boottime_offset}s, "
                            f"wall clock {-self.behind:+.0f}s")
        node.start("containerd")
        node.start("publisher")
        node.start("kubelet")

    def cleanup(self, node: Node, record: FaultRecord) -> None:
        node.release("publisher", "kubelet", "containerd", "chain-keeper")


class NtpStep(Fault):
    """After a reboot with the clock behind: the clock is corrected (a forward step of the wall clock)."""

    name = "ntp-step"

    def run(self, node: Node, nudge: Callable[[], None], record: FaultRecord) -> None:
        clock = node.soak_dir / "clock-offset"
        was = clock.read_text().strip() if clock.exists() else "0"
        clock.write_text("0\n")
        record.notes.append(f"wall clock stepped from {was}s to 0s")
        nudge()
        time.sleep(2)  # the shim re-reads the offset every second


class TokenRotation(Fault):
    """Kubelet's projected-token rotation, with the old credential revoked: the publisher's and the keeper's
    token files replaced atomically by the next generation, the previous one revoked (its holder pod and
    Secret deleted) until a TokenReview refuses it. Neither process is restarted. Then a claimed pod is
    started, whose status only a publisher that took up the new token can write."""

    name = "token-rotation"

    def run(self, node: Node, nudge: Callable[[], None], record: FaultRecord) -> None:
        if node.tokens is None:
            raise RuntimeError("the soak set up no rotating tokens")
        pid = node.pid("publisher")
        rotation, notes = node.tokens.rotate(pid if pid is not None and pid_alive(pid) else None)
        record.notes.extend(notes)
        rotation.claimed_restart = node.claimed_start()
        record.notes.append(f"claimed pod started after the rotation: {rotation.claimed_restart or 'none'}")


def restart_phase() -> list[Fault]:
    return [Restart("publisher", signal.SIGKILL), Restart("publisher", signal.SIGTERM), SpoolReadOnly(), Reboot(),
            NtpStep()]


def live_phase(rotations: int = 1) -> list[Fault]:
    """The faults that leave the publisher running. A token rotation comes right before the API server restart
    (every watch lists again, with the new token); `rotations` 2 adds one more later in the cycle."""
    second: list[Fault] = [TokenRotation()] if rotations >= 2 else []
    return [Restart("kubelet", signal.SIGKILL), Restart("containerd", signal.SIGTERM), TokenRotation(),
            ApiserverRestart(), JournalLock(), Restart("kubelet", signal.SIGTERM), *second, StateDiskFull(),
            Restart("containerd", signal.SIGKILL), ConflistRewrite()]
