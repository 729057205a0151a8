"""netclaim in a real Kubernetes node: what `kubectl get resourceclaim -o yaml` shows.

Nothing here plays the scheduler or the kubelet: the controller-manager
generates claims from templates, the scheduler allocates the DRA test
driver's devices, the kubelet prepares them and asks containerd 2.x for the
sandbox, containerd runs the CNI chain that ends in netclaim, and the
publisher (a node service with the shipped RBAC) writes the claim status.
Every expectation about addresses is read from the pod's own netns.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from runtime.controlplane import api_client
from runtime.identity import kubeconfig_token, token_review
from runtime.realcluster import RealCluster, entries_of, ready_status, wait_until


def visible_entry(cluster: RealCluster, ns: str, claim: str, ips: list[str] | None = None) -> dict:
    """Wait until the claim shows netclaim's Ready entry (with exactly `ips` when given); return it."""
    def entry() -> dict | None:
        mine = entries_of(cluster.claim_yaml(ns, claim), cluster.driver)
        if len(mine) == 1 and ready_status(mine[0]) == "True":
            if ips is None or sorted(mine[0]["networkData"]["ips"]) == sorted(ips):
                return mine[0]
        return None
    return wait_until(entry, f"netclaim's Ready entry on {ns}/{claim}", timeout=60)


def entry_gone(cluster: RealCluster, ns: str, claim: str) -> None:
    def gone() -> bool:
        out = cluster.kubectl("get", "resourceclaim", claim, "-n", ns, "-o", "yaml", check=False)
        return not out or not entries_of(yaml.safe_load(out), cluster.driver)
    wait_until(gone, f"netclaim's entry on {ns}/{claim} to go", timeout=60)


def assert_entry_is_the_pods(cluster: RealCluster, ns: str, pod: str, claim: str) -> dict:
    eth0 = cluster.interface(ns, pod)
    entry = visible_entry(cluster, ns, claim, eth0.cidrs)
    assert entry["networkData"] == {"interfaceName": "eth0", "ips": eth0.cidrs, "hardwareAddress": eth0.mac}
    assert cluster.pod_ip(ns, pod) in [c.split("/")[0] for c in eth0.cidrs]
    claim_obj = cluster.claim_yaml(ns, claim)
    (result,) = claim_obj["status"]["allocation"]["devices"]["results"]
    # The entry names exactly the device the scheduler allocated from the driver's pool on this node.
    assert (entry["driver"], entry["pool"], entry["device"]) == (cluster.driver, cluster.node, result["device"])
    return entry


def test_template_pod_gets_the_ready_entry_with_its_real_ips_and_mac(real_cluster: RealCluster, ns: str) -> None:
    real_cluster.claim_template(ns)
    real_cluster.pod(ns, "web", template="net")
    real_cluster.wait_running(ns, "web")
    claim = real_cluster.pod_claim(ns, "web")
    entry = assert_entry_is_the_pods(real_cluster, ns, "web", claim)
    sandbox_id = real_cluster.sandbox(ns, "web")["id"]
    assert sandbox_id in json.dumps(entry.get("data") or {})  # the CNI result of this very sandbox


def test_pod_with_a_shared_precreated_claim(real_cluster: RealCluster, ns: str) -> None:
    real_cluster.claim(ns, "shared-net")
    real_cluster.pod(ns, "user", claim="shared-net")
    real_cluster.wait_running(ns, "user")
    assert_entry_is_the_pods(real_cluster, ns, "user", "shared-net")


def test_pod_deletion_runs_del_and_the_entry_goes(real_cluster: RealCluster, ns: str) -> None:
    real_cluster.claim(ns, "kept-net")
    real_cluster.pod(ns, "gone", claim="kept-net")
    real_cluster.wait_running(ns, "gone")
    sandbox_id = real_cluster.sandbox(ns, "gone")["id"]
    assert_entry_is_the_pods(real_cluster, ns, "gone", "kept-net")
    real_cluster.delete_pod(ns, "gone")
    entry_gone(real_cluster, ns, "kept-net")
    # The claim outlives the pod (it was not generated for it); the DEL for its sandbox really ran.
    assert real_cluster.claim_yaml(ns, "kept-net")["metadata"]["name"] == "kept-net"
    # The entry may go before the DEL (the pod left the claim's reservedFor first); the DEL comes too.
    plugin_log = Path(real_cluster.values["NETCLAIM_PLUGIN_LOG"])
    wait_until(lambda: any(sandbox_id in line and '"DEL"' in line for line in plugin_log.read_text().splitlines()),
               f"netclaim's DEL of sandbox {sandbox_id}", timeout=60)


