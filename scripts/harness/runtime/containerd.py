"""Start and stop a private containerd (1.6) with the settings these machines need.

Why each setting (see the project's reference notes on containerd):
- restrict_oom_score_adj: the machine lacks CAP_SYS_RESOURCE; without it
  RunPodSandbox fails ("can't get final child's PID from pipe").
- SystemdCgroup = false: there is no systemd.
- one CNI bin_dir: 1.6 takes a single directory, so the caller links the
  reference plugins (and netclaim) into one.
- netns_mounts_under_state_dir: pod netns mounts live under our state dir, so
  they are found and unmounted with everything else at teardown.
- sandbox_image: a locally imported image, no registry is reachable.
Root, state, sockets and the CRI conf dir are all under one base directory.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from .jsonlog import log
from .procs import terminate

DISABLED_PLUGINS = (
    "io.containerd.snapshotter.v1.aufs",
    "io.containerd.snapshotter.v1.btrfs",
    "io.containerd.snapshotter.v1.devmapper",
    "io.containerd.snapshotter.v1.zfs",
    "io.containerd.tracing.processor.v1.otlp",
)


@dataclass(frozen=True)
class ContainerdPaths:
    """Every location this containerd writes, derived from one base dir."""

    base: Path

    @property
    def root(self) -> Path:
        return self.base / "root"

    @property
    def state(self) -> Path:
        return self.base / "state"

    @property
    def socket(self) -> Path:
        return self.base / "containerd.sock"

    @property
    def config(self) -> Path:
        return self.base / "config.toml"

    @property
    def log(self) -> Path:
        return self.base / "containerd.log"

    @property
    def cni_bin_dir(self) -> Path:
        return self.base / "cni-bin"

    @property
    def cni_conf_dir(self) -> Path:
        return self.base / "cni-conf"

    @property
    def opt(self) -> Path:
        return self.base / "opt"


def _q(value: object) -> str:
    """TOML basic string."""
    return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'


def render_config(paths: ContainerdPaths, sandbox_image: str) -> str:
    disabled = ", ".join(_q(p) for p in DISABLED_PLUGINS)
    cri = '[plugins."io.containerd.grpc.v1.cri"]'
    return f"""version = 2
root = {_q(paths.root)}
state = {_q(paths.state)}
disabled_plugins = [{disabled}]

[grpc]
  address = {_q(paths.socket)}

[debug]
  level = "info"

[plugins."io.containerd.internal.v1.opt"]
  path = {_q(paths.opt)}

{cri}
  sandbox_image = {_q(sandbox_image)}
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  disable_apparmor = true
  enable_selinux = false
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"

{cri[:-1]}.containerd]
  snapshotter = "overlayfs"
  default_runtime_name = "runc"

{cri[:-1]}.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"

{cri[:-1]}.containerd.runtimes.runc.options]
  SystemdCgroup = false

{cri[:-1]}.cni]
  bin_dir = {_q(paths.cni_bin_dir)}
  conf_dir = {_q(paths.cni_conf_dir)}
  max_conf_num = 1
"""


def require_binaries() -> dict[str, str]:
    """Paths of containerd, its runc shim, runc and ctr; fail with the package to install."""
    found = {}
    for name in ("containerd", "containerd-shim-runc-v2", "runc", "ctr"):
        path = shutil.which(name)
        if path is None:
            raise RuntimeError(f"{name} not found: install the Debian packages containerd and runc")
        found[name] = path
    return found


class Containerd:
    """One containerd process we started, plus what it spawned (shims)."""

    def __init__(self, paths: ContainerdPaths, sandbox_image: str) -> None:
        self.paths = paths
        self.sandbox_image = sandbox_image
        self.proc: subprocess.Popen[bytes] | None = None
        self._log_fh = None

    def start(self, timeout: float = 30.0) -> None:
        bins = require_binaries()
        for d in (self.paths.root, self.paths.state, self.paths.cni_bin_dir, self.paths.cni_conf_dir, self.paths.opt):
            d.mkdir(parents=True, exist_ok=True)
        self.paths.config.write_text(render_config(self.paths, self.sandbox_image))
        self._log_fh = open(self.paths.log, "ab")
        self.proc = subprocess.Popen(
            [bins["containerd"], "--config", str(self.paths.config)],
            stdin=subprocess.DEVNULL,
            stdout=self._log_fh,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log("containerd.start", pid=self.proc.pid, socket=str(self.paths.socket), config=str(self.paths.config))
        deadline = time.monotonic() + timeout
        while not self.paths.socket.exists():
            if self.proc.poll() is not None:
                raise RuntimeError(f"containerd exited with {self.proc.returncode}: {self.log_tail()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"containerd socket did not appear within {timeout}s: {self.log_tail()}")
            time.sleep(0.05)

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.paths.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def ctr(self, *args: str, timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
        cmd = [require_binaries()["ctr"], "--address", str(self.paths.socket), "-n", "k8s.io", *args]
        return subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=timeout)

    def import_image(self, archive: Path) -> None:
        try:
            self.ctr("images", "import", "--no-unpack=false", str(archive))
        except subprocess.CalledProcessError:
            # Older ctr has no --no-unpack flag; unpacking is the default there.
            self.ctr("images", "import", str(archive))
        log("containerd.image_imported", image=self.sandbox_image, archive=str(archive))

    def shim_pids(self) -> list[int]:
        """Shims that serve *our* containerd: their command line names our socket."""
        ours = str(self.paths.socket)
        pids = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if argv and argv[0].endswith(b"containerd-shim-runc-v2") and ours.encode() in argv:
                pids.append(int(entry))
        return pids

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM containerd, then kill leftover shims and their children by pid."""
        if self.proc is not None and terminate(self.proc, timeout):
            log("containerd.stopped", pid=self.proc.pid, rc=self.proc.returncode)
        for pid in self.shim_pids():
            kill_tree(pid)
        if self._log_fh is not None:
            self._log_fh.close()
            self._log_fh = None


def _children(pid: int) -> list[int]:
    kids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        # field 4 (ppid) follows the ")" that ends the command name
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == pid:
            kids.append(int(entry))
    return kids


def kill_tree(pid: int) -> None:
    """SIGKILL a process and all its descendants (children first collected, then killed)."""
    tree, todo = [], [pid]
    while todo:
        p = todo.pop()
        tree.append(p)
        todo.extend(_children(p))
    for p in tree:
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass
    log("process.killed", pids=tree)
    for p in tree:
        wait_gone(p)


def wait_gone(pid: int, timeout: float = 5.0) -> None:
    """Wait until a killed process is dead (a zombie counts: it holds nothing open)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            return
        if state in ("Z", "X"):
            return
        time.sleep(0.02)
