"""Every Kubernetes minor the chart accepts, on a real control plane and kubelet of that minor.

One single-node cluster per minor (scripts/cluster.sh up --kube-version 1.3x: kube-apiserver,
kube-controller-manager, kube-scheduler, kubelet, kubectl and the DRA test driver of that
release, built from its Go modules), shared by that minor's cases, with the chart installed
the way docs/install.md says: a template-claimed pod and a pod of a pre-created shared claim
get the entries their netns holds, a second driver's entry on the same claim is never
touched, the live watch turns a downed link into Ready=False, an API-server restart loses
nothing, the boot rule retires what an earlier boot's sandboxes left, deleting a pod removes
its entry, the publisher's own token cannot write a claim of another node, and uninstalling
leaves the node as it was.

What ran is recorded: each minor's run writes <tmp>/netclaim-kube-matrix/<minor>.json (the
release and the cases that passed); `scripts/build/version_table.py --record` merges those into
docs/kubernetes-versions.json and renders docs/install.md's version table from it, and
`test_the_documented_row_is_what_ran` holds each committed row to this run.
NETCLAIM_KUBE_VERSIONS="1.34 1.36" runs only those minors.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from chartlib import CHART, helm
from deploylib import REPO
from kubehelpers import (
    Claim,
    allocated_claim,
    apply_status,
    assert_driver_refusal,
    create_pod,
    device_entry,
    status_devices,
    token_request,
)
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from test_daemonset_cluster import NAMESPACE, RELEASE, NodeFiles, uninstall_release

sys.path.insert(0, str(REPO / "scripts" / "harness"))
sys.path.insert(0, str(REPO / "scripts" / "build"))
from runtime.identity import ensure_node
from runtime.nodechart import build_image, daemonset_pods, version
from runtime.realcluster import ClusterError, RealCluster, entries_of, free_port, ready_status, wait_until
from version_table import MATRIX_FILE, matrix_minors

pytestmark = pytest.mark.containerd

SA = "netclaim-publisher"
OTHER_NODE = "nc-other-node"
OTHER_DRIVER = "gpu.example.com"
POLICY = f"{RELEASE}-claim-status"  # the chart's claim-status policy and its binding (release "netclaim")
WANTED = os.environ.get("NETCLAIM_KUBE_VERSIONS", "").split() or matrix_minors()


@dataclass
class Minor:
    """One minor's cluster with the chart installed, and what its cases saw."""

    minor: str
    cluster: RealCluster
    files: NodeFiles
    before_install: dict[str, Any]
    ns: str
    api: client.ApiClient
    git_version: str = ""
    passed: list[str] = field(default_factory=list)


def pod_netns_dir(cluster: RealCluster) -> str:
    """Where the node's containerd mounts pod netns (netns_mounts_under_state_dir), made a shared mount as
    /var/run/netns is on a systemd host: the chart mounts it into the netns opener with HostToContainer
    propagation, which the runtime refuses from a private mount. `cluster.sh down` unmounts it."""
    path = os.path.join(cluster.dir, "c", "state", "io.containerd.grpc.v1.cri", "netns")
    os.makedirs(path, exist_ok=True)
    if subprocess.run(["mountpoint", "-q", path], check=False).returncode != 0:
        subprocess.run(["mount", "--bind", path, path], check=True, timeout=30)
    subprocess.run(["mount", "--make-shared", path], check=True, timeout=30)
    return path


