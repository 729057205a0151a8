"""A pod that uses a claim through its PodGroup (KEP-5729) counts as the claim's user in the repair paths.

The claim's reservedFor names the PodGroup, not the pod. The journal's rebuild (after a newer journal
was set aside) keeps such a pod's live sandbox entry, and the check for pods started while netclaim
was not chained reports such a pod, as both do for a pod the claim names. Real kube-apiserver, a real
PodGroup, the allocation written as the scheduler would (tests/publisher/podgroup_kit.py).
"""

from __future__ import annotations

import time

from cni_plugin.wire.event import boot_id
from podgroup_kit import group_pod, podgroup, reserve_for_group
from publisher.kube.calls import Credentials, Kube
from publisher.repair.rebuild import live_attachments, node_pods
from publisher_testkit import DRIVER, Cluster, apply_as, suffix


def _kube(kubeconfig: str) -> Kube:
    return Kube(Credentials(kubeconfig).loader(kubeconfig, 4), credentials=Credentials(kubeconfig))


def test_the_rebuild_keeps_the_live_sandbox_of_a_pod_the_claim_is_reserved_for_by_its_podgroup(
        cluster: Cluster, control_plane) -> None:
    claim, group, cid = f"shared-{suffix()}", f"train-{suffix()}", "c" + suffix()
    cluster.claim(claim, ("nic",))
    group_obj = podgroup(cluster, group, claim)
    # Listed first (pods come in name order): were a pod outside the group taken for a user, the
    # sandbox would be adopted as this pod's.
    group_pod(cluster, "a-outsider", claim, None)
    member = group_pod(cluster, "worker-0", claim, group)
    reserve_for_group(cluster, claim, cluster.node, [("nic", "nic0")], group_obj)
    manager = f"netclaim/{cluster.node}"
    apply_as(cluster, claim, manager, [{
        "driver": DRIVER, "pool": cluster.node, "device": "nic0",
        "data": {"network": "testnet", "containerID": cid},
        "networkData": {"interfaceName": "eth0", "ips": ["10.77.0.5/24"]}}])

    kube = _kube(control_plane.kubeconfig)
    pods = [p for p in node_pods(kube, cluster.node) if p.namespace == cluster.namespace]
    assert sorted(p.name for p in pods) == ["a-outsider", "worker-0"]
    adopted, dead = live_attachments(kube.get_claim(cluster.namespace, claim), manager, pods, {},
                                     [boot_id(), 0, time.time_ns()])
    assert dead == 0
    assert [(a.pod_name, a.pod_uid, a.container_id, a.device) for a in adopted] == [("worker-0", member, cid, "nic0")]


def test_a_podgroup_pod_started_while_netclaim_was_not_chained_is_reported(
        cluster: Cluster, publisher_factory) -> None:
    publisher_factory(extra=["--driver-name", DRIVER, "--unchained-grace", "1"])
    claim, group = f"shared-{suffix()}", f"train-{suffix()}"
    cluster.claim(claim, ("nic",))
    group_obj = podgroup(cluster, group, claim)
    group_pod(cluster, "worker-0", claim, group)
    reserve_for_group(cluster, claim, cluster.node, [("nic", "nic0")], group_obj)
    # Running, as the kubelet reports it, and no ADD ever came: its sandbox never ran netclaim.
    cluster.core.patch_namespaced_pod_status("worker-0", cluster.namespace, {"status": {"phase": "Running"}})

    warned = cluster.wait_warnings(lambda w: any(e.get("reason") == "NetclaimNotChained" for e in w), timeout=30)
    [event] = [e for e in warned if e.get("reason") == "NetclaimNotChained"]
    assert event["regarding"]["name"] == "worker-0" and event["related"]["name"] == claim, event
