"""List, then watch from the list's resourceVersion: the one loop the publisher's watches share.

The pod cache (publisher/podcache.py) and the keeper's watch of its own
DaemonSet (publisher/ownerwatch.py) differ only in what they list and what an
event changes. The rules they share live here: a watch that ends normally
goes on from the last resourceVersion seen; an ERROR event (410 Gone: the
version is too old) means list again; a failure (refused, unreachable, a
broken stream) is reported and retried after a backoff that doubles to 30 s,
so an API server outage costs one request per backoff, not a tight loop.
"""

from __future__ import annotations

import json
import threading
from typing import Any, Callable, Iterator

MAX_BACKOFF = 30.0


class Relist(Exception):
    """Raised by an event handler: the watch's resourceVersion is no longer served, list again."""


def follow(stopping: threading.Event, relist: Callable[[], str], watch: Callable[[str], str],
           failed: Callable[[Exception], None]) -> None:
    """Run until `stopping`: relist() gives a resourceVersion, watch(rv) the one to go on from
    ('' or Relist: list again without waiting); failures wait a doubling backoff."""
    delay = 1.0
    while not stopping.is_set():
        try:
            rv = relist()
            delay = 1.0
            while rv and not stopping.is_set():
                rv = watch(rv)
            continue
        except Relist:
            continue
        except Exception as exc:  # noqa: BLE001 - refused, unreachable or a broken stream: back off, list again
            failed(exc)
        stopping.wait(delay)
        delay = min(delay * 2, MAX_BACKOFF)


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
