"""The EndpointSlice controller: watched Services, pods and claims in; our slices written out.

Every change a watch reports marks the Services it may touch (those of the object's namespace
that ask for endpoints); one worker thread then brings each marked Service's slices to what
publisher/endpoints/slices.py says they should be. Marks coalesce: a burst of pod starts costs one
pass per Service, not one per pod. A slice is written only when its content changed (the digest
of what was last applied, or what the watched slice already holds after a restart), and slices
no longer wanted are deleted. Reads are the caches' (publisher/endpoints/watch.py): no request
per pod, ever.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Callable

from publisher import logs
from publisher.endpoints import select, slices
from publisher.endpoints.api import EndpointsKube
from publisher.endpoints.watch import Cache, Key, key_of
from publisher.kube.calls import ApiError, NotFound


class NotLeading(Exception):
    """A write refused here: this replica's Lease renewal is overdue, another may lead (election.holds)."""


RETRY_AFTER_FAILURE = 1.0  # seconds before a Service whose write failed is tried again (doubling up to 30)
RETRY_CAP = 30.0


def _strip(obj: dict[str, Any] | None) -> dict[str, Any] | None:
    """Drop managedFields: the largest part of most objects, and never read here."""
    if obj is not None:
        (obj.get("metadata") or {}).pop("managedFields", None)
    return obj


def _same_content(existing: dict[str, Any], body: dict[str, Any]) -> bool:
    """Whether a watched slice already says what `body` would apply (after a restart: nothing to write)."""
    meta, want = existing.get("metadata") or {}, body["metadata"]
    owners = [(o.get("uid"), o.get("controller")) for o in meta.get("ownerReferences") or []]
    return (existing.get("addressType") == body["addressType"]
            and (existing.get("endpoints") or []) == body["endpoints"]
            and (existing.get("ports") or []) == body["ports"]
            and all((meta.get("labels") or {}).get(k) == v for k, v in want["labels"].items())
            and owners == [(o["uid"], True) for o in want["ownerReferences"]])


@dataclass
class Stats:
    """What the controller did: for logs, tests and the benchmark."""

    syncs: int = 0
    applies: int = 0
    deletes: int = 0
    failures: int = 0