def in_pod_netns(cluster: RealCluster, ns: str, pod: str, *ip_args: str) -> None:
    """`ip ...` inside the pod's netns (a pause pod has no shell for kubectl exec)."""
    subprocess.run(["nsenter", f"--net={cluster.netns(ns, pod)}", "ip", *ip_args], check=True, capture_output=True)


def entry_where(cluster: RealCluster, ns: str, claim: str, what: str, ok) -> dict:
    def entry() -> dict | None:
        mine = entries_of(cluster.claim_yaml(ns, claim), cluster.driver)
        return mine[0] if len(mine) == 1 and ok(mine[0]) else None
    return wait_until(entry, f"{what} on {ns}/{claim}", timeout=60)


def ready_reason(entry: dict) -> str:
    return next((c.get("reason", "") for c in entry.get("conditions") or [] if c.get("type") == "Ready"), "")


def test_the_entry_follows_the_pods_interface_after_the_add(real_cluster: RealCluster, ns: str) -> None:
    """Set down in the pod's netns: Ready=False LinkDown; up: True. What the workload puts on its interface
    itself is never published: an address it adds does not show, a MAC it sets is Ready=False MacChanged with
    the ADD's MAC kept, and its own MAC back is Ready=True. No CNI CHECK runs (containerd never calls it): the
    publisher sees the netns itself."""
    real_cluster.claim_template(ns)
    real_cluster.pod(ns, "live", template="net")
    real_cluster.wait_running(ns, "live")
    claim = real_cluster.pod_claim(ns, "live")
    first = assert_entry_is_the_pods(real_cluster, ns, "live", claim)
    in_pod_netns(real_cluster, ns, "live", "link", "set", "eth0", "down")
    down = entry_where(real_cluster, ns, claim, "Ready=False", lambda e: ready_status(e) == "False")
    assert ready_reason(down) == "LinkDown", down
    in_pod_netns(real_cluster, ns, "live", "link", "set", "eth0", "up")
    entry_where(real_cluster, ns, claim, "Ready=True again", lambda e: ready_status(e) == "True")
    # The workload adds an address, then sets a MAC of its own: the MAC shows the watch has read the
    # interface since the address was added, and neither reaches networkData.
    extra, planted_mac = "192.0.2.77/32", "02:00:5e:00:53:77"
    in_pod_netns(real_cluster, ns, "live", "addr", "add", extra, "dev", "eth0")
    in_pod_netns(real_cluster, ns, "live", "link", "set", "eth0", "address", planted_mac)
    changed = entry_where(real_cluster, ns, claim, "Ready=False MacChanged",
                          lambda e: ready_status(e) == "False" and ready_reason(e) == "MacChanged")
    assert changed["networkData"] == first["networkData"], changed
    in_pod_netns(real_cluster, ns, "live", "link", "set", "eth0", "address", first["networkData"]["hardwareAddress"])
    back = entry_where(real_cluster, ns, claim, "Ready=True with the ADD's MAC back",
                       lambda e: ready_status(e) == "True")
    assert back["networkData"] == first["networkData"] and extra in real_cluster.interface(ns, "live").cidrs, back
    in_pod_netns(real_cluster, ns, "live", "addr", "del", extra, "dev", "eth0")


def netns_inode(path: str) -> int:
    return os.stat(path).st_ino


def holders_of(inode: int, members_only: bool = False) -> dict[int, str]:
    """Every process (pid -> command) that is in the network namespace `inode` or (unless members_only)
    holds a descriptor of it."""
    out: dict[int, str] = {}
    for pid in (int(p) for p in os.listdir("/proc") if p.isdigit()):
        try:
            spaces = {os.stat(f"/proc/{pid}/task/{t}/ns/net").st_ino for t in os.listdir(f"/proc/{pid}/task")}
            fds = set() if members_only else {os.readlink(f"/proc/{pid}/fd/{fd}")
                                              for fd in os.listdir(f"/proc/{pid}/fd")}
            if inode in spaces or f"net:[{inode}]" in fds:
                out[pid] = Path(f"/proc/{pid}/comm").read_text().strip()
        except OSError:  # gone meanwhile
            continue
    return out


def netlink_sockets_in(netns: str) -> set[int]:
    """The inodes of every netlink socket made inside the network namespace at `netns`."""
    out = subprocess.run(["nsenter", f"--net={netns}", "cat", "/proc/net/netlink"], capture_output=True, text=True,
                         check=True).stdout
    return {int(line.split()[-1]) for line in out.splitlines()[1:] if line.strip()}


