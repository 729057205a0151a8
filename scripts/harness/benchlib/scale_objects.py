"""The API objects the scale bench and tests/deploy/test_apf.py create as the scheduler would: pods with a claim allocated on a node."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from .publisher import CLASS, DRIVER, MERGE

NETWORK = "scalenet"
REQUEST = "nic"


@dataclass
class PodSpec:
    node: str
    name: str
    claim: str
    uid: str = ""
    cid: str = ""
    index: int = 0


def scheduled_pod(api: Any, ns: str, spec: PodSpec) -> None:
    """A claim, a pod bound to spec.node using it, and the allocation on that node's pool reserved
    for the pod: the scheduler's writes. Fills spec.uid."""
    from kubernetes import client

    res, core = client.ResourceV1Api(api), client.CoreV1Api(api)
    res.create_namespaced_resource_claim(ns, {"metadata": {"name": spec.claim}, "spec": {"devices": {
        "requests": [{"name": REQUEST, "exactly": {"deviceClassName": CLASS}}]}}}, _preload_content=False)
    resp = core.create_namespaced_pod(ns, {"metadata": {"name": spec.name}, "spec": {
        "nodeName": spec.node, "containers": [{"name": "c", "image": "local/pause:1"}],
        "resourceClaims": [{"name": "net", "resourceClaimName": spec.claim}]}}, _preload_content=False)
    spec.uid = json.loads(resp.data)["metadata"]["uid"]
    res.patch_namespaced_resource_claim_status(spec.claim, ns, {"status": {
        "allocation": {"devices": {"results": [{"request": REQUEST, "driver": DRIVER, "pool": spec.node,
                                                "device": "nic0"}]},
                       "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                           {"key": "metadata.name", "operator": "In", "values": [spec.node]}]}]}},
        "reservedFor": [{"resource": "pods", "name": spec.name, "uid": spec.uid}]}},
        _content_type=MERGE, _preload_content=False)


def ensure_device_class(api: Any) -> None:
    from kubernetes import client

    try:
        client.ResourceV1Api(api).create_device_class({"metadata": {"name": CLASS}, "spec": {}})
    except client.ApiException as exc:
        if exc.status != 409:
            raise
