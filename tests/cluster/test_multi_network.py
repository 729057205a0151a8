"""In a real node: containerd's own multi-network (no Multus), and dual-stack.

One cluster for this module (`scripts/cluster.sh up --networks 2 --dual-stack`): containerd's
CRI reads the first two conflists of its conf dir (max_conf_num 2) and gives every pod eth0
from the first and eth1 from the second; the first network has an IPv4 and an IPv6 range.
`install-netclaim` chains netclaim into both, each entry with its own request (`nic` for
eth0, `nic1` for eth1), so a claim's device of request `nic` is eth0's and of `nic1` eth1's.

What a user checks, and what each test asserts: `kubectl get resourceclaim -o yaml` shows, per
device, the interface that really got it, with exactly the addresses and MAC that the pod's
own netns has (read with `ip -j` inside it), the IPv6 address in the API's canonical form,
and the pod's IPs (containerd reports eth0's only) among them.

The DaemonSet's chain keeper, run beside it, must leave the second network's entry alone.

Budget: one cluster up and down and four pods: 35 s measured (2 shared cores; up 14 s, down 9 s).
"""

from __future__ import annotations

import ipaddress
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

from cluster_kit import cluster_with_netclaim, fresh_namespace, need_root, netclaim_warnings, publisher_metric
from runtime.realcluster import PAUSE_IMAGE, RealCluster, entries_of, parse_env, ready_status, wait_until

DEVICE_CLASS = "net.example.com"  # the DeviceClass scripts/cluster.sh creates for its DRA driver


@pytest.fixture(scope="module")
def multi_cluster() -> Iterator[RealCluster]:
    """Its own cluster (the session's has one single-stack network), in NETCLAIM_CLUSTER_DIR + "-mn";
    one already up there with these options is reused and left up. Never skipped: fails with the reason."""
    need_root()
    base = os.environ.get("NETCLAIM_CLUSTER_DIR")
    directory = f"{base}-mn" if base else os.path.join(tempfile.gettempdir(), "nc-mn")
    env = {**os.environ, "NETCLAIM_CLUSTER_DIR": directory}

    def up() -> RealCluster:
        cluster = RealCluster(directory, {}, env)
        cluster.values = parse_env(cluster.sh("up", "--networks", "2", "--dual-stack", timeout=1800))
        return cluster

    yield from cluster_with_netclaim(env, up, "the multi-network cluster")


@pytest.fixture
def ns(multi_cluster: RealCluster) -> Iterator[str]:
    yield from fresh_namespace(multi_cluster, "mn")


# ---------------------------------------------------------------- objects

def spec(*requests: str) -> dict[str, Any]:
    return {"devices": {"requests": [{"name": r, "exactly": {"deviceClassName": DEVICE_CLASS}}
                                     for r in requests]}}


def claim(cluster: RealCluster, ns: str, name: str, *requests: str) -> None:
    cluster.apply({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                   "metadata": {"name": name, "namespace": ns}, "spec": spec(*requests)})


def template(cluster: RealCluster, ns: str, name: str, *requests: str) -> None:
    cluster.apply({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
                   "metadata": {"name": name, "namespace": ns}, "spec": {"spec": spec(*requests)}})


def pod(cluster: RealCluster, ns: str, name: str, claims: dict[str, str] | None = None,
        templates: dict[str, str] | None = None) -> None:
    """A pause pod with its claims at pod level (by reference name: claim name or template name)."""
    refs = [{"name": k, "resourceClaimName": v} for k, v in (claims or {}).items()]
    refs += [{"name": k, "resourceClaimTemplateName": v} for k, v in (templates or {}).items()]
    cluster.apply({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": ns},
                   "spec": {"resourceClaims": refs, "terminationGracePeriodSeconds": 0,
                            "containers": [{"name": "app", "image": PAUSE_IMAGE, "imagePullPolicy": "Never"}]}})


def generated_claim(cluster: RealCluster, ns: str, pod_name: str, ref: str) -> str:
    def name() -> str:
        statuses = cluster.get("pod", pod_name, ns).get("status", {}).get("resourceClaimStatuses") or []
        return next((s.get("resourceClaimName", "") for s in statuses if s.get("name") == ref), "")
    return wait_until(name, f"the claim generated for {ns}/{pod_name} ({ref})", timeout=60)


# ---------------------------------------------------------------- what the claim and the netns show

def netns_cidrs(cluster: RealCluster, ns: str, pod_name: str, ifname: str) -> tuple[list[str], str]:
    """The interface's global addresses (canonical, as Python's ipaddress prints them) and MAC, from the netns."""
    iface = cluster.interface(ns, pod_name, ifname)
    return sorted(str(ipaddress.ip_interface(c)) for c in iface.cidrs), iface.mac