def sockets_of(pid: int) -> set[int]:
    """The socket inodes process `pid` holds open."""
    out = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            out.add(int(target[len("socket:["):-1]))
    return out


def host_link_exists(ifindex: int) -> bool:
    links = json.loads(subprocess.run(["ip", "-j", "link", "show"], capture_output=True, text=True, check=True).stdout)
    return any(link["ifindex"] == ifindex for link in links)


def test_a_sandbox_lost_without_del_is_let_go_and_its_entry_removed(real_cluster: RealCluster, ns: str) -> None:
    """The runtime loses a sandbox without a CNI DEL: its processes are killed and its netns unmounted (the
    kubelet stopped, so nothing sends a DEL or starts a new sandbox meanwhile). The publisher, which watched
    that netns, must not keep it alive: the namespace is freed (its veth's host end disappears with it), and
    the dead sandbox's entry is removed from the claim."""
    real_cluster.claim_template(ns)
    real_cluster.pod(ns, "lost", template="net")
    real_cluster.wait_running(ns, "lost")
    claim = real_cluster.pod_claim(ns, "lost")
    assert_entry_is_the_pods(real_cluster, ns, "lost", claim)
    path = real_cluster.netns(ns, "lost")
    inode = netns_inode(path)
    out = subprocess.run(["nsenter", f"--net={path}", "ip", "-j", "link", "show", "dev", "eth0"],
                         capture_output=True, text=True, check=True).stdout
    peer = json.loads(out)[0]["link_index"]  # the bridge plugin's veth: its host end
    assert host_link_exists(peer)
    publisher_pid = int((Path(real_cluster.dir) / "publisher.pid").read_text())
    # The live watch holds the namespace the way anything can that keeps a socket made inside it.
    wait_until(lambda: sockets_of(publisher_pid) & netlink_sockets_in(path),
               "the publisher's live watch to hold netlink sockets in the pod's netns", timeout=30)
    real_cluster.sh("kubelet-stop")
    try:
        # The pod's own processes (its watch thread enters a netns only to open, the publisher is spared).
        for pid in set(holders_of(inode, members_only=True)) - {publisher_pid}:
            os.kill(pid, signal.SIGKILL)
        wait_until(lambda: not set(holders_of(inode, members_only=True)) - {publisher_pid},
                   "the sandbox's processes to be gone", timeout=30)
        subprocess.run(["umount", path], check=True)
        os.unlink(path)
        try:
            wait_until(lambda: not host_link_exists(peer), f"the netns freed (host veth {peer} gone)", timeout=60)
        except AssertionError as exc:
            raise AssertionError(f"{exc}; the netns is still held by {holders_of(inode)}") from None
        entry_gone(real_cluster, ns, claim)
    finally:
        real_cluster.sh("kubelet-start")


@pytest.mark.parametrize("component", ["kubelet", "containerd"])
def test_restart_keeps_live_entries_and_drops_dead_ones(real_cluster: RealCluster, ns: str, component: str) -> None:
    real_cluster.claim(ns, "live-net")
    real_cluster.claim(ns, "dead-net")
    real_cluster.pod(ns, "live", claim="live-net")
    real_cluster.pod(ns, "dead", claim="dead-net")
    real_cluster.wait_running(ns, "live", "dead")
    live = assert_entry_is_the_pods(real_cluster, ns, "live", "live-net")
    assert_entry_is_the_pods(real_cluster, ns, "dead", "dead-net")

    # While the component is down, the dead pod is removed from the API: only the
    # restarted node can tear its sandbox down (kubelet's orphan cleanup / its retry).
    real_cluster.sh(f"{component}-stop")
    try:
        real_cluster.kubectl("delete", "pod", "dead", "-n", ns, "--grace-period=0", "--force", "--wait=false")
    finally:
        real_cluster.sh(f"{component}-start")
    entry_gone(real_cluster, ns, "dead-net")
    real_cluster.wait_running(ns, "live")
    after = visible_entry(real_cluster, ns, "live-net", live["networkData"]["ips"])
    assert after["networkData"] == live["networkData"]
    assert real_cluster.interface(ns, "live").cidrs == live["networkData"]["ips"]


