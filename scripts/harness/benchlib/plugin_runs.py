"""How the plugin benchmarks install and start a plugin: shared by `plugin` and `plugin --orphaned-node`.

A runtime starts a CNI plugin with vfork+exec and a publisher answers on a unix socket; these are
the pieces each suite times with, so both suites measure the same way.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
ROUNDS = 5  # per-round medians give the ratio's range


def run_timed(argv: list[str], env: dict[str, str], stdin: bytes) -> tuple[float, int, bytes, float]:
    """(wall seconds, exit code, stdout, CPU seconds) of one child started with posix_spawn,
    as a runtime starts a plugin (vfork+exec: the bench's own size does not slow the fork).
    CPU = user + system time of the child: less sensitive than wall time to other load."""
    start = time.perf_counter()
    r, w = os.pipe()
    o_r, o_w = os.pipe()
    devnull = os.open(os.devnull, os.O_WRONLY)
    actions = [(os.POSIX_SPAWN_DUP2, r, 0), (os.POSIX_SPAWN_DUP2, o_w, 1), (os.POSIX_SPAWN_DUP2, devnull, 2)]
    pid = os.posix_spawn(argv[0], argv, env, file_actions=actions)
    for fd in (r, o_w, devnull):
        os.close(fd)
    os.write(w, stdin)
    os.close(w)
    chunks = []
    while chunk := os.read(o_r, 65536):
        chunks.append(chunk)
    os.close(o_r)
    _pid, status, usage = os.wait4(pid, 0)
    return (time.perf_counter() - start, os.waitstatus_to_exitcode(status), b"".join(chunks),
            usage.ru_utime + usage.ru_stime)


class AckServer:
    """A trivial acking publisher (speaks the wire framing, commits nothing)."""

    def __init__(self, path: str) -> None:
        sys.path.insert(0, str(REPO))
        from cni_plugin.wire import frame as wire_frame

        self.frames = wire_frame
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(path)
        self.sock.listen(64)
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                try:
                    msg = self.frames.read_frame(conn)
                    conn.sendall(self.frames.encode_frame({"ok": True, "id": msg["event"]["event_id"]}))
                except Exception:  # noqa: BLE001 - a bench server never dies on one bad client
                    pass

    def close(self) -> None:
        self.sock.close()


def sh(*argv: str) -> str:
    return subprocess.run(list(argv), check=True, capture_output=True, text=True).stdout


def install_bundle(tmp: Path) -> tuple[str, Path]:
    """scripts/install.sh into a temp bin dir, as an operator installs it; returns (exe, source bundle)."""
    conflist = tmp / "net.d" / "10-bench.conflist"
    conflist.parent.mkdir()
    conflist.write_text(json.dumps({"cniVersion": "1.0.0", "name": "bench", "plugins": [{"type": "bridge"}]}))
    built = sh("bash", str(REPO / "scripts" / "build-plugin.sh")).strip().splitlines()[-1]
    sh("bash", str(REPO / "scripts" / "install.sh"), "--cni-bin-dir", str(tmp / "bin"), "--conflist", str(conflist),
        "--driver-name", "net.example.com", "--bundle", built, "--drivers-file", str(tmp / "drivers"))
    return str(tmp / "bin" / "netclaim"), Path(built)


def span(ratios: list[float]) -> str:
    return f"{min(ratios):.2f}-{max(ratios):.2f}"
