"""netclaim in a real Kubernetes node whose runtime is CRI-O (`scripts/cluster.sh up --runtime crio`).

The same single-node cluster as test_real_cluster.py (etcd, kube-apiserver, kube-controller-manager,
kube-scheduler, kubelet, the DRA test driver), with CRI-O (built from the Go module proxy by
scripts/build/crio.sh, Debian's conmon and runc) as the kubelet's runtime instead of containerd.
netclaim is installed the operator way into the conflist CRI-O runs. CRI-O differs from containerd
where netclaim can see it: it runs CNI CHECK right after every ADD, one DEL per sandbox, a GC at its
start, and passes runtimeConfig without portMappings.

The cluster has its own directory, NETCLAIM_CRIO_CLUSTER_DIR (default /tmp/nc-crtest), beside the
containerd one of conftest.py, and lives for this module only (it goes down after its last test, and
`down` must leave no trace of CRI-O on the host); a cluster already up there is reused and left up,
NETCLAIM_CLUSTER_KEEP=1 keeps the one started here. If any part cannot start, every test here FAILS with
the reason. The last test makes Multus (thin plugin, `cluster.sh multus-up`) the node's primary CNI on the
same cluster and runs one pod on three networks.
Measured here (2 cores, binaries and the netclaim image cached): ~80 s for the module, of which `up` ~18 s,
`down` ~13 s and the kubectl test ~19 s (most of it importing the netclaim image into CRI-O).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
from pathlib import Path
from typing import Any, Iterator

import pytest

from cluster_kit import cluster_with_netclaim, fresh_namespace, need_root, netclaim_warnings, publisher_metric
from runtime import multinet
from runtime.realcluster import (ClusterError, RealCluster, cluster_sh, entries_of, parse_env, pod_manifest,
                                 ready_status, wait_until)
from test_kubectl_reaches_the_node import import_app_image, kubectl_reaches_the_node
from test_multus import BRIDGE2, MACVLAN, expected_of, settled
from test_real_cluster import assert_entry_is_the_pods, entry_gone

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def crio_cluster() -> Iterator[RealCluster]:
    need_root("kubelet, CRI-O, cgroups")
    directory = os.environ.get("NETCLAIM_CRIO_CLUSTER_DIR", "/tmp/nc-crtest")
    # eth0 reports under the primary request, as with Multus (the last test puts Multus on this node)
    env = {**os.environ, "NETCLAIM_CLUSTER_DIR": directory, "NETCLAIM_REQUEST": multinet.PRIMARY_REQUEST}
    before = host_state()

    def runs_crio(cluster: RealCluster) -> None:
        if cluster.values.get("NETCLAIM_RUNTIME") != "crio":
            raise ClusterError(f"the cluster in {directory} runs {cluster.values.get('NETCLAIM_RUNTIME')}, not CRI-O")

    def no_leftovers(cluster: RealCluster) -> None:
        left = host_leftovers(cluster, before)
        if left:
            pytest.fail(f"`cluster.sh down` left CRI-O's traces on the host: {left}", pytrace=False)

    yield from cluster_with_netclaim(
        env, lambda: RealCluster(directory, parse_env(cluster_sh("up", "--runtime", "crio", env=env)), env),
        "the real cluster with CRI-O", check=runs_crio, after_down=no_leftovers)


def host_state() -> dict[str, Any]:
    """What CRI-O may leave outside its cluster's directory: host-port chains, the image blob-info cache."""
    chains = {line.split()[1] for line in subprocess.run(["iptables", "-w", "-t", "nat", "-S"], capture_output=True,
                                                         text=True, check=True).stdout.splitlines()
              if line.startswith("-N ")}
    return {"nat chains": sorted(c for c in chains if c.startswith(("KUBE-HOSTPORTS", "KUBE-HP-", "CRIO-"))),
            "/var/lib/containers": os.path.exists("/var/lib/containers")}


