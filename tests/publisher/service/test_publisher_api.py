"""The publisher against the real kube-apiserver, with the real plugin binary as the client.

Events come from `netclaim` run exactly as a runtime runs it (CNI env + stdin
with a prevResult that already carries the MAC, so no netns is needed here;
the netns path is in test_publisher_netns.py).
"""

from __future__ import annotations

import time

import pytest

from cni_plugin.wire.event import PodRef
from publisher_testkit import DRIVER, Cluster, Plugin, add, apply_as, drained, suffix, wait_until

pytestmark = pytest.mark.controlplane


def delete(plugin: Plugin, cid: str, pod: PodRef, **kw) -> None:
    out = plugin.run("DEL", cid, pod, None, **kw)
    assert out.returncode == 0, f"plugin DEL failed: {out.stdout} {out.stderr}"


def ours(devices: list[dict]) -> list[dict]:
    return [d for d in devices if d["driver"] == DRIVER]


def test_add_publishes_canonical_ips_mac_and_ready(cluster: Cluster, publisher, plugin):
    claim, uid = cluster.pod_with_claim("web", [("nic", "nic0")])
    pod = PodRef(cluster.namespace, "web", uid)
    add(plugin, "c" + suffix(), pod, res={"ipv6": "fd00:0077:0000:0000::5/64", "mac": "0A:58:0A:4D:00:05"})
    devices = cluster.wait_devices(claim, lambda d: len(d) == 1)
    d = devices[0]
    assert (d["driver"], d["pool"], d["device"]) == (DRIVER, "node-a", "nic0")
    assert d["networkData"] == {"interfaceName": "eth0", "ips": ["10.77.0.5/24", "fd00:77::5/64"],
                                "hardwareAddress": "0a:58:0a:4d:00:05"}
    ready = d["conditions"][0]
    assert (ready["type"], ready["status"], ready["reason"]) == ("Ready", "True", "NetworkConfigured")
    assert d["data"]["network"] == "testnet"
    deadline = time.time() + 10  # the log line follows the apply (and the journal commit) by a moment
    while not (published := [e for e in publisher.log_events() if e.get("msg") == "published"]) \
            and time.time() < deadline:
        time.sleep(0.05)
    assert published and published[0]["claim"] == f"{cluster.namespace}/{claim}"
    assert published[0]["pod"] == f"{cluster.namespace}/web" and published[0]["containerID"].startswith("c")


def test_repeated_identical_add_writes_nothing(cluster: Cluster, publisher, plugin):
    claim, uid = cluster.pod_with_claim("web", [("nic", "nic0")])
    pod, cid = PodRef(cluster.namespace, "web", uid), "c" + suffix()
    add(plugin, cid, pod)
    cluster.wait_devices(claim, lambda d: len(d) == 1)
    drained(publisher)
    before = publisher.metrics()
    add(plugin, cid, pod)
    drained(publisher)
    after = publisher.metrics()

    def api(m):  # gets and applies (the node's pod watch is not per ADD)
        return sum(v for k, v in m.items() if k.startswith("netclaim_api_requests_total")
                   and ('verb="get"' in k or 'verb="apply"' in k))
    assert api(after) == api(before)
    assert after["netclaim_apply_skips_total"] == before["netclaim_apply_skips_total"] + 1


def test_two_devices_of_one_claim_both_kept(cluster: Cluster, publisher, plugin):
    claim, uid = cluster.pod_with_claim("multi", [("nic-a", "nic0"), ("nic-b", "nic1")])
    pod, cid = PodRef(cluster.namespace, "multi", uid), "c" + suffix()
    add(plugin, cid, pod, ifname="eth0", request_name="nic-a", res={"ifname": "eth0", "ipv4": "10.77.0.5/24"})
    add(plugin, cid, pod, ifname="net1", request_name="nic-b",
        res={"ifname": "net1", "ipv4": "10.78.0.5/24", "ipv6": None, "mac": "0a:58:0a:4e:00:05"})
    devices = cluster.wait_devices(claim, lambda d: len(d) == 2)
    by_device = {d["device"]: d["networkData"] for d in devices}
    assert by_device["nic0"]["interfaceName"] == "eth0" and by_device["nic0"]["ips"][0] == "10.77.0.5/24"
    assert by_device["nic1"] == {"interfaceName": "net1", "ips": ["10.78.0.5/24"], "hardwareAddress": "0a:58:0a:4e:00:05"}
    delete(plugin, cid, pod, ifname="eth0", request_name="nic-a")
    devices = cluster.wait_devices(claim, lambda d: len(d) == 1)
    assert devices[0]["device"] == "nic1"


