"""Small builders for what the e2e tests, the demo and the benchmark put in the API: Node, Pod, ResourceClaim.

There is no scheduler: like the scheduler would, the claim's
`status.allocation` (one device of our driver on our node, node selector =
exactly one matchFields term on metadata.name) and `reservedFor` (the pod's
UID) are written through the status subresource.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable

from kubernetes import client
from kubernetes.client.rest import ApiException

from .dataschema import check_entries, check_status

REQUEST = "net"


@dataclass
class PodRecord:
    name: str
    namespace: str
    uid: str
    claim: str = ""
    device: str = ""


class Cluster:
    """One test's namespace and Node, plus the calls the tests need."""

    def __init__(self, api: client.ApiClient, driver: str, suffix: str, prefix: str = "e2e") -> None:
        self.api = api
        self.core = client.CoreV1Api(api)
        self.resource = client.ResourceV1Api(api)
        self.driver = driver
        self.namespace = f"{prefix}-{suffix}"
        self.node = f"{prefix}-node-{suffix}"

    def setup(self) -> None:
        self.core.create_namespace({"metadata": {"name": self.namespace}})
        self.core.create_node({"metadata": {"name": self.node, "labels": {"kubernetes.io/hostname": self.node}}})

    def teardown(self) -> None:
        for call, args in (
            (self.core.delete_namespace, (self.namespace,)),
            (self.core.delete_node, (self.node,)),
        ):
            try:
                call(*args)
            except ApiException as exc:
                if exc.status != 404:
                    raise

    # ------------------------------------------------------------ objects

    def create_pod(self, name: str, claim: str = "") -> PodRecord:
        spec: dict[str, Any] = {
            "nodeName": self.node,
            "containers": [{"name": "app", "image": "netclaim.local/pause:e2e"}],
        }
        if claim:
            spec["resourceClaims"] = [{"name": REQUEST, "resourceClaimName": claim}]
            spec["containers"][0]["resources"] = {"claims": [{"name": REQUEST}]}
        pod = self.core.create_namespaced_pod(self.namespace, {"metadata": {"name": name}, "spec": spec})
        return PodRecord(name, self.namespace, pod.metadata.uid, claim)

    def create_claim(self, name: str) -> None:
        body = {
            "metadata": {"name": name},
            "spec": {"devices": {"requests": [{"name": REQUEST, "exactly": {"deviceClassName": "netclaim-e2e"}}]}},
        }
        self.resource.create_namespaced_resource_claim(self.namespace, body)

    def allocate(self, claim: str, pod: PodRecord, device: str) -> None:
        """What the scheduler writes: the allocation on our node and the pod as consumer."""
        status = {
            "allocation": {
                "devices": {
                    "results": [{"request": REQUEST, "driver": self.driver, "pool": self.node, "device": device}]
                },
                "nodeSelector": {
                    "nodeSelectorTerms": [
                        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [self.node]}]}
                    ]
                },
            },
            "reservedFor": [{"resource": "pods", "name": pod.name, "uid": pod.uid}],
        }
        self.resource.patch_namespaced_resource_claim_status(claim, self.namespace, {"status": status})
        pod.device = device

    def pod_with_claim(self, name: str, device: str = "eth0-dev") -> PodRecord:
        claim = f"{name}-net"
        self.create_claim(claim)
        pod = self.create_pod(name, claim)
        self.allocate(claim, pod, device)
        return pod

    # ------------------------------------------------------------ reading

    def claim_status(self, claim: str) -> dict[str, Any]:
        obj = self.resource.read_namespaced_resource_claim_status(claim, self.namespace)
        return check_status(self.api.sanitize_for_serialization(obj).get("status") or {})

    def device_entries(self, claim: str) -> list[dict[str, Any]]:
        obj = self.resource.read_namespaced_resource_claim_status(claim, self.namespace)
        raw = self.api.sanitize_for_serialization(obj)
        return check_entries((raw.get("status") or {}).get("devices") or [])

    def wait_for_entries(
        self, claim: str, ok: Callable[[list[dict[str, Any]]], bool], timeout: float = 60.0
    ) -> list[dict[str, Any]]:
        """Poll the claim until `ok(entries)`; on timeout fail with what was last seen."""
        deadline = time.monotonic() + timeout
        entries: list[dict[str, Any]] = []
        while time.monotonic() < deadline:
            entries = self.device_entries(claim)
            if ok(entries):
                return entries
            time.sleep(0.2)
        raise AssertionError(f"claim {self.namespace}/{claim} never matched within {timeout}s; last devices: {entries}")


def ready(entry: dict[str, Any]) -> str:
    """The Ready condition's status ("True"/"False"/"" when absent)."""
    for cond in entry.get("conditions") or []:
        if cond.get("type") == "Ready":
            return cond.get("status", "")
    return ""
