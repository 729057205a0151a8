"""Health: what /healthz and /readyz answer, from heartbeats and faults, never from the journal.

Liveness (/healthz) fails only when the publisher cannot make progress by
itself, so that the kubelet restarting it is the right cure: a journal write
stuck or failing for `limits.JOURNAL_WEDGED`, a loop (worker, housekeeping)
that completed no iteration for `limits.LOOP_STALLED`, a thread that crashed
more than its restart budget. Readiness (/readyz) fails for any fault and
names the component first (`journal: ...`, `spool: ...`, `api: ...`,
`credentials: ...`, `thread: ...`), so an operator knows where to look.

Everything here is plain attributes written by the parts themselves (a dict
assignment is atomic in CPython): a probe never takes a lock that a stuck
part could be holding, and never touches SQLite.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from publisher import limits
from publisher.clock import node_seconds


@dataclass
class Fault:
    message: str
    since: float  # node_seconds() when it was first seen


@dataclass
class Health:
    """Heartbeats of the loops, faults by component, crash counts of the supervised threads."""

    now: Callable[[], float] = node_seconds
    beats: dict[str, float] = field(default_factory=dict)  # loop name -> node time of its last iteration
    faults: dict[str, Fault] = field(default_factory=dict)  # component -> what is wrong
    crashes: dict[str, list[float]] = field(default_factory=dict)  # thread name -> node times of crashes
    # Extra liveness checks that return a reason ("" when fine); they must not block either. Given at
    # construction (publisher/service.py: the journal's wedged writes, the socket's accept loop).
    checks: tuple[Callable[[], str], ...] = ()

    def beat(self, loop: str) -> None:
        """A loop completed one iteration (or one unit of work inside a long one)."""
        self.beats[loop] = self.now()

    def fault(self, component: str, message: str) -> bool:
        """Record a fault; True when it is new (the caller logs only then: no log flood)."""
        old = self.faults.get(component)
        self.faults[component] = Fault(message, old.since if old else self.now())
        return old is None

    def clear(self, component: str) -> bool:
        """The component works again; True when it had a fault (worth one log line)."""
        return self.faults.pop(component, None) is not None

    def crashed(self, thread: str) -> int:
        """Count a crash of a supervised thread; returns its crashes within the window."""
        now = self.now()
        recent = [t for t in self.crashes.get(thread, []) if now - t < limits.THREAD_RESTART_WINDOW] + [now]
        self.crashes[thread] = recent
        return len(recent)

    def liveness(self) -> tuple[bool, str]:
        now = self.now()
        for loop, last in sorted(self.beats.items()):
            if now - last > limits.LOOP_STALLED:
                return False, f"thread: {loop} completed no iteration for {now - last:.0f}s"
        for thread, times in sorted(self.crashes.items()):
            recent = [t for t in times if now - t < limits.THREAD_RESTART_WINDOW]
            if len(recent) >= limits.THREAD_RESTART_BUDGET:
                return False, (f"thread: {thread} crashed {len(recent)} times in "
                               f"{limits.THREAD_RESTART_WINDOW:.0f}s")
        for check in self.checks:
            why = check()
            if why:
                return False, why
        return True, ""

    def readiness(self) -> tuple[bool, str]:
        """Not ready while any fault lasts; the reason starts with the component at fault."""
        alive, why = self.liveness()
        if not alive:
            return False, why
        faults = sorted(self.faults.items(), key=lambda kv: (_RANK.get(kv[0].split(":")[0], 9), kv[0]))
        if faults:
            return False, "; ".join(f"{_label(c)}: {f.message}" for c, f in faults)
        return True, ""


# Which fault speaks first when several are present: the root cause is usually the earlier one.
_RANK = {"thread": 0, "journal": 1, "spool": 2, "credentials": 3, "api": 4}


def _label(component: str) -> str:
    """`thread:worker-0` is reported as `thread` (its message names the thread)."""
    return component.split(":")[0]