def test_other_managers_entry_untouched_and_del_removes_ours(cluster: Cluster, publisher, plugin):
    claim = "shared-net"
    cluster.claim(claim, ("nic", "gpu"))
    uid = cluster.pod("shared", [claim])
    status = {"allocation": {
        "devices": {"results": [
            {"request": "nic", "driver": DRIVER, "pool": "node-a", "device": "nic0"},
            {"request": "gpu", "driver": "gpu.example.com", "pool": "node-a", "device": "gpu0"}]},
        "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
            {"key": "metadata.name", "operator": "In", "values": ["node-a"]}]}]}},
        "reservedFor": [{"resource": "pods", "name": "shared", "uid": uid}]}
    cluster.resource.patch_namespaced_resource_claim_status(claim, cluster.namespace, {"status": status},
                                                            _content_type="application/merge-patch+json")
    other = {"driver": "gpu.example.com", "pool": "node-a", "device": "gpu0",
             "conditions": [{"type": "Ready", "status": "True", "reason": "GPUReady", "message": "gpu",
                             "lastTransitionTime": "2026-01-01T00:00:00Z"}], "data": {"by": "gpu-driver"}}
    cluster.resource.patch_namespaced_resource_claim_status(
        claim, cluster.namespace,
        {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
         "metadata": {"name": claim, "namespace": cluster.namespace}, "status": {"devices": [other]}},
        field_manager="gpu.example.com", _content_type="application/apply-patch+yaml")
    pod, cid = PodRef(cluster.namespace, "shared", uid), "c" + suffix()
    add(plugin, cid, pod)
    devices = cluster.wait_devices(claim, lambda d: len(d) == 2)
    gpu = [d for d in devices if d["driver"] == "gpu.example.com"][0]
    assert gpu["data"] == {"by": "gpu-driver"} and gpu["conditions"][0]["reason"] == "GPUReady"
    delete(plugin, cid, pod)
    devices = cluster.wait_devices(claim, lambda d: len(d) == 1)
    assert devices[0]["driver"] == "gpu.example.com" and devices[0]["data"] == {"by": "gpu-driver"}


def test_stale_del_after_newer_add_keeps_the_newer_entry(cluster: Cluster, publisher, plugin):
    claim, uid = cluster.pod_with_claim("web", [("nic", "nic0")])
    pod = PodRef(cluster.namespace, "web", uid)
    old, new = "old" + suffix(), "new" + suffix()
    add(plugin, old, pod, res={"ipv4": "10.77.0.5/24"})
    cluster.wait_devices(claim, lambda d: len(d) == 1 and d[0]["data"]["containerID"] == old)
    add(plugin, new, pod, res={"ipv4": "10.77.0.6/24"})
    cluster.wait_devices(claim, lambda d: len(d) == 1 and d[0]["data"]["containerID"] == new)
    delete(plugin, old, pod)  # the runtime cleans up the old sandbox after the new one started
    drained(publisher)
    devices = cluster.devices(claim)
    assert len(devices) == 1 and devices[0]["data"]["containerID"] == new
    assert devices[0]["networkData"]["ips"][0] == "10.77.0.6/24"
    delete(plugin, new, pod)
    cluster.wait_devices(claim, lambda d: d == [])


def test_add_before_allocation_is_published_once_allocated(cluster: Cluster, publisher, plugin):
    claim = "late-net"
    cluster.claim(claim)
    uid = cluster.pod("late", [claim])
    add(plugin, "c" + suffix(), PodRef(cluster.namespace, "late", uid))
    time.sleep(1.5)
    assert cluster.devices(claim) == []
    assert publisher.status()["journal_depth"] == 1
    cluster.allocate(claim, [("nic", "nic0")], "late", uid)
    cluster.wait_devices(claim, lambda d: len(d) == 1)


