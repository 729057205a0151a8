"""Warning Events for permanent failures, on the real kube-apiserver.

A user whose claim never gets network data runs `kubectl describe`; these
tests check that the publisher leaves exactly one Warning there per failure
(regarding the claim when it knows it, else the pod), that a failure loop does
not flood the API, and that `--no-emit-events` really posts nothing.
"""

from __future__ import annotations

import time

import pytest

from cni_plugin.wire import PodRef
from publisher_testkit import (DRIVER, Cluster, Plugin, add, drained, send_check, take_interface_name,
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


def test_claim_without_a_device_for_the_request_gets_an_event_on_the_pod(cluster: Cluster, publisher, plugin):
    """The pod's claim has a device of the driver, but none for the configured request: a real
    failure (a pod with no claim of the driver is no failure: test_publisher_issue16_input.py)."""
    claim, uid = cluster.pod_with_claim("mismatch", [("other-req", "nic0")])
    cid = "c" + suffix()
    add(plugin, cid, PodRef(cluster.namespace, "mismatch", uid))
    drained(publisher)
    [warning] = cluster.wait_warnings(lambda e: len(e) == 1)
    assert (warning["type"], warning["reason"]) == ("Warning", "Unresolvable")
    assert warning["regarding"] == {"apiVersion": "v1", "kind": "Pod", "namespace": cluster.namespace,
                                    "name": "mismatch", "uid": uid}
    assert "related" not in warning or warning["related"] is None
    assert f"has a device of driver {DRIVER}" in warning["note"] and cid in warning["note"]
    assert publisher.status()["failed_events"] and cluster.devices(claim) == []
    assert publisher.metric('netclaim_events_ignored_total{reason="no_claim"}') == 0


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
    _, uid = cluster.pod_with_claim("bare", [("other-req", "nic0")])
    add(plugin, "c" + suffix(), PodRef(cluster.namespace, "bare", uid))
    st = drained(publisher)
    assert f"has a device of driver {DRIVER}" in st["failed_events"][0]["error"]
    assert publisher.metric('netclaim_k8s_events_total{result="disabled"}') == 1
    time.sleep(1.0)
    assert cluster.warnings() == []
