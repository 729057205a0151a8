"""Several devices under one request: each interface's entry goes to the device whose ID it was handed.

dra-driver-sriov's multi-VF shape: one request `vf` with `count: 2`, the same network twice.
Multus hands each delegate the device ID of one allocated VF, in sorted-ID order, whatever
order the allocation lists them in; the request name cannot tell them apart. Real plugin, real
kube-apiserver with ResourceSlices carrying the IDs as a driver publishes them.
"""

from __future__ import annotations

import pytest

from cni_plugin.wire.event import PodRef
from publisher_testkit import (DRIVER, MERGE, NO_NETNS, Cluster, Plugin, cni_result, resynced, suffix, wait_until)

FAST = ["--spool-interval", "0.2", "--resync-interval", "1", "--retry-max-delay", "1"]


def _slice(cluster: Cluster, pool: str, devices: dict[str, dict[str, str]], name: str = "", generation: int = 1,
           count: int = 1) -> dict:
    """A ResourceSlice of this node: device name -> {attribute: string value}. The API lists
    slices in name order: `name` (a suffix) decides where this one comes."""
    body = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": f"{cluster.namespace}-{pool}{'-' + name if name else ''}"},
            "spec": {"driver": DRIVER, "nodeName": cluster.node,
                     "pool": {"name": pool, "generation": generation, "resourceSliceCount": count},
                     "devices": [{"name": name, "attributes": {k: {"string": v} for k, v in attrs.items()}}
                                 for name, attrs in devices.items()]}}
    cluster.resource.create_resource_slice(body)
    return body


@pytest.fixture
def slices(cluster: Cluster):
    made: list[dict] = []
    yield lambda pool, devices, **kw: made.append(_slice(cluster, pool, devices, **kw))
    for body in made:
        cluster.resource.delete_resource_slice(body["metadata"]["name"])


def _vf_add(plugin: Plugin, cid: str, pod: PodRef, ifname: str, ipv4: str, mac: str, device_id: str):
    conf = plugin.conf(cni_result(ifname=ifname, ipv4=ipv4, ipv6=None, mac=mac), request_name="vf")
    conf["capabilities"] = {"deviceID": True}
    conf["runtimeConfig"] = {"deviceID": device_id}
    out = plugin.run("ADD", cid, pod, ifname=ifname, netns=NO_NETNS, conf=conf)
    assert out.returncode == 0, out.stdout + out.stderr


def _by_device(devices: list[dict]) -> dict[str, tuple[str, list[str], str]]:
    return {d["device"]: (d["networkData"]["interfaceName"], d["networkData"]["ips"],
                          d["networkData"]["hardwareAddress"]) for d in devices}


def _two_vf_pod(cluster: Cluster, pool: str) -> tuple[str, str]:
    """A claim whose request `vf` got two devices, listed in name order (vf-0, vf-3)."""
    claim, uid = f"vfs-{suffix()}", ""
    cluster.claim(claim, ("vf",))
    uid = cluster.pod("vfpod", [claim])
    cluster.allocate(claim, [("vf", "vf-0"), ("vf", "vf-3")], "vfpod", uid, pool=pool)
    return claim, uid


def test_two_devices_of_one_request_each_get_the_interface_on_their_id(cluster: Cluster, publisher, plugin,
                                                                       slices) -> None:
    # Sorted by name vf-0 < vf-3, by ID the other way round; vf-3 publishes only the PCI address.
    slices("vfpool", {"vf-0": {"k8s.cni.cncf.io/deviceID": "0000:00:05.3", "deviceID": "0x1889"},
                      "vf-3": {"resource.kubernetes.io/pciBusID": "0000:00:05.0", "deviceID": "0x1889"}})
    claim, uid = _two_vf_pod(cluster, "vfpool")
    pod, cid = PodRef(cluster.namespace, "vfpod", uid), "c" + suffix()
    _vf_add(plugin, cid, pod, "net1", "10.81.0.5/24", "0a:58:0a:51:00:05", "00:05.0")  # short form
    _vf_add(plugin, cid, pod, "net2", "10.82.0.5/24", "0a:58:0a:52:00:05", "0000:00:05.3")
    devices = cluster.wait_devices(claim, lambda d: len(d) == 2)
    assert _by_device(devices) == {"vf-3": ("net1", ["10.81.0.5/24"], "0a:58:0a:51:00:05"),
                                   "vf-0": ("net2", ["10.82.0.5/24"], "0a:58:0a:52:00:05")}
    assert cluster.warnings() == []


def test_an_id_no_allocated_device_carries_is_refused_with_the_reason_not_guessed(cluster: Cluster, publisher,
                                                                                  plugin, slices) -> None:
    slices("vfpool", {"vf-0": {"k8s.cni.cncf.io/deviceID": "0000:00:05.3"},
                      "vf-3": {"k8s.cni.cncf.io/deviceID": "0000:00:05.0"},
                      "vf-9": {"k8s.cni.cncf.io/deviceID": "0000:00:05.7"}})
    claim, uid = _two_vf_pod(cluster, "vfpool")
    pod = PodRef(cluster.namespace, "vfpod", uid)
    # 05.7 is a device of the node, but not one allocated to this claim.
    _vf_add(plugin, "c" + suffix(), pod, "net1", "10.81.0.5/24", "0a:58:0a:51:00:05", "0000:00:05.7")
    warned = cluster.wait_warnings(lambda w: any(e.get("reason") == "DeviceIDNotAllocated" for e in w))
    note = next(e for e in warned if e.get("reason") == "DeviceIDNotAllocated")["note"]
    assert "0000:00:05.7" in note and "vfpool/vf-0=0000:00:05.3" in note and "vfpool/vf-3=0000:00:05.0" in note, note
    assert cluster.devices(claim) == []


