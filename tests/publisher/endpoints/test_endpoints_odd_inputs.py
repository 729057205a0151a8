"""One pod's odd entry never costs the other pods of its Service their endpoints (the real API server).

An EndpointSlice is written whole: an address the API server refuses in it (a link-local, loopback or
unspecified address) would refuse the slice, and with it the
endpoints of every pod that shares it, for as long as that entry stays.
"""

from __future__ import annotations

from endpoints_kit import annotated_service, endpoints_by_pod, entry, server_pod, write_entries
from kubernetes import client
from publisher_testkit import wait_until


def test_addresses_the_api_refuses_in_a_slice_are_left_out_and_the_other_pods_stay_served(
        cluster, endpoints_controller):
    server_pod(cluster, "a", ["fd50::a/64", "fe80::a/64"])  # its usable address, and a link-local one
    server_pod(cluster, "b", ["::1/128", "fd50::b/64"])  # loopback first
    server_pod(cluster, "c", ["fd50::c/64"])
    annotated_service(cluster, family="IPv6")
    endpoints_controller()
    wait_until("every pod on the IPv6 slice at its usable address",
               lambda: {p: ep["addresses"] for p, ep in endpoints_by_pod(cluster).items()} ==
               {"a": ["fd50::a"], "b": ["fd50::b"], "c": ["fd50::c"]}, timeout=60)


def test_the_address_of_a_claim_two_running_pods_share_goes_to_neither_of_them(cluster, endpoints_controller):
    """The claim's one entry shows the attachment of one of the two pods, and does not say which: listing the
    address on both endpoints would make one of them wrong (and keep it ready while its pod is not)."""
    uid_a = server_pod(cluster, "a", ["192.168.50.10/24"])
    uid_b = cluster.pod("b", ["a-net"])
    client.CoreV1Api(cluster.api).patch_namespaced_pod("b", cluster.namespace, {"metadata": {"labels": {"app": "web"}}})
    cluster.resource.patch_namespaced_resource_claim_status("a-net", cluster.namespace, {"status": {"reservedFor": [
        {"resource": "pods", "name": "a", "uid": uid_a}, {"resource": "pods", "name": "b", "uid": uid_b}]}},
        _content_type="application/merge-patch+json")
    server_pod(cluster, "c", ["192.168.50.12/24"])  # the control: a claim of its own
    annotated_service(cluster, family="IPv4")
    endpoints_controller()
    wait_until("only c, whose claim is its own, on the slice",
               lambda: {p: ep["addresses"] for p, ep in endpoints_by_pod(cluster).items()} ==
               {"c": ["192.168.50.12"]}, timeout=60)


def test_a_shared_device_whose_entry_lists_each_pods_attachment_gives_each_pod_its_own_address(
        cluster, endpoints_controller):
    """The node's publisher with --shared-attachments lists every pod on the device in the entry's data."""
    uid_a = server_pod(cluster, "a", ["192.168.50.10/24"])
    uid_b = cluster.pod("b", ["a-net"])
    client.CoreV1Api(cluster.api).patch_namespaced_pod("b", cluster.namespace, {"metadata": {"labels": {"app": "web"}}})
    cluster.resource.patch_namespaced_resource_claim_status("a-net", cluster.namespace, {"status": {"reservedFor": [
        {"resource": "pods", "name": "a", "uid": uid_a}, {"resource": "pods", "name": "b", "uid": uid_b}]}},
        _content_type="application/merge-patch+json")
    shown = entry("mv-a", ["192.168.50.11/24"])  # b's sandbox is the newest: the entry shows it
    shown["data"] = {"apiVersion": "netclaim.dev/v1", "kind": "CNIResult", "cniVersion": "1.1.0", "network": "mv",
                     "containerID": "sandbox-b", "attachments": [
                         {"pod": "a", "podUID": uid_a, "containerID": "sandbox-a", "interfaceName": "net1",
                          "ips": ["192.168.50.10/24"]},
                         {"pod": "b", "podUID": uid_b, "containerID": "sandbox-b", "interfaceName": "net1",
                          "ips": ["192.168.50.11/24"]}]}
    write_entries(cluster, "a-net", [entry("eth-a", ["10.244.0.9/24"]), shown])
    annotated_service(cluster, family="IPv4")
    endpoints_controller()
    wait_until("a and b on the slice, each at its own address",
               lambda: {p: ep["addresses"] for p, ep in endpoints_by_pod(cluster).items()} ==
               {"a": ["192.168.50.10"], "b": ["192.168.50.11"]}, timeout=60)
