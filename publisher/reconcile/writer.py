"""Apply: server-side apply of one claim's status.devices, all of this node's entries at once.

Why one apply per claim with every entry: with server-side apply, the set of
entries in an apply IS what this field manager owns afterwards, so an apply
that carries one device drops the manager's other devices (docs/design.md "Never clobber").
Entries of other managers (other nodes, other drivers) are never in our
applies and are therefore never touched. `force` is off: if another manager
owns a field of one of our entries, the API answers 409 and we report it
instead of taking the field away from them.
"""

from __future__ import annotations

import hashlib
import json
import threading
from contextlib import contextmanager
from typing import Any, Callable, Iterator

from publisher.kube.calls import Kube


def body_hash(entries: list[Any]) -> str:
    """A stable digest of JSON-shaped data (an apply body's entries): equal data, equal hash."""
    return hashlib.sha256(json.dumps(entries, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def sort_entries(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted(entries, key=lambda e: (e["driver"], e["pool"], e["device"], e.get("shareID", "")))


class Writer:
    """Applies claim status, skips identical re-applies, retries what can succeed later."""

    def __init__(
        self,
        *,
        kube: Kube,
        node_name: str,
        stopping: threading.Event,
        on_skip: Callable[[], None] = lambda: None,
        backoff_base: float = 0.2,
        backoff_cap: float = 5.0,
        applied: dict[str, str] | None = None,
        remember: Callable[[str, str | None], None] = lambda key, digest: None,
    ) -> None:
        self.kube = kube
        self.field_manager = f"netclaim/{node_name}"
        self.stopping = stopping
        self.on_skip = on_skip
        self.backoff_base = backoff_base
        self.backoff_cap = backoff_cap
        self._last: dict[str, str] = dict(applied or {})
        self.remember = remember
        # claim -> [lock, users]; `users` counts holders and waiters so that a
        # lock is only forgotten when nobody can still be using it.
        self._locks: dict[str, list[Any]] = {}
        self._guard = threading.Lock()
        self._answered: dict[str, str] = {}  # claim -> resourceVersion of its last apply's answer

    @contextmanager
    def claim_lock(self, claim_key: str) -> Iterator[None]:
        """Held from reading a claim's desired state to committing it: no lost sibling entries."""
        with self._guard:
            entry = self._locks.setdefault(claim_key, [threading.Lock(), 0])
            entry[1] += 1
        try:
            with entry[0]:
                yield
        finally:
            with self._guard:
                entry[1] -= 1

    def forget_inactive(self, active: set[str]) -> int:
        """Drop the per-claim lock and last-applied hash of claims we no longer track.

        Without this both maps grow with every claim the node has ever seen
        (pod churn over weeks). A lock someone holds or waits for is kept; a later
        event for a forgotten claim simply applies again.
        """
        dropped = []
        with self._guard:
            for key in [k for k, (_, users) in self._locks.items() if k not in active and users == 0]:
                del self._locks[key]
            for key in [k for k in self._answered if k not in active]:
                del self._answered[key]
            for key in [k for k in self._last if k not in active]:
                del self._last[key]
                dropped.append(key)
        for key in dropped:
            self.remember(key, None)
        return len(dropped)

    def invalidate(self, claim_key: str) -> None:
        with self._guard:
            known = self._last.pop(claim_key, None)
        if known is not None:
            self.remember(claim_key, None)

    def apply(self, namespace: str, name: str, entries: list[dict[str, Any]],
              on_server: list[dict[str, Any]] | None = None, record: bool = True,
              owned: set[tuple[str, str, str, str]] | None = None) -> bool:
        """One apply attempt; True when a request was made, False when skipped.

        Skipped when the body equals the last one applied for the claim and,
        if the caller read the live claim (`on_server`, and `owned`: the entries
        this manager owns there, from owned_keys), the server holds exactly our
        entries as applied (someone may have wiped one; an apply whose answer
        was lost may have left one more). Errors are raised as classified by
        publisher/kube/calls.py; retrying is the caller's job (publisher/reconcile/reconciler.py),
        so a failing claim never holds a worker. Any failed apply forgets the
        remembered body first: a request lost in flight (timeout, reset) may
        have been applied, so the server's state is unknown and the next
        reconcile must apply again even when its body went back to the old one.
        With `record` off the caller stores the applied body's hash itself
        (last_digest), in a transaction it makes anyway.
        """
        key = f"{namespace}/{name}"
        entries = sort_entries(entries)
        digest = body_hash(entries)
        with self._guard:
            same = self._last.get(key) == digest
        if same and (on_server is None or holds(on_server, entries, owned)):
            self.on_skip()
            return False
        try:
            with self.kube.purpose("apply"):
                answered = self.kube.apply_claim_status(namespace, name, entries, self.field_manager)
        except Exception:
            self.invalidate(key)
            raise
        with self._guard:
            self._last[key] = digest
            self._answered[key] = answered or ""
        if record:
            self.remember(key, digest)
        return True

    def answered(self, claim_key: str) -> str:
        """The resourceVersion the API server gave the claim in its answer to our last apply."""
        with self._guard:
            return self._answered.get(claim_key, "")

    def last_digest(self, claim_key: str) -> str | None:
        with self._guard:
            return self._last.get(claim_key)


def entry_key(entry: dict[str, Any]) -> tuple[str, str, str, str]:
    """An entry's identity in status.devices (its list-map keys)."""
    return (entry.get("driver", ""), entry.get("pool", ""), entry.get("device", ""), entry.get("shareID", "") or "")


def owned_keys(claim: dict[str, Any], manager: str) -> set[tuple[str, str, str, str]] | None:
    """The status.devices entries `manager` owns on a live claim, from its managedFields
    (None when the copy carries no managedFields: then nothing can be said)."""
    managed = (claim.get("metadata") or {}).get("managedFields")
    if managed is None:
        return None
    out: set[tuple[str, str, str, str]] = set()
    for m in managed:
        if m.get("manager") != manager:
            continue
        devices = ((m.get("fieldsV1") or {}).get("f:status") or {}).get("f:devices") or {}
        for field_key in devices:
            if not field_key.startswith("k:"):
                continue
            try:
                out.add(entry_key(json.loads(field_key[2:])))
            except (ValueError, AttributeError):
                continue
    return out


def holds(on_server: list[dict[str, Any]], entries: list[dict[str, Any]],
          owned: set[tuple[str, str, str, str]] | None = None) -> bool:
    """True when every desired entry is on the server with each field we apply unchanged and,
    given what we own there (`owned`), when we own no entry beyond the desired ones."""
    by_key = {entry_key(e): e for e in on_server}
    for entry in entries:
        server = by_key.get(entry_key(entry))
        if server is None or any(server.get(k) != v for k, v in entry.items()):
            return False
    return owned is None or owned == {entry_key(e) for e in entries}
