"""Regression tests, one or more per ordering defect a review found, on the real kube-apiserver.

Each drives the real `netclaim-publisher run` through its public interfaces
(socket, spool dir, CLI flags, status) and the real plugin binary where the
plugin is the event source; "late" deliveries are events the plugin stamped
earlier and that reach the publisher through the spool afterwards, exactly
what a plugin does when the socket was briefly unreachable.
"""

from __future__ import annotations

import os
import time
import urllib.error
import urllib.request

import pytest

from cni_plugin.wire.event import PodRef
from cni_plugin.wire.frame import event_request
from cni_plugin.wire.spool import write_spool
from publisher_testkit import (DRIVER, MERGE, Cluster, Plugin, Publisher, add, cni_result, drained, request,
                               resynced, suffix, wire_event)

pytestmark = pytest.mark.controlplane

FAST = ["--spool-interval", "0.2", "--resync-interval", "1", "--retry-max-delay", "1"]


def ours(devices: list[dict]) -> list[dict]:
    return [d for d in devices if d["driver"] == DRIVER]


def by_container(devices: list[dict]) -> set[str]:
    return {d["data"]["containerID"] for d in ours(devices)}


def send(publisher: Publisher, event) -> None:
    assert request(publisher.socket, event_request(event))["ok"] is True


def gc_conf(plugin: Plugin, keep: list[str]) -> dict:
    conf = plugin.conf(None)
    conf["cni.dev/valid-attachments"] = [{"containerID": c, "ifname": "eth0"} for c in keep]
    return conf


# ---------------------------------------------------------------- defect 1: GC and later sandboxes


def test_late_gc_spares_sandboxes_added_after_it(cluster: Cluster, publisher_factory, workdir):
    publisher = publisher_factory(extra=FAST)
    plugin = Plugin(publisher.socket, publisher.spool, workdir)
    old_claim, old_uid = cluster.pod_with_claim("old", [("nic", "nic0")])
    new_claim, new_uid = cluster.pod_with_claim("new", [("nic", "nic0")])
    old = "old" + suffix()
    add(plugin, old, PodRef(cluster.namespace, "old", old_uid))
    cluster.wait_devices(old_claim, lambda d: len(d) == 1)
    # The runtime GCs at T with nothing valid (node reboot); that GC is delivered late (spool) ...
    gc = wire_event("GC", "*", None, ifname="*", valid_attachments=[])
    # ... after kubelet started a new pod whose ADD went over the socket.
    new = "new" + suffix()
    add(plugin, new, PodRef(cluster.namespace, "new", new_uid))
    cluster.wait_devices(new_claim, lambda d: len(d) == 1)
    write_spool(publisher.spool, gc)
    cluster.wait_devices(old_claim, lambda d: d == [])  # added before the GC: removed
    drained(publisher)
    assert by_container(cluster.devices(new_claim)) == {new}  # added after it: kept
    # ... and a late ADD of the old sandbox (stamped before the GC) cannot bring it back.
    late = wire_event("ADD", old, PodRef(cluster.namespace, "old", old_uid), cni_result())
    late.order = [gc.order[0], gc.order[1] - 1, gc.order[2] - 1]
    send(publisher, late)
    resynced(publisher)
    assert cluster.devices(old_claim) == []
    assert publisher.status()["gc_fences"] == 1


# ---------------------------------------------------------------- defect 2: spooled ADD vs its DEL


def test_spooled_add_does_not_outlive_its_del(cluster: Cluster, publisher_factory, workdir):
    publisher = publisher_factory()
    claim, uid = cluster.pod_with_claim("web", [("nic", "nic0")])
    pod, cid = PodRef(cluster.namespace, "web", uid), "c" + suffix()
    # The socket was briefly unreachable: the real plugin spooled its ADD. It spools beside the
    # publisher's spool, so the running publisher cannot ingest it before the DEL, whenever its
    # housekeeping wakes.
    aside = workdir / "spool-aside"
    spooling = Plugin(str(workdir / "no-such.sock"), str(aside), workdir)
    add(spooling, cid, pod)
    assert len(os.listdir(aside)) == 1
    # The sandbox dies; its DEL reaches the publisher over the socket first.
    out = Plugin(publisher.socket, publisher.spool, workdir).run("DEL", cid, pod, None)
    assert out.returncode == 0, out.stdout + out.stderr
    drained(publisher)
    publisher.stop()
    os.replace(aside, publisher.spool)  # the spooled ADD reaches the (empty) spool while nothing reads it
    publisher.start()  # now the spooled ADD is ingested, after its DEL
    st = drained(publisher)
    assert cluster.devices(claim) == []
    assert st["attachments"] == 0 and st["tombstones"] == 1