def test_unresolvable_event_is_reported_after_the_timeout(cluster: Cluster, publisher_factory, workdir):
    publisher = publisher_factory(extra=["--resolve-timeout", "2"])
    plugin = Plugin(publisher.socket, publisher.spool, workdir)
    add(plugin, "c" + suffix(), PodRef(cluster.namespace, "never-created", "uid-x"))
    st = drained(publisher, timeout=30)
    assert st["failed_events"] and "not visible" in st["failed_events"][0]["error"]
    # Counted just after the journal marks the event failed (which `drained` sees): wait for it.
    wait_until("the failure counted", lambda: publisher.metric('netclaim_events_failed_total{reason="unresolved"}'))
    assert publisher.metric('netclaim_events_failed_total{reason="unresolved"}') == 1
    [warning] = cluster.wait_warnings(lambda e: len(e) == 1)
    assert warning["reason"] == "Unresolvable" and "not visible" in warning["note"]
    assert warning["regarding"] == {"apiVersion": "v1", "kind": "Pod", "namespace": cluster.namespace,
                                    "name": "never-created", "uid": "uid-x"}


def test_claim_allocated_to_another_node_is_not_written(cluster: Cluster, publisher, plugin):
    claim = "elsewhere"
    cluster.claim(claim)
    uid = cluster.pod("elsewhere", [claim])
    cluster.allocate(claim, [("nic", "nic0")], "elsewhere", uid, node="node-b")
    add(plugin, "c" + suffix(), PodRef(cluster.namespace, "elsewhere", uid))
    st = drained(publisher)
    assert "node-b" in st["failed_events"][0]["error"]
    assert cluster.devices(claim) == []
    [warning] = cluster.wait_warnings(lambda e: len(e) == 1)
    assert warning["reason"] == "AllocatedToOtherNode" and "node-b" in warning["note"]
    assert (warning["regarding"]["kind"], warning["regarding"]["name"]) == ("ResourceClaim", claim)
    assert warning["related"]["name"] == "elsewhere" and warning["related"]["uid"] == uid


def test_refused_apply_is_reported_and_not_retried_forever(cluster: Cluster, publisher, plugin):
    claim, uid = cluster.pod_with_claim("web", [("nic", "nic0")])
    # Another manager already owns our device's interface name: with force off the API answers 409.
    apply_as(cluster, claim, "someone-else", [{"driver": DRIVER, "pool": "node-a", "device": "nic0",
                                               "networkData": {"interfaceName": "other0"}}])
    pod, cid = PodRef(cluster.namespace, "web", uid), "c" + suffix()
    add(plugin, cid, pod)
    st = drained(publisher)
    key = f"{cluster.namespace}/{claim}"
    assert st["claims"][key]["state"] == "error"
    assert st["claims"][key]["error"].startswith("409: ")
    applies = publisher.metric('netclaim_api_requests_total{code="409",verb="apply"}')
    assert applies == 1
    # Its latency is in the histogram, under the same verb and code.
    assert publisher.metric('netclaim_api_request_duration_seconds_count{code="409",verb="apply"}') == 1
    assert publisher.metric('netclaim_api_request_duration_seconds_bucket{code="409",le="30.0",verb="apply"}') == 1
    time.sleep(3)
    assert publisher.metric('netclaim_api_requests_total{code="409",verb="apply"}') == applies
    assert publisher.metric('netclaim_apply_errors_total{code="409"}') == 1
    # ... and it is where `kubectl describe resourceclaim` looks: one Warning Event.
    api_message = st["claims"][key]["error"].split(": ", 1)[1]
    [warning] = cluster.wait_warnings(lambda e: len(e) >= 1)
    assert (warning["type"], warning["reason"], warning["action"]) == ("Warning", "ApplyRejected",
                                                                       "PublishDeviceStatus")
    assert warning["regarding"]["kind"] == "ResourceClaim" and warning["regarding"]["name"] == claim
    assert warning["regarding"]["uid"] == cluster.resource.read_namespaced_resource_claim(
        claim, cluster.namespace).metadata.uid
    assert warning["related"] == {"apiVersion": "v1", "kind": "Pod", "namespace": cluster.namespace,
                                  "name": "web", "uid": uid}
    assert api_message[:200] in warning["note"] and "(409)" in warning["note"] and cid[:12] in warning["note"]
    assert warning["reportingInstance"] == "netclaim/node-a"
    # Counted when the API server's answer to the POST arrives, a moment after the Event is visible.
    wait_until("the Event counted", lambda: publisher.metric('netclaim_k8s_events_total{result="created"}') >= 1)
    assert publisher.metric('netclaim_k8s_events_total{result="created"}') == 1


