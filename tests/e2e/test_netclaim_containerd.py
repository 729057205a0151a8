"""netclaim in a real containerd chain, with the real publisher and the real API server.

Each test is what a user would notice on a node: pods start, and the claim's
`status.devices` tells the truth about the pod's network - the interface, IPs
and MAC that are really inside the pod's netns - even when the publisher was
down, when sandboxes are re-created, and when they go away.
"""

from __future__ import annotations

import json
import time
import urllib.request

import pytest

from runtime.cri import PodMeta, SandboxInfo

from runtime.cluster import PodRecord, ready
from runtime.identity import kubeconfig_token, token_review

pytestmark = [pytest.mark.containerd, pytest.mark.controlplane]


def run_sandbox(harness, pod: PodRecord, attempt: int = 0) -> SandboxInfo:
    """RunPodSandbox with the pod's metadata, as kubelet sends it."""
    return harness.run_pod(PodMeta(pod.name, pod.namespace, pod.uid, attempt))


def remove_sandbox(harness, sandbox: SandboxInfo) -> None:
    harness.stop_pod(sandbox.id)
    harness.remove_pod(sandbox.id)


def ours(cluster, pod: PodRecord):
    """Predicate helpers on the claim's entries for the pod's allocated device."""

    def entries_for_device(entries):
        return [e for e in entries if (e["driver"], e["pool"], e["device"]) == (cluster.driver, cluster.node, pod.device)]

    return entries_for_device


def shows(cluster, pod: PodRecord, ips: list[str]):
    """The claim has exactly one entry for the device, Ready=True, with these IPs."""
    mine = ours(cluster, pod)

    def ok(entries) -> bool:
        found = mine(entries)
        return len(found) == 1 and ready(found[0]) == "True" and sorted(found[0].get("networkData", {}).get("ips", [])) == sorted(ips)

    return ok


def new_log_lines(publisher, since: int):
    return publisher.log_records()[since:]


def ignored_no_claim(publisher) -> float:
    """The publisher's count of events it had nothing to publish for: pods without a claim of the driver."""
    with urllib.request.urlopen(publisher.metrics_url, timeout=5) as resp:
        for line in resp.read().decode().splitlines():
            if line.startswith('netclaim_events_ignored_total{reason="no_claim"}'):
                return float(line.rsplit(" ", 1)[1])
    return 0.0


def wait_for_plugin_dels(log_file, container_id: str, count: int, timeout: float = 60.0) -> None:
    """Wait until the plugin logged `count` DELs of this sandbox whose hand-off the publisher acked."""
    deadline = time.monotonic() + timeout
    acked: list[dict] = []
    while time.monotonic() < deadline:
        records = [json.loads(line) for line in log_file.read_text().splitlines() if line.startswith("{")]
        acked = [r for r in records if r.get("command") == "DEL" and r.get("containerID") == container_id
                 and r.get("handoff") == "acked"]
        if len(acked) >= count:
            return
        time.sleep(0.2)
    raise AssertionError(f"plugin logged {len(acked)} acked DELs of {container_id}, expected {count}")


def test_run_pod_sandbox_publishes_what_the_pod_netns_shows(harness, netclaim_chain, cluster, publisher, control_plane):
    # The publisher runs as the shipped least-privilege identity, bound to this node - not admin.
    assert publisher.kubeconfig != control_plane.kubeconfig
    who = token_review(cluster.api, kubeconfig_token(publisher.kubeconfig))
    assert who["username"] == "system:serviceaccount:netclaim-system:netclaim-publisher"
    assert "system:masters" not in who["groups"]
    assert who["extra"].get("authentication.kubernetes.io/node-name") == [cluster.node]
    pod = cluster.pod_with_claim("web")
    sandbox = run_sandbox(harness, pod)
    try:
        eth0 = harness.interface_in_netns(sandbox.netns, "eth0")
        entries = cluster.wait_for_entries(pod.claim, shows(cluster, pod, eth0.cidrs))
        (entry,) = ours(cluster, pod)(entries)
        assert entry["networkData"] == {"interfaceName": "eth0", "ips": eth0.cidrs, "hardwareAddress": eth0.mac}
        assert sandbox.ip in [c.split("/")[0] for c in entry["networkData"]["ips"]]
        assert sandbox.id in json.dumps(entry.get("data") or {})  # the full CNI result names its sandbox
        (cond,) = [c for c in entry["conditions"] if c["type"] == "Ready"]
        assert cond["reason"] and cond["lastTransitionTime"]
    finally:
        remove_sandbox(harness, sandbox)


