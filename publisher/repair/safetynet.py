"""When each tracked claim is next compared with the live cluster by the safety net.

Drift is repaired by events (publisher/repair/claimwatch.py windows, the pod watch, the outcome of
every apply); the safety net is for what no event shows (a change after a window closed, a
bug). It must cost next to nothing at rest, so it is not a pass over every claim: each claim
has its own due time, `after` + uniform[0, `spread`] seconds after it was last verified (any
reconcile that compared it with the live claim counts), and housekeeping verifies the due ones
a few at a time. The jitter spreads the reads evenly over time and over nodes: with the
defaults (24 h + up to 12 h) a node with 1,000 claims reads one every 108 s on average.

Due times live in memory. A claim first seen by this process (after a start, or a claim
tracked from a replay) gets a due time uniform over [0, after + spread], so a restart neither
reads every claim at once nor pushes them all a whole interval back.
"""

from __future__ import annotations

import random
import threading
from typing import Iterable

from publisher.clock import node_seconds, wall

VERIFY_BATCH = 8  # claims verified per housekeeping iteration at most (a requested resync too)


class SafetyNet:
    def __init__(self, after: float, spread: float) -> None:
        self.after = max(0.0, after)
        self.spread = max(0.0, spread)
        self._due: dict[str, float] = {}  # claim -> node time
        self._verified: dict[str, float] = {}  # claim -> wall time of its last verification
        self._lock = threading.Lock()

    def verified(self, key: str) -> None:
        """The claim was just compared with the live cluster (and settled): due again later."""
        with self._lock:
            self._due[key] = node_seconds() + self.after + random.uniform(0, self.spread)
            self._verified[key] = wall()

    def postpone(self, key: str) -> None:
        """Not verified now (the claim is being retried): due again a whole interval later."""
        with self._lock:
            if key in self._due:
                self._due[key] = node_seconds() + self.after + random.uniform(0, self.spread)

    def track(self, keys: Iterable[str]) -> None:
        """Give every claim not seen before its first due time; forget claims no longer tracked."""
        now = node_seconds()
        active = set(keys)
        with self._lock:
            for key in active - self._due.keys():
                self._due[key] = now + random.uniform(0, self.after + self.spread)
            for key in [k for k in self._due if k not in active]:
                del self._due[key]
                self._verified.pop(key, None)

    def due(self, now: float, limit: int = VERIFY_BATCH) -> list[str]:
        with self._lock:
            ready = sorted((t, k) for k, t in self._due.items() if t <= now)
        return [k for _, k in ready[:limit]]

    def next_due(self) -> float | None:
        with self._lock:
            return min(self._due.values()) if self._due else None

    def request_all(self) -> None:
        """`netclaim-publisher resync`: every tracked claim is due now."""
        with self._lock:
            for key in self._due:
                self._due[key] = 0.0

    def oldest_verified(self) -> float | None:
        """Wall time since which every tracked claim has been verified (None: one never was)."""
        with self._lock:
            if not self._due:
                return None
            return min(self._verified.get(k, 0.0) for k in self._due) or None
