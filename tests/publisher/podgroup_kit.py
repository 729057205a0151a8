"""PodGroups (KEP-5729) for publisher tests: the group, its pods and its claim's reservation, as a
workload controller, the user and the scheduler leave them on the real API server.

The test control plane serves them (scripts/control-plane.sh turns on Kubernetes 1.37's workload
gates and scheduling.k8s.io/v1beta1 there); one started without them fails these tests with how to fix it.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from publisher_testkit import DRIVER, MERGE, Cluster

GROUP, VERSION, PODGROUPS = "scheduling.k8s.io", "v1beta1", "podgroups"
CLAIM_REF = "net"  # the claim's name in the PodGroup's and its pods' spec.resourceClaims


def podgroup(cluster: Cluster, name: str, claim: str) -> dict[str, Any]:
    """A PodGroup that shares `claim` among its pods, as a workload controller creates it."""
    body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "PodGroup", "metadata": {"name": name},
            "spec": {"schedulingPolicy": {"basic": {}},
                     "resourceClaims": [{"name": CLAIM_REF, "resourceClaimName": claim}]}}
    try:
        return client.CustomObjectsApi(cluster.api).create_namespaced_custom_object(
            GROUP, VERSION, cluster.namespace, PODGROUPS, body)
    except ApiException as exc:
        if exc.status == 404:
            pytest.fail("the control plane serves no scheduling.k8s.io/v1beta1 PodGroups: it was started without "
                        "the workload gates (scripts/control-plane.sh down, then run again)", pytrace=False)
        raise


def group_pod(cluster: Cluster, name: str, claim: str, group: str | None) -> str:
    """A pod bound to our node that uses the claim, in PodGroup `group` (None: in none); its UID."""
    spec: dict[str, Any] = {
        "nodeName": cluster.node,
        "containers": [{"name": "c", "image": "local/pause:1", "resources": {"claims": [{"name": CLAIM_REF}]}}],
        "resourceClaims": [{"name": CLAIM_REF, "resourceClaimName": claim}]}
    if group:
        spec["schedulingGroup"] = {"podGroupName": group}
    cluster.core.create_namespaced_pod(cluster.namespace, {"apiVersion": "v1", "kind": "Pod",
                                                           "metadata": {"name": name}, "spec": spec})
    obj = json.loads(cluster.core.read_namespaced_pod(name, cluster.namespace, _preload_content=False).data)
    if group and (obj["spec"].get("schedulingGroup") or {}).get("podGroupName") != group:
        pytest.fail("the API server dropped the pod's spec.schedulingGroup: it runs without the GenericWorkload "
                    "gate (scripts/control-plane.sh down, then run again)", pytrace=False)
    return obj["metadata"]["uid"]


def reserve_for_group(cluster: Cluster, claim: str, pool: str, devices: list[tuple[str, str]], group: dict) -> None:
    """status.allocation + reservedFor as the scheduler writes them for a PodGroup's claim:
    devices = [(request, device)] of `pool`, reserved for the PodGroup object `group`."""
    meta = group["metadata"]
    status = {"allocation": {
        "devices": {"results": [{"request": r, "driver": DRIVER, "pool": pool, "device": d} for r, d in devices]},
        "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
            {"key": "metadata.name", "operator": "In", "values": [cluster.node]}]}]}},
        "reservedFor": [{"apiGroup": GROUP, "resource": PODGROUPS, "name": meta["name"], "uid": meta["uid"]}]}
    cluster.resource.patch_namespaced_resource_claim_status(claim, cluster.namespace, {"status": status},
                                                            _content_type=MERGE)
