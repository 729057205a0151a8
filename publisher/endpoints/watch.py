"""A cache of one collection (Services, pods, claims or our slices), kept by list, then watch.

The controller reads the pods and claims it needs from these caches, never by a GET per pod: its
requests do not grow with the number of pods, only with the number of changes it writes. Each
cache follows publisher/kube/listwatch.py's rules (resourceVersion bookkeeping, an ERROR event
or 410 lists again, a failed watch backs off with jitter). A relist compares the new list with
the cache and reports every object that appeared, changed or vanished meanwhile, so nothing
missed while the watch was down stays missed.
"""

from __future__ import annotations

import threading
from typing import Any, Callable

from publisher import logs
from publisher.endpoints.api import EndpointsKube
from publisher.kube import listwatch

Key = tuple[str, str]  # (namespace, name)
# Told (old, new) of every change: old None for an object that appeared, new None for one that vanished.
OnChange = Callable[[dict[str, Any] | None, dict[str, Any] | None], None]


def key_of(obj: dict[str, Any]) -> Key:
    meta = obj.get("metadata") or {}
    return meta.get("namespace", ""), meta.get("name", "")


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
        self._thread: threading.Thread | None = None

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
        self._thread = threading.Thread(target=self._run, args=(stopping,), name=f"watch-{self.what}", daemon=True)
        self._thread.start()

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
        self.synced.set()
        return rv

    def watch(self, rv: str, stopping: threading.Event) -> str:
        """One watch from `rv`; the resourceVersion to go on from (Relist on an ERROR event)."""
        resp = self.kube.watch_collection(self.path, self.query, rv)
        self.watches += 1
        for kind, obj, new_rv in listwatch.events(resp, stopping):
            rv = new_rv or rv
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