def test_del_retires_an_add_backing_off(cluster: Cluster, publisher, plugin):
    """An ADD waiting for its claim's allocation must not hold up (or outlive) its DEL."""
    claim = "late-net"
    cluster.claim(claim)
    uid = cluster.pod("late", [claim])
    pod, cid = PodRef(cluster.namespace, "late", uid), "c" + suffix()
    add(plugin, cid, pod)
    out = plugin.run("DEL", cid, pod, None)
    assert out.returncode == 0
    drained(publisher)
    cluster.allocate(claim, [("nic", "nic0")], "late", uid)
    time.sleep(1.0)
    drained(publisher)
    assert cluster.devices(claim) == []


def test_check_after_del_does_not_bring_the_attachment_back(cluster: Cluster, publisher, plugin):
    claim, uid = cluster.pod_with_claim("web", [("nic", "nic0")])
    pod, cid = PodRef(cluster.namespace, "web", uid), "c" + suffix()
    add(plugin, cid, pod)
    cluster.wait_devices(claim, lambda d: len(d) == 1)
    assert plugin.run("DEL", cid, pod, None).returncode == 0
    cluster.wait_devices(claim, lambda d: d == [])
    send(publisher, wire_event("CHECK", cid, pod, cni_result()))  # stamped after the DEL
    st = drained(publisher)
    assert cluster.devices(claim) == [] and st["attachments"] == 0


# ---------------------------------------------------------------- defect 3: stale attachments


def test_lost_del_does_not_block_the_next_pod(cluster: Cluster, publisher_factory, workdir):
    publisher = publisher_factory(extra=FAST)
    plugin = Plugin(publisher.socket, publisher.spool, workdir)
    claim, uid_a = cluster.pod_with_claim("a", [("nic", "nic0")])
    cid_a = "a" + suffix()
    add(plugin, cid_a, PodRef(cluster.namespace, "a", uid_a), res={"ipv4": "10.77.0.5/24"})
    cluster.wait_devices(claim, lambda d: by_container(d) == {cid_a})
    # Pod a's DEL is lost. The claim is deallocated and given to pod b, same device.
    uid_b = cluster.pod("b", [claim])
    cluster.resource.patch_namespaced_resource_claim_status(
        claim, cluster.namespace, {"status": {"reservedFor": None, "allocation": None}}, _content_type=MERGE)
    cluster.allocate(claim, [("nic", "nic0")], "b", uid_b)
    cid_b = "b" + suffix()
    add(plugin, cid_b, PodRef(cluster.namespace, "b", uid_b), res={"ipv4": "10.77.0.6/24"})
    devices = cluster.wait_devices(claim, lambda d: by_container(d) == {cid_b})
    assert ours(devices)[0]["networkData"]["ips"][0] == "10.77.0.6/24"
    st = resynced(publisher)
    assert by_container(cluster.devices(claim)) == {cid_b}
    assert st["failed_events"] == []  # nothing refused as "taken"


def test_model_f3_reallocation_to_the_same_pod_on_another_device_republishes(cluster: Cluster, publisher_factory,
                                                                              workdir):
    """Model finding F3: the sandbox is still live (no DEL, no GC); when its claim is
    allocated again for its pod, on another device, the entry appears on that device."""
    publisher = publisher_factory(extra=FAST)
    plugin = Plugin(publisher.socket, publisher.spool, workdir)
    claim, uid = cluster.pod_with_claim("web", [("nic", "nic0")])
    cid = "c" + suffix()
    add(plugin, cid, PodRef(cluster.namespace, "web", uid))
    cluster.wait_devices(claim, lambda d: len(d) == 1)
    cluster.resource.patch_namespaced_resource_claim_status(
        claim, cluster.namespace, {"status": {"reservedFor": None, "allocation": None}}, _content_type=MERGE)
    resynced(publisher)  # the publisher has seen the claim deallocated
    publisher.kill()
    publisher.start()
    cluster.allocate(claim, [("nic", "nic1")], "web", uid)
    devices = cluster.wait_devices(claim, lambda d: len(d) == 1 and d[0]["device"] == "nic1")
    assert by_container(devices) == {cid} and devices[0]["conditions"][0]["status"] == "True"