def host_leftovers(cluster: RealCluster, before: dict[str, Any]) -> dict[str, Any]:
    now = host_state()
    left = {k: v for k, v in now.items() if v != before[k]}
    if subprocess.run(["ip", "link", "show", cluster.values["NETCLAIM_BRIDGE"]], capture_output=True).returncode == 0:
        left["bridge"] = cluster.values["NETCLAIM_BRIDGE"]
    conmons = subprocess.run(["pgrep", "-f", f"conmon .*{cluster.values['NETCLAIM_CRIO_DIR']}/"], capture_output=True,
                             text=True).stdout.split()
    if conmons:
        left["conmon"] = conmons
    if os.path.exists(cluster.dir):
        left["directory"] = cluster.dir
    return left


@pytest.fixture
def crio_ns(crio_cluster: RealCluster) -> Iterator[str]:
    yield from fresh_namespace(crio_cluster, "o")


# ---------------------------------------------------------------- helpers (CRI-O's view, netclaim's logs)

def log_records(path: str, key: str, value: str) -> list[dict[str, Any]]:
    """The JSON log records of `path` whose `key` is `value`, in order."""
    out = []
    for line in Path(path).read_text().splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if rec.get(key) == value:
            out.append(rec)
    return out


def plugin_calls(cluster: RealCluster, sandbox: str) -> list[dict[str, Any]]:
    """netclaim's plugin log records about one sandbox, in order."""
    return log_records(cluster.values["NETCLAIM_PLUGIN_LOG"], "containerID", sandbox)


def message(rec: dict[str, Any]) -> str:
    """A JSON log record's message."""
    return rec.get("msg") or ""


def commands(cluster: RealCluster, sandbox: str) -> list[str]:
    return [r["command"] for r in plugin_calls(cluster, sandbox) if message(r).endswith(" done")]


def add_then_check(cluster: RealCluster, sandbox: str) -> bool:
    """netclaim's log shows CRI-O's ADD of the sandbox, then its CHECK (else what it shows, for wait_until)."""
    calls = [(r.get("command"), message(r)) for r in plugin_calls(cluster, sandbox)]
    if [c for c, _ in calls][:2] != ["ADD", "CHECK"]:
        raise AssertionError(f"netclaim's log about sandbox {sandbox}: {calls}")
    return True


def publisher_status(cluster: RealCluster) -> dict[str, Any]:
    out = subprocess.run([str(REPO / ".venv" / "bin" / "netclaim-publisher"), "status", "--socket",
                          cluster.values["NETCLAIM_PUBLISHER_SOCKET"], "-o", "json"],
                         capture_output=True, text=True, check=True, timeout=30).stdout
    return json.loads(out)


def quiescent(cluster: RealCluster) -> None:
    wait_until(lambda: publisher_status(cluster)["quiescent"], "the publisher to be quiescent", timeout=60)


def publisher_said(cluster: RealCluster, claim: str) -> list[dict[str, Any]]:
    """The publisher's log records about one claim ("ns/name"), in order."""
    return log_records(cluster.values["NETCLAIM_PUBLISHER_LOG"], "claim", claim)


ACKED_CHECKS = 'netclaim_events_acked_total{op="CHECK"}'


def ready_condition(entry: dict[str, Any]) -> dict[str, Any]:
    return next(c for c in entry.get("conditions") or [] if c.get("type") == "Ready")


# ---------------------------------------------------------------- the tests

def test_the_node_runs_crio_with_netclaim_chained_in_its_conflist(crio_cluster: RealCluster) -> None:
    version = crio_cluster.crictl("version")
    assert "RuntimeName:  cri-o" in version, version
    node = crio_cluster.get("node", crio_cluster.node)
    assert node["status"]["nodeInfo"]["containerRuntimeVersion"].startswith("cri-o://"), node["status"]["nodeInfo"]
    conflist = json.loads(Path(crio_cluster.values["NETCLAIM_CONFLIST"]).read_text())
    assert conflist["plugins"][-1]["type"] == "netclaim"


def test_template_pod_on_crio_gets_the_ready_entry_of_its_netns(crio_cluster: RealCluster, crio_ns: str) -> None:
    crio_cluster.claim_template(crio_ns)
    crio_cluster.pod(crio_ns, "web", template="net")
    crio_cluster.wait_running(crio_ns, "web")
    claim = crio_cluster.pod_claim(crio_ns, "web")
    entry = assert_entry_is_the_pods(crio_cluster, crio_ns, "web", claim)
    sandbox = crio_cluster.sandbox(crio_ns, "web")["id"]
    assert entry["data"]["containerID"] == sandbox  # the CNI result of this very sandbox, from CRI-O's ADD