def values(cluster: RealCluster, files: NodeFiles, boot_file: Path) -> list[str]:
    """The chart's values as docs/install.md gives them, plus this host's paths and the test's boot id."""
    sets = {
        "driverName": cluster.driver, "image.pullPolicy": "Never", "priorityClassName": "",
        "cni.confDir": str(files.conf), "cni.binDir": str(files.bin),
        "hostPaths.run": str(files.run), "hostPaths.state": str(files.state), "metrics.port": str(free_port()),
        "metrics.keeperPort": str(free_port()),
        # No kube-proxy here: the API server as the node sees it.
        "apiServer.host": "127.0.0.1",
        # This kernel has no AppArmor: the kubelet refuses a pod that asks for a profile.
        "liveWatch.openerAppArmorProfile": "",
        "liveWatch.netnsDir": pod_netns_dir(cluster),
        # The node of another node's claim (a Node object, no kubelet) gets no DaemonSet pod.
        "nodeSelector.kubernetes\\.io/hostname": cluster.node,
        # The boot rule's simulated reboot (docs/publisher.md "The boot rule").
        "extraEnv[0].name": "NETCLAIM_BOOT_ID_FILE", "extraEnv[0].value": str(boot_file),
    }
    strings = {"image.tag": version(), "cni.pollInterval": "0.5",
               "apiServer.port": cluster.values["NETCLAIM_APISERVER"].rsplit(":", 1)[1]}
    return [*(a for k, v in sets.items() for a in ("--set", f"{k}={v}")),
            *(a for k, v in strings.items() for a in ("--set-string", f"{k}={v}"))]


@pytest.fixture(scope="module")
def image() -> str:
    try:
        return build_image()
    except ClusterError as exc:
        pytest.fail(str(exc), pytrace=False)


@pytest.fixture(scope="module", params=WANTED, ids=[f"k8s-{m}" for m in WANTED])
def minor(request: pytest.FixtureRequest, image: str) -> Iterator[Minor]:
    """The minor's cluster (built on first use), the image imported and the chart installed."""
    wanted = request.param
    directory = os.path.join(tempfile.gettempdir(), f"nc-kv{wanted.split('.')[1]}")
    try:
        cluster = RealCluster.up(directory, {**os.environ, "NETCLAIM_CLUSTER_DIR": directory}, kube_version=wanted)
    except ClusterError as exc:
        pytest.fail(f"the Kubernetes {wanted} cluster could not start: {exc}", pytrace=False)
    api = client.ApiClient()
    try:
        files = NodeFiles(cluster)
        before = files.snapshot()
        cluster.sh("import-image", image, timeout=900)
        files.run.mkdir(parents=True, exist_ok=True)
        helm("upgrade", "--install", RELEASE, str(CHART), "-n", NAMESPACE, "--create-namespace",
             *values(cluster, files, files.run / "boot-id"), "--wait", "--timeout", "300s",
             kubeconfig=cluster.kubeconfig, timeout=400)
        wait_until(lambda: files.chained(files.conflist), "netclaim chained into the node's conflist")
        from kubernetes import config
        api = config.new_client_from_config(config_file=cluster.kubeconfig)
        ns = cluster.namespace(f"kv-{uuid.uuid4().hex[:6]}")
        with cluster.second_driver(OTHER_DRIVER):
            yield Minor(wanted, cluster, files, before, ns, api)
    finally:
        api.close()
        if not os.environ.get("NETCLAIM_CLUSTER_KEEP"):
            cluster.down()


RECORDS = Path(tempfile.gettempdir()) / "netclaim-kube-matrix"


@pytest.fixture(autouse=True)
def record(request: pytest.FixtureRequest, minor: Minor) -> Iterator[None]:
    """Each case that passes is written into the minor's record of this run."""
    yield
    report = getattr(request.node, "rep_call", None)  # tests/deploy/conftest.py keeps it
    if report is None or not report.passed:
        return
    minor.passed.append(request.node.originalname)
    RECORDS.mkdir(mode=0o700, exist_ok=True)
    (RECORDS / f"{minor.minor}.json").write_text(json.dumps({
        "minor": minor.minor, "release": minor.git_version, "date": time.strftime("%Y-%m-%d", time.gmtime()),
        "passed": [name for name in minor.passed if name != "test_the_documented_row_is_what_ran"]}, indent=2))


# ---------------------------------------------------------------------------------------- helpers

def entry_of(cluster: RealCluster, ns: str, claim: str, what: str, ok: Any, timeout: float = 90) -> dict[str, Any]:
    def look() -> dict[str, Any] | None:
        mine = entries_of(cluster.claim_yaml(ns, claim), cluster.driver)
        return mine[0] if len(mine) == 1 and ok(mine[0]) else None
    return wait_until(look, f"{what} on {ns}/{claim}", timeout=timeout)


