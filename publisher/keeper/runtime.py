"""How the node's container runtime tears a sandbox's network down, learnt from the kubelet's pod status.

CRI-O runs a sandbox's CNI DEL with the config libcni cached at its ADD, so an
uninstall must keep the plugin while such a cached config chains it.
containerd runs DEL with the config it has loaded now, which follows the conf
dir: once netclaim is unchained nothing runs the plugin again, and keeping it
"for the cached configs" would keep it forever (no DEL of netclaim ever comes
to remove it).

The kubelet reports every container as `<runtime>://<id>`, so one pod on this
node names the runtime. It is learnt while the keeper runs (the release's RBAC
is being deleted when the uninstall's SIGTERM comes); until it is known, the
keeper assumes the cautious answer (cached configs count).
"""

from __future__ import annotations

import threading
import time
from typing import Any

from publisher import logs

CACHED_CONFIG = "cached-config"  # CRI-O: DEL with the config cached at ADD
LOADED_CONFIG = "loaded-config"  # containerd: DEL with the config loaded now
RUNTIMES = {"containerd": LOADED_CONFIG, "cri-o": CACHED_CONFIG}
RETRY = 5.0  # seconds between looks while no pod of the node has a started container


def teardown_of(container_id: str) -> str:
    """The teardown rule of the runtime that `container_id` (`<runtime>://<id>`) names; "" when unknown."""
    runtime, sep, _ = container_id.partition("://")
    return RUNTIMES.get(runtime, "") if sep else ""


def teardown_in(pods: list[dict[str, Any]]) -> str:
    """The teardown rule named by the first started container among `pods`; "" when none names a known one."""
    for pod in pods:
        status = pod.get("status") or {}
        for container in (status.get("initContainerStatuses") or []) + (status.get("containerStatuses") or []):
            rule = teardown_of(str(container.get("containerID") or ""))
            if rule:
                return rule
    return ""


class RuntimeTeardown:
    """The node runtime's teardown rule: fixed by the operator, or learnt from the API in the background."""

    def __init__(self, setting: str, kube: Any = None, node_name: str = "") -> None:
        self.rule = CACHED_CONFIG if setting == "auto" else setting
        self.known = setting != "auto"
        self._kube, self._node = kube, node_name

    def uses_cached_config(self) -> bool:
        return self.rule == CACHED_CONFIG

    def learn(self) -> None:
        """Start learning the rule (auto only, with an API client and a node name)."""
        if self.known or self._kube is None or not self._node:
            return
        threading.Thread(target=self._learn, name="runtime-teardown", daemon=True).start()

    def _learn(self) -> None:
        log = logs.get()
        while True:
            try:
                rule = teardown_in(self._kube.list_pods_on_node(self._node, limit=20).get("items") or [])
            except Exception as exc:  # noqa: BLE001 - the API may be down or refuse: look again later
                log.debug("runtime not learnt yet", extra={"error": type(exc).__name__})
                rule = ""
            if rule:
                self.rule, self.known = rule, True
                log.info("runtime teardown learnt", extra={"node": self._node, "teardown": rule})
                return
            time.sleep(RETRY)  # a daemon thread: it ends with the keeper
