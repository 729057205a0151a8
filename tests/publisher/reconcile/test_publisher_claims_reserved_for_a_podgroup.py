"""A claim reserved for a PodGroup (KEP-5729) is published for every pod of that group, and only for them.

With DRAWorkloadResourceClaims on, the scheduler reserves a claim that a PodGroup shares for the
group itself: one `reservedFor` entry `scheduling.k8s.io/podgroups <name> <uid>`, no entry per pod.
The kubelet starts each pod whose `spec.schedulingGroup.podGroupName` names the group, so the
publisher must take such a claim as reserved for each of them, and still refuse a pod outside the
group. Real plugin, real kube-apiserver (serving PodGroups and schedulingGroup: scripts/control-plane.sh),
a real PodGroup object whose UID the reservation carries, the allocation written as the scheduler would.

The group's claim holds one VF per pod under one request (`vf`, count 2): each pod's interface is
told apart by the VF's device ID, which the driver publishes in its ResourceSlice.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from cni_plugin.wire.event import PodRef
from podgroup_kit import group_pod, podgroup, reserve_for_group
from publisher_testkit import DRIVER, NO_NETNS, Cluster, Plugin, cni_result, suffix

@pytest.fixture
def vf_slice(cluster: Cluster) -> Iterator[str]:
    """This node's ResourceSlice with two VFs and their PCI addresses; the pool's name."""
    pool = f"{cluster.namespace}-vfs"
    body = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": pool},
            "spec": {"driver": DRIVER, "nodeName": cluster.node,
                     "pool": {"name": pool, "generation": 1, "resourceSliceCount": 1},
                     "devices": [{"name": f"vf-{i}",
                                  "attributes": {"k8s.cni.cncf.io/deviceID": {"string": f"0000:00:05.{i}"}}}
                                 for i in (0, 1)]}}
    cluster.resource.create_resource_slice(body)
    yield pool
    cluster.resource.delete_resource_slice(pool)


def _vf_add(plugin: Plugin, pod: PodRef, cid: str, ipv4: str, device_id: str) -> None:
    """The real plugin's ADD of a VF interface, with the device ID Multus hands it."""
    conf = plugin.conf(cni_result(ifname="net1", ipv4=ipv4, ipv6=None), request_name="vf")
    conf["capabilities"] = {"deviceID": True}
    conf["runtimeConfig"] = {"deviceID": device_id}
    out = plugin.run("ADD", cid, pod, ifname="net1", netns=NO_NETNS, conf=conf)
    assert out.returncode == 0, out.stdout + out.stderr


def test_each_pod_of_the_podgroup_gets_its_entry_and_a_pod_outside_it_is_refused(
        cluster: Cluster, publisher_factory, workdir, vf_slice) -> None:
    publisher = publisher_factory(extra=["--resolve-timeout", "3"])
    plugin = Plugin(publisher.socket, publisher.spool, workdir)
    claim, group = f"shared-{suffix()}", f"train-{suffix()}"
    cluster.claim(claim, ("vf",))
    group_obj = podgroup(cluster, group, claim)
    members = {name: group_pod(cluster, name, claim, group) for name in ("worker-0", "worker-1")}
    outsider = group_pod(cluster, "outsider", claim, None)  # uses the claim by name, in no PodGroup
    reserve_for_group(cluster, claim, vf_slice, [("vf", "vf-0"), ("vf", "vf-1")], group_obj)

    cids = {name: "c" + suffix() for name in (*members, "outsider")}
    _vf_add(plugin, PodRef(cluster.namespace, "worker-0", members["worker-0"]), cids["worker-0"],
            "10.81.0.10/24", "0000:00:05.0")
    _vf_add(plugin, PodRef(cluster.namespace, "worker-1", members["worker-1"]), cids["worker-1"],
            "10.81.0.11/24", "0000:00:05.1")
    # The positive control: the same claim, the same node, a free VF's ID, but the pod is not the group's.
    _vf_add(plugin, PodRef(cluster.namespace, "outsider", outsider), cids["outsider"], "10.81.0.12/24",
            "0000:00:05.1")

    devices = cluster.wait_devices(claim, lambda d: len(d) == 2)
    shown = {d["device"]: (d["data"]["containerID"], d["networkData"]["ips"]) for d in devices}
    assert shown == {"vf-0": (cids["worker-0"], ["10.81.0.10/24"]), "vf-1": (cids["worker-1"], ["10.81.0.11/24"])}

    warned = cluster.wait_warnings(lambda w: any(e["regarding"].get("name") == "outsider" for e in w))
    [refusal] = [e for e in warned if e["regarding"].get("name") == "outsider"]
    assert f"claim {cluster.namespace}/{claim} is not reserved for the pod" in refusal["note"], refusal
    # Both members were published without a Warning, and the outsider's refusal changed nothing on the claim.
    assert [e["regarding"].get("name") for e in warned] == ["outsider"], warned
    assert {d["data"]["containerID"] for d in cluster.devices(claim)} == {cids["worker-0"], cids["worker-1"]}
