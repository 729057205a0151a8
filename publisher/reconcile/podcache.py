"""A watch of the pods bound to this node, so resolving an ADD needs no pod GET.

The kubelet learned about the pod from the API before it asked the runtime for
a sandbox, so by the time an ADD arrives the pod is almost always in this cache
already. Only the fields resolution needs are kept (UID, claim names, the
PodGroup a claim may be reserved for), which keeps memory flat with many pods.
A miss (or a UID that differs) waits a moment for the watch (`wait_for`, woken
by the watch itself) and then falls back to a GET, so the cache can only save
requests, never change an answer.

Most pods on a node have no claim at all (netclaim runs for every pod of the
primary network), so the cache also says whether a pod declares any claim
(`PodInfo.declares_claims`): one that does not can never be this driver's, and
its ADD and DEL cost no request at all (docs/design.md "Finding the claim and
device"). Pods the watch saw deleted are remembered for a while (bounded,
limits.MAX_GONE_PODS), so a DEL that arrives after its pod is gone still knows
what that pod was.

Observers (`observers`, given at construction, e.g. publisher/repair/unchained.py) are shown every pod the
watch delivers, whole, before it is cut down to PodInfo, and None for a pod
deleted; they run on the watch thread and must be O(1) and never block.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any, Protocol, Sequence

from publisher import limits, logs
from publisher.kube.calls import Kube, NotFound
from publisher.kube.listwatch import events, follow
from publisher.reconcile.resolver import PodInfo, pod_info


class PodObserver(Protocol):
    """Shown each pod the watch delivers (None: deleted); runs on the watch thread, O(1), never blocks
    (publisher/repair/unchained.py UnchainedPods.observe, publisher/repair/resync.py DeletedPods)."""

    def __call__(self, pod: dict[str, Any] | None, namespace: str, name: str, uid: str) -> None: ...


class PodCache:
    def __init__(self, *, kube: Kube, node_name: str, stopping: threading.Event,
                 observers: Sequence[PodObserver] = ()) -> None:
        self.kube = kube
        self.node_name = node_name
        self.stopping = stopping
        self.log = logs.get()
        self._pods: dict[tuple[str, str], PodInfo] = {}
        self._gone: OrderedDict[tuple[str, str], PodInfo] = OrderedDict()  # seen deleted, newest last
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)  # notified on every change: wakes wait_for
        self.synced = threading.Event()
        # Called with (pod or None when deleted, namespace, name, uid): see the module docstring.
        self.observers: tuple[PodObserver, ...] = tuple(observers)
        self._thread = threading.Thread(target=self._run, name="pod-watch", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def get(self, namespace: str, name: str) -> PodInfo | None:
        with self._lock:
            return self._pods.get((namespace, name))

    def wait_for(self, namespace: str, name: str, uid: str, timeout: float) -> PodInfo | None:
        """The pod (with this UID, when given), waiting up to `timeout` s for the watch to show it.

        The kubelet saw the pod before the runtime ran the plugin, so the watch
        delivers it within moments; waiting for it here spares the GET.
        """
        def found() -> PodInfo | None:
            info = self._pods.get((namespace, name))
            return info if info is not None and (not uid or info.uid == uid) else None

        with self._changed:
            if timeout > 0:
                self._changed.wait_for(found, timeout)
            return found()

    def gone(self, namespace: str, name: str, uid: str) -> PodInfo | None:
        """The pod as it was when the watch saw it deleted (same UID when given), if remembered."""
        with self._lock:
            info = self._gone.get((namespace, name))
        return info if info is not None and (not uid or info.uid == uid) else None

    def put(self, namespace: str, name: str, info: PodInfo) -> None:
        with self._changed:
            self._pods[(namespace, name)] = info
            self._changed.notify_all()

    def _show(self, pod: dict[str, Any] | None, key: tuple[str, str], uid: str = "") -> None:
        """Tell the observers; one that fails is logged, never the watch's problem."""
        for observer in self.observers:
            try:
                observer(pod, key[0], key[1], uid)
            except Exception as exc:  # noqa: BLE001 - an observer is a report, not the cache
                self.log.warning("pod observer failed", extra={"pod": f"{key[0]}/{key[1]}",
                                                               "error": f"{type(exc).__name__}: {exc}"})

    def _deleted(self, key: tuple[str, str]) -> None:
        """Move a deleted pod to the bounded gone list (the caller holds the lock)."""
        info = self._pods.pop(key, None)
        if info is None:
            return
        self._show(None, key, info.uid)
        self._gone.pop(key, None)
        self._gone[key] = info
        while len(self._gone) > limits.MAX_GONE_PODS:
            self._gone.popitem(last=False)

    def remember(self, pod: dict[str, Any]) -> None:
        """A pod read with a GET: the reconciler then finds it without another request."""
        meta = pod.get("metadata") or {}
        if (pod.get("spec") or {}).get("nodeName") == self.node_name:
            self.put(meta.get("namespace", ""), meta.get("name", ""), pod_info(pod))

    def alive(self, namespace: str, name: str, uid: str) -> bool:
        """Whether the pod with this UID exists: the watch's answer, else one GET."""
        info = self.get(namespace, name)
        if info is not None and (not uid or info.uid == uid):
            return True
        try:
            pod = self.kube.get_pod(namespace, name)
        except NotFound:
            return False
        self.remember(pod)
        return not uid or (pod.get("metadata") or {}).get("uid", "") == uid

    def __len__(self) -> int:
        return len(self._pods)

    def _run(self) -> None:
        follow(self.stopping, self._relist, self._watch, lambda exc: self.log.warning(
            "pod watch failed, relisting", extra={"error": f"{type(exc).__name__}: {exc}"}))

    def _relist(self) -> str:
        pods: dict[tuple[str, str], PodInfo] = {}
        cont = ""
        while True:
            page = self.kube.list_pods_on_node(self.node_name, cont=cont)
            for pod in page.get("items") or []:
                meta = pod.get("metadata") or {}
                key = (meta.get("namespace", ""), meta.get("name", ""))
                pods[key] = pod_info(pod)
                self._show(pod, key)
            meta = page.get("metadata") or {}
            cont = meta.get("continue", "")
            del page
            if not cont:
                break
        with self._changed:
            for key in [k for k in self._pods if k not in pods]:  # deleted while the watch was down
                self._deleted(key)
            self._pods = pods
            self._changed.notify_all()
        self.synced.set()
        return meta.get("resourceVersion", "")

    def _watch(self, rv: str) -> str:
        for kind, obj, version in events(self.kube.watch_pods_on_node(self.node_name, rv), self.stopping):
            rv = version or rv
            if kind == "BOOKMARK":
                continue
            meta = obj.get("metadata") or {}
            key = (meta.get("namespace", ""), meta.get("name", ""))
            with self._changed:
                if kind == "DELETED":
                    self._deleted(key)
                else:
                    self._pods[key] = pod_info(obj)
                    self._show(obj, key)
                self._changed.notify_all()
        return rv
