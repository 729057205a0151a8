"""Figures shared by the benchmark suites."""

from __future__ import annotations


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..1): a value that was really measured."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]