def test_resync_repairs_a_wiped_status(cluster: Cluster, publisher_factory, workdir):
    publisher = publisher_factory(extra=["--resync-interval", "1"])
    plugin = Plugin(publisher.socket, publisher.spool, workdir)
    claim, uid = cluster.pod_with_claim("web", [("nic", "nic0")])
    add(plugin, "c" + suffix(), PodRef(cluster.namespace, "web", uid))
    first = cluster.wait_devices(claim, lambda d: len(d) == 1)
    cluster.resource.patch_namespaced_resource_claim_status(
        claim, cluster.namespace, {"status": {"devices": []}}, _content_type="application/merge-patch+json")
    repaired = cluster.wait_devices(claim, lambda d: len(d) == 1, timeout=20)
    assert repaired[0]["networkData"] == first[0]["networkData"]


def test_resync_drops_attachments_of_deleted_pods(cluster: Cluster, publisher_factory, workdir):
    publisher = publisher_factory(extra=["--resync-interval", "1"])
    plugin = Plugin(publisher.socket, publisher.spool, workdir)
    claim, uid = cluster.pod_with_claim("web", [("nic", "nic0")])
    add(plugin, "c" + suffix(), PodRef(cluster.namespace, "web", uid))
    cluster.wait_devices(claim, lambda d: len(d) == 1)
    cluster.core.delete_namespaced_pod("web", cluster.namespace, grace_period_seconds=0)
    cluster.wait_devices(claim, lambda d: d == [], timeout=20)
    assert publisher.status()["attachments"] == 0


def test_gc_removes_attachments_not_in_the_valid_list(cluster: Cluster, publisher, plugin):
    keep_claim, keep_uid = cluster.pod_with_claim("keep", [("nic", "nic0")])
    gone_claim, gone_uid = cluster.pod_with_claim("gone", [("nic", "nic0")])
    keep, gone = "keep" + suffix(), "gone" + suffix()
    add(plugin, keep, PodRef(cluster.namespace, "keep", keep_uid))
    add(plugin, gone, PodRef(cluster.namespace, "gone", gone_uid))
    cluster.wait_devices(keep_claim, lambda d: len(d) == 1)
    cluster.wait_devices(gone_claim, lambda d: len(d) == 1)
    conf = plugin.conf(None)
    conf["cni.dev/valid-attachments"] = [{"containerID": keep, "ifname": "eth0"}]
    out = plugin.run("GC", "", None, conf=conf)
    assert out.returncode == 0, out.stdout + out.stderr
    cluster.wait_devices(gone_claim, lambda d: d == [])
    assert len(cluster.devices(keep_claim)) == 1


def test_publisher_absent_during_adds_spools_then_publishes(cluster: Cluster, publisher_factory, workdir):
    publisher = publisher_factory(start=False)
    plugin = Plugin(publisher.socket, publisher.spool, workdir)
    claims = []
    for i in range(5):
        claim, uid = cluster.pod_with_claim(f"p{i}", [("nic", "nic0")])
        add(plugin, f"c{i}" + suffix(), PodRef(cluster.namespace, f"p{i}", uid))
        claims.append(claim)
    import os
    assert len(os.listdir(publisher.spool)) == 5
    publisher.start()
    for claim in claims:
        cluster.wait_devices(claim, lambda d: len(d) == 1)
    assert os.listdir(publisher.spool) == []
