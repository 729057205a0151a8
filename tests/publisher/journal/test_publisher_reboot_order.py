"""A reboot whose clock is behind the previous boot's, through the real publisher and the real
API server.

The events of the previous boot carry that boot's id and a wall clock AHEAD of this
boot's (a bad RTC, a restored VM, NTP not stepped yet), exactly what the plugin
stamped before the reboot and what a late channel (the spool) delivers afterwards.
Their sandboxes died with that boot: whatever the wall clocks say, such an event
changes nothing in this boot (the boot rule, docs/publisher.md).
"""

from __future__ import annotations

import time

import pytest

from cni_plugin.wire.event import new_order, PodRef
from cni_plugin.wire.frame import event_request
from publisher_testkit import DRIVER, Cluster, Publisher, cni_result, drained, request, suffix, wire_event

pytestmark = pytest.mark.controlplane

AHEAD_NS = 3600 * 10**9  # the previous boot's wall clock was an hour ahead of this boot's


def old_boot_stamp() -> list:
    """A stamp of the previous boot: its own CLOCK_BOOTTIME, a wall clock an hour ahead."""
    return ["previous-boot-" + suffix(), 9_000 * 10**9, time.time_ns() + AHEAD_NS]


def send(publisher: Publisher, event) -> None:
    assert request(publisher.socket, event_request(event))["ok"] is True


def shown(devices: list[dict]) -> set[str]:
    return {d["data"]["containerID"] for d in devices if d["driver"] == DRIVER}


def setup_pod(cluster: Cluster, name: str) -> tuple[str, PodRef]:
    claim, uid = cluster.pod_with_claim(name, [("nic", "nic0")])
    return claim, PodRef(cluster.namespace, name, uid)


def test_an_add_of_the_previous_boot_delivered_late_never_shows_whatever_its_wall_clock(
        cluster: Cluster, publisher):
    claim, pod = setup_pod(cluster, "rebooted")
    old, new = "old" + suffix(), "new" + suffix()
    send(publisher, wire_event("ADD", old, pod, cni_result(ipv4="10.77.0.5/24"), order=old_boot_stamp()))
    drained(publisher)
    assert shown(cluster.devices(claim)) == set(), "a sandbox of the previous boot (dead) was published"
    assert publisher.metric('netclaim_events_ignored_total{reason="earlier_boot"}') == 1
    send(publisher, wire_event("ADD", new, pod, cni_result(ipv4="10.77.0.6/24", mac="0a:58:0a:4d:00:06"),
                               order=new_order()))
    devices = cluster.wait_devices(claim, lambda d: shown(d) == {new})
    assert devices[0]["networkData"]["hardwareAddress"] == "0a:58:0a:4d:00:06"
    # A DEL of the previous boot's sandbox arriving now (the runtime cleans up after the reboot,
    # with the old stamp) must not touch this boot's sandbox.
    send(publisher, wire_event("DEL", old, pod, order=old_boot_stamp()))
    drained(publisher)
    assert shown(cluster.devices(claim)) == {new}


def test_a_gc_of_the_previous_boot_delivered_late_does_not_fence_new_adds(cluster: Cluster, publisher):
    claim, pod = setup_pod(cluster, "fenced")
    # The runtime's GC of the previous boot (nothing valid), delivered late ...
    send(publisher, wire_event("GC", "*", None, ifname="*", valid_attachments=[], order=old_boot_stamp()))
    drained(publisher)
    # ... then kubelet starts the pod's sandbox in this boot.
    new = "new" + suffix()
    send(publisher, wire_event("ADD", new, pod, cni_result(), order=new_order()))
    drained(publisher)
    assert shown(cluster.devices(claim)) == {new}, "the old boot's GC fence hid a sandbox of this boot"
