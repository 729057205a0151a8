"""Read a claim to resolve an ADD with a short watch instead of a GET, and keep following it for
a window after netclaim's apply, so drift is repaired when it happens rather than by polling.

Why: a periodic re-read of every tracked claim costs one GET per claim per interval on every
node (5,000 nodes x 30 claims every 300 s is 500 GETs/s at rest). The changes that undo
netclaim's entry cluster right after it is written: a driver that does a read-modify-write
UpdateStatus at pod start with a copy read before our apply, or an apply of ours whose answer
was lost and that lands late. So the one request that reads the claim for an ADD is a watch of
that claim by name with `sendInitialEvents`: the server sends the claim as it is (ADDED), then a
BOOKMARK annotated `k8s.io/initial-events-end` (only the bookmark: no such claim). Then the
stream stays open for `window` seconds after the reconcile that follows (ClaimWindows.settled):
a change that leaves netclaim's entries other than the ones it just wrote, a change of the
allocation or reservations, or the claim's deletion marks the claim dirty (`on_drift`), and
housekeeping reconciles it at once. The ADD still costs 2 requests (watch + apply).

Bounds: at most `max_open` windows at a time (one thread and one connection each); beyond
that, and for a claim that already has a window, the claim is read with a plain GET and no
window. A server that refuses `sendInitialEvents` (400/422: the WatchList feature off) is
remembered and every read becomes a GET. A stream nobody settles (the claim was not ours, or
not allocated yet) is closed after a short grace.

Ordering: events of one watch arrive in resourceVersion order. The window knows the
resourceVersion of the claim as netclaim last left it (the answer to its apply, or the copy
it reconciled with when the apply was skipped); events up to and including that one are
history, only later ones can be drift. A window that never sees that version (it was
written before the stream started) checks from the start.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

from publisher import logs
from publisher.clock import node_seconds
from publisher.kube.calls import Forbidden, Kube, NotFound, PermanentError, TransientError
from publisher.kube.listwatch import Relist, events
from publisher.reconcile.reconciler import allocation_fingerprint
from publisher.reconcile.writer import holds, owned_keys

INITIAL_EVENTS_END = "k8s.io/initial-events-end"
SEEN_KEPT = 64  # resourceVersions of a window's recent events, to place its settle point
FORBIDDEN_PAUSE = 300.0  # after a watch got 403 but the GET did not: GETs only for this long


def _rv(obj: dict[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("resourceVersion", ""))


@dataclass
class Window:
    """One open watch of one claim."""

    namespace: str
    name: str
    resp: Any
    stream: Iterator[tuple[str, dict[str, Any], str]]
    deadline: float  # node time: closed at the first sweep after it
    hard_deadline: float  # the server ends the stream by then (timeoutSeconds)
    entries: list[dict[str, Any]] | None = None  # netclaim's entries as last settled
    fingerprint: str = ""  # allocation + reservations as last settled
    settled_rv: str = ""  # the claim's version as netclaim last left it
    past_settle: bool = False  # an event at or after settled_rv was seen
    seen: list[tuple[str, dict[str, Any]]] = field(default_factory=list)  # (rv, claim), newest last
    closing: bool = False  # swept: its stream was shut down, its thread is ending

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


class ClaimWindows:
    def __init__(self, *, kube: Kube, field_manager: str, on_drift: Callable[[str, str, str], None],
                 stopping: threading.Event, window: float = 90.0, max_open: int = 32,
                 grace: float = 20.0, on_gauge: Callable[[int], None] = lambda n: None) -> None:
        self.kube = kube
        self.field_manager = field_manager
        self.on_drift = on_drift
        self.stopping = stopping
        self.window = window
        self.max_open = max_open
        self.grace = min(grace, window) if window > 0 else 0.0
        self.on_gauge = on_gauge
        self.log = logs.get()
        self.refused = False  # the server refuses sendInitialEvents: plain GETs from now on
        self.forbidden_until = 0.0  # node time: RBAC without `watch` (an old ClusterRole), GETs until then
        self._open: dict[str, Window] = {}
        self._lock = threading.Lock()

    # ------------------------------------------------------------ resolving

    def read(self, namespace: str, name: str) -> dict[str, Any]:
        """The live claim (raises NotFound): by a windowed watch when a slot is free, else a GET."""
        key = f"{namespace}/{name}"
        if not self._reserve(key):
            with self.kube.purpose("resolve-get"):
                return self.kube.get_claim(namespace, name)
        try:
            claim = self._open_watch(namespace, name)
        except _Refused:
            with self.kube.purpose("resolve-get"):
                return self.kube.get_claim(namespace, name)
        except Forbidden as exc:
            # An install whose ClusterRole predates the window grants `get` only: keep
            # publishing with GETs, and say so. A 403 that the GET gets too is the API's
            # own (an authorizer not synced yet): raised as before, retried with backoff.
            with self.kube.purpose("resolve-get"):
                claim = self.kube.get_claim(namespace, name)
            self.forbidden_until = node_seconds() + FORBIDDEN_PAUSE
            self.log.warning("watching a claim is forbidden (RBAC without `watch` on resourceclaims?): claims "
                             "are read with GET and not followed", extra={"claim": key, "error": exc.message})
        return claim

    def unused(self, namespace: str, name: str) -> None:
        """The claim read to resolve is not the ADD's (another driver's, not allocated or reserved
        yet): close its stream now rather than after the grace, so it holds no slot."""
        with self._lock:
            win = self._open.get(f"{namespace}/{name}")
            stale = win if win is not None and win.entries is None and not win.settled_rv else None
        if stale is not None:
            _close(stale.resp)

    def _reserve(self, key: str) -> bool:
        if self.window <= 0 or self.refused or self.stopping.is_set() or node_seconds() < self.forbidden_until:
            return False
        self.sweep()
        with self._lock:
            if key in self._open or len(self._open) >= self.max_open:
                return False
            self._open[key] = None  # type: ignore[assignment]  # the slot, until the stream is open
        return True

    def _release(self, key: str) -> None:
        with self._lock:
            self._open.pop(key, None)
            n = len(self._open)
        self.on_gauge(n)

    def _open_watch(self, namespace: str, name: str) -> dict[str, Any]:
        key = f"{namespace}/{name}"
        life = self.grace + self.window
        timeout = int(life) + 1
        try:
            with self.kube.purpose("resolve-watch"):
                resp = self.kube.watch_claim(namespace, name, timeout)
        except PermanentError as exc:
            self._release(key)
            if exc.code in (400, 422) and not isinstance(exc, NotFound):
                self.refused = True
                self.log.warning("the API server refuses watches with sendInitialEvents; claims are read "
                                 "with GET and followed by no window", extra={"code": exc.code, "error": exc.message})
                raise _Refused() from None
            raise
        except BaseException:
            self._release(key)
            raise
        stream = events(resp, self.stopping)
        claim: dict[str, Any] | None = None
        seen: list[tuple[str, dict[str, Any]]] = []
        try:
            for kind, obj, rv in stream:
                if kind == "BOOKMARK":
                    if ((obj.get("metadata") or {}).get("annotations") or {}).get(INITIAL_EVENTS_END) == "true":
                        break
                    continue
                claim = None if kind == "DELETED" else obj
                seen.append((rv, obj))
            else:
                raise TransientError(0, f"the watch of claim {key} ended before its initial events")
        except Relist as exc:
            _close(resp)
            self._release(key)
            raise TransientError(0, f"the watch of claim {key} failed: {exc}") from None
        except BaseException:
            _close(resp)
            self._release(key)
            raise
        if claim is None:
            _close(resp)
            self._release(key)
            raise NotFound(404, f"resourceclaims {name!r} not found")
        now = node_seconds()
        win = Window(namespace, name, resp, stream, deadline=now + self.grace, hard_deadline=now + life,
                     seen=seen[-SEEN_KEPT:])
        with self._lock:
            self._open[key] = win
            n = len(self._open)
        self.on_gauge(n)
        threading.Thread(target=self._follow, args=(win,), name=f"claim-window-{name}"[:60], daemon=True).start()
        return claim

    # ------------------------------------------------------------ the window

    def writing(self, key: str) -> None:
        """A reconcile of `key` is about to apply: its own write is not drift. Checks pause until
        settled() says which version that write made (events after it are checked then)."""
        with self._lock:
            win = self._open.get(key)
            if win is not None:
                win.entries = None
                win.past_settle = False
                win.settled_rv = ""

    def settled(self, key: str, entries: list[dict[str, Any]], claim: dict[str, Any], rv: str) -> None:
        """A reconcile of `key` succeeded: netclaim's entries are `entries`, the claim is at version
        `rv` (the apply's answer, or the copy used when the apply was skipped). Opens the window."""
        with self._lock:
            win = self._open.get(key)
            if win is None:
                return
            win.entries = list(entries)
            win.fingerprint = allocation_fingerprint(claim)
            win.settled_rv = rv
            win.deadline = min(win.hard_deadline, node_seconds() + self.window)
            at = next((i for i, (seen_rv, _) in enumerate(win.seen) if seen_rv == rv), None)
            win.past_settle = at is not None or not rv
            later = win.seen[at + 1:] if at is not None else []
        if later:  # changes that came after our write but before this call
            self._check(win, later[-1][1])

    def _follow(self, win: Window) -> None:
        """Runs on the window's own thread until the stream ends (deadline, server timeout, stop)."""
        try:
            for kind, obj, rv in win.stream:
                if kind == "BOOKMARK":
                    continue
                if kind == "DELETED":
                    self._drift(win, "deleted")
                    return
                with self._lock:
                    win.seen = (win.seen + [(rv, obj)])[-SEEN_KEPT:]
                    if rv and rv == win.settled_rv:
                        win.past_settle = True
                        continue
                    check = win.past_settle and win.entries is not None
                if check:
                    self._check(win, obj)
        except Exception as exc:  # noqa: BLE001 - a broken stream only ends the window early
            if not self.stopping.is_set() and node_seconds() < win.deadline:
                self.log.debug("claim window ended early", extra={"claim": win.key, "error": str(exc)})
        finally:
            _close(win.resp)
            with self._lock:
                if self._open.get(win.key) is win:
                    del self._open[win.key]
                n = len(self._open)
            self.on_gauge(n)

    def _check(self, win: Window, claim: dict[str, Any]) -> None:
        """Drift: netclaim's entries differ from the settled ones, or the allocation moved."""
        entries = win.entries
        if entries is None:
            return
        devices = (claim.get("status") or {}).get("devices") or []
        if not holds(devices, entries, owned_keys(claim, self.field_manager)):
            self._drift(win, "entries")
        elif allocation_fingerprint(claim) != win.fingerprint:
            self._drift(win, "allocation")

    def _drift(self, win: Window, why: str) -> None:
        with self._lock:
            win.entries = None  # told once; the reconcile that follows settles the window again
        self.log.info("claim changed under netclaim's entries, reconciling", extra={"claim": win.key, "why": why})
        self.on_drift(win.namespace, win.name, why)

    def sweep(self) -> None:
        """Close the windows past their deadline (their thread then ends and frees the slot)."""
        now = node_seconds()
        with self._lock:
            expired = [w for w in self._open.values() if w is not None and not w.closing and now >= w.deadline]
            for win in expired:
                win.closing = True
        for win in expired:
            _close(win.resp)

    def open_count(self) -> int:
        with self._lock:
            return len(self._open)

    def next_deadline(self) -> float | None:
        with self._lock:
            deadlines = [w.deadline for w in self._open.values() if w is not None and not w.closing]
        return min(deadlines) if deadlines else None

    def close_all(self) -> None:
        with self._lock:
            wins = [w for w in self._open.values() if w is not None]
        for win in wins:
            _close(win.resp)


class _Refused(Exception):
    """The server refused the watch form: read with GET instead."""


def _close(resp: Any) -> None:
    """Unblock a reader of this stream and drop its connection."""
    for method in ("shutdown", "close"):
        try:
            getattr(resp, method)()
        except Exception:  # noqa: BLE001 - already closed
            pass
