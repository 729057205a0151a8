"""A pod with several networks on one claim costs the API server one status write, not one per network.

Multus runs a pod's networks one after another, each chain ending in netclaim, so the
publisher gets one ADD per network within a few hundred milliseconds while the pod starts.
Everything is real: the publisher process (or its Service in this process, with its one
worker thread), kube-apiserver and etcd.
"""

from __future__ import annotations

import pytest

from cni_plugin.wire.event import PodRef
from cni_plugin.wire.frame import event_request
from publisher.service import Service
from publisher_testkit import DRIVER, MERGE, Cluster, cni_result, drained, request, suffix, wait_until, wire_event

pytestmark = pytest.mark.controlplane

# Long enough that no scheduling delay of a loaded machine ends the hold between two ADDs: the
# last network's ADD applies at once, so the test never waits for it.
LONG_HOLD = ["--sibling-hold", "30"]
NETWORKS = [("eth0", "nic", "10.77.0.5/24"), ("net1", "nic2", "10.78.0.5/24"), ("net2", "nic3", "10.79.0.5/24")]


def entries(devices: list[dict]) -> dict[str, list[str]]:
    return {d["device"]: d.get("networkData", {}).get("ips", []) for d in devices if d["driver"] == DRIVER}


def applies(publisher) -> float:
    return publisher.metric('netclaim_api_requests_by_purpose_total{purpose="apply"}')


def reads(publisher) -> float:
    return sum(publisher.metric(f'netclaim_api_requests_by_purpose_total{{purpose="{p}"}}')
               for p in ("resolve-get", "resolve-watch"))


def reconcile_reads(publisher) -> float:
    return publisher.metric('netclaim_api_requests_by_purpose_total{purpose="reconcile"}')


def add(publisher, cid: str, pod: PodRef, ifname: str, request_name: str, ip: str) -> None:
    event = wire_event("ADD", cid, pod, cni_result(ifname=ifname, ipv4=ip, ipv6=None), ifname=ifname,
                       request_name=request_name)
    assert request(publisher.socket, event_request(event))["ok"] is True


def test_a_sandboxs_networks_on_one_claim_are_written_in_one_apply(cluster: Cluster, publisher_factory):
    publisher = publisher_factory(extra=LONG_HOLD)
    claim, uid = cluster.pod_with_claim("three", [("nic", "nic0"), ("nic2", "nic1"), ("nic3", "nic2")])
    pod, cid = PodRef(cluster.namespace, "three", uid), "c" + suffix()
    before, read_before = applies(publisher), reads(publisher)
    for ifname, request_name, ip in NETWORKS:  # as Multus runs them: one after another
        add(publisher, cid, pod, ifname, request_name, ip)
    cluster.wait_devices(claim, lambda d: len(entries(d)) == 3)
    drained(publisher)
    assert entries(cluster.devices(claim)) == {"nic0": ["10.77.0.5/24"], "nic1": ["10.78.0.5/24"],
                                               "nic2": ["10.79.0.5/24"]}
    assert applies(publisher) - before == 1, "one apply for the sandbox's three networks"
    assert reads(publisher) - read_before == 1, "the next ADDs resolve against the copy the first one read"
    assert publisher.metric("netclaim_apply_holds_total") == 2


def test_a_device_no_network_reports_on_delays_the_others_by_the_hold_only(cluster: Cluster, publisher):  # 1 s
    """The claim's second device belongs to no chain with netclaim: the first network's entry is
    written when the hold ends, by the sandbox's worker with the claim copy its ADD read (one
    read, one apply: no second read), and counts as no repair."""
    claim, uid = cluster.pod_with_claim("lonely", [("nic", "nic0"), ("nic2", "nic1")])
    pod, cid = PodRef(cluster.namespace, "lonely", uid), "c" + suffix()
    before, read_before, reconcile_before = applies(publisher), reads(publisher), reconcile_reads(publisher)
    add(publisher, cid, pod, "eth0", "nic", "10.77.0.5/24")
    cluster.wait_devices(claim, lambda d: set(entries(d)) == {"nic0"}, timeout=30)
    drained(publisher)
    assert applies(publisher) - before == 1
    assert (reads(publisher) - read_before, reconcile_reads(publisher) - reconcile_before) == (1, 0), \
        "the claim was read again when the hold ended"
    assert sum(publisher.metric(f'netclaim_drift_repaired_total{{cause="{c}"}}')
               for c in ("window", "outcome", "pod_deleted", "safety_net")) == 0


def test_an_ended_hold_keeps_no_claim_copy_when_no_pod_follows(cluster: Cluster, service: Service):  # 1 s
    """A hold that ends without the sandbox's last ADD is applied by the sandbox's worker and
    forgotten with its claim copy, without waiting for another pod's hold to sweep it."""
    claim, uid = cluster.pod_with_claim("forgotten", [("nic", "nic0"), ("nic2", "nic1")])
    cid = "c" + suffix()
    event = wire_event("ADD", cid, PodRef(cluster.namespace, "forgotten", uid),
                       cni_result(ipv4="10.77.0.5/24", ipv6=None))
    service._spawn("housekeeping", service.housekeeping.run)
    service.pods.synced.set()  # the worker's wait for the pod watch's first listing: nothing to wait for here
    service._spawn("worker-0", lambda: service.workers.run(0))  # the publisher's only worker
    assert service.journal.append(event)
    service.shards.notify(event)  # what the socket intake does once an event is committed
    wait_until("the ADD to be held", lambda: service.metrics.apply_holds._value.get() == 1, timeout=30)
    cluster.wait_devices(claim, lambda d: set(entries(d)) == {"nic0"}, timeout=30)
    wait_until("the ended hold and its claim copy to be dropped", lambda: service.rules.holding() == 0, timeout=30)
    assert service.journal.dirty_claims() == []


def test_a_claim_shared_by_two_pods_is_not_held(cluster: Cluster, publisher_factory):
    """Another pod may attach the shared claim's other device: each ADD is written at once."""
    publisher = publisher_factory(extra=LONG_HOLD)
    claim = "shared-net"
    cluster.claim(claim, ("nic", "nic2"))
    uid_a, uid_b = cluster.pod("shared-a", [claim]), cluster.pod("shared-b", [claim])
    cluster.allocate(claim, [("nic", "nic0"), ("nic2", "nic1")], "shared-a", uid_a)
    cluster.resource.patch_namespaced_resource_claim_status(claim, cluster.namespace, {"status": {"reservedFor": [
        {"resource": "pods", "name": "shared-a", "uid": uid_a},
        {"resource": "pods", "name": "shared-b", "uid": uid_b}]}}, _content_type=MERGE)
    add(publisher, "c" + suffix(), PodRef(cluster.namespace, "shared-a", uid_a), "eth0", "nic", "10.77.0.5/24")
    cluster.wait_devices(claim, lambda d: set(entries(d)) == {"nic0"}, timeout=20)  # long before the hold ends
    assert publisher.metric("netclaim_apply_holds_total") == 0
