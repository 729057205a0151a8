"""List, then watch from the list's resourceVersion: the one loop the publisher's watches share.

The pod cache (publisher/reconcile/podcache.py) and the keeper's watch of its own
DaemonSet (publisher/keeper/ownerwatch.py) differ only in what they list and what an
event changes. The rules they share live here, and they are client-go's
reflector's, because they decide what an API server restart costs at 5,000
nodes, each with one of each watch:

- A watch that ends normally having delivered something (its resourceVersion
  moved: an event or a bookmark) is reopened at once from where it got. An
  ERROR event (410 Gone: the version is too old) means list again at once.
- A failure (refused, unreachable, a broken stream, a 429) is reported and
  followed by a relist after a random wait in [0, window] (full jitter): the
  nodes whose watches broke at the same instant come back spread over the
  window instead of in lockstep. The window starts at
  limits.WATCH_BACKOFF_BASE and grows limits.WATCH_BACKOFF_FACTOR times
  after each failure up to limits.WATCH_BACKOFF_CAP (client-go doubles it;
  Backoff says why this loop grows it faster).
- A watch that ends (or answers "list again") within limits.WATCH_TOO_SHORT
  seconds without delivering anything is a failure too: a proxy or a
  stopping API server that ends streams cleanly at once must not become a
  tight loop of requests.
- The window goes back to the start only once a watch has lived
  limits.WATCH_BACKOFF_RESET seconds, never after a good LIST: a WATCH
  refused after every LIST (RBAC without `watch`, watches shed during
  overload) must cost one LIST per backoff, not one per second.
- A Retry-After the API server sent (kube.ApiError.retry_after) is a floor
  for the wait.
"""

from __future__ import annotations

import json
import random
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

from publisher import limits
from publisher.clock import node_seconds


class Relist(Exception):
    """Raised by an event handler: the watch's resourceVersion is no longer served, list again."""


class ShortWatch(Exception):
    """A watch that ended within limits.WATCH_TOO_SHORT seconds having delivered nothing: a failure."""


@dataclass
class Backoff:
    """Full-jitter exponential backoff: the n-th failure in a row waits uniform(0, base * factor**n), capped.

    Why the window grows 4-fold (limits.WATCH_BACKOFF_FACTOR) where client-go's doubles: when
    an API server comes back after an outage, the nodes whose next relist falls in the first
    second are those whose wait in progress ends then; with each node's wait uniform in its
    window, that is about 2/window of the nodes per second, whatever jitter they drew before.
    Nothing re-synchronises them at the server's return; what bunches them is that their
    windows are still narrow. A node enters window W after its earlier waits, about W/(2(f-1))
    seconds on average, so t seconds into an outage the window in progress is only t to 2t wide
    when it doubles (f = 2): 5 s into one, 20-40 % of the waiting nodes are due in each second. Grown
    4-fold it is 1.5t to 6t wide (12.8 s from the third failure on, reached about 2 s into an
    outage), so most nodes come back spread over the next 10 s or so. Decorrelated jitter (each
    wait drawn up to 3 times the last one) does not help: its waits grow more slowly than these
    windows. A wider first window would, but it would also slow the recovery from every brief
    blip, which the first window of 0.8 s keeps quick. The price is the tail after an outage of
    a few seconds (the last nodes watch again up to 30 s after the API is back, as after a long
    one); a node sends fewer requests through an outage, not more.
    """

    base: float = limits.WATCH_BACKOFF_BASE
    factor: float = limits.WATCH_BACKOFF_FACTOR
    cap: float = limits.WATCH_BACKOFF_CAP
    rng: random.Random = field(default_factory=random.Random)
    failures: int = 0

    def next(self, floor: float = 0.0) -> float:
        """The wait after one more failure; never below `floor` (a Retry-After)."""
        window = min(self.cap, self.base * self.factor ** min(self.failures, 30))
        self.failures += 1
        return max(floor, self.rng.uniform(0.0, window))

    def reset(self) -> None:
        self.failures = 0


def retry_after(exc: BaseException) -> float:
    """The Retry-After seconds an API error carries (0.0 for anything else)."""
    return float(getattr(exc, "retry_after", 0.0) or 0.0)


def follow(stopping: threading.Event, relist: Callable[[], str], watch: Callable[[str], str],
           failed: Callable[[Exception], None], clock: Callable[[], float] = node_seconds,
           rng: random.Random | None = None) -> None:
    """Run until `stopping`: relist() gives a resourceVersion, watch(rv) the one to go on from
    ('' or Relist: list again); failures wait a jittered backoff (module docstring).

    `clock` times the watches and `rng` draws the jitter; waits go through `stopping.wait`.
    Tests pass a simulated clock and a seeded rng; each follower's own default rng keeps
    nodes independent of each other."""
    backoff = Backoff(rng=rng or random.Random())
    while not stopping.is_set():
        try:
            rv = relist()
            while rv and not stopping.is_set():
                rv = _watch_once(watch, rv, clock, backoff)
            continue
        except Relist:
            continue
        except Exception as exc:  # noqa: BLE001 - refused, unreachable, a broken or short stream: back off, list again
            failed(exc)
            wait = backoff.next(retry_after(exc))
        stopping.wait(wait)


def _watch_once(watch: Callable[[str], str], rv: str, clock: Callable[[], float], backoff: Backoff) -> str:
    """One watch from `rv`; the resourceVersion to go on from. A watch that lived long enough
    resets the backoff however it ended; one that ended at once with nothing raises ShortWatch."""
    opened = clock()
    try:
        after = watch(rv)
    except Relist as exc:
        if clock() - opened < limits.WATCH_TOO_SHORT:
            raise ShortWatch(f"the watch answered 'list again' at once: {exc}") from exc
        raise
    finally:
        if clock() - opened >= limits.WATCH_BACKOFF_RESET:
            backoff.reset()
    lived = clock() - opened
    if after in (rv, "") and lived < limits.WATCH_TOO_SHORT:
        raise ShortWatch(f"the watch ended after {lived:.3f} s without any event")
    return after


def events(resp: Any, stopping: threading.Event) -> Iterator[tuple[str, dict[str, Any], str]]:
    """(type, object, resourceVersion) of each event of a watch response, until it ends or `stopping`.

    An ERROR event raises Relist; the connection is released however the caller stops.
    """
    buf = b""
    try:
        for chunk in resp.stream(65536):
            buf += chunk
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                if not line.strip():
                    continue
                ev = json.loads(line)
                kind, obj = ev.get("type", ""), ev.get("object") or {}
                if kind == "ERROR":
                    raise Relist(str(obj.get("message", ""))[:300])
                yield kind, obj, (obj.get("metadata") or {}).get("resourceVersion", "")
            if stopping.is_set():
                return
    finally:
        resp.release_conn()
