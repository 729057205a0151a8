"""TEST-ONLY shim: shift one Python process's wall clock, for the soak's "reboot with the clock behind".

A node that reboots with its real-time clock behind (a bad RTC battery, a VM
restored from a snapshot, NTP not yet synced) stamps every new event with a
wall time earlier than the events of the boot before. The soak needs the
plugin and the publisher to live through that without changing this host's
clock (other processes share it), and Linux time namespaces offset only
CLOCK_MONOTONIC and CLOCK_BOOTTIME, never CLOCK_REALTIME. So, for a Python
process only, `install()` replaces `time.time` and `time.time_ns` (what the
plugin's stamps, the publisher's `clock.wall()`, its logs and its API
timestamps read) with the real clock plus the offset in seconds written in the
file `$NETCLAIM_SOAK_CLOCK_FILE`. The file is re-read at most once a second,
so writing 0 into it is "NTP steps the clock forward". Nothing in the product
imports this module; the soak loads it through a generated sitecustomize
(publisher) or launcher (plugin).
"""

from __future__ import annotations

import os
import threading
import time

ENV = "NETCLAIM_SOAK_CLOCK_FILE"


class _Offset:
    """The offset in the file, cached for a second of real monotonic time."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.value = 0.0
        self.read_at = float("-inf")
        self.lock = threading.Lock()
        self.monotonic = time.monotonic

    def __call__(self) -> float:
        now = self.monotonic()
        if now - self.read_at >= 1.0:
            with self.lock:
                try:
                    with open(self.path, encoding="ascii") as fh:
                        self.value = float(fh.read().strip() or 0)
                except (OSError, ValueError):
                    self.value = 0.0
                self.read_at = now
        return self.value


def install(path: str | None = None) -> bool:
    """Shift time.time/time.time_ns by the file's offset; False (and nothing changed) without a file."""
    path = path or os.environ.get(ENV, "")
    if not path:
        return False
    offset = _Offset(path)
    real_time, real_time_ns = time.time, time.time_ns
    time.time = lambda: real_time() + offset()  # type: ignore[assignment]
    time.time_ns = lambda: real_time_ns() + int(offset() * 1_000_000_000)  # type: ignore[assignment]
    return True
