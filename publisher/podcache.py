"""A watch of the pods bound to this node, so resolving an ADD needs no pod GET.

The kubelet learned about the pod from the API before it asked the runtime for
a sandbox, so by the time an ADD arrives the pod is almost always in this cache
already. Only the fields resolution needs are kept (UID, claim names), which
keeps memory flat with many pods. A miss (or a UID that differs) falls back to
a GET, so the cache can only save requests, never change an answer.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from typing import Any

from . import logs
from .kube import ApiError, Kube, NotFound
from .resolver import pod_claim_names


@dataclass(frozen=True)
class PodInfo:
    uid: str
    claims: tuple[str, ...]


def pod_info(pod: dict[str, Any]) -> PodInfo:
    return PodInfo((pod.get("metadata") or {}).get("uid", ""), tuple(pod_claim_names(pod)))


class PodCache:
    def __init__(self, kube: Kube, node_name: str, stopping: threading.Event) -> None:
        self.kube = kube
        self.node_name = node_name
        self.stopping = stopping
        self.log = logs.get()
        self._pods: dict[tuple[str, str], PodInfo] = {}
        self._lock = threading.Lock()
        self.synced = threading.Event()
        self._thread = threading.Thread(target=self._run, name="pod-watch", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def get(self, namespace: str, name: str) -> PodInfo | None:
        with self._lock:
            return self._pods.get((namespace, name))

    def put(self, namespace: str, name: str, info: PodInfo) -> None:
        with self._lock:
            self._pods[(namespace, name)] = info

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
        delay = 1.0
        while not self.stopping.is_set():
            try:
                rv = self._relist()
                delay = 1.0
                while not self.stopping.is_set():
                    rv = self._watch(rv)
                    if rv is None:
                        break  # expired: relist
            except ApiError as exc:
                self.log.warning("pod watch failed, relisting", extra={"error": str(exc)})
                self.stopping.wait(delay)
                delay = min(delay * 2, 30.0)
            except Exception as exc:  # a broken stream: start over
                self.log.warning("pod watch interrupted, relisting", extra={"error": f"{type(exc).__name__}: {exc}"})
                self.stopping.wait(delay)
                delay = min(delay * 2, 30.0)

    def _relist(self) -> str:
        pods: dict[tuple[str, str], PodInfo] = {}
        cont = ""
        while True:
            page = self.kube.list_pods_on_node(self.node_name, cont=cont)
            for pod in page.get("items") or []:
                meta = pod.get("metadata") or {}
                pods[(meta.get("namespace", ""), meta.get("name", ""))] = pod_info(pod)
            meta = page.get("metadata") or {}
            cont = meta.get("continue", "")
            del page
            if not cont:
                break
        with self._lock:
            self._pods = pods
        self.synced.set()
        return meta.get("resourceVersion", "")

    def _watch(self, rv: str) -> str | None:
        resp = self.kube.watch_pods_on_node(self.node_name, rv)
        buf = b""
        try:
            for chunk in resp.stream(65536):
                buf += chunk
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    if not line.strip():
                        continue
                    ev = json.loads(line)
                    obj = ev.get("object") or {}
                    kind = ev.get("type")
                    if kind == "ERROR":
                        return None  # 410 Gone and friends: relist
                    meta = obj.get("metadata") or {}
                    rv = meta.get("resourceVersion", rv)
                    if kind == "BOOKMARK":
                        continue
                    key = (meta.get("namespace", ""), meta.get("name", ""))
                    with self._lock:
                        if kind == "DELETED":
                            self._pods.pop(key, None)
                        else:
                            self._pods[key] = pod_info(obj)
                if self.stopping.is_set():
                    break
        finally:
            resp.release_conn()
        return rv
