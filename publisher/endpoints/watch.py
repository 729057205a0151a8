"""A cache of one collection (Services, pods, claims or our slices), kept by list, then watch.

The controller reads the pods and claims it needs from these caches, never by a GET per pod: its
requests do not grow with the number of pods, only with the number of changes it writes. Each
cache follows publisher/kube/listwatch.py's rules (resourceVersion bookkeeping, an ERROR event
or 410 lists again, a failed watch backs off with jitter). A relist compares the new list with
the cache and reports every object that appeared, changed or vanished meanwhile, so nothing
missed while the watch was down stays missed.

Each cache says when it last made progress (an event, a bookmark or a completed list) and
whether its thread still runs: the controller's liveness (publisher/endpoints/probes.py) fails
on a watch that died or went quiet beyond limits.WATCH_STALLED, instead of leaving every slice
stale behind a pod that looks healthy.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable

from publisher import logs
from publisher.clock import node_seconds
from publisher.endpoints.api import EndpointsKube
from publisher.kube import listwatch

Key = tuple[str, str]  # (namespace, name)
# Told (old, new) of every change: old None for an object that appeared, new None for one that vanished.
OnChange = Callable[[dict[str, Any] | None, dict[str, Any] | None], None]


def key_of(obj: dict[str, Any]) -> Key:
    meta = obj.get("metadata") or {}
    return meta.get("namespace", ""), meta.get("name", "")


class StopEvent(threading.Event):
    """One cache's stop: set by Cache.stop(), or as soon as the controller's `outer` stop is."""

    def __init__(self, outer: threading.Event) -> None:
        super().__init__()
        self.outer = outer

    def is_set(self) -> bool:
        return super().is_set() or self.outer.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        """Wakes at once on Cache.stop(), within half a second of the controller's stop."""
        end = None if timeout is None else time.monotonic() + timeout
        while not self.is_set():
            left = 0.5 if end is None else min(0.5, end - time.monotonic())
            if left <= 0:
                return False
            super().wait(left)
        return True


class Cache:
    """The objects of one collection by (namespace, name), and a thread that keeps them current."""

    def __init__(self, kube: EndpointsKube, what: str, path: str, on_change: OnChange,
                 query: list[tuple[str, str]] | None = None) -> None:
        self.kube, self.what, self.path, self.query = kube, what, path, list(query or [])
        self.on_change = on_change
        self.lock = threading.Lock()
        self.objects: dict[Key, dict[str, Any]] = {}
        self.synced = threading.Event()
        self.lists = 0
        self.watches = 0
        self.progressed = 0.0  # node time of the last event, bookmark or completed list (or of the start)
        self._thread: threading.Thread | None = None
        self._stop: StopEvent | None = None
        self._resp: Any = None  # the watch in progress, ended at once by stop()

    def get(self, namespace: str, name: str) -> dict[str, Any] | None:
        with self.lock:
            return self.objects.get((namespace, name))

    def in_namespace(self, namespace: str) -> list[dict[str, Any]]:
        with self.lock:
            return [o for (ns, _), o in self.objects.items() if ns == namespace]

    def all(self) -> list[dict[str, Any]]:
        with self.lock:
            return list(self.objects.values())

    def start(self, stopping: threading.Event) -> None:
        self._stop = StopEvent(stopping)
        self.progressed = node_seconds()  # a first list that never completes counts from here
        self._thread = threading.Thread(target=self._run, args=(self._stop,), name=f"watch-{self.what}", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """End this cache's thread now, the watch in progress included (the controller's stop ends them all)."""
        if self._stop is not None:
            self._stop.set()
        resp = self._resp
        if resp is not None:
            resp.shutdown()  # wakes the read blocked on a quiet watch

    def stalled(self, bound: float) -> str:
        """Why this watch makes no progress ("" while it does): its thread ended, or nothing came for `bound` s."""
        if self._thread is None or (self._stop is not None and self._stop.outer.is_set()):
            return ""  # not started, or the whole controller stopping
        if not self._thread.is_alive():
            return f"watch {self.what}: its thread ended"
        idle = node_seconds() - self.progressed
        if idle > bound:
            return f"watch {self.what}: no event, bookmark or completed list for {idle:.0f}s"
        return ""

    def _run(self, stopping: threading.Event) -> None:
        def failed(exc: Exception) -> None:
            if stopping.is_set():
                return
            logs.get().warning("watch failed, listing again after a backoff",
                               extra={"resource": self.what, "error": str(exc)[:300]})

        listwatch.follow(stopping, self.relist, lambda rv: self.watch(rv, stopping), failed)

    def relist(self) -> str:
        """List every page; report what differs from the cache; the list's resourceVersion."""
        items: dict[Key, dict[str, Any]] = {}
        cont, rv = "", ""
        while True:
            page = self.kube.list_page(self.path, self.query, cont)
            self.lists += 1
            for obj in page.get("items") or []:
                items[key_of(obj)] = obj
            meta = page.get("metadata") or {}
            rv = meta.get("resourceVersion", rv)
            cont = meta.get("continue") or ""
            if not cont:
                break
        with self.lock:
            old, self.objects = self.objects, items
        for key in old.keys() - items.keys():
            self.on_change(old[key], None)
        for key, obj in items.items():
            before = old.get(key)
            if before is None or (before.get("metadata") or {}).get("resourceVersion") != \
                    (obj.get("metadata") or {}).get("resourceVersion"):
                self.on_change(before, obj)
        self.progressed = node_seconds()
        self.synced.set()
        return rv

    def watch(self, rv: str, stopping: threading.Event) -> str:
        """One watch from `rv`; the resourceVersion to go on from (Relist on an ERROR event)."""
        resp = self.kube.watch_collection(self.path, self.query, rv)
        self.watches += 1
        self._resp = resp
        try:
            if stopping.is_set():  # stop() came while the watch was being opened
                resp.release_conn()
                return rv
            return self._follow(resp, rv, stopping)
        finally:
            self._resp = None

    def _follow(self, resp: Any, rv: str, stopping: threading.Event) -> str:
        for kind, obj, new_rv in listwatch.events(resp, stopping):
            rv = new_rv or rv
            self.progressed = node_seconds()
            if kind == "BOOKMARK":
                continue
            key = key_of(obj)
            with self.lock:
                before = self.objects.get(key)
                if kind == "DELETED":
                    self.objects.pop(key, None)
                else:
                    self.objects[key] = obj
            self.on_change(before, None if kind == "DELETED" else obj)
        return rv
