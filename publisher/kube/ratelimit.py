"""A token bucket in front of every API request a process makes (publisher/kube/calls.py Kube._request_once).

client-go limits each client to 5 requests/s with bursts of 10 by default; a
node agent that has none has nothing between a retry storm and 5,000 nodes'
worth of load on the API server. A request takes a token; without one it
waits until the bucket has refilled enough. The token is reserved under the
bucket's lock and the wait happens after the lock is released, so a waiting
request holds no lock and later requests reserve later slots (first come,
first served), exactly as golang.org/x/time/rate's reservations do.
"""

from __future__ import annotations

import threading
import time
from typing import Callable

from publisher.clock import node_seconds


class TokenBucket:
    """`qps` tokens per second, at most `burst` saved up; qps <= 0 means no limit."""

    def __init__(self, qps: float, burst: int, clock: Callable[[], float] = node_seconds,
                 sleep: Callable[[float], object] = time.sleep) -> None:
        self.qps = float(qps)
        self.burst = max(1, int(burst))
        self.clock = clock
        self.sleep = sleep
        self._tokens = float(self.burst)
        self._last = clock()
        self._lock = threading.Lock()
        self.waits = 0  # requests that had to wait for a token (for `status` or metrics)
        self.waited = 0.0  # seconds they waited in all

    def reserve(self) -> float:
        """Take a token now; the seconds to wait before using it (0.0: at once)."""
        if self.qps <= 0:
            return 0.0
        with self._lock:
            now = self.clock()
            self._tokens = min(float(self.burst), self._tokens + max(0.0, now - self._last) * self.qps)
            self._last = now
            self._tokens -= 1.0
            wait = 0.0 if self._tokens >= 0 else -self._tokens / self.qps
            if wait > 0:
                self.waits += 1
                self.waited += wait
            return wait

    def take(self) -> float:
        """Wait for a token (holding no lock while waiting); the seconds waited."""
        wait = self.reserve()
        if wait > 0:
            self.sleep(wait)
        return wait