def the_pods_entry(m: Minor, pod: str, claim: str) -> dict[str, Any]:
    """netclaim's Ready entry on `claim`, once it is exactly what the pod's netns holds."""
    eth0 = m.cluster.interface(m.ns, pod)
    want = {"interfaceName": "eth0", "ips": eth0.cidrs, "hardwareAddress": eth0.mac}
    entry = entry_of(m.cluster, m.ns, claim, f"{pod}'s entry",
                     lambda e: ready_status(e) == "True" and e.get("networkData") == want)
    assert entry["data"]["containerID"] == m.cluster.sandbox(m.ns, pod)["status"]["id"], entry
    return entry


def gone(m: Minor, claim: str) -> None:
    def no_entry() -> bool:
        out = m.cluster.kubectl("get", "resourceclaim", claim, "-n", m.ns, "-o", "json", check=False)
        return not out or not entries_of(json.loads(out), m.cluster.driver)
    wait_until(no_entry, f"netclaim's entry on {m.ns}/{claim} to go", timeout=90)


def in_pod_netns(m: Minor, pod: str, *ip_args: str) -> None:
    subprocess.run(["nsenter", f"--net={m.cluster.netns(m.ns, pod)}", "ip", *ip_args], check=True, timeout=30)


def publisher_pod(cluster: RealCluster) -> dict[str, Any]:
    """The chart's pod on the node (not one that is terminating), or {}."""
    return daemonset_pods(cluster).get(cluster.node, {})


def restarted(pod: dict[str, Any], old_uid: str) -> bool:
    """The DaemonSet's pod is another one than `old_uid` (any, for ""), every container ready."""
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    return bool(pod) and pod["metadata"]["uid"] != old_uid and bool(statuses) and all(s["ready"] for s in statuses)


def reason(entry: dict[str, Any]) -> str:
    return next(c.get("reason", "") for c in entry.get("conditions") or [] if c["type"] == "Ready")


def shared_claim(m: Minor, name: str) -> None:
    """A pre-created claim with a device of netclaim's driver and one of the second driver."""
    m.cluster.apply({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                     "metadata": {"name": name, "namespace": m.ns},
                     "spec": {"devices": {"requests": [
                         {"name": "nic", "exactly": {"deviceClassName": m.cluster.values["NETCLAIM_DEVICE_CLASS"]}},
                         {"name": "gpu", "exactly": {"deviceClassName": OTHER_DRIVER}}]}}})


def second_drivers_entry(m: Minor, claim: str) -> dict[str, Any]:
    """The second driver's entry, written with its own field manager as that driver would."""
    results = m.cluster.claim_yaml(m.ns, claim)["status"]["allocation"]["devices"]["results"]
    (gpu,) = [r for r in results if r["driver"] == OTHER_DRIVER]
    entry = {"driver": OTHER_DRIVER, "pool": gpu["pool"], "device": gpu["device"], "data": {"slot": 3}}
    apply_status(m.api, Claim(m.ns, claim, m.cluster.node, []), [entry], OTHER_DRIVER)
    return entry


# ------------------------------------------------------------------------------------------ cases

def test_the_cluster_runs_the_wanted_minor_and_the_chart_installs(minor: Minor) -> None:
    got = json.loads(minor.cluster.kubectl("version", "-o", "json"))
    server, node = got["serverVersion"], minor.cluster.get("node", minor.cluster.node)
    minor.git_version = server["gitVersion"]
    assert f"{server['major']}.{server['minor']}" == minor.minor, server
    assert node["status"]["nodeInfo"]["kubeletVersion"] == server["gitVersion"]
    wait_until(lambda: restarted(publisher_pod(minor.cluster), ""), "every container of the DaemonSet's pod ready",
               timeout=180)
    # The ClusterRole is stored as rendered on every minor: before 1.36 its resourceclaims/driver rule is
    # accepted and never consulted (there is no such check to consult it).
    role = minor.cluster.get("clusterrole", SA)
    assert any("resourceclaims/driver" in r.get("resources", []) for r in role["rules"]), role["rules"]


