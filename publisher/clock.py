"""The publisher's two clocks, and which one each kind of time uses.

Durations (backoff, retry times, resync intervals, resolve timeouts, pruning
ages) use `node_seconds()`: CLOCK_BOOTTIME, which never steps when the wall
clock is set (NTP, a bad RTC, a restored VM) and is shared by every process of
one boot, so values stored in the journal stay comparable across a publisher
restart. A value from another boot means nothing; the journal rebases those at
start (a new boot id). `wall()` is for what people and the API read:
timestamps in logs, status and Events.
"""

from __future__ import annotations

import random
import time


def node_seconds() -> float:
    """Seconds on CLOCK_BOOTTIME: monotonic within a boot, immune to wall-clock steps."""
    return time.clock_gettime(time.CLOCK_BOOTTIME)


def wall() -> float:
    """The wall clock: only for timestamps shown to people or written to the API."""
    return time.time()


def boot_began_wall() -> float:
    """Wall time this boot began: now less CLOCK_BOOTTIME (moves with wall-clock steps). What a
    stamp or file time of before it is, or a container started before it, belongs to an earlier boot."""
    return wall() - node_seconds()


def now_rfc3339() -> str:
    """The wall clock as the API writes times (a condition's lastTransitionTime): whole seconds, UTC."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def backoff_delay(attempt: int, base: float, cap: float) -> float:
    """How long to wait before retry `attempt`: capped exponential backoff with jitter (half fixed, half random)."""
    delay = min(cap, base * (2 ** min(attempt, 20)))
    return delay / 2 + random.uniform(0, delay / 2)