def test_unreserved_pod_is_removed_by_resync(cluster: Cluster, publisher_factory, workdir):
    publisher = publisher_factory(extra=FAST)
    plugin = Plugin(publisher.socket, publisher.spool, workdir)
    claim, uid = cluster.pod_with_claim("a", [("nic", "nic0")])
    add(plugin, "a" + suffix(), PodRef(cluster.namespace, "a", uid))
    cluster.wait_devices(claim, lambda d: len(d) == 1)
    cluster.resource.patch_namespaced_resource_claim_status(
        claim, cluster.namespace, {"status": {"reservedFor": None}}, _content_type=MERGE)
    cluster.wait_devices(claim, lambda d: ours(d) == [])


# ---------------------------------------------------------------- defect 4: rotating credentials


def token_file_kubeconfig(control_plane, workdir, token_file) -> str:
    """A kubeconfig whose user reads its token from `token_file` (as a cron-renewed install has)."""
    kubeconfig = workdir / "rotating.kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        f"clusters:\n- name: k\n  cluster:\n    server: {control_plane.server}\n"
        f"    certificate-authority: {control_plane.ca_file}\n"
        "contexts:\n- name: c\n  context: {cluster: k, user: u}\n"
        f"users:\n- name: u\n  user:\n    tokenFile: {token_file}\n")
    return str(kubeconfig)


def start_unready(publisher: Publisher) -> None:
    publisher.start(wait=False)
    deadline = time.time() + 30
    while not os.path.exists(publisher.socket) and time.time() < deadline:
        time.sleep(0.1)


def test_expired_token_drops_nothing_and_a_rotated_one_is_used(cluster: Cluster, control_plane,
                                                                       publisher_factory, workdir):
    token_file = workdir / "token"
    token_file.write_text("expired-token\n")
    kubeconfig = token_file_kubeconfig(control_plane, workdir, token_file)
    publisher = Publisher(str(kubeconfig), workdir / "p", extra=FAST)
    (workdir / "p").mkdir()
    start_unready(publisher)
    try:
        claim, uid = cluster.pod_with_claim("web", [("nic", "nic0")])
        add(Plugin(publisher.socket, publisher.spool, workdir), "c" + suffix(), PodRef(cluster.namespace, "web", uid))
        deadline = time.time() + 30
        while time.time() < deadline and publisher.status()["credentials"]["unauthorized_consecutive"] < 3:
            time.sleep(0.2)
        st = publisher.status()
        assert st["credentials"]["unauthorized_total"] >= 3 and st["failed_events"] == [], publisher.logs()[-2000:]
        assert not st["ready"] and "401" in st["not_ready_reason"]
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(f"http://127.0.0.1:{publisher.port}/readyz", timeout=5)
        assert info.value.code == 503
        token_file.write_text(control_plane.token("admin") + "\n")  # rotated on disk
        cluster.wait_devices(claim, lambda d: len(d) == 1)
        st = drained(publisher)
        assert st["ready"] and st["credentials"]["reloads"] >= 1 and st["failed_events"] == []
    finally:
        publisher.kill()


def test_model_f2_a_403_is_retried_never_dropped(cluster: Cluster, control_plane, workdir):
    """Model finding F2: right after an API server restart its authorizer answers 403 until
    RBAC has synced. Here the 403 comes from an identity that may not read the pod (another
    node), then the token file is rotated to one that may."""
    token_file = workdir / "token"
    token_file.write_text(control_plane.token("system:node:node-b"))
    (workdir / "p").mkdir()
    publisher = Publisher(token_file_kubeconfig(control_plane, workdir, token_file), workdir / "p", extra=FAST)
    start_unready(publisher)
    try:
        claim, uid = cluster.pod_with_claim("web", [("nic", "nic0")])
        add(Plugin(publisher.socket, publisher.spool, workdir), "c" + suffix(), PodRef(cluster.namespace, "web", uid))
        deadline = time.time() + 30
        while time.time() < deadline and "403" not in str(publisher.status()["last_error"]):
            time.sleep(0.2)
        st = publisher.status()
        assert "403" in str(st["last_error"]) and st["failed_events"] == [] and st["journal_depth"] == 1
        token_file.write_text(control_plane.token("admin"))
        cluster.wait_devices(claim, lambda d: len(d) == 1)
        assert drained(publisher)["failed_events"] == []
    finally:
        publisher.kill()


# ---------------------------------------------------------------- defect 5: workers and backoff


