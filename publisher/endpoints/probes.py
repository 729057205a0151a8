"""The endpoints controller's /healthz and /readyz: a watch that died or went quiet restarts the pod.

The controller's failure a user would not see is a silent one: a watch thread that ended or hangs
leaves every slice as it was, forever, while the pod runs. So liveness fails when any part stopped
making progress, and the kubelet restarts the pod (a restart costs one list per collection):
- a watch (Services, pods, claims, our slices) whose thread ended, or that neither received an
  event or a bookmark nor completed a list for limits.WATCH_STALLED (publisher/endpoints/watch.py);
- the election loop (every replica's) or the leader's worker thread, with no round or pass for
  limits.LOOP_STALLED, or whose thread ended.
Readiness: a standby is ready while the API server answers its election (within the Lease's
duration: one cut off could never take over, and two Ready replicas would hide that none can
lead); the leader once the first lists of all its watches are done (before that its slices are
not known to be right).

The checks are the node publisher's (publisher/observe/health.py: heartbeats and extra checks that
never block), served by its bounded probe listener (publisher/observe/metrics.py HealthServer, kept
open by publisher/observe/listeners.py). When a check turns bad it is logged once, naming the part
and why, even when no probe asks: every election round looks.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Protocol

from publisher import limits, logs
from publisher.observe.health import Health


class Watched(Protocol):
    """What the probes read of a watch cache (publisher/endpoints/watch.py Cache)."""

    what: str
    synced: threading.Event

    def stalled(self, bound: float) -> str: ...


class Probes:
    """Liveness and readiness of one replica: its election loop, and while it leads, its watches and worker."""

    def __init__(self, stopping: threading.Event, leading: threading.Event,
                 stalled: float = limits.WATCH_STALLED,
                 unanswered: Callable[[], float | None] = lambda: 0.0, answer_within: float = 15.0) -> None:
        self.stopping = stopping
        self.leading = leading  # the Election's: set while this replica holds the Lease
        # The Election's unanswered_for, and how long a standby may go unanswered and stay ready (the
        # Lease's duration: a standby cut off longer could not take over when the leader goes).
        self.unanswered = unanswered
        self.answer_within = answer_within
        self.stalled = stalled
        self.health = Health(checks=(self._parts,))
        self.watches: list[Watched] = []  # set when this replica starts leading
        self.worker: threading.Thread | None = None
        self._said = ""  # the failing reason last logged ("" while live)
        self._lock = threading.Lock()

    def lead(self, watches: list[Any], worker: threading.Thread) -> None:
        """This replica leads now: its watches and worker are looked at from here on."""
        self.watches, self.worker = list(watches), worker

    def beat(self, loop: str) -> None:
        """A loop (`election`, `worker`) completed one round."""
        self.health.beat(loop)

    def election_round(self) -> None:
        """Called by the election after each round: a beat, and a look, so a bad check is logged unasked."""
        self.beat("election")
        self.live()

    def _parts(self) -> str:
        for watch in self.watches:
            why = watch.stalled(self.stalled)
            if why:
                return why
        if self.worker is not None and not self.worker.is_alive() and not self.stopping.is_set():
            return "thread: worker ended"
        return ""

    def live(self) -> tuple[bool, str]:
        """Liveness (/healthz): False only when a restart is the cure."""
        if self.stopping.is_set():
            return True, ""
        ok, why = self.health.liveness()
        self._say(why)
        return ok, why

    def ready(self) -> tuple[bool, str]:
        """Readiness (/readyz): live, and (leading) the first lists done, or (standby) the election loop running."""
        ok, why = self.live()
        if not ok:
            return False, why
        if self.stopping.is_set():
            return False, "stopping"
        if "election" not in self.health.beats:
            return False, "starting: no election round yet"
        if not self.leading.is_set():
            age = self.unanswered()
            if age is None:
                return False, "standby: the API server has not answered the election yet"
            if age > self.answer_within:
                return False, f"standby: the API server has not answered the election for {age:.0f} s"
            return True, "standby"
        if not self.watches:
            return False, "leading: starting the watches"
        pending = [w.what for w in self.watches if not w.synced.is_set()]
        if pending:
            return False, "leading: first list not done: " + ", ".join(pending)
        return True, "leading"

    def _say(self, why: str) -> None:
        """One line when a check turns bad (or its reason changes), one when all pass again."""
        with self._lock:
            if why == self._said or (why and self._said and _part(why) == _part(self._said)):
                return
            before, self._said = self._said, why
        if why:
            logs.get().error("liveness check failed: the kubelet restarts this pod",
                             extra={"part": _part(why), "reason": why})
        elif before:
            logs.get().info("liveness checks pass again", extra={"part": _part(before)})


def _part(why: str) -> str:
    """The part a reason names: `watch pods`, `election`, `worker`."""
    head = why.split(":", 1)[0]
    if head == "thread":  # publisher/observe/health.py's "thread: <loop> ..."
        return why.split(":", 1)[1].split()[0] if ":" in why else head
    return head