def device_of(claim_obj: dict[str, Any], request: str) -> str:
    results = claim_obj["status"]["allocation"]["devices"]["results"]
    (device,) = [r["device"] for r in results if r["request"] == request]
    return device


def ready_entries(cluster: RealCluster, ns: str, claim_name: str, count: int) -> dict[str, dict[str, Any]]:
    """Wait for `count` Ready entries of netclaim on the claim; by device."""
    def entries() -> dict[str, dict[str, Any]] | None:
        mine = entries_of(cluster.claim_yaml(ns, claim_name), cluster.driver)
        if len(mine) == count and all(ready_status(e) == "True" for e in mine):
            return {e["device"]: e for e in mine}
        return None
    return wait_until(entries, f"{count} Ready entries on {ns}/{claim_name}", timeout=90)


def assert_entry_is_the_interface(cluster: RealCluster, ns: str, pod_name: str, entry: dict[str, Any],
                                  ifname: str) -> list[str]:
    cidrs, mac = netns_cidrs(cluster, ns, pod_name, ifname)
    net = entry["networkData"]
    assert (net["interfaceName"], net["hardwareAddress"]) == (ifname, mac)
    assert sorted(net["ips"]) == cidrs, f"{ifname}: claim {net['ips']} != netns {cidrs}"
    # Every address in the API's canonical form (RFC 5952 for IPv6), exactly as written.
    assert all(str(ipaddress.ip_interface(ip)) == ip for ip in net["ips"]), net["ips"]
    assert (entry["driver"], entry["pool"]) == (cluster.driver, cluster.node)
    return net["ips"]


def in_subnet(cidr: str, subnet: str) -> bool:
    return ipaddress.ip_interface(cidr).ip in ipaddress.ip_network(subnet)


# ---------------------------------------------------------------- the tests

def test_one_claim_with_two_requests_shows_eth0_and_eth1_on_their_devices(multi_cluster: RealCluster,
                                                                          ns: str) -> None:
    c, v = multi_cluster, multi_cluster.values
    claim(c, ns, "both", "nic", "nic1")
    pod(c, ns, "web", claims={"net": "both"})
    c.wait_running(ns, "web")
    obj = c.claim_yaml(ns, "both")
    entries = ready_entries(c, ns, "both", 2)
    eth0 = assert_entry_is_the_interface(c, ns, "web", entries[device_of(obj, "nic")], "eth0")
    eth1 = assert_entry_is_the_interface(c, ns, "web", entries[device_of(obj, "nic1")], "eth1")
    # Each interface on its own network: eth0 dual-stack on the primary, eth1 IPv4 on the second.
    assert sorted(ipaddress.ip_interface(ip).version for ip in eth0) == [4, 6]
    assert any(in_subnet(ip, v["NETCLAIM_NET0_SUBNET"]) for ip in eth0)
    assert any(in_subnet(ip, v["NETCLAIM_SUBNET6"]) for ip in eth0)
    assert len(eth1) == 1 and in_subnet(eth1[0], v["NETCLAIM_NET1_SUBNET"])
    # containerd reports eth0's addresses (both families) as the pod's IPs, never eth1's.
    pod_ips = [p["ip"] for p in c.get("pod", "web", ns)["status"]["podIPs"]]
    assert sorted(pod_ips) == sorted(ip.split("/")[0] for ip in eth0)
    # Each entry carries its own network's CNI result.
    assert entries[device_of(obj, "nic")]["data"]["network"] == v["NETCLAIM_NET0_NAME"]
    assert entries[device_of(obj, "nic1")]["data"]["network"] == v["NETCLAIM_NET1_NAME"]

    # Pod deletion: containerd runs DEL on both networks, and both entries go.
    c.delete_pod(ns, "web")
    wait_until(lambda: not entries_of(c.claim_yaml(ns, "both"), c.driver), f"the entries of {ns}/both to go",
               timeout=60)
    assert netclaim_warnings(c, ns) == []


def test_two_claims_one_per_network(multi_cluster: RealCluster, ns: str) -> None:
    c = multi_cluster
    template(c, ns, "primary", "nic")
    claim(c, ns, "second", "nic1")
    pod(c, ns, "two", claims={"second": "second"}, templates={"primary": "primary"})
    c.wait_running(ns, "two")
    primary = generated_claim(c, ns, "two", "primary")
    (eth0,) = ready_entries(c, ns, primary, 1).values()
    (eth1,) = ready_entries(c, ns, "second", 1).values()
    assert eth0["device"] == device_of(c.claim_yaml(ns, primary), "nic")
    assert eth1["device"] == device_of(c.claim_yaml(ns, "second"), "nic1")
    assert_entry_is_the_interface(c, ns, "two", eth0, "eth0")
    assert_entry_is_the_interface(c, ns, "two", eth1, "eth1")
    assert netclaim_warnings(c, ns) == []


