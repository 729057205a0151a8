"""The API facts netclaim relies on, proven against the real kube-apiserver.

If one of these fails, the publisher's design no longer holds on this version of
Kubernetes: server-side apply of ResourceClaim.status.devices, per-manager
ownership of list-map entries, and the server's validation of device entries.
"""

from __future__ import annotations

import uuid

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

pytestmark = pytest.mark.controlplane

DRIVER = "net.example.com"
APPLY = "application/apply-patch+yaml"
MERGE = "application/merge-patch+json"


@pytest.fixture()
def claim(api_client):
    """A Namespace, a Node, and a ResourceClaim allocated (by us, as the scheduler
    would) to two devices on that node."""
    core = client.CoreV1Api(api_client)
    resource = client.ResourceV1Api(api_client)
    suffix = uuid.uuid4().hex[:6]
    ns, node, name = f"facts-{suffix}", f"facts-node-{suffix}", "net-claim"
    core.create_namespace({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    core.create_node({"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}})
    resource.create_namespaced_resource_claim(
        ns,
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": name},
            "spec": {
                "devices": {
                    "requests": [
                        {"name": "nic", "exactly": {"deviceClassName": "net.example.com", "count": 2,
                                                    "allocationMode": "ExactCount"}}
                    ]
                }
            },
        },
    )
    allocation = {
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {"request": "nic", "driver": DRIVER, "pool": node, "device": "nic0"},
                        {"request": "nic", "driver": DRIVER, "pool": node, "device": "nic1"},
                    ]
                },
                "nodeSelector": {
                    "nodeSelectorTerms": [
                        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
                    ]
                },
            }
        }
    }
    resource.patch_namespaced_resource_claim_status(name, ns, allocation, _content_type=MERGE)
    yield {"ns": ns, "node": node, "name": name, "api": resource}
    core.delete_namespace(ns)
    core.delete_node(node)


def _apply(claim: dict, manager: str, devices: list[dict]):
    body = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": claim["name"], "namespace": claim["ns"]},
        "status": {"devices": devices},
    }
    return claim["api"].patch_namespaced_resource_claim_status(
        claim["name"], claim["ns"], body, field_manager=manager, _content_type=APPLY
    )


def _entry(claim: dict, device: str, ips: list[str], mac: str = "0a:58:0a:01:00:05") -> dict:
    return {
        "driver": DRIVER,
        "pool": claim["node"],
        "device": device,
        "networkData": {"interfaceName": "eth0", "ips": ips, "hardwareAddress": mac},
        "data": {"cniVersion": "1.1.0", "network": "podnet", "containerID": "abc123"},
        "conditions": [
            {
                "type": "Ready",
                "status": "True",
                "reason": "NetworkConfigured",
                "message": "eth0 configured by the CNI chain",
                "lastTransitionTime": "2026-11-29T12:00:00Z",
            }
        ],
    }


def _devices(claim: dict) -> dict[str, dict]:
    current = claim["api"].read_namespaced_resource_claim_status(claim["name"], claim["ns"])
    devices = current.status.devices or []
    return {d.device: d for d in devices}


def test_apply_writes_network_data_data_and_ready(claim):
    _apply(claim, "netclaim/a", [_entry(claim, "nic0", ["10.1.0.5/16", "2001:db8::5/64"])])

    got = _devices(claim)["nic0"]
    assert got.network_data.interface_name == "eth0"
    assert got.network_data.ips == ["10.1.0.5/16", "2001:db8::5/64"]
    assert got.network_data.hardware_address == "0a:58:0a:01:00:05"
    assert got.data["network"] == "podnet"
    assert [(c.type, c.status, c.reason) for c in got.conditions] == [("Ready", "True", "NetworkConfigured")]


def test_other_managers_entry_survives_reapply(claim):
    _apply(claim, "netclaim/a", [_entry(claim, "nic0", ["10.1.0.5/16"])])
    _apply(claim, "other-driver-agent", [_entry(claim, "nic1", ["10.2.0.9/16"])])

    # The first manager re-applies with a changed IP: its entry changes, the
    # other manager's entry is untouched.
    _apply(claim, "netclaim/a", [_entry(claim, "nic0", ["10.1.0.6/16"])])
    got = _devices(claim)
    assert got["nic0"].network_data.ips == ["10.1.0.6/16"]
    assert got["nic1"].network_data.ips == ["10.2.0.9/16"]

    # Applying without the entry removes only that manager's entry.
    _apply(claim, "netclaim/a", [])
    assert set(_devices(claim)) == {"nic1"}


def test_non_canonical_ip_is_rejected_with_422(claim):
    with pytest.raises(ApiException) as err:
        _apply(claim, "netclaim/a", [_entry(claim, "nic0", ["2001:0db8::5/64"])])
    assert err.value.status == 422
    assert "canonical" in err.value.body
    assert _devices(claim) == {}


def test_entry_for_unallocated_device_is_rejected_with_422(claim):
    with pytest.raises(ApiException) as err:
        _apply(claim, "netclaim/a", [_entry(claim, "nic9", ["10.1.0.5/16"])])
    assert err.value.status == 422
    assert "must be an allocated device in the claim" in err.value.body
    assert _devices(claim) == {}


def test_resource_claims_listable_with_admin_kubeconfig(control_plane, claim):
    """What the README promises: the admin kubeconfig lists claims through ResourceV1Api."""
    api = client.ResourceV1Api(control_plane.api_client())
    names = {(c.metadata.namespace, c.metadata.name) for c in api.list_resource_claim_for_all_namespaces().items}
    assert (claim["ns"], claim["name"]) in names