def test_a_reallocated_claim_keeps_each_interface_on_the_device_with_its_id(cluster: Cluster, publisher_factory,
                                                                          workdir, slices) -> None:
    """The driver republished its VFs under new names: the claim is allocated again with them,
    and each interface, still on its VF, follows the ID to the new device name."""
    publisher = publisher_factory(extra=FAST)
    plugin = Plugin(publisher.socket, publisher.spool, workdir)
    slices("vfpool", {"vf-0": {"k8s.cni.cncf.io/deviceID": "0000:00:05.3"},
                      "vf-3": {"k8s.cni.cncf.io/deviceID": "0000:00:05.0"}})
    claim, uid = _two_vf_pod(cluster, "vfpool")
    pod, cid = PodRef(cluster.namespace, "vfpod", uid), "c" + suffix()
    _vf_add(plugin, cid, pod, "net1", "10.81.0.5/24", "0a:58:0a:51:00:05", "0000:00:05.0")
    _vf_add(plugin, cid, pod, "net2", "10.82.0.5/24", "0a:58:0a:52:00:05", "0000:00:05.3")
    cluster.wait_devices(claim, lambda d: len(d) == 2)
    slices("vfpool2", {"a": {"k8s.cni.cncf.io/deviceID": "0000:00:05.0"},
                       "b": {"k8s.cni.cncf.io/deviceID": "0000:00:05.3"}})
    cluster.resource.patch_namespaced_resource_claim_status(
        claim, cluster.namespace, {"status": {"reservedFor": None, "allocation": None}}, _content_type=MERGE)
    resynced(publisher)  # the publisher has seen the claim deallocated
    cluster.allocate(claim, [("vf", "b"), ("vf", "a")], "vfpod", uid, pool="vfpool2")
    devices = cluster.wait_devices(claim, lambda d: {e["device"] for e in d} == {"a", "b"})
    assert {k: v[0] for k, v in _by_device(devices).items()} == {"a": "net1", "b": "net2"}


# Before and after a driver re-enumerated its VFs: the same PCI addresses, on the other device.
BEFORE = {"vf-0": {"k8s.cni.cncf.io/deviceID": "0000:00:05.0"}, "vf-3": {"k8s.cni.cncf.io/deviceID": "0000:00:05.3"}}
AFTER = {"vf-0": {"k8s.cni.cncf.io/deviceID": "0000:00:05.3"}, "vf-3": {"k8s.cni.cncf.io/deviceID": "0000:00:05.0"}}


def test_a_pool_republished_at_a_new_generation_maps_by_the_new_ids_while_the_old_slice_remains(
        cluster: Cluster, publisher, plugin, slices) -> None:
    # The old generation is still there and lists after the new one (names sort a < b).
    slices("vfpool", AFTER, name="a", generation=2)
    slices("vfpool", BEFORE, name="b", generation=1)
    claim, uid = _two_vf_pod(cluster, "vfpool")
    pod, cid = PodRef(cluster.namespace, "vfpod", uid), "c" + suffix()
    _vf_add(plugin, cid, pod, "net1", "10.81.0.5/24", "0a:58:0a:51:00:05", "0000:00:05.0")
    _vf_add(plugin, cid, pod, "net2", "10.82.0.5/24", "0a:58:0a:52:00:05", "0000:00:05.3")
    devices = cluster.wait_devices(claim, lambda d: len(d) == 2)
    assert {k: v[0] for k, v in _by_device(devices).items()} == {"vf-3": "net1", "vf-0": "net2"}


def test_a_new_generation_still_missing_slices_is_waited_for_not_guessed_from(cluster: Cluster, publisher, plugin,
                                                                              slices) -> None:
    slices("vfpool", BEFORE, name="b", generation=1)
    # Generation 2 says it has two slices; the driver has written the first one only.
    slices("vfpool", {"vf-0": AFTER["vf-0"]}, name="a1", generation=2, count=2)
    claim, uid = _two_vf_pod(cluster, "vfpool")
    pod = PodRef(cluster.namespace, "vfpod", uid)
    _vf_add(plugin, "c" + suffix(), pod, "net1", "10.81.0.5/24", "0a:58:0a:51:00:05", "0000:00:05.0")
    def waiting() -> list[dict]:
        return [e for e in publisher.log_events() if e.get("msg") == "event not resolvable yet, retrying"
                and "being republished" in e.get("error", "") and "has 1 of its 2 ResourceSlices" in e["error"]]

    wait_until("the publisher to wait for the pool's slices, or to publish", lambda: waiting() or cluster.devices(claim))
    assert cluster.devices(claim) == []  # not the old generation's vf-0, which carried 05.0
    assert waiting()
    slices("vfpool", {"vf-3": AFTER["vf-3"]}, name="a2", generation=2, count=2)
    devices = cluster.wait_devices(claim, lambda d: len(d) == 1, timeout=60.0)
    assert {k: v[0] for k, v in _by_device(devices).items()} == {"vf-3": "net1"}
    assert cluster.warnings() == []