def test_crio_check_right_after_add_neither_flips_nor_duplicates_the_entry(crio_cluster: RealCluster,
                                                                           crio_ns: str) -> None:
    """CRI-O sends CHECK a few ms after the ADD: the publisher takes it without writing the claim again, so
    one entry stays, Ready never leaves True (its lastTransitionTime is the ADD's), and the claim was
    written once, for the ADD."""
    failed = publisher_metric(crio_cluster, "netclaim_events_failed_total")
    checks = publisher_metric(crio_cluster, ACKED_CHECKS)
    crio_cluster.claim(crio_ns, "checked")
    crio_cluster.pod(crio_ns, "checked", claim="checked")
    crio_cluster.wait_running(crio_ns, "checked")
    sandbox = crio_cluster.sandbox(crio_ns, "checked")["id"]
    entry = assert_entry_is_the_pods(crio_cluster, crio_ns, "checked", "checked")
    wait_until(lambda: add_then_check(crio_cluster, sandbox),
               f"CRI-O's ADD then CHECK of sandbox {sandbox} in netclaim's log", timeout=30)
    check = [r for r in plugin_calls(crio_cluster, sandbox) if r.get("command") == "CHECK"][0]
    assert (check.get("handoff"), check.get("drift")) == ("acked", ""), check  # handed to the publisher, no drift
    wait_until(lambda: publisher_metric(crio_cluster, ACKED_CHECKS) > checks, "the publisher to take the CHECK",
               timeout=30)
    quiescent(crio_cluster)
    claim = f"{crio_ns}/checked"
    said = [(message(r), r.get("op")) for r in publisher_said(crio_cluster, claim)]
    assert [op for event, op in said if event == "published"] == ["ADD"], said  # the CHECK wrote nothing
    mine = entries_of(crio_cluster.claim_yaml(crio_ns, "checked"), crio_cluster.driver)
    assert len(mine) == 1, mine
    assert ready_status(mine[0]) == "True", mine[0]
    assert ready_condition(mine[0]) == ready_condition(entry)  # same reason, same lastTransitionTime: no flip
    assert mine[0]["networkData"] == entry["networkData"]
    assert publisher_metric(crio_cluster, "netclaim_events_failed_total") == failed
    assert netclaim_warnings(crio_cluster, crio_ns) == []


def test_pod_deletion_on_crio_runs_del_and_the_entry_goes(crio_cluster: RealCluster, crio_ns: str) -> None:
    crio_cluster.claim(crio_ns, "kept-net")
    crio_cluster.pod(crio_ns, "gone", claim="kept-net")
    crio_cluster.wait_running(crio_ns, "gone")
    sandbox = crio_cluster.sandbox(crio_ns, "gone")["id"]
    assert_entry_is_the_pods(crio_cluster, crio_ns, "gone", "kept-net")
    crio_cluster.delete_pod(crio_ns, "gone")
    entry_gone(crio_cluster, crio_ns, "kept-net")
    assert crio_cluster.claim_yaml(crio_ns, "kept-net")["metadata"]["name"] == "kept-net"
    wait_until(lambda: "DEL" in commands(crio_cluster, sandbox), f"netclaim's DEL of sandbox {sandbox}", timeout=60)
    calls = commands(crio_cluster, sandbox)
    assert calls[:2] == ["ADD", "CHECK"] and calls.count("ADD") == 1, calls


