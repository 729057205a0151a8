"""Stopping the processes a harness, a demo or a test started."""

from __future__ import annotations

import signal
import subprocess


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
