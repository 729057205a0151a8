"""Run the real netclaim-publisher as a child process (tests, demo, benchmarks).

The publisher is started exactly as an operator would start it (the
`netclaim-publisher run` console script with flags), its stderr (JSON lines)
goes to a log file the caller can read, and readiness is "the socket answers
a status request" - the same thing the plugin depends on.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .jsonlog import log
from .procs import terminate

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO))

from cni_plugin.wire.frame import encode_frame, read_frame  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def publisher_command(python: str) -> list[str]:
    script = Path(python).parent / "netclaim-publisher"
    return [str(script)] if script.exists() else [python, "-m", "publisher.cli"]


@dataclass
class PublisherProcess:
    node_name: str
    kubeconfig: str
    socket: Path
    state_dir: Path
    spool_dir: Path
    log_file: Path
    python: str = sys.executable
    metrics_port: int = field(default_factory=free_port)
    extra_args: list[str] = field(default_factory=list)
    proc: subprocess.Popen[bytes] | None = None

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}/metrics"

    def start(self, timeout: float = 30.0) -> None:
        cmd = [
            *publisher_command(self.python), "run",
            "--node-name", self.node_name,
            "--kubeconfig", self.kubeconfig,
            "--socket", str(self.socket),
            "--state-dir", str(self.state_dir),
            "--spool-dir", str(self.spool_dir),
            "--metrics-address", f"127.0.0.1:{self.metrics_port}",
            *self.extra_args,
        ]
        self.log_file.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_file, "ab") as out:
            self.proc = subprocess.Popen(
                cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        log("publisher.start", pid=self.proc.pid, node=self.node_name, socket=str(self.socket))
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"netclaim-publisher exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                self.status()
                return
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"netclaim-publisher socket not answering after {timeout}s:\n{self.log_tail()}")
            time.sleep(0.1)

    def status(self) -> dict[str, Any]:
        """Ask the publisher over its socket (the request the wire format defines)."""
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(5)
            s.connect(str(self.socket))
            s.sendall(encode_frame({"kind": "status"}))
            return read_frame(s)

    def stop(self, timeout: float = 15.0) -> None:
        if self.proc is not None and terminate(self.proc, timeout):
            log("publisher.stopped", pid=self.proc.pid, rc=self.proc.returncode)

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_file.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def log_records(self) -> list[dict[str, Any]]:
        """The publisher's JSON log lines (other lines are skipped)."""
        records = []
        try:
            text = self.log_file.read_text(errors="replace")
        except OSError:
            return records
        for line in text.splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if isinstance(rec, dict):
                records.append(rec)
        return records