def test_failed_resync_backs_off(cluster: Cluster, publisher_factory, workdir, control_plane):
    publisher = publisher_factory(extra=["--resync-interval", "0.2", "--spool-interval", "0.2"])
    plugin = Plugin(publisher.socket, publisher.spool, workdir)
    claim, uid = cluster.pod_with_claim("web", [("nic", "nic0")])
    add(plugin, "c" + suffix(), PodRef(cluster.namespace, "web", uid))
    cluster.wait_devices(claim, lambda d: len(d) == 1)
    before = publisher.metric('netclaim_api_requests_total{code="error",verb="get"}')
    control_plane.stop_apiserver()
    try:
        deadline = time.time() + 60
        while time.time() < deadline and publisher.status()["resync_failures"] < 3:
            time.sleep(0.2)
        st = publisher.status()
        gets = publisher.metric('netclaim_api_requests_total{code="error",verb="get"}') - before
    finally:
        control_plane.start_apiserver()
    assert st["resync_failures"] >= 3
    # One GET per failed pass (it stops at the first failure), not a retry every 0.1 s.
    assert gets <= st["resync_failures"] + 1
    resynced(publisher, timeout=60)


# ---------------------------------------------------------------- defect 6: allocation shapes


def test_shared_device_shows_the_latest_sandbox(cluster: Cluster, publisher, plugin):
    claim = "shared"
    cluster.claim(claim)
    uid1, uid2 = cluster.pod("p1", [claim]), cluster.pod("p2", [claim])
    cluster.allocate(claim, [("nic", "nic0")])
    cluster.resource.patch_namespaced_resource_claim_status(claim, cluster.namespace, {"status": {"reservedFor": [
        {"resource": "pods", "name": "p1", "uid": uid1}, {"resource": "pods", "name": "p2", "uid": uid2}]}},
        _content_type=MERGE)
    c1, c2 = "p1" + suffix(), "p2" + suffix()
    add(plugin, c1, PodRef(cluster.namespace, "p1", uid1), res={"ipv4": "10.77.0.5/24"})
    cluster.wait_devices(claim, lambda d: by_container(d) == {c1})
    add(plugin, c2, PodRef(cluster.namespace, "p2", uid2), res={"ipv4": "10.77.0.6/24"})
    cluster.wait_devices(claim, lambda d: by_container(d) == {c2})
    assert drained(publisher)["failed_events"] == []
    plugin.run("DEL", c2, PodRef(cluster.namespace, "p2", uid2), None)
    cluster.wait_devices(claim, lambda d: by_container(d) == {c1})  # the other pod's sandbox again


def test_claim_of_another_node_does_not_hide_ours(cluster: Cluster, publisher, plugin):
    cluster.claim("far")
    cluster.claim("near")
    uid = cluster.pod("web", ["far", "near"])
    cluster.allocate("far", [("nic", "nic0")], "web", uid, node="node-b")
    cluster.allocate("near", [("nic", "nic1")], "web", uid)
    add(plugin, "c" + suffix(), PodRef(cluster.namespace, "web", uid))
    devices = cluster.wait_devices("near", lambda d: len(d) == 1)
    assert devices[0]["device"] == "nic1" and cluster.devices("far") == []


def test_several_devices_for_one_request(cluster: Cluster, publisher, plugin):
    """Two devices for request `nic`: the first interface takes one (ambiguous at first: a
    Warning, retried), the slice names them; the second interface takes the other."""
    claim, uid = cluster.pod_with_claim("multi", [("nic", "nic0"), ("nic", "nic1")])
    slice_body = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
                  "metadata": {"name": f"{cluster.namespace}-slice"},
                  "spec": {"driver": DRIVER, "nodeName": "node-a", "pool": {"name": "node-a", "generation": 1,
                                                                           "resourceSliceCount": 1},
                           "devices": [{"name": "nic0", "attributes": {"interfaceName": {"string": "net1"}}},
                                       {"name": "nic1", "attributes": {"interfaceName": {"string": "eth0"}}}]}}
    cluster.resource.create_resource_slice(slice_body)
    try:
        pod, cid = PodRef(cluster.namespace, "multi", uid), "c" + suffix()
        add(plugin, cid, pod, ifname="eth0", res={"ifname": "eth0", "ipv4": "10.77.0.5/24"})
        add(plugin, cid, pod, ifname="net1", res={"ifname": "net1", "ipv4": "10.78.0.5/24", "ipv6": None})
        devices = cluster.wait_devices(claim, lambda d: len(d) == 2)
        by_device = {d["device"]: d["networkData"]["interfaceName"] for d in devices}
        assert by_device == {"nic1": "eth0", "nic0": "net1"}
    finally:
        cluster.resource.delete_resource_slice(slice_body["metadata"]["name"])


