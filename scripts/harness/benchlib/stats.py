"""Figures shared by the benchmark suites."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Iterable


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..1): a value that was really measured."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def paced(items: Iterable[Any], rate: float, fn: Callable[[Any], None], workers: int = 8) -> None:
    """Call fn(item) for each item, the i-th started at i / rate seconds (open loop: a slow call
    does not delay the next start), and wait for all; an exception in any call is raised."""
    with ThreadPoolExecutor(workers) as pool:
        start = time.time()
        futures = []
        for i, item in enumerate(items):
            delay = start + i / rate - time.time()
            if delay > 0:
                time.sleep(delay)
            futures.append(pool.submit(fn, item))
        for f in futures:
            f.result()