def test_a_template_claim_and_a_shared_claim_get_the_entries_of_their_pods(minor: Minor) -> None:
    m, c = minor, minor.cluster
    c.claim_template(m.ns)
    c.pod(m.ns, "tmpl", template="net")
    shared_claim(m, "shared")
    c.pod(m.ns, "sharer", claim="shared")
    c.wait_running(m.ns, "tmpl", "sharer", timeout=180)
    the_pods_entry(m, "tmpl", c.pod_claim(m.ns, "tmpl"))
    the_pods_entry(m, "sharer", "shared")


def test_a_second_drivers_entry_is_never_touched(minor: Minor) -> None:
    """netclaim rewrites its entry on the shared claim twice (link down, up); the other driver's stays as written."""
    m, c = minor, minor.cluster
    theirs = second_drivers_entry(m, "shared")
    in_pod_netns(m, "sharer", "link", "set", "eth0", "down")
    entry_of(c, m.ns, "shared", "Ready=False", lambda e: ready_status(e) == "False")
    in_pod_netns(m, "sharer", "link", "set", "eth0", "up")
    the_pods_entry(m, "sharer", "shared")
    kept = [{k: d.get(k) for k in theirs} for d in c.claim_yaml(m.ns, "shared")["status"]["devices"]
            if d["driver"] == OTHER_DRIVER]
    assert kept == [theirs], kept


def test_the_live_watch_shows_a_downed_link_as_not_ready(minor: Minor) -> None:
    m, c = minor, minor.cluster
    claim = c.pod_claim(m.ns, "tmpl")
    in_pod_netns(m, "tmpl", "link", "set", "eth0", "down")
    down = entry_of(c, m.ns, claim, "Ready=False", lambda e: ready_status(e) == "False")
    assert reason(down) == "LinkDown", down
    in_pod_netns(m, "tmpl", "link", "set", "eth0", "up")
    the_pods_entry(m, "tmpl", claim)


def test_an_api_server_restart_loses_no_entry_and_the_next_pod_is_published(minor: Minor) -> None:
    m, c = minor, minor.cluster
    before = {claim: entries_of(c.claim_yaml(m.ns, claim), c.driver) for claim in ("shared",)}
    c.sh("apiserver-stop")
    c.sh("apiserver-start")
    c.claim(m.ns, "after")
    c.pod(m.ns, "after", claim="after")
    c.wait_running(m.ns, "after", timeout=180)
    the_pods_entry(m, "after", "after")
    assert {claim: entries_of(c.claim_yaml(m.ns, claim), c.driver) for claim in before} == before


def test_deleting_a_pod_removes_its_entry(minor: Minor) -> None:
    m, c = minor, minor.cluster
    c.delete_pod(m.ns, "after")
    gone(m, "after")


def test_the_boot_rule_retires_what_an_earlier_boot_left(minor: Minor) -> None:
    """A new boot id and a publisher restart: every attachment of an earlier boot is retired, its entry goes."""
    m, c = minor, minor.cluster
    claim = c.pod_claim(m.ns, "tmpl")
    assert entries_of(c.claim_yaml(m.ns, claim), c.driver)
    old = publisher_pod(c)["metadata"]["uid"]
    (m.files.run / "boot-id").write_text(f"{uuid.uuid4()}\n")
    c.kubectl("delete", "pod", "-n", NAMESPACE, publisher_pod(c)["metadata"]["name"], "--wait=false")
    wait_until(lambda: restarted(publisher_pod(c), old), "the publisher restarted in the new boot", timeout=180)
    gone(m, claim)
    gone(m, "shared")
    assert [d["driver"] for d in c.claim_yaml(m.ns, "shared")["status"]["devices"]] == [OTHER_DRIVER]


