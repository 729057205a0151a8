"""A node of its own on this machine, where a reader's node commands run exactly as the docs write them.

The docs' node commands name a node's own paths (/opt/netclaim/venv, /etc/cni/net.d, /etc/netclaim,
/etc/systemd/system, /run/netclaim, /var/lib/netclaim) and its name (`$(hostname)`). This machine is
shared with other tests and must not get any of them, so a NodeRoot is a node for those commands: a
private mount and UTS namespace whose root is an overlay of this machine's root file system (everything
installed here is there; nothing written there reaches this machine) and whose host name is the node's.
/proc, /sys and /dev are this machine's; so is the network (a test cluster's API server listens on
this machine's 127.0.0.1), and with it the ports a command uses.

Directories that must stay the real ones (a test cluster's CNI and netclaim dirs, which its kubelet
and containerd use) are bind-mounted at their own paths. The namespaces last as long as the NodeRoot:
close() stops every process still in it and lets go of both.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from deploylib import terminate

PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@dataclass(frozen=True)
class LineRun:
    """One command line as run, and what it did."""

    line: str
    rc: int
    out: str
    err: str

    def tail(self) -> str:
        return f"`{self.line}` exited {self.rc}\n--- stdout\n{self.out[-1500:]}\n--- stderr\n{self.err[-1500:]}"


class NodeRoot:
    """A private root and host name for commands run on a node (see the module's docstring)."""

    def __init__(self, hostname: str, binds: Sequence[str] = (), env: Mapping[str, str] | None = None) -> None:
        self.hostname = hostname
        self.binds = [str(b) for b in binds]
        self.env = {"PATH": PATH, "HOME": "/root", "LANG": "C.UTF-8",
                    # pip as this machine is configured (an index or a wheelhouse): what the reader's pip has.
                    **{k: v for k, v in os.environ.items() if k.startswith("PIP_")}, **(env or {})}
        self.base = Path(tempfile.mkdtemp(prefix="ncnode-"))
        self.procs: list[subprocess.Popen[Any]] = []
        self.runs = 0

    # ---------------------------------------------------------------- life

    def __enter__(self) -> NodeRoot:
        try:
            self.open()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    @property
    def root(self) -> Path:
        return self.base / "root"

    @property
    def io(self) -> Path:
        """Where a run's output lands: the same directory inside and outside."""
        return self.base / "io"

    def open(self) -> None:
        # The overlay's upper layer on a file system of its own: overlayfs refuses an upper dir inside its lower.
        subprocess.run(["mount", "-t", "tmpfs", "-o", "mode=0700", "tmpfs", str(self.base)], check=True)
        for name in ("upper", "work", "root", "io"):
            (self.base / name).mkdir()
        for name in ("mnt", "uts"):
            (self.base / name).touch()
        binds = [str(self.io), *self.binds]
        setup = [
            f"mount -t overlay overlay -o lowerdir=/,upperdir={self.base}/upper,workdir={self.base}/work {self.root}",
            *(f"mount --rbind /{d} {self.root}/{d}" for d in ("proc", "sys", "dev")),
            *(f"mkdir -p {self.root}{b} && mount --rbind {b} {self.root}{b}" for b in binds),
            f"hostname {shlex.quote(self.hostname)}",
        ]
        subprocess.run(["unshare", f"--mount={self.base}/mnt", f"--uts={self.base}/uts", "--propagation", "private",
                        "--", "sh", "-euc", " && ".join(setup)], check=True, capture_output=True, text=True,
                       timeout=60)

    def close(self) -> None:
        for proc in self.procs:
            terminate(proc)
        self.kill_the_rest()
        for name in ("mnt", "uts"):
            subprocess.run(["umount", str(self.base / name)], capture_output=True)
        subprocess.run(["umount", "-l", str(self.base)], capture_output=True)
        try:
            self.base.rmdir()
        except OSError:
            pass

    def kill_the_rest(self) -> None:
        """Every process still in this node's mount namespace (and only those): what a command left behind."""
        try:
            ns = os.stat(self.base / "mnt").st_ino
        except OSError:
            return
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                if os.stat(f"/proc/{pid}/ns/mnt").st_ino == ns and int(pid) != os.getpid():
                    os.kill(int(pid), signal.SIGKILL)
            except (OSError, ValueError):
                continue

    # ---------------------------------------------------------------- running things on the node

    def argv(self, *command: str, env: Mapping[str, str] | None = None) -> list[str]:
        """`command` on the node, as root, in a clean environment (the node's, plus `env`)."""
        assignments = [f"{k}={v}" for k, v in {**self.env, **(env or {})}.items()]
        return ["nsenter", f"--mount={self.base}/mnt", f"--uts={self.base}/uts", "--", "chroot", str(self.root),
                "/usr/bin/env", "-i", *assignments, *command]

    def sh(self, script: str, *, stdin: str | None = None, env: Mapping[str, str] | None = None,
           check: bool = True, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(self.argv("bash", "-c", script, env=env), input=stdin, capture_output=True, text=True,
                              timeout=timeout)
        if check and proc.returncode != 0:
            raise AssertionError(f"on the node: {script!r} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
        return proc

    def write(self, path: str, text: str, mode: int = 0o644) -> None:
        self.sh(f"install -D -m {mode:o} /dev/stdin {shlex.quote(path)}", stdin=text)

    def read(self, path: str) -> str:
        return self.sh(f"cat {shlex.quote(path)}").stdout

    def start(self, *command: str, env: Mapping[str, str] | None = None, umask: int = 0o022,
              log: Path | None = None) -> subprocess.Popen[Any]:
        """A long-running process on the node (a service), stopped by close()."""
        out = open(log, "ab") if log else subprocess.DEVNULL
        script = f"umask {umask:o} && exec {shlex.join(command)}"
        proc = subprocess.Popen(self.argv("sh", "-c", script, env=env), stdout=out, stderr=subprocess.STDOUT)
        self.procs.append(proc)
        return proc

    def run_lines(self, lines: Sequence[str], *, cwd: str, after: str = "", timeout: float = 900) -> list[LineRun]:
        """Each line as a reader pastes it into one shell, in order (a variable a line sets is there for the
        next), each with its own exit code and output; `after` runs last in the same shell, unrecorded (what
        the reader does between two blocks)."""
        self.runs += 1
        tag = f"{self.io}/run{self.runs}"
        script = [f"cd {shlex.quote(cwd)} || exit 97"]
        for i, line in enumerate(lines):
            script.append(f"{{\n{line}\n}} >{tag}.{i}.out 2>{tag}.{i}.err </dev/null; echo $? >{tag}.{i}.rc")
        if after:
            script.append(f"{{\n{after}\n}} >{tag}.after 2>&1 </dev/null || {{ cat {tag}.after >&2; exit 98; }}")
        proc = subprocess.run(self.argv("bash", "-c", "\n".join(script)), capture_output=True, text=True,
                              timeout=timeout)
        if proc.returncode != 0:
            raise AssertionError(f"the shell on the node exited {proc.returncode}:\n{proc.stderr[-3000:]}")
        out = []
        for i, line in enumerate(lines):
            read = lambda suffix: Path(f"{tag}.{i}.{suffix}").read_text(errors="replace")  # noqa: E731
            out.append(LineRun(line, int(read("rc").strip()), read("out"), read("err")))
        return out
