"""The journal's rebuild (after a newer journal was set aside) credits each sandbox of a claim shared by
several pods on the node to its own pod, as the set-aside journal named it, so an entry is dropped when its
own pod goes, not when another user of the claim does. Real kube-apiserver and a real set-aside journal file.
"""

from __future__ import annotations

import time
from pathlib import Path

from cni_plugin.wire.event import boot_id
from publisher.journal.store import Attachment, Journal
from publisher.kube.calls import Credentials, Kube
from publisher.repair.rebuild import live_attachments, node_pods, read_hints
from publisher_testkit import DRIVER, MERGE, Cluster, apply_as, suffix


def _kube(kubeconfig: str) -> Kube:
    return Kube(Credentials(kubeconfig).loader(kubeconfig, 4), credentials=Credentials(kubeconfig))


def shared_claim(cluster: Cluster, claim: str, users: dict[str, str]) -> None:
    """The claim allocated on this node with one device, reserved for every pod of `users` (name: uid)."""
    cluster.allocate(claim, [("nic", "nic0")])
    cluster.resource.patch_namespaced_resource_claim_status(claim, cluster.namespace, {"status": {"reservedFor": [
        {"resource": "pods", "name": name, "uid": uid} for name, uid in users.items()]}}, _content_type=MERGE)


def set_aside_journal(path: Path, claim: tuple[str, str], sandboxes: dict[str, tuple[str, str]]) -> str:
    """A journal as the newer release left it: one attachment per sandbox (container ID: pod name, uid)."""
    journal = Journal(str(path))
    journal.finish(None, upsert=[Attachment(
        container_id=cid, ifname="eth0", driver=DRIVER, network="testnet", pod_namespace=claim[0], pod_name=pod,
        pod_uid=uid, claim_namespace=claim[0], claim_name=claim[1], claim_uid="", pool="node-a", device="nic0",
        share_id="", entry={}, result_hash="", event_ts=time.time()) for cid, (pod, uid) in sandboxes.items()])
    journal.close()
    return str(path / "journal.db")


def test_each_sandbox_of_a_shared_claim_is_credited_to_the_pod_the_set_aside_journal_named(
        cluster: Cluster, control_plane, workdir: Path) -> None:
    claim, sandbox = f"shared-{suffix()}", "c" + suffix()
    cluster.claim(claim, ("nic",))
    uids = {name: cluster.pod(name, [claim]) for name in ("a-first", "b-second")}
    shared_claim(cluster, claim, uids)
    manager = f"netclaim/{cluster.node}"
    apply_as(cluster, claim, manager, [{
        "driver": DRIVER, "pool": cluster.node, "device": "nic0",
        "data": {"network": "testnet", "containerID": sandbox},
        "networkData": {"interfaceName": "eth0", "ips": ["10.77.0.5/24"]}}])
    kube = _kube(control_plane.kubeconfig)
    pods = [p for p in node_pods(kube, cluster.node) if p.namespace == cluster.namespace]
    assert sorted(p.name for p in pods) == ["a-first", "b-second"]
    live = kube.get_claim(cluster.namespace, claim)
    stamp = [boot_id(), 0, time.time_ns()]

    # The entry is b-second's sandbox, as the set-aside journal says: credited to b-second, though a-first
    # is listed first (pods come in name order).
    hints = read_hints(set_aside_journal(workdir / "aside", (cluster.namespace, claim),
                                         {sandbox: ("b-second", uids["b-second"])}))
    adopted, dead = live_attachments(live, manager, pods, hints, stamp)
    assert dead == 0 and [(a.container_id, a.pod_name, a.pod_uid) for a in adopted] == [
        (sandbox, "b-second", uids["b-second"])]

    # A sandbox of a pod that no longer uses the claim (here: a pod UID the claim does not know) is dead,
    # not adopted into another user.
    hints = read_hints(set_aside_journal(workdir / "aside-gone", (cluster.namespace, claim),
                                         {sandbox: ("old", "0f0f0f0f-dead-pod0-uid0-000000000000")}))
    adopted, dead = live_attachments(live, manager, pods, hints, stamp)
    assert (dead, adopted) == (1, [])

    # No hint (the set-aside journal unreadable): credited to a user of the claim, as before.
    adopted, dead = live_attachments(live, manager, pods, {}, stamp)
    assert dead == 0 and [a.pod_name for a in adopted] == ["a-first"]