def written(api: client.ApiClient, claim: Claim, entry: dict[str, Any]) -> bool:
    """True once the apply goes through; False while an admission policy refuses it."""
    try:
        apply_status(api, claim, [entry], "netclaim/intruder")
    except ApiException as exc:
        if exc.status != 403:
            raise
        return False
    return True


def older_than_1_36(minor: str) -> bool:
    return tuple(int(x) for x in minor.split(".")) < (1, 36)


def test_the_publishers_token_cannot_write_a_claim_of_another_node(minor: Minor) -> None:
    """The chart's service account, with a token bound to the publisher's pod on this node, against a claim
    allocated to another node: the API server's own check refuses it from 1.36 on; before, the chart's
    claim-status policy does, and without the policy's binding the same write goes through (the control)."""
    m, c = minor, minor.cluster
    publisher = publisher_pod(c)["metadata"]
    ensure_node(m.api, OTHER_NODE)
    elsewhere = create_pod(m.api, m.ns, "elsewhere", OTHER_NODE, claim="far")
    far = allocated_claim(m.api, m.ns, "far", OTHER_NODE, elsewhere,
                          [{"request": "nic", "driver": c.driver, "pool": OTHER_NODE, "device": "nic0"}])
    token = token_request(m.api, NAMESPACE, SA, {"name": publisher["name"], "uid": publisher["uid"]}, "Pod",
                          seconds=600)
    conf = client.Configuration()
    conf.host = m.api.configuration.host
    conf.ssl_ca_cert = m.api.configuration.ssl_ca_cert
    conf.api_key = {"authorization": f"Bearer {token}"}
    as_publisher = client.ApiClient(conf)
    entry = device_entry(far, far.results[0])
    try:
        with pytest.raises(ApiException) as refused:
            apply_status(as_publisher, far, [entry], "netclaim/intruder")
        assert status_devices(m.api, far) == []
        if not older_than_1_36(m.minor):
            assert_driver_refusal(refused.value, c.driver)
            return
        assert refused.value.status == 403, refused.value.body
        assert "only on claims allocated to the node in its token" in refused.value.body, refused.value.body
        binding = json.loads(c.kubectl("get", "validatingadmissionpolicybinding", POLICY, "-o", "json"))
        c.kubectl("delete", "validatingadmissionpolicybinding", POLICY)
        try:
            wait_until(lambda: written(as_publisher, far, entry), "the write to go through without the policy",
                       timeout=60)
            assert [d["device"] for d in status_devices(m.api, far)] == ["nic0"]
        finally:
            for key in ("resourceVersion", "uid", "creationTimestamp", "generation", "managedFields"):
                binding["metadata"].pop(key, None)
            c.kubectl("create", "-f", "-", stdin=json.dumps(binding))
    finally:
        as_publisher.close()


def test_uninstall_leaves_the_node_as_it_was(minor: Minor) -> None:
    m, c = minor, minor.cluster
    for pod in ("tmpl", "sharer"):
        c.delete_pod(m.ns, pod)
    uninstall_release(c, c.kubeconfig, 2000)
    (m.files.run / "boot-id").unlink(missing_ok=True)
    assert m.files.snapshot() == m.before_install


def test_the_documented_row_is_what_ran(minor: Minor) -> None:
    """docs/kubernetes-versions.json's row for this minor names the release that ran and every case above."""
    rows = json.loads(MATRIX_FILE.read_text())["versions"]
    row = next((r for r in rows if r["minor"] == minor.minor), None)
    assert row, f"{MATRIX_FILE.name} has no row for {minor.minor}: run scripts/build/version_table.py --record"
    assert row["release"] == minor.git_version, (row["release"], minor.git_version)
    cases = [name for name in globals() if name.startswith("test_") and name != "test_the_documented_row_is_what_ran"]
    assert sorted(row["passed"]) == sorted(cases), "the row lists other cases than this module runs"
    assert sorted(minor.passed) == sorted(cases), f"cases that did not pass on {minor.minor}: " \
        f"{sorted(set(cases) - set(minor.passed))}"
