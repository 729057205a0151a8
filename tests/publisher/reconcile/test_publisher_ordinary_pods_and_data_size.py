"""on the real kube-apiserver with the real plugin and publisher.

11: netclaim runs for every pod of its network and most pods have no claim. Such a pod
    must cost nothing beyond the node's pod watch: no GET, no failure, no Warning Event,
    no tombstone; a counter at most. (A pod whose claim of the driver cannot be resolved
    still gets its Warning: test_publisher_events.py.)
14: text the API cannot take (a lone surrogate in a prevResult string) must be made
    valid before it is written, so one bad attachment never blocks its claim's others.
"""

from __future__ import annotations

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from cni_plugin.wire.event import PodRef
from publisher_testkit import DRIVER, MERGE, Cluster, Plugin, add, cni_result, drained, suffix, wait_until

pytestmark = pytest.mark.controlplane

ORDINARY_PODS = 6
OTHER_DRIVER = "other.example.com"


def api_gets(publisher) -> float:
    """Every GET the publisher sent, whatever the answer (pods and claims; list/watch are other verbs)."""
    return sum(v for k, v in publisher.metrics().items()
               if k.startswith("netclaim_api_requests_total") and 'verb="get"' in k)


@pytest.fixture()
def watch_only_kubeconfig(control_plane, api_client, cluster: Cluster, workdir):
    """A publisher identity that may list and watch pods but never GET one.

    The API server's own authorizer then stands behind "zero pod GETs": a GET would be
    refused with 403, which the publisher counts, retries and shows as its last error.
    """
    core, rbac = client.CoreV1Api(api_client), client.RbacAuthorizationV1Api(api_client)
    name = f"netclaim-watch-only-{suffix()}"
    core.create_namespaced_service_account(cluster.namespace, {"metadata": {"name": "publisher"}})
    rbac.create_cluster_role({"metadata": {"name": name}, "rules": [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "watch"]},
        {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims"], "verbs": ["get"]},
        {"apiGroups": ["events.k8s.io"], "resources": ["events"], "verbs": ["create", "patch"]}]})
    try:
        rbac.create_cluster_role_binding({
            "metadata": {"name": name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
            "subjects": [{"kind": "ServiceAccount", "name": "publisher", "namespace": cluster.namespace}]})
        token = core.create_namespaced_service_account_token(
            "publisher", cluster.namespace,
            {"spec": {"audiences": ["https://kubernetes.default.svc"], "expirationSeconds": 3600}}).status.token
        path = control_plane.kubeconfig_for_token(token, workdir / "watch-only.kubeconfig")
        sa_core = client.CoreV1Api(control_plane.api_client(path))
        probe = f"probe-{suffix()}"
        cluster.pod(probe, [])

        def can_list() -> bool:
            try:
                sa_core.list_namespaced_pod(cluster.namespace, _preload_content=False)
                return True
            except ApiException:
                return False
        wait_until("the watch-only identity can list pods", can_list)
        with pytest.raises(ApiException) as refused:
            sa_core.read_namespaced_pod(probe, cluster.namespace)
        assert refused.value.status == 403
        yield path
    finally:
        for delete in (rbac.delete_cluster_role_binding, rbac.delete_cluster_role):
            try:
                delete(name)
            except ApiException:
                pass


def test_ordinary_pods_cost_nothing(cluster: Cluster, publisher_factory, workdir,
                                                   watch_only_kubeconfig):
    publisher = publisher_factory(kubeconfig=watch_only_kubeconfig)
    plugin = Plugin(publisher.socket, publisher.spool, workdir)
    wait_until("the publisher's pod watch is open",
               lambda: publisher.metric('netclaim_api_requests_total{code="200",verb="watch"}') >= 1)
    before = publisher.metrics()
    gets = api_gets(publisher)
    pods = [(f"plain-{i}", "c" + suffix()) for i in range(ORDINARY_PODS)]
    for i, (name, cid) in enumerate(pods):
        pod = PodRef(cluster.namespace, name, cluster.pod(name, []))
        add(plugin, cid, pod)
        if i % 2:  # the DEL of a pod already deleted: the watch remembers what it was
            cluster.core.delete_namespaced_pod(name, cluster.namespace, grace_period_seconds=0)
        out = plugin.run("DEL", cid, pod, None)
        assert out.returncode == 0, f"plugin DEL failed: {out.stdout} {out.stderr}"
    ignored = 'netclaim_events_ignored_total{reason="no_claim"}'
    wait_until("every ADD and DEL finished as a pod without a claim",
               lambda: publisher.metric(ignored) >= 2 * len(pods))
    st = drained(publisher)
    after = publisher.metrics()
    assert api_gets(publisher) == gets, "an ordinary pod cost a GET"
    assert after.get('netclaim_api_requests_total{code="403",verb="get"}', 0) == 0
    assert st["failed_events"] == [] and st["last_error"] is None
    assert st["tombstones"] == 0 and st["attachments"] == 0
    failed = [k for k in after if k.startswith("netclaim_events_failed_total")]
    assert all(after[k] == before.get(k, 0) for k in failed)
    assert publisher.metric("netclaim_k8s_events_total") == 0
    assert cluster.warnings() == []
    assert publisher.metric(ignored) == 2 * len(pods)


def allocate_to_other_driver(cluster: Cluster, claim: str, pod: str, uid: str) -> None:
    status = {"allocation": {
        "devices": {"results": [{"request": "nic", "driver": OTHER_DRIVER, "pool": cluster.node, "device": "gpu0"}]},
        "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
            {"key": "metadata.name", "operator": "In", "values": [cluster.node]}]}]}},
        "reservedFor": [{"resource": "pods", "name": pod, "uid": uid}]}
    cluster.resource.patch_namespaced_resource_claim_status(claim, cluster.namespace, {"status": status},
                                                            _content_type=MERGE)


