"""The EndpointSlices a Service on a secondary network should have: pure functions of what is watched.

One set of slices per address family (an EndpointSlice holds one `addressType`), at most
limits.ENDPOINTS_PER_SLICE endpoints each, named `<service>-netclaim-<family>-<n>` so that the
same input always gives the same objects: a re-apply of an unchanged slice is skipped, and a
slice whose name is no longer wanted is deleted. Each carries the labels consumers select on
(`kubernetes.io/service-name`, `endpointslice.kubernetes.io/managed-by: netclaim`) and an owner
reference to its Service, so deleting the Service deletes them (kube-controller-manager's garbage
collector).

An endpoint is one pod: its addresses of the family on the network (a consumer may use the first
only, as the API says), `ready`/`serving` from its entries' Ready conditions, `terminating` while
the pod is being deleted, `nodeName`, and `targetRef` to the pod.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from publisher import limits
from publisher.endpoints.select import Address

MANAGED_BY = "endpointslice.kubernetes.io/managed-by"
MANAGER = "netclaim"
SERVICE_NAME = "kubernetes.io/service-name"


@dataclass(frozen=True)
class PodAddresses:
    """One selected pod and its addresses on the Service's network."""

    pod: dict[str, Any]
    addresses: tuple[Address, ...]


def slice_name(service: str, family: str, index: int) -> str:
    return f"{service}-netclaim-{family.lower()}-{index}"


def ports_of(service: dict[str, Any]) -> list[dict[str, Any]]:
    """The Service's ports as slice ports: a numeric targetPort (the pods' port), else the port itself.

    A named targetPort would need each pod's container ports; the slice carries the Service's port then."""
    ports = []
    for p in ((service.get("spec") or {}).get("ports") or [])[:limits.MAX_SLICE_PORTS]:
        target = p.get("targetPort")
        port: dict[str, Any] = {"port": target if isinstance(target, int) else p.get("port"),
                                "protocol": p.get("protocol") or "TCP"}
        if p.get("name"):
            port["name"] = p["name"]
        if p.get("appProtocol"):
            port["appProtocol"] = p["appProtocol"]
        ports.append(port)
    return ports


def endpoint(member: PodAddresses, family: str) -> dict[str, Any] | None:
    """The pod's endpoint in one family, or None when it has no address of that family."""
    mine = [a for a in member.addresses if a.family == family][:limits.MAX_ENDPOINT_ADDRESSES]
    if not mine:
        return None
    meta, spec = member.pod.get("metadata") or {}, member.pod.get("spec") or {}
    terminating = bool(meta.get("deletionTimestamp"))
    serving = all(a.ready for a in mine)
    ep: dict[str, Any] = {
        "addresses": [a.ip for a in mine],
        "conditions": {"ready": serving and not terminating, "serving": serving, "terminating": terminating},
        "targetRef": {"kind": "Pod", "namespace": meta.get("namespace", ""), "name": meta.get("name", ""),
                      "uid": meta.get("uid", "")},
    }
    if spec.get("nodeName"):
        ep["nodeName"] = spec["nodeName"]
    return ep


def desired(service: dict[str, Any], families: tuple[str, ...], members: list[PodAddresses]) -> list[dict[str, Any]]:
    """Every slice the Service should have, as the server-side apply bodies (sorted by pod name)."""
    meta = service.get("metadata") or {}
    name, namespace = meta.get("name", ""), meta.get("namespace", "")
    members = sorted(members, key=lambda m: (m.pod.get("metadata") or {}).get("name", ""))
    ports = ports_of(service)
    out = []
    for family in families:
        endpoints = [ep for ep in (endpoint(m, family) for m in members) if ep is not None]
        chunks = [endpoints[i:i + limits.ENDPOINTS_PER_SLICE]
                  for i in range(0, len(endpoints), limits.ENDPOINTS_PER_SLICE)] or [[]]
        for index, chunk in enumerate(chunks):
            out.append({
                "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                "metadata": {
                    "name": slice_name(name, family, index), "namespace": namespace,
                    "labels": {SERVICE_NAME: name, MANAGED_BY: MANAGER},
                    "ownerReferences": [{"apiVersion": "v1", "kind": "Service", "name": name,
                                         "uid": meta.get("uid", ""), "controller": True}],
                },
                "addressType": family,
                "endpoints": chunk,
                "ports": ports,
            })
    return out


def fingerprint(body: dict[str, Any]) -> str:
    """What a slice's apply body says, as a short digest: an unchanged slice is not applied again."""
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:32]
