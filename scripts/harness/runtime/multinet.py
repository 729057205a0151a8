"""Pods with several networks behind Multus on the real cluster: manifests, and the one check of what they show.

`scripts/cluster.sh multus-up` makes Multus the node's primary CNI and creates
NetworkAttachmentDefinitions in `default` whose chains end in netclaim, each
naming its own claim request (macvlan, ipvlan, bridge2, hostdev; eth0's chain
names `nic` when installed with NETCLAIM_REQUEST=nic). A pod lists its
secondary networks in `k8s.v1.cni.cncf.io/networks` and gets one device per
network from its claims. `check_pod` compares, for every interface, the three
views a user can look at: the claim's `status.devices` entry, what the pod's
network namespace holds (`ip` inside it), and Multus's own
`k8s.v1.cni.cncf.io/network-status` annotation; every disagreement is one line.
"""

from __future__ import annotations

import ipaddress
import json
import subprocess
from dataclasses import dataclass
from typing import Any

from .realcluster import PAUSE_IMAGE, Interface, RealCluster, entries_of, ready_status

NETWORKS_ANNOTATION = "k8s.v1.cni.cncf.io/networks"
STATUS_ANNOTATION = "k8s.v1.cni.cncf.io/network-status"
PRIMARY_REQUEST = "nic"


@dataclass(frozen=True)
class Attachment:
    """One secondary network of a pod: the NAD (in `default`), the interface, the claim request it reports under."""

    nad: str
    ifname: str

    @property
    def request(self) -> str:
        return "hostdev" if self.nad.startswith("hostdev") else self.nad


def networks_value(attachments: list[Attachment]) -> str:
    return ",".join(f"default/{a.nad}@{a.ifname}" for a in attachments)


def request_spec(name: str, device_class: str) -> dict[str, Any]:
    return {"name": name, "exactly": {"deviceClassName": device_class}}


def claim_template(namespace: str, name: str, requests: list[str], device_class: str) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"spec": {"devices": {"requests": [request_spec(r, device_class) for r in requests]}}}}


def claim(namespace: str, name: str, requests: list[str], device_class: str) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"devices": {"requests": [request_spec(r, device_class) for r in requests]}}}


def pod_spec(attachments: list[Attachment], claims: dict[str, dict[str, str]]) -> tuple[dict[str, str], dict[str, Any]]:
    """(annotations, spec) of a pause pod; `claims` maps the pod's claim name to
    {"resourceClaimTemplateName": ...} or {"resourceClaimName": ...}."""
    spec = {
        "containers": [{"name": "app", "image": PAUSE_IMAGE, "imagePullPolicy": "Never"}],
        "terminationGracePeriodSeconds": 0,
        "resourceClaims": [{"name": n, **ref} for n, ref in claims.items()],
    }
    return {NETWORKS_ANNOTATION: networks_value(attachments)}, spec


def pod(namespace: str, name: str, attachments: list[Attachment], claims: dict[str, dict[str, str]]) -> dict[str, Any]:
    annotations, spec = pod_spec(attachments, claims)
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "annotations": annotations}, "spec": spec}


def deployment(namespace: str, name: str, attachments: list[Attachment], template: str) -> dict[str, Any]:
    annotations, spec = pod_spec(attachments, {"net": {"resourceClaimTemplateName": template}})
    labels = {"app": name}
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "namespace": namespace},
            "spec": {"replicas": 0, "selector": {"matchLabels": labels},
                     "template": {"metadata": {"labels": labels, "annotations": annotations}, "spec": spec}}}


def claim_names(pod_obj: dict[str, Any]) -> list[str]:
    """Every ResourceClaim of the pod: pre-created ones by name, generated ones from the pod's status."""
    generated = {s.get("name"): s.get("resourceClaimName") for s in
                 (pod_obj.get("status") or {}).get("resourceClaimStatuses") or []}
    names = []
    for ref in pod_obj["spec"].get("resourceClaims") or []:
        name = ref.get("resourceClaimName") or generated.get(ref["name"])
        if name:
            names.append(name)
    return names


def _address(cidr: str) -> str:
    return str(ipaddress.ip_interface(cidr).ip)