def test_pod_whose_claims_are_of_another_driver_is_ignored(cluster: Cluster, publisher, plugin):
    """The claims are read (one GET each), found allocated without a device of the driver: no failure."""
    cluster.claim("gpu-only")
    uid = cluster.pod("gpu-pod", ["gpu-only"])
    allocate_to_other_driver(cluster, "gpu-only", "gpu-pod", uid)
    cid = "c" + suffix()
    add(plugin, cid, PodRef(cluster.namespace, "gpu-pod", uid))
    assert plugin.run("DEL", cid, PodRef(cluster.namespace, "gpu-pod", uid), None).returncode == 0
    wait_until("ADD ignored", lambda: publisher.metric('netclaim_events_ignored_total{reason="no_claim"}') >= 1)
    st = drained(publisher)
    assert st["failed_events"] == [] and st["last_error"] is None
    assert publisher.metric("netclaim_k8s_events_total") == 0 and cluster.warnings() == []


def test_lone_surrogate_does_not_block_the_claims_other_entry(cluster: Cluster, publisher,
                                                                            plugin):
    """Two attachments of one pod on two devices of one claim (one apply carries both). The
    first one's prevResult has a lone surrogate ("\\ud800" on the plugin's stdin, valid JSON)
    in a DNS search domain and a host-side interface name; the second has a character beyond
    U+FFFF. Both entries are published, the bad text replaced, and the claim is not in error."""
    claim, uid = cluster.pod_with_claim("odd", [("nic-a", "nic0"), ("nic-b", "nic1")])
    pod, cid = PodRef(cluster.namespace, "odd", uid), "c" + suffix()
    bad = cni_result(ifname="net1", ipv4="10.78.0.5/24", ipv6=None, mac="0a:58:0a:4e:00:05")
    bad["dns"] = {"nameservers": ["10.0.0.10"], "search": ["lab\ud800.example"]}
    bad["interfaces"][1]["name"] = "veth\ud800x"
    add(plugin, cid, pod, ifname="net1", request_name="nic-b", prev=bad)
    good = cni_result(ifname="eth0")
    good["dns"] = {"search": ["caf\u00e9-\U0001F600.example"]}
    add(plugin, cid, pod, ifname="eth0", request_name="nic-a", prev=good)
    devices = cluster.wait_devices(claim, lambda d: len(d) == 2)
    by_device = {d["device"]: d for d in devices}
    assert by_device["nic1"]["networkData"]["interfaceName"] == "net1"
    assert by_device["nic1"]["data"]["dns"]["search"] == ["lab\ufffd.example"]
    assert by_device["nic1"]["data"]["interfaces"][1]["name"] == "veth\ufffdx"
    assert by_device["nic0"]["data"]["dns"]["search"] == ["caf\u00e9-\U0001F600.example"]
    st = drained(publisher)
    assert st["claims"][f"{cluster.namespace}/{claim}"]["state"] == "published"
    assert st["failed_events"] == [] and st["last_error"] is None
    assert publisher.metric("netclaim_apply_errors_total") == 0


def test_data_is_measured_as_the_api_server_counts_it(cluster: Cluster, publisher, plugin):
    """The API server counts `data` in its own JSON, where <, > and & take 6 bytes each: a
    result that is small in Python's count but over 10 KiB in the server's is trimmed
    locally (dns first) instead of refused with 422 for the whole claim."""
    claim, uid = cluster.pod_with_claim("html", [("nic", "nic0")])
    res = cni_result()
    res["dns"] = {"search": [f"{i}<&><&><&>" for i in range(300)]}  # ~5 KB in Python's count, ~18 KB in the server's
    add(plugin, "c" + suffix(), PodRef(cluster.namespace, "html", uid), prev=res)
    [entry] = cluster.wait_devices(claim, lambda d: len(d) == 1)
    assert entry["data"]["trimmed"] == ["dns"] and "dns" not in entry["data"]
    assert entry["networkData"]["ips"] == ["10.77.0.5/24", "fd00:77::5/64"]
    st = drained(publisher)
    assert st["claims"][f"{cluster.namespace}/{claim}"]["state"] == "published" and st["last_error"] is None