class Controller:
    """Keeps the slices of every annotated Service (in `namespace`, or all namespaces when empty)."""

    def __init__(self, kube: EndpointsKube, namespace: str = "",
                 beat: Callable[[str], None] = lambda _loop: None,
                 may_write: Callable[[], bool] = lambda: True) -> None:
        self.kube = kube
        self.namespace = namespace
        self.beat = beat  # told `worker` after each pass of the worker's loop (publisher/endpoints/probes.py)
        self.may_write = may_write  # asked before every write: the Lease still ours (election.holds)
        scope = f"/namespaces/{namespace}" if namespace else ""
        self.services = Cache(kube, "services", f"/api/v1{scope}/services", self._service_changed)
        self.pods = Cache(kube, "pods", f"/api/v1{scope}/pods", self._namespace_changed)
        self.claims = Cache(kube, "resourceclaims", f"/apis/resource.k8s.io/v1{scope}/resourceclaims",
                            self._namespace_changed)
        self.slices = Cache(kube, "endpointslices", f"/apis/discovery.k8s.io/v1{scope}/endpointslices",
                            self._slice_changed,
                            query=[("labelSelector", f"{slices.MANAGED_BY}={slices.MANAGER}")])
        self.caches = [self.services, self.pods, self.claims, self.slices]
        self.stats = Stats()
        self._applied: dict[Key, str] = {}  # slice -> digest of the body last applied (or found) there
        self._dirty: set[Key] = set()
        self._cond = threading.Condition()
        self._retry: dict[Key, float] = {}
        self._deleting: set[Key] = set()  # slices deleted whose DELETED event has not come yet
        self._refused: dict[Key, str] = {}  # Service -> the last NotSelectable message logged
        self._ready = threading.Event()

    # ------------------------------------------------------------------ marking

    def mark(self, key: Key) -> None:
        with self._cond:
            self._dirty.add(key)
            self._cond.notify()

    def _mark_namespace(self, namespace: str) -> None:
        for svc in self.services.in_namespace(namespace):
            if select.wants_endpoints(svc):
                self.mark(key_of(svc))

    def _service_changed(self, old: dict[str, Any] | None, new: dict[str, Any] | None) -> None:
        _strip(new)
        self.mark(key_of(new or old or {}))

    def _namespace_changed(self, old: dict[str, Any] | None, new: dict[str, Any] | None) -> None:
        _strip(new)
        if self._ready.is_set():
            self._mark_namespace(key_of(new or old or {})[0])

    def _slice_changed(self, old: dict[str, Any] | None, new: dict[str, Any] | None) -> None:
        _strip(new)
        obj = new or old or {}
        key = key_of(obj)
        if new is None or old is None:  # deleted, or made (again): no deletion of ours is pending for it
            with self._cond:
                if new is None:
                    self._applied.pop(key, None)  # deleted by someone: write it again if still wanted
                self._deleting.discard(key)
        service = ((obj.get("metadata") or {}).get("labels") or {}).get(slices.SERVICE_NAME)
        if service and self._ready.is_set():
            self.mark((key[0], service))

    # ------------------------------------------------------------------ running

    def start(self, stopping: threading.Event) -> threading.Thread:
        for cache in self.caches:
            cache.start(stopping)
        worker = threading.Thread(target=self._work, args=(stopping,), name="endpoints-worker", daemon=True)
        worker.start()
        return worker

    def _work(self, stopping: threading.Event) -> None:
        for cache in self.caches:
            while not cache.synced.wait(0.5):
                self.beat("worker")  # waiting for a list is the watch's to report (probes), not a stall here
                if stopping.is_set():
                    return
        self._ready.set()
        logs.get().info("caches synced", extra={"services": len(self.services.all()), "pods": len(self.pods.all()),
                                                "claims": len(self.claims.all())})
        for svc in self.services.all():
            self.mark(key_of(svc))
        for sl in self.slices.all():  # slices of Services deleted while no controller ran
            service = ((sl.get("metadata") or {}).get("labels") or {}).get(slices.SERVICE_NAME)
            if service:
                self.mark((key_of(sl)[0], service))
        while not stopping.is_set():
            self.beat("worker")
            with self._cond:
                while not self._dirty and not stopping.is_set():
                    self._cond.wait(0.5)
                    self.beat("worker")
                batch, self._dirty = self._dirty, set()
            for key in sorted(batch):
                if stopping.is_set():
                    return
                self._sync_logged(key, stopping)
                self.beat("worker")  # a long batch (the first pass over many Services) is progress too

    def _sync_logged(self, key: Key, stopping: threading.Event) -> None:
        try:
            self.sync(key)
            self._retry.pop(key, None)
        except Exception as exc:  # noqa: BLE001 - an API error, or a bug on one odd object: the worker goes on
            self.stats.failures += 1
            wait = min(RETRY_CAP, self._retry.get(key, RETRY_AFTER_FAILURE / 2) * 2)
            self._retry[key] = wait
            logs.get().warning("slices not written, trying again", extra={
                "service": f"{key[0]}/{key[1]}", "error": str(exc)[:300], "retry_in": wait},
                exc_info=not isinstance(exc, (ApiError, NotLeading)))
            timer = threading.Timer(wait, lambda: None if stopping.is_set() else self.mark(key))
            timer.daemon = True
            timer.start()

    # ------------------------------------------------------------------ one Service

    def _fence(self) -> None:
        if not self.may_write():
            raise NotLeading("the Lease was not renewed in time: another replica may lead; not writing")

    def desired(self, key: Key) -> list[dict[str, Any]]:
        """The slice bodies the Service `key` should have now ([] when it asks for none)."""
        namespace, name = key
        svc = self.services.get(namespace, name)
        if svc is None or not select.wants_endpoints(svc):
            self._refused.pop(key, None)
            return []
        try:
            sel = select.selection_of(svc)
        except select.NotSelectable as exc:
            if self._refused.get(key) != str(exc):
                self._refused[key] = str(exc)
                logs.get().warning("Service not served", extra={"service": f"{namespace}/{name}", "reason": str(exc)})
            return []
        self._refused.pop(key, None)
        claims = {key_of(c)[1]: c for c in self.claims.in_namespace(namespace)}
        pods = self.pods.in_namespace(namespace)
        shared = select.shared_claims(pods, claims)
        members = []
        for pod in pods:
            if not sel.selects(pod) or not select.running(pod):
                continue
            members.append(slices.PodAddresses(pod, tuple(select.addresses(pod, claims, sel, shared))))
        return slices.desired(svc, sel.families, members)

    def sync(self, key: Key) -> None:
        """Apply the Service's changed slices and delete those no longer wanted."""
        self.stats.syncs += 1
        namespace, name = key
        wanted = self.desired(key)
        names = set()
        for body in wanted:
            skey = (namespace, body["metadata"]["name"])
            names.add(skey)
            digest = slices.fingerprint(body)
            with self._cond:
                known = self._applied.get(skey)
            if known == digest:
                continue
            existing = self.slices.get(*skey)
            if known is None and existing is not None and _same_content(existing, body):
                with self._cond:
                    self._applied[skey] = digest
                continue
            self._fence()
            self.kube.apply_slice(body)
            self.stats.applies += 1
            with self._cond:
                self._applied[skey] = digest
        for sl in self.slices.in_namespace(namespace):
            skey = key_of(sl)
            if skey in names or skey in self._deleting or \
                    ((sl.get("metadata") or {}).get("labels") or {}).get(slices.SERVICE_NAME) != name:
                continue
            self._fence()
            # Marked before the call: the slice's DELETED event may come before the call returns, and a
            # mark set after it would then never be cleared, so a slice of that name made again later
            # would never be deleted. Gone already, or not deleted: the mark goes at once.
            with self._cond:
                self._applied.pop(skey, None)
                self._deleting.add(skey)
            try:
                self.kube.delete_slice(*skey)
            except NotFound:
                with self._cond:
                    self._deleting.discard(skey)
            except BaseException:
                with self._cond:
                    self._deleting.discard(skey)
                raise
            self.stats.deletes += 1
        if wanted:
            logs.get().debug("slices in sync", extra={"service": f"{namespace}/{name}", "slices": len(wanted)})