def test_stop_and_remove_sandbox_remove_the_entry_without_error(harness, netclaim_chain, cluster, publisher):
    pod = cluster.pod_with_claim("gone")
    sandbox = run_sandbox(harness, pod)
    eth0 = harness.interface_in_netns(sandbox.netns, "eth0")
    cluster.wait_for_entries(pod.claim, shows(cluster, pod, eth0.cidrs))
    since = len(publisher.log_records())

    harness.stop_pod(sandbox.id)  # DEL with netns and prevResult
    cluster.wait_for_entries(pod.claim, lambda entries: ours(cluster, pod)(entries) == [])
    harness.remove_pod(sandbox.id)  # second DEL, CNI_NETNS empty: must succeed (no exception)

    assert sandbox.id not in harness.cri.list_sandboxes()
    assert ours(cluster, pod)(cluster.device_entries(pod.claim)) == []
    errors = [r for r in new_log_lines(publisher, since) if r.get("level") in ("error", "critical")]
    assert errors == []


def test_recreated_sandbox_updates_the_entry_and_a_late_del_keeps_it(harness, netclaim_chain, cluster, publisher,
                                                                      node_dirs):
    pod = cluster.pod_with_claim("again")
    first = run_sandbox(harness, pod, attempt=0)
    first_eth0 = harness.interface_in_netns(first.netns, "eth0")
    cluster.wait_for_entries(pod.claim, shows(cluster, pod, first_eth0.cidrs))

    # kubelet's order when a sandbox dies: stop the old one, start a new one, remove the old one later.
    harness.stop_pod(first.id)
    second = run_sandbox(harness, pod, attempt=1)
    try:
        second_eth0 = harness.interface_in_netns(second.netns, "eth0")
        assert second_eth0.cidrs != first_eth0.cidrs  # host-local hands out the next address
        entries = cluster.wait_for_entries(pod.claim, shows(cluster, pod, second_eth0.cidrs))
        (entry,) = ours(cluster, pod)(entries)
        assert entry["networkData"]["hardwareAddress"] == second_eth0.mac

        harness.remove_pod(first.id)  # the old sandbox's last DEL arrives after the new ADD
        # The publisher acknowledged it (a stale DEL changes nothing, so it may log nothing itself).
        wait_for_plugin_dels(node_dirs.log_file, first.id, count=2)
        entries = cluster.device_entries(pod.claim)
        (entry,) = ours(cluster, pod)(entries)
        assert sorted(entry["networkData"]["ips"]) == sorted(second_eth0.cidrs)
        assert ready(entry) == "True"
    finally:
        remove_sandbox(harness, second)


def test_pod_starts_while_publisher_is_down_and_status_appears_when_it_is_back(
    harness, netclaim_chain, cluster, publisher, node_dirs
):
    pod = cluster.pod_with_claim("offline")
    publisher.stop()
    sandbox = run_sandbox(harness, pod)
    try:
        assert sandbox.state == "SANDBOX_READY"
        eth0 = harness.interface_in_netns(sandbox.netns, "eth0")
        assert eth0.cidrs  # the pod has its network although nobody took the event
        assert list(node_dirs.spool_dir.glob("*.event.json"))  # handed over durably, to disk
        assert ours(cluster, pod)(cluster.device_entries(pod.claim)) == []

        publisher.start()
        entries = cluster.wait_for_entries(pod.claim, shows(cluster, pod, eth0.cidrs))
        (entry,) = ours(cluster, pod)(entries)
        assert entry["networkData"]["hardwareAddress"] == eth0.mac
    finally:
        remove_sandbox(harness, sandbox)


def test_pod_without_a_claim_starts_and_nothing_is_written(harness, netclaim_chain, cluster, publisher):
    bystander = cluster.pod_with_claim("bystander")  # a claim in the same namespace, not this pod's
    pod = cluster.create_pod("noclaim")
    since = len(publisher.log_records())
    before = ignored_no_claim(publisher)
    sandbox = run_sandbox(harness, pod)
    try:
        assert sandbox.state == "SANDBOX_READY"
        assert harness.interface_in_netns(sandbox.netns, "eth0").cidrs
        # Most pods are like this one: the publisher counts the ADD as "nothing to publish"
        # and stays silent about it (no warning or error line, no failed event).
        deadline = time.monotonic() + 60
        while ignored_no_claim(publisher) <= before:
            assert time.monotonic() < deadline, f"ADD of a pod without a claim never counted:\n{publisher.log_tail()}"
            time.sleep(0.2)
        name = f"{pod.namespace}/{pod.name}"
        loud = [r for r in publisher.log_records()[since:] if r.get("pod") == name
                and r.get("level") not in ("debug", "info", "DEBUG", "INFO")]
        assert loud == [], loud
        assert not [f for f in publisher.status()["status"]["failed_events"] if name in json.dumps(f)]
        assert cluster.device_entries(bystander.claim) == []
    finally:
        remove_sandbox(harness, sandbox)