def test_dual_stack_entry_of_a_pod_that_claims_only_eth0(multi_cluster: RealCluster, ns: str) -> None:
    """Item 4: eth0's entry holds the IPv4 and the IPv6 address, canonical, equal to the netns and the pod's
    IPs. The pod claimed no device for eth1 (it still has one: containerd attaches every network): no
    entry for it, no Warning Event, no failed event on the publisher."""
    c, v = multi_cluster, multi_cluster.values
    before = {NO_REQUEST: publisher_metric(c, NO_REQUEST), FAILED: publisher_metric(c, FAILED)}
    template(c, ns, "net", "nic")
    pod(c, ns, "dual", templates={"net": "net"})
    c.wait_running(ns, "dual")
    name = generated_claim(c, ns, "dual", "net")
    (entry,) = ready_entries(c, ns, name, 1).values()
    ips = assert_entry_is_the_interface(c, ns, "dual", entry, "eth0")
    v4 = [ip for ip in ips if ipaddress.ip_interface(ip).version == 4]
    v6 = [ip for ip in ips if ipaddress.ip_interface(ip).version == 6]
    assert len(v4) == 1 and len(v6) == 1, ips
    assert in_subnet(v6[0], v["NETCLAIM_SUBNET6"]) and v6[0].endswith("/64")
    assert sorted(p["ip"] for p in c.get("pod", "dual", ns)["status"]["podIPs"]) == sorted(
        ip.split("/")[0] for ip in ips)
    assert c.get("pod", "dual", ns)["status"]["podIP"] == v4[0].split("/")[0]  # IPv4 first (containerd's ip_pref)
    # eth1 exists in the pod, on the second network, and is nobody's device: the publisher counts its ADD
    # as nothing to publish, and reports nothing.
    eth1, _ = netns_cidrs(c, ns, "dual", "eth1")
    assert len(eth1) == 1 and in_subnet(eth1[0], v["NETCLAIM_NET1_SUBNET"])
    wait_until(lambda: publisher_metric(c, NO_REQUEST) >= before[NO_REQUEST] + 1,
               "the publisher to count eth1's ADD as nothing to publish", timeout=30)
    assert publisher_metric(c, FAILED) == before[FAILED]
    assert netclaim_warnings(c, ns) == []
    assert len(entries_of(c.claim_yaml(ns, name), c.driver)) == 1


NO_REQUEST = 'netclaim_events_ignored_total{reason="no_request"}'
FAILED = "netclaim_events_failed_total"


def test_chain_keeper_keeps_each_network_its_own_entry(multi_cluster: RealCluster, ns: str) -> None:
    """The DaemonSet's chain keeper (run as a node process) keeps its entry in the primary conflist and leaves
    the second network's entry alone: eth1's file is not touched, and a pod still gets both entries."""
    c, v = multi_cluster, multi_cluster.values
    files = [Path(v[f"NETCLAIM_NET{i}_CONFLIST"]) for i in (0, 1)]
    second = files[1].read_bytes()
    log = Path(c.dir) / "chain-keeper.log"
    start = log.stat().st_size if log.exists() else 0
    c.sh("chain-keeper-start")
    try:
        wait_until(lambda: '"chain status"' in log.read_text()[start:], "the keeper's first look at the conf dir",
                   timeout=60)
        time.sleep(3.0)  # a few more polls (every second)
        assert files[1].read_bytes() == second, "the keeper rewrote the second network's conflist"
        entries = [[(p.get("driverName"), p.get("request")) for p in json.loads(f.read_text())["plugins"]
                    if p["type"] == "netclaim"] for f in files]
        assert entries == [[(c.driver, "nic")], [(c.driver, "nic1")]]
        claim(c, ns, "kept", "nic", "nic1")
        pod(c, ns, "kept", claims={"net": "kept"})
        c.wait_running(ns, "kept")
        obj = c.claim_yaml(ns, "kept")
        found = ready_entries(c, ns, "kept", 2)
        assert_entry_is_the_interface(c, ns, "kept", found[device_of(obj, "nic")], "eth0")
        assert_entry_is_the_interface(c, ns, "kept", found[device_of(obj, "nic1")], "eth1")
    finally:
        c.sh("chain-keeper-stop")
