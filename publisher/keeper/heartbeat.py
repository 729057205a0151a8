"""The chain keeper's liveness: is its loop still turning?

The keeper's readiness says how the node stands (chained or not); its liveness
says whether the keeper can still do its job, so that the kubelet restarting it
is the right cure. The main loop beats once per turn (one look at the conf dir,
every poll interval). /healthz fails when the loop has not turned for
`stall_after` seconds: many poll intervals, never less than STALL_MIN, because
one pass may legitimately take seconds (copying the plugin executable, fsync of
a conflist on a busy disk).

Three phases are alive however long they last, since nothing is stuck in them:

- waiting for the node lock (publisher/nodelock.py): a new install's
  keeper waits while an older keeper (an uninstall cleaning up, a rollout's
  previous pod) holds it. Restarting the waiter would only start the wait
  again, so waiting is alive; the waiting loop beats too.
- stopping: SIGTERM came; deciding between uninstall and upgrade and cleaning
  up are bounded by the pod's grace period, not by the poll interval.
- stepped down: a newer keeper claimed the node; this one touches nothing.

Everything is plain attribute reads and writes (atomic in CPython): a probe
never waits for the loop it judges.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from publisher.clock import node_seconds

STALL_POLLS = 60  # poll intervals without a turn of the loop before /healthz fails
STALL_MIN = 60.0  # seconds: never less, whatever the poll interval

STARTING = "starting"
WAITING = "waiting for the node lock"
KEEPING = "keeping the chain"
STOPPING = "stopping"
STEPPED_DOWN = "stepped down"


def stall_after(poll_interval: float, given: float = 0.0) -> float:
    """Seconds without a turn that fail liveness: `given` when set, else STALL_POLLS polls, at least STALL_MIN."""
    if given > 0:
        return given
    return max(STALL_POLLS * poll_interval, STALL_MIN)


@dataclass
class Heartbeat:
    """The phase the keeper is in and when its current loop last turned."""

    stall_after: float
    now: Callable[[], float] = node_seconds
    phase: str = STARTING
    last: float = field(default=0.0)
    since: float = field(default=0.0)  # when the phase began

    def __post_init__(self) -> None:
        self.last = self.since = self.now()

    def enter(self, phase: str) -> None:
        """A new phase; it counts as a turn."""
        now = self.now()
        self.phase, self.since, self.last = phase, now, now

    def beat(self) -> None:
        """The current loop turned once."""
        self.last = self.now()

    def live(self) -> tuple[bool, str]:
        """(alive, why): what /healthz answers."""
        now = self.now()
        if self.phase in (WAITING, STOPPING, STEPPED_DOWN):
            return True, f"{self.phase} (for {now - self.since:.0f}s)"
        quiet = now - self.last
        if quiet > self.stall_after:
            return False, (f"chain keeper loop: no turn for {quiet:.0f}s while {self.phase} "
                           f"(limit {self.stall_after:.0f}s); stuck in a pass")
        return True, ""