def test_pod_without_a_claim_on_crio_costs_nothing(crio_cluster: RealCluster, crio_ns: str) -> None:
    """netclaim runs for the pod (ADD, CHECK) and answers it without reading the API to resolve it, writing,
    failing, a Warning or a line in the publisher's log. (Other reads may happen meanwhile: the publisher
    forgets the claims of the earlier tests' namespaces as they go.)"""
    quiescent(crio_cluster)
    costs = {what: publisher_metric(crio_cluster, what) for what in (
        'netclaim_api_requests_by_purpose_total{purpose="resolve-get"}', "netclaim_events_failed_total")}
    log_lines = len(Path(crio_cluster.values["NETCLAIM_PUBLISHER_LOG"]).read_text().splitlines())
    crio_cluster.pod(crio_ns, "plain")
    crio_cluster.wait_running(crio_ns, "plain")
    sandbox = crio_cluster.sandbox(crio_ns, "plain")["id"]
    assert crio_cluster.interface(crio_ns, "plain").cidrs  # the chain ran: the pod has its address
    wait_until(lambda: add_then_check(crio_cluster, sandbox),
               f"CRI-O's ADD then CHECK of sandbox {sandbox} in netclaim's log", timeout=30)
    quiescent(crio_cluster)
    assert {what: publisher_metric(crio_cluster, what) for what in costs} == costs
    said = Path(crio_cluster.values["NETCLAIM_PUBLISHER_LOG"]).read_text().splitlines()[log_lines:]
    assert not [line for line in said if f"{crio_ns}/plain" in line or sandbox in line], said
    assert netclaim_warnings(crio_cluster, crio_ns) == []


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("0.0.0.0", 0))
        return s.getsockname()[1]


def test_a_host_port_pod_on_crio_gets_its_entry_and_crio_maps_the_port(crio_cluster: RealCluster,
                                                                       crio_ns: str) -> None:
    """CRI-O maps host ports itself (iptables) and passes no portMappings to the CNI chain: the pod's entry is
    the same as any pod's, and the DNAT rule is CRI-O's (`down` removes its chains: see the fixture)."""
    port = free_port()
    crio_cluster.claim(crio_ns, "hp-net")
    pod = pod_manifest(crio_ns, "hp", claim="hp-net")
    pod["spec"]["containers"][0]["ports"] = [{"containerPort": 8080, "hostPort": port}]
    crio_cluster.apply(pod)
    crio_cluster.wait_running(crio_ns, "hp")
    assert_entry_is_the_pods(crio_cluster, crio_ns, "hp", "hp-net")
    ip = crio_cluster.pod_ip(crio_ns, "hp")
    rules = subprocess.run(["iptables", "-w", "-t", "nat", "-S"], capture_output=True, text=True, check=True).stdout
    assert f"--dport {port} " in rules and f"--to-destination {ip}:8080" in rules, rules


def test_crio_applies_the_drivers_cdi_edits_to_a_container_using_the_claim(crio_cluster: RealCluster,
                                                                          crio_ns: str) -> None:
    """CRI-O reads the cluster's CDI dir (where the DRA driver writes): the test driver's edit (an environment
    variable) reaches the container that uses the claim, and netclaim still reports the pod's eth0."""
    crio_cluster.claim(crio_ns, "cdinet")
    pod = pod_manifest(crio_ns, "cdi", claim="cdinet")
    pod["spec"]["containers"][0]["resources"] = {"claims": [{"name": "net"}]}
    crio_cluster.apply(pod)
    crio_cluster.wait_running(crio_ns, "cdi")
    (ctr,) = crio_cluster.crictl("ps", "--pod", crio_cluster.sandbox(crio_ns, "cdi")["id"], "--name", "^app$",
                                 "-q").split()
    spec = json.loads(crio_cluster.crictl("inspect", "-o", "json", ctr))["info"]["runtimeSpec"]
    assert "claim_cdinet_nic=true" in spec["process"]["env"], spec["process"]["env"]
    assert_entry_is_the_pods(crio_cluster, crio_ns, "cdi", "cdinet")


def gc_calls(cluster: RealCluster) -> list[dict[str, Any]]:
    out = []
    for line in Path(cluster.values["NETCLAIM_PLUGIN_LOG"]).read_text().splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if rec.get("command") == "GC" and message(rec) == "GC done":
            out.append(rec)
    return out