def test_extended_resource_claim_is_found(cluster: Cluster, publisher, plugin):
    claim = "ext-claim"
    cluster.claim(claim)
    uid = cluster.core.create_namespaced_pod(cluster.namespace, {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "ext"},
        "spec": {"nodeName": cluster.node, "containers": [{
            "name": "c", "image": "local/pause:1",
            "resources": {"requests": {"example.com/nic": "1"}, "limits": {"example.com/nic": "1"}}}]}}).metadata.uid
    cluster.core.patch_namespaced_pod_status("ext", cluster.namespace, {"status": {"extendedResourceClaimStatus": {
        "resourceClaimName": claim,
        "requestMappings": [{"containerName": "c", "resourceName": "example.com/nic", "requestName": "nic"}]}}})
    cluster.allocate(claim, [("nic", "nic0")], "ext", uid)
    add(plugin, "c" + suffix(), PodRef(cluster.namespace, "ext", uid))
    cluster.wait_devices(claim, lambda d: len(d) == 1)


def test_ipv4_mapped_address_is_published_as_the_server_wants(cluster: Cluster, publisher, plugin):
    claim, uid = cluster.pod_with_claim("web", [("nic", "nic0")])
    add(plugin, "c" + suffix(), PodRef(cluster.namespace, "web", uid),
        res={"ipv4": "010.77.0.5/24", "ipv6": "::ffff:10.77.0.6/120"})
    devices = cluster.wait_devices(claim, lambda d: len(d) == 1)
    assert devices[0]["networkData"]["ips"] == ["10.77.0.5/24", "10.77.0.6/24"]


def test_attachment_moving_to_another_claim_leaves_nothing_behind(cluster: Cluster, publisher, plugin):
    cluster.claim("first")
    cluster.claim("second")
    uid = cluster.pod("web", ["first", "second"])
    cluster.allocate("first", [("nic", "nic0")], "web", uid)
    pod, cid = PodRef(cluster.namespace, "web", uid), "c" + suffix()
    add(plugin, cid, pod)
    cluster.wait_devices("first", lambda d: len(d) == 1)
    # The first claim is given up, the second allocated; the runtime re-runs ADD for the sandbox.
    cluster.resource.patch_namespaced_resource_claim_status(
        "first", cluster.namespace, {"status": {"reservedFor": None, "allocation": None}}, _content_type=MERGE)
    cluster.allocate("second", [("nic", "nic3")], "web", uid)
    add(plugin, cid, pod, res={"ipv4": "10.77.0.9/24"})
    cluster.wait_devices("second", lambda d: len(d) == 1)
    drained(publisher)
    assert ours(cluster.devices("first")) == []


# ---------------------------------------------------------------- spool overflow (the plugin's marker)


def test_spool_overflow_is_counted_shown_and_warned_about(cluster: Cluster, publisher_factory, workdir):
    import json

    publisher = publisher_factory(extra=["--spool-interval", "0.2"])
    os.makedirs(publisher.spool, mode=0o700, exist_ok=True)
    marker = {"dropped": 3, "firstDroppedAt": time.time() - 5, "lastDroppedAt": time.time(), "lastCommand": "DEL"}
    with open(os.path.join(publisher.spool, "overflow"), "w") as fh:  # as cni_plugin/wire/spool.py writes it
        json.dump(marker, fh)
    deadline = time.time() + 20
    while time.time() < deadline and publisher.status()["spool_overflow"]["dropped"] < 3:
        time.sleep(0.1)
    st = publisher.status()
    assert st["spool_overflow"]["dropped"] == 3 and st["spool_overflow"]["last"]["lastCommand"] == "DEL"
    assert "spool was full" in st["last_error"]["error"]
    assert publisher.metric("netclaim_spool_overflow_events_total") == 3
    assert not os.path.exists(os.path.join(publisher.spool, "overflow"))  # taken: counted once
    from kubernetes import client

    def node_warnings() -> list[dict]:
        resp = client.EventsV1Api(cluster.api).list_namespaced_event("default", _preload_content=False)
        return [e for e in json.loads(resp.data)["items"]
                if e.get("reason") == "SpoolOverflow" and e["regarding"]["kind"] == "Node"]

    deadline = time.time() + 20
    while time.time() < deadline and not node_warnings():
        time.sleep(0.2)
    assert node_warnings(), "no SpoolOverflow Warning on the Node"
