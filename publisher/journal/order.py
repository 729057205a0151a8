"""The order of events across boots: which of two stamps happened first.

A stamp is [boot id, CLOCK_BOOTTIME ns, wall clock ns] (cni_plugin/wire/event.py
new_order). Within one boot CLOCK_BOOTTIME orders events. Across boots no clock
can be trusted: after a reboot the wall clock may be behind the previous boot's
(a bad RTC, a restored VM, NTP not stepped yet), and comparing by it would let a
sandbox of the previous boot outrank the new one, ignore the DEL that removes
it, or let an old GC fence hide every new ADD. So the publisher ranks boots
itself, in the journal's `boots` table:

- the current boot is newer than every other boot;
- other boots rank by the order in which the publisher first saw them (a boot
  first seen now that is not the current one gets the next sequence number but
  still ranks below the current boot);
- stamps written before stamps existed (["", 0, wall], wire.legacy_order) rank
  below every real boot and compare by wall clock among themselves.

The order key of a stamp is (is_current_boot, boot_seq, boottime_ns, wall_ns).
"""

from __future__ import annotations

from typing import Callable, Iterable, Protocol, TypeVar

from cni_plugin.wire.event import new_order
from publisher.clock import node_seconds


class BootTable(Protocol):
    """The journal's `boots` table as the order sees it; a protocol so order does not import the journal that
    uses it."""

    def boot_seq(self, boot_id: str) -> tuple[int, bool]: ...

OrderKey = tuple[int, int, int, int]
T = TypeVar("T")


def current_boot_id() -> str:
    """This boot's id as the plugin stamps it (wire's reader of the kernel's boot_id)."""
    return new_order()[0]


class BootOrder:
    """Ranks stamps by boot (as the journal first saw the boots), then by CLOCK_BOOTTIME."""

    def __init__(self, journal: BootTable, boot_id: str | None = None) -> None:
        self.journal = journal
        self.boot_id = current_boot_id() if boot_id is None else boot_id
        # boot id -> sequence, only for rows known to be committed (see _seq).
        self._seqs: dict[str, int] = {}
        if self.boot_id:
            self._seq(self.boot_id)  # registered at start: later boots get higher numbers

    def _seq(self, boot_id: str) -> int:
        cached = self._seqs.get(boot_id)
        if cached is not None:
            return cached
        seq, committed = self.journal.boot_seq(boot_id)
        if committed:  # a row inserted inside a transaction that may still roll back is not cached
            self._seqs[boot_id] = seq
        return seq

    def key(self, stamp: list) -> OrderKey:
        """The sort key of a stamp: later events have larger keys."""
        boot, boottime, wall_ns = stamp[0], int(stamp[1]), int(stamp[2])
        if not boot:
            return (0, 0, 0, wall_ns)  # legacy: below every real boot, by wall clock
        if boot == self.boot_id:
            return (1, self._seq(boot), boottime, wall_ns)
        return (0, self._seq(boot), boottime, wall_ns)

    def before(self, a: list, b: list) -> bool:
        """True when stamp `a` happened before stamp `b`."""
        return self.key(a) < self.key(b)

    def latest(self, items: Iterable[T], stamp_of: Callable[[T], list]) -> T:
        """The item whose stamp is the latest (the first one on a tie)."""
        best: T | None = None
        best_key: OrderKey | None = None
        for item in items:
            k = self.key(stamp_of(item))
            if best_key is None or best_key < k:
                best, best_key = item, k
        if best is None:
            raise ValueError("latest() of nothing")
        return best

    def seconds_since(self, stamp: list) -> float | None:
        """Time elapsed since a stamp of this boot (CLOCK_BOOTTIME), None for another boot."""
        if not stamp or stamp[0] != self.boot_id or not self.boot_id:
            return None
        return max(0.0, node_seconds() - int(stamp[1]) / 1e9)