def test_crio_restart_gc_and_check_keep_the_live_entry(crio_cluster: RealCluster, crio_ns: str) -> None:
    """CRI-O restarted while a pod runs: at its start it sends GC naming the sandboxes it restored, then CHECKs
    them. netclaim removes nothing of the live pod and the entry stays as it was (no flip, no duplicate)."""
    crio_cluster.claim(crio_ns, "kept")
    crio_cluster.pod(crio_ns, "kept", claim="kept")
    crio_cluster.wait_running(crio_ns, "kept")
    sandbox = crio_cluster.sandbox(crio_ns, "kept")["id"]
    entry = assert_entry_is_the_pods(crio_cluster, crio_ns, "kept", "kept")
    checks = commands(crio_cluster, sandbox).count("CHECK")
    gcs = len(gc_calls(crio_cluster))
    crio_cluster.sh("crio-stop")
    crio_cluster.sh("crio-start")
    wait_until(lambda: len(gc_calls(crio_cluster)) > gcs, "CRI-O's GC at its start in netclaim's log", timeout=60)
    gc = gc_calls(crio_cluster)[gcs]
    assert gc["removedState"] == [] and gc["valid"] >= 1, gc
    wait_until(lambda: commands(crio_cluster, sandbox).count("CHECK") > checks,
               f"CRI-O's CHECK of the restored sandbox {sandbox}", timeout=60)
    quiescent(crio_cluster)
    crio_cluster.wait_running(crio_ns, "kept")
    mine = entries_of(crio_cluster.claim_yaml(crio_ns, "kept"), crio_cluster.driver)
    assert len(mine) == 1 and ready_condition(mine[0]) == ready_condition(entry), mine
    assert mine[0]["networkData"] == entry["networkData"]
    assert crio_cluster.interface(crio_ns, "kept").cidrs == entry["networkData"]["ips"]


def test_kubectl_logs_exec_port_forward_and_the_node_proxy_reach_the_crio_node(crio_cluster: RealCluster,
                                                                               crio_ns: str) -> None:
    """The kubelet serves on the node IP with the CA's certificate whatever the runtime; exec and port-forward
    go on to CRI-O's streaming server, which the kubelet reaches on 127.0.0.1."""
    kubectl_reaches_the_node(crio_cluster, crio_ns, import_app_image(crio_cluster))


@pytest.fixture(scope="module")
def crio_multus(crio_cluster: RealCluster) -> RealCluster:
    """The CRI-O cluster with Multus (thin plugin) as the node's primary CNI from now on."""
    try:
        crio_cluster.sh("multus-up", timeout=1800)
    except ClusterError as exc:
        pytest.fail(f"Multus could not be put on the CRI-O node: {exc}", pytrace=False)
    return crio_cluster


def test_multus_on_crio_gives_a_pod_three_networks_each_with_its_entry(crio_multus: RealCluster,
                                                                       crio_ns: str) -> None:
    """eth0 + macvlan + bridge2 from one template claim: three entries, one each, each the interface CRI-O's CNI
    call through Multus made (claim entry, netns and Multus's network-status agree). Multus answers CRI-O's
    CHECK with the delegates of its own conf only (none here): netclaim sees one ADD per network."""
    cls = crio_multus.values["NETCLAIM_DEVICE_CLASS"]
    nets = [MACVLAN, BRIDGE2]
    crio_multus.apply(multinet.claim_template(crio_ns, "three", ["nic", "macvlan", "bridge2"], cls),
                      multinet.pod(crio_ns, "p", nets, {"net": {"resourceClaimTemplateName": "three"}}))
    crio_multus.wait_running(crio_ns, "p")
    settled(crio_multus, crio_ns, "p", expected_of(nets))
    sandbox = crio_multus.sandbox(crio_ns, "p")["id"]
    wait_until(lambda: sorted(r["ifname"] for r in plugin_calls(crio_multus, sandbox) if r.get("command") == "ADD")
               == ["eth0", "net1", "net2"], f"netclaim's ADD of sandbox {sandbox} on every network", timeout=30)
    quiescent(crio_multus)
    v = multinet.view(crio_multus, crio_ns, "p")
    assert sorted(len(e) for e in v.entries.values()) == [1, 1, 1], v.entries
    assert multinet.problems(v, expected_of(nets)) == []
    assert netclaim_warnings(crio_multus, crio_ns) == []