@dataclass
class PodView:
    """What one pod shows: its entries (by interface), Multus's network-status, its netns (by interface)."""

    entries: dict[str, list[dict[str, Any]]]
    requests: dict[tuple[str, str], str]  # (pool, device) -> request
    network_status: list[dict[str, Any]]
    netns: dict[str, Any]


def netns_interfaces(cluster: RealCluster, namespace: str, name: str) -> dict[str, Interface]:
    """Every interface the pod sees, read with one `ip` inside its network namespace."""
    out = subprocess.run(["nsenter", f"--net={cluster.netns(namespace, name)}", "ip", "-j", "addr", "show"],
                         capture_output=True, text=True, check=True, timeout=30).stdout
    found = {}
    for link in json.loads(out):
        cidrs = [f"{a['local']}/{a['prefixlen']}" for a in link.get("addr_info", []) if a.get("scope") == "global"]
        found[link["ifname"]] = Interface(link["ifname"], link.get("address", "").lower(), cidrs)
    return found


def view(cluster: RealCluster, namespace: str, name: str, pod_obj: dict[str, Any] | None = None,
         claims: dict[str, dict[str, Any]] | None = None) -> PodView:
    """The pod's three views; `pod_obj` and `claims` (by name) may come from one list of a whole sweep."""
    pod_obj = pod_obj or cluster.get("pod", name, namespace)
    entries: dict[str, list[dict[str, Any]]] = {}
    requests: dict[tuple[str, str], str] = {}
    for claim_name in claim_names(pod_obj):
        c = (claims or {}).get(claim_name) or cluster.get("resourceclaim", claim_name, namespace)
        for r in ((c.get("status") or {}).get("allocation") or {}).get("devices", {}).get("results") or []:
            requests[(r.get("pool", ""), r.get("device", ""))] = r.get("request", "")
        for e in entries_of(c, cluster.driver):
            entries.setdefault((e.get("networkData") or {}).get("interfaceName", ""), []).append(e)
    status = json.loads(((pod_obj["metadata"].get("annotations") or {}).get(STATUS_ANNOTATION)) or "[]")
    return PodView(entries, requests, status, netns_interfaces(cluster, namespace, name))


def problems(v: PodView, expected: dict[str, str]) -> list[str]:
    """Every disagreement for a pod whose interfaces should report under `expected` (ifname -> request)."""
    out: list[str] = []
    status_by_if = {s.get("interface"): s for s in v.network_status}
    if set(v.entries) != set(expected):
        out.append(f"entries name interfaces {sorted(v.entries)}, the pod has {sorted(expected)}")
    if set(status_by_if) != set(expected):
        out.append(f"network-status names {sorted(status_by_if)}, the pod has {sorted(expected)}")
    for ifname, request in expected.items():
        found = v.entries.get(ifname) or []
        if len(found) != 1:
            out.append(f"{ifname}: {len(found)} entries")
            continue
        e = found[0]
        nd = e.get("networkData") or {}
        got_request = v.requests.get((e.get("pool", ""), e.get("device", "")), "?")
        if got_request != request:
            out.append(f"{ifname}: entry on device {e.get('device')} of request {got_request!r}, wanted {request!r}")
        if ready_status(e) != "True":
            out.append(f"{ifname}: Ready={ready_status(e)!r}")
        ns = v.netns.get(ifname)
        if ns is None:
            out.append(f"{ifname}: not in the pod's netns")
            continue
        if nd.get("hardwareAddress", "").lower() != ns.mac:
            out.append(f"{ifname}: entry mac {nd.get('hardwareAddress')} != netns {ns.mac}")
        if sorted(nd.get("ips") or []) != sorted(ns.cidrs):
            out.append(f"{ifname}: entry ips {nd.get('ips')} != netns {ns.cidrs}")
        st = status_by_if.get(ifname)
        if st is not None:
            if (st.get("mac") or "").lower() != ns.mac:
                out.append(f"{ifname}: network-status mac {st.get('mac')} != netns {ns.mac}")
            if sorted(st.get("ips") or []) != sorted(_address(c) for c in ns.cidrs):
                out.append(f"{ifname}: network-status ips {st.get('ips')} != netns {ns.cidrs}")
    return out
