"""A pod that asks for DRA extended resources in its containers' resources (no claim in its spec)
gets the claim the scheduler makes for it published, one interface per resource, on the real API
server with the real plugin and publisher: the scheduler names that claim's requests itself
(container-<i>-request-<j>), so only the entry's extendedResourceName ties a request to an interface."""

from __future__ import annotations

from typing import Any

from publisher_testkit import NO_NETNS, Cluster, Plugin, cni_result, drained, suffix

from cni_plugin.wire.event import PodRef

NIC, FAST = "example.com/nic", "example.com/fast"


def scheduler_made_claim(cluster: Cluster, pod: str, resources: list[str]) -> tuple[str, str]:
    """What the scheduler does for a pod asking for `resources` (one each, in container c): the claim
    with generated request names, the pod's status naming it with its requestMappings, the allocation
    (request i -> device nic<i>) reserved for the pod. Returns (claim name, pod uid)."""
    claim = f"{pod}-extended-resources-{suffix()}"
    requests = [f"container-0-request-{i}" for i in range(len(resources))]
    cluster.claim(claim, tuple(requests))
    limits = {r: "1" for r in resources}
    uid = cluster.core.create_namespaced_pod(cluster.namespace, {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": pod},
        "spec": {"nodeName": cluster.node, "containers": [{
            "name": "c", "image": "local/pause:1", "resources": {"requests": limits, "limits": limits}}]}}).metadata.uid
    cluster.core.patch_namespaced_pod_status(pod, cluster.namespace, {"status": {"extendedResourceClaimStatus": {
        "resourceClaimName": claim,
        "requestMappings": [{"containerName": "c", "resourceName": r, "requestName": q}
                            for r, q in zip(resources, requests)]}}})
    cluster.allocate(claim, [(q, f"nic{i}") for i, q in enumerate(requests)], pod, uid)
    return claim, uid


def entry_conf(plugin: Plugin, request: str, extended: str) -> dict[str, Any]:
    conf = plugin.conf(None, request)
    if extended:
        conf["extendedResourceName"] = extended
    return conf


def add_as(plugin: Plugin, cid: str, pod: PodRef, ifname: str, ipv4: str, request: str, extended: str) -> None:
    conf = entry_conf(plugin, request, extended)
    conf["prevResult"] = cni_result(ifname=ifname, ipv4=ipv4, ipv6=None)
    out = plugin.run("ADD", cid, pod, ifname=ifname, netns=NO_NETNS, conf=conf)
    assert out.returncode == 0, f"plugin ADD failed: {out.stdout} {out.stderr}"


def test_each_interface_gets_the_device_of_the_extended_resource_its_entry_names(cluster: Cluster, publisher,
                                                                                plugin: Plugin):
    """Two networks, two entries (eth0: request nic / example.com/nic; net1: request fast / example.com/fast);
    the pod asks for both resources. Each interface lands on its resource's device, whatever order the
    scheduler gave the requests (fast's mapping comes first here)."""
    claim, uid = scheduler_made_claim(cluster, "ext", [FAST, NIC])  # request-0 (nic0) is fast's
    pod, cid = PodRef(cluster.namespace, "ext", uid), "c" + suffix()
    add_as(plugin, cid, pod, "eth0", "10.77.0.5/24", "nic", NIC)
    add_as(plugin, cid, pod, "net1", "10.78.0.5/24", "fast", FAST)
    devices = cluster.wait_devices(claim, lambda d: len(d) == 2)
    by_device = {d["device"]: (d["networkData"]["interfaceName"], d["networkData"]["ips"]) for d in devices}
    assert by_device == {"nic0": ("net1", ["10.78.0.5/24"]), "nic1": ("eth0", ["10.77.0.5/24"])}


def test_an_entry_naming_no_extended_resource_leaves_the_schedulers_claim_alone(cluster: Cluster, publisher_factory,
                                                                              workdir):
    """With only a request configured, the scheduler's claim gets no entry (a request name never matches
    the generated ones), and the publisher's debug line says which setting would tie it; the same pod's
    interface under an entry naming the resource is published (the positive control)."""
    publisher = publisher_factory(extra=["--log-level", "debug"])
    plugin = Plugin(publisher.socket, publisher.spool, workdir)
    claim, uid = scheduler_made_claim(cluster, "plain", [NIC])
    pod = PodRef(cluster.namespace, "plain", uid)
    add_as(plugin, "c" + suffix(), pod, "eth0", "10.77.0.6/24", "nic", "")
    drained(publisher)
    assert cluster.devices(claim) == []
    log = publisher.log_path.read_text()
    assert f"extended resource(s) {NIC}" in log and "extendedResourceName" in log, log[-3000:]
    add_as(plugin, "c" + suffix(), pod, "eth0", "10.77.0.7/24", "nic", NIC)
    (entry,) = cluster.wait_devices(claim, lambda d: len(d) == 1)
    assert (entry["device"], entry["networkData"]["ips"]) == ("nic0", ["10.77.0.7/24"])


def test_an_entry_naming_another_extended_resource_takes_none_of_the_claims_devices(cluster: Cluster, publisher,
                                                                                  plugin: Plugin):
    """A pod that asks only for example.com/fast: the eth0 entry (example.com/nic) must not take fast's
    device, even with no request configured, where an ordinary claim's only device would be taken; the
    sandbox's net1 (example.com/fast) then gets it (the positive control)."""
    claim, uid = scheduler_made_claim(cluster, "other", [FAST])
    pod, cid = PodRef(cluster.namespace, "other", uid), "c" + suffix()
    add_as(plugin, cid, pod, "eth0", "10.77.0.8/24", "", NIC)
    drained(publisher)
    assert cluster.devices(claim) == []
    add_as(plugin, cid, pod, "net1", "10.78.0.8/24", "", FAST)
    (entry,) = cluster.wait_devices(claim, lambda d: len(d) == 1)
    assert (entry["device"], entry["networkData"]["interfaceName"]) == ("nic0", "net1")