def test_pod_without_a_netclaim_device_runs_and_nothing_is_written(real_cluster: RealCluster, ns: str,
                                                                   other_driver: str) -> None:
    real_cluster.claim(ns, "gpu", device_class=other_driver)
    real_cluster.pod(ns, "plain", claim="gpu")
    real_cluster.wait_running(ns, "plain")
    claim = real_cluster.claim_yaml(ns, "gpu")
    (result,) = claim["status"]["allocation"]["devices"]["results"]
    assert result["driver"] == other_driver
    # The chain ran (the pod has its address) and the publisher answered it: still nothing written.
    assert real_cluster.interface(ns, "plain").cidrs
    assert (claim.get("status") or {}).get("devices") in (None, [])


def test_publisher_down_during_pod_churn_converges_when_it_returns(real_cluster: RealCluster, ns: str) -> None:
    real_cluster.claim_template(ns)
    real_cluster.claim(ns, "left-net")
    real_cluster.pod(ns, "left", claim="left-net")
    real_cluster.wait_running(ns, "left")
    assert_entry_is_the_pods(real_cluster, ns, "left", "left-net")
    real_cluster.sh("publisher-stop")
    try:
        for name in ("churn-a", "churn-b"):
            real_cluster.pod(ns, name, template="net")
        real_cluster.wait_running(ns, "churn-a", "churn-b")  # pods never wait for netclaim
        real_cluster.delete_pod(ns, "left")  # its DEL is spooled too
    finally:
        real_cluster.sh("publisher-start")
    for name in ("churn-a", "churn-b"):
        assert_entry_is_the_pods(real_cluster, ns, name, real_cluster.pod_claim(ns, name))
    entry_gone(real_cluster, ns, "left-net")


def test_status_polling_without_the_publisher_keeps_the_node_ready(real_cluster: RealCluster, ns: str) -> None:
    conflist = json.loads(Path(real_cluster.values["NETCLAIM_CONFLIST"]).read_text())
    assert conflist["cniVersion"] == "1.1.0"  # containerd 2.x runs STATUS only from CNI 1.1.0 on
    assert conflist["plugins"][-1]["type"] == "netclaim"
    real_cluster.sh("publisher-stop")
    try:
        # The runtime's STATUS through the whole chain, netclaim included, while the publisher is absent.
        info = json.loads(real_cluster.crictl("info", "-o", "json"))
        conditions = {c["type"]: c["status"] for c in info["status"]["conditions"]}
        assert (conditions["RuntimeReady"], conditions["NetworkReady"]) == (True, True), info["status"]
        # The kubelet polls the same status (every 5 s): after two of its polls the node still says Ready.
        before = runtime_status_calls(real_cluster)
        wait_until(lambda: runtime_status_calls(real_cluster) >= before + 2, "two kubelet runtime status polls",
                   timeout=60)
        cond = node_ready(real_cluster)
        assert cond["status"] == "True", cond
        real_cluster.claim_template(ns)
        real_cluster.pod(ns, "meanwhile", template="net")
        real_cluster.wait_running(ns, "meanwhile")
    finally:
        real_cluster.sh("publisher-start")
    assert_entry_is_the_pods(real_cluster, ns, "meanwhile", real_cluster.pod_claim(ns, "meanwhile"))


def node_ready(cluster: RealCluster) -> dict:
    node = cluster.get("node", cluster.node)
    return next(c for c in node["status"]["conditions"] if c["type"] == "Ready")


def runtime_status_calls(cluster: RealCluster) -> float:
    """How many CRI Status calls the kubelet has made (its own counter)."""
    total = 0.0
    for line in cluster.kubelet_metrics().splitlines():
        if line.startswith("kubelet_runtime_operations_total{") and 'operation_type="status"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


@pytest.fixture(scope="module")
def other_driver(real_cluster: RealCluster) -> Iterator[str]:
    """A second real DRA driver (the same test driver under another name): not netclaim's."""
    with real_cluster.second_driver("gpu.example.com") as name:
        yield name


def test_publisher_runs_as_the_node_bound_service_account_not_admin(real_cluster: RealCluster) -> None:
    kubeconfig = Path(real_cluster.dir) / "nc" / "publisher.kubeconfig"
    who = token_review(api_client(real_cluster.kubeconfig), kubeconfig_token(kubeconfig))
    assert who["username"] == "system:serviceaccount:netclaim-system:netclaim-publisher"
    assert "system:masters" not in who["groups"]
    assert who["extra"].get("authentication.kubernetes.io/node-name") == [real_cluster.node]
    plugin = json.loads(Path(real_cluster.values["NETCLAIM_CONFLIST"]).read_text())["plugins"][-1]
    assert (plugin["type"], plugin["driverName"]) == ("netclaim", real_cluster.driver)
    assert (Path(real_cluster.values["NETCLAIM_CNI_BIN"]) / "netclaim").is_file()
