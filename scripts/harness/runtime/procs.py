"""Stopping the processes a harness, a demo or a test started."""

from __future__ import annotations

import signal
import subprocess
import time


def terminate(proc: subprocess.Popen, timeout: float = 15.0) -> bool:
    """SIGTERM, wait up to `timeout`, then SIGKILL: a graceful stop that cannot hang.

    Returns False when the process had already exited (nothing was sent)."""
    if proc.poll() is not None:
        return False
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)
    return True


def pid_alive(pid: int) -> bool:
    """Alive and not a zombie (an unreaped child still answers kill -0)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def wait_gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while pid_alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True
