"""A pod whose sandbox ran netclaim on one network but not on another is reported, device by device.

A secondary network whose chain does not end in netclaim leaves its device of the claim with no
entry, and nothing else says why (the pod-level unchained check sees the pod's other ADDs). The
publisher names the devices: one Warning on the pod, a counter, no request for it. Real plugin,
real kube-apiserver; the pod's Running phase is written as the kubelet would.
"""

from __future__ import annotations

from cni_plugin.wire.event import PodRef
from publisher_testkit import DRIVER, Cluster, Plugin, add, cni_result, suffix, wait_until

REASON = "NetclaimDeviceNotChained"


def _running(cluster: Cluster, pod: str) -> None:
    cluster.core.patch_namespaced_pod_status(pod, cluster.namespace, {"status": {"phase": "Running"}})


def test_a_claimed_device_no_network_attached_through_netclaim_is_named_in_a_warning(
        cluster: Cluster, publisher_factory, workdir) -> None:
    publisher = publisher_factory(extra=["--driver-name", DRIVER, "--unchained-grace", "1"])
    plugin = Plugin(publisher.socket, publisher.spool, workdir)
    # `half`: eth0 runs netclaim for request nic; the network for request storage never does.
    claim, uid = cluster.pod_with_claim("half", [("nic", "nic0"), ("storage", "nic1")])
    # `whole`: both of its networks run netclaim: nothing to report.
    whole_claim, whole_uid = cluster.pod_with_claim("whole", [("nic", "nic2"), ("storage", "nic3")])
    add(plugin, "h" + suffix(), PodRef(cluster.namespace, "half", uid))
    cid = "w" + suffix()
    add(plugin, cid, PodRef(cluster.namespace, "whole", whole_uid))
    add(plugin, cid, PodRef(cluster.namespace, "whole", whole_uid), ifname="net1", request_name="storage",
        prev=cni_result(ifname="net1", ipv4="10.78.0.5/24", ipv6=None))
    cluster.wait_devices(claim, lambda d: [e["device"] for e in d] == ["nic0"])
    cluster.wait_devices(whole_claim, lambda d: len(d) == 2)
    _running(cluster, "half")
    _running(cluster, "whole")

    warned = cluster.wait_warnings(lambda w: any(e.get("reason") == REASON for e in w), timeout=30)
    [event] = [e for e in warned if e.get("reason") == REASON]
    assert event["regarding"]["name"] == "half" and event["related"]["name"] == claim, event
    assert "nic1 (request storage)" in event["note"] and "nic0" not in event["note"], event["note"]
    wait_until("the counter", lambda: publisher.metric("netclaim_devices_unchained_reported_total") == 1)
    # The pod-level check stays quiet: the pod's sandbox did run netclaim.
    assert not [e for e in cluster.warnings() if e.get("reason") == "NetclaimNotChained"]
    assert not [e for e in cluster.warnings() if e.get("regarding", {}).get("name") == "whole"]
