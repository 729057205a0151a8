"""Warning Events for permanent failures, on the real kube-apiserver.

A user whose claim never gets network data runs `kubectl describe`; these
tests check that the publisher leaves exactly one Warning there per failure
(regarding the claim when it knows it, else the pod), that a failure loop does
not flood the API, and that `--no-emit-events` really posts nothing.
"""

from __future__ import annotations

import time

import pytest

from cni_plugin.wire.event import PodRef
from publisher_testkit import (DRIVER, Cluster, Plugin, add, drained, send_check, take_interface_name, wait_until,
                               suffix)

pytestmark = pytest.mark.controlplane

def wait_metric(publisher, name: str, value: float, timeout: float = 20.0) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if publisher.metric(name) >= value:
            return
        time.sleep(0.1)
    raise AssertionError(f"{name} never reached {value}: {publisher.metric(name)}")


def test_repeated_apply_refusal_makes_one_event_within_the_window(cluster: Cluster, publisher, plugin):
    claim, uid = cluster.pod_with_claim("web", [("nic", "nic0")])
    pod, cid = PodRef(cluster.namespace, "web", uid), "c" + suffix()
    add(plugin, cid, pod)
    cluster.wait_devices(claim, lambda d: len(d) == 1)
    take_interface_name(cluster, claim)
    send_check(publisher, cid, pod, "mtu differs")
    cluster.wait_warnings(lambda e: len(e) == 1)
    send_check(publisher, cid, pod, "mtu still differs")  # the same refusal again
    wait_metric(publisher, 'netclaim_apply_errors_total{code="409"}', 2)
    wait_metric(publisher, 'netclaim_k8s_events_total{result="deduplicated"}', 1)
    time.sleep(1.0)  # a second Event, if any were posted, would be visible by now
    [warning] = cluster.warnings()
    assert warning["reason"] == "ApplyRejected" and warning["regarding"]["name"] == claim
    assert publisher.metric('netclaim_k8s_events_total{result="created"}') == 1


def test_pod_uid_mismatch_gets_an_event_on_the_pod(cluster: Cluster, publisher, plugin):
    """The event names a pod UID the pod of that name does not have: never resolvable, reported on the pod."""
    claim, uid = cluster.pod_with_claim("mismatch", [("nic", "nic0")])
    cid = "c" + suffix()
    add(plugin, cid, PodRef(cluster.namespace, "mismatch", "0000-not-" + uid[9:]))
    drained(publisher)
    [warning] = cluster.wait_warnings(lambda e: len(e) == 1)
    assert (warning["type"], warning["reason"]) == ("Warning", "Unresolvable")
    assert warning["regarding"]["kind"] == "Pod" and warning["regarding"]["name"] == "mismatch"
    assert "related" not in warning or warning["related"] is None
    assert f"has uid {uid}" in warning["note"] and cid in warning["note"]
    assert publisher.status()["failed_events"] and cluster.devices(claim) == []


def test_claim_without_a_device_for_the_request_is_no_failure(cluster: Cluster, publisher, plugin):
    """The pod's claim has a device of the driver, but none for this entry's request: with one conflist per
    network (containerd's max_conf_num) every pod gets every interface, and a pod that claimed a device
    only for eth0 is no failure on eth1: no Warning, no failed event, the eth0 entry shown, a counter."""
    claim, uid = cluster.pod_with_claim("one-net", [("nic", "nic0")])
    pod, cid = PodRef(cluster.namespace, "one-net", uid), "c" + suffix()
    add(plugin, cid, pod, ifname="eth0", request_name="nic", res={"ifname": "eth0"})
    add(plugin, cid, pod, ifname="eth1", request_name="nic1", res={"ifname": "eth1", "ipv4": "10.78.0.5/24"})
    wait_until("the eth1 ADD counted as nothing to publish",
               lambda: publisher.metric('netclaim_events_ignored_total{reason="no_request"}') >= 1)
    st = drained(publisher)
    [entry] = cluster.devices(claim)
    assert (entry["device"], entry["networkData"]["interfaceName"]) == ("nic0", "eth0")
    assert st["failed_events"] == [] and st["last_error"] is None
    time.sleep(1.0)  # a Warning, if any were posted, would be visible by now
    assert cluster.warnings() == [] and publisher.metric("netclaim_k8s_events_total") == 0


def test_ambiguous_device_gets_an_event_on_the_claim(cluster: Cluster, publisher, plugin):
    claim, uid = cluster.pod_with_claim("two", [("nic-a", "nic0"), ("nic-b", "nic1")])
    add(plugin, "c" + suffix(), PodRef(cluster.namespace, "two", uid), request_name="")
    [warning] = cluster.wait_warnings(lambda e: len(e) == 1)
    assert cluster.devices(claim) == []
    # Not dropped: it waits (and is retried) in case the claim changes.
    assert "ambiguous" in publisher.status()["oldest_pending"]["last_error"]
    assert warning["reason"] == "AmbiguousDevice"
    assert (warning["regarding"]["kind"], warning["regarding"]["name"]) == ("ResourceClaim", claim)
    assert warning["related"]["uid"] == uid
    assert "node-a/nic0, node-a/nic1" in warning["note"]


def test_no_emit_events_posts_nothing(cluster: Cluster, publisher_factory, workdir):
    publisher = publisher_factory(extra=["--no-emit-events"])
    plugin = Plugin(publisher.socket, publisher.spool, workdir)
    _, uid = cluster.pod_with_claim("bare", [("nic", "nic0")])
    add(plugin, "c" + suffix(), PodRef(cluster.namespace, "bare", "0000-not-" + uid[9:]))
    st = drained(publisher)
    assert f"has uid {uid}" in st["failed_events"][0]["error"]
    wait_metric(publisher, 'netclaim_k8s_events_total{result="disabled"}', 1)  # told just after the journal
    assert publisher.metric('netclaim_k8s_events_total{result="disabled"}') == 1
    time.sleep(1.0)
    assert cluster.warnings() == []
