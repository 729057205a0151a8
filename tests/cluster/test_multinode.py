"""netclaim on a real 3-node Kubernetes (scripts/cluster.sh up --nodes 3), one cluster for the module.

Three kubelets with their own containerd, node IP, bridge, pod /24 and mount
namespace; one control plane with scheduler and controller-manager (node
lifecycle with a short grace period); the Kubernetes DRA test driver on every
node; netclaim as the chart's DaemonSet with the image built here. What a user
of such a cluster notices:

- kubectl logs/exec/port-forward work on every node, and pods on different nodes reach each other;
- every claim of a spread Deployment shows its pod's interface, IPs and MAC (read in the pod's netns),
  written by the publisher of the pod's own node;
- a node's publisher credential (the token its DaemonSet pod holds) cannot write a claim of another node;
- a rolling update of the DaemonSet loses no status and restarts no pod;
- a drained node's pods come back elsewhere with their new node's status, nothing stale left;
- a lost node's pods come back elsewhere; when the node returns, its publisher removes nothing of the
  other nodes and its own leftovers go.
Plus the figure pod create -> claim status visible over 12 pods on 3 nodes.

NETCLAIM_MULTINODE_DIR picks the cluster dir (default <tmp>/nc-3n); NETCLAIM_CLUSTER_KEEP=1 leaves it up.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import statistics
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from multinode_kit import (
    APP_IMAGE, NAMESPACE, PYTHON, Sampler, claim_of, claims, daemonset_pods, deployment, host_traces,
    icmp_echo, install, install_everywhere, live_pods, ready_pods, stale_entries, wait_statuses,
)
from runtime.controlplane import api_client
from runtime.observe import ClaimWatcher
from runtime.realcluster import ClusterError, RealCluster, cluster_sh, entries_of, pod_manifest, wait_until

pytestmark = pytest.mark.containerd

NODES = 3
APPLY = "application/apply-patch+yaml"


@dataclass
class MultiNode:
    cluster: RealCluster
    ports: tuple[int, int]
    up_seconds: float


@pytest.fixture(scope="module")
def mn() -> Iterator[MultiNode]:
    if os.geteuid() != 0:
        pytest.fail("the real cluster needs root", pytrace=False)
    directory = os.environ.get("NETCLAIM_MULTINODE_DIR", os.path.join(tempfile.gettempdir(), "nc-3n"))
    env = {**os.environ, "NETCLAIM_CLUSTER_DIR": directory}
    reused = os.path.exists(os.path.join(directory, "cluster.env"))
    t0 = time.monotonic()
    try:
        cluster = RealCluster.up(directory, env, nodes=NODES)
    except ClusterError as exc:
        try:
            if not reused:  # a half-started cluster of ours; never someone else's cluster in that dir
                cluster_sh("down", env=env)
        finally:
            pytest.fail(f"the 3-node cluster could not start: {exc}", pytrace=False)
    up_seconds = time.monotonic() - t0
    print(f"up --nodes {NODES}: {up_seconds:.1f}s")
    try:
        ports = install_everywhere(cluster, "updateStrategy.maxUnavailable=1")
        yield MultiNode(cluster, ports, up_seconds)
    finally:
        if not os.environ.get("NETCLAIM_CLUSTER_KEEP"):
            cluster.down()
            # `down` leaves the host as it was: no link, mount, cgroup, process or directory of ours.
            if not reused and (left := host_traces(directory)):
                pytest.fail(f"scripts/cluster.sh down left on the host: {left}", pytrace=False)


@pytest.fixture
def ns(mn: MultiNode) -> Iterator[str]:
    name = mn.cluster.namespace(f"mn-{uuid.uuid4().hex[:6]}")
    yield name
    # Waited for: a pod left terminating here would be in the next test's way (kubectl drain refuses a
    # node that still runs a pod without a controller, such as the roll test's "during").
    mn.cluster.kubectl("delete", "namespace", name, "--timeout=180s", check=False, timeout=200)


def spread(mn: MultiNode, ns: str, app: str, **kw: object) -> list[dict]:
    """A Deployment of one pod per node (claims from a template); its Ready pods."""
    mn.cluster.claim_template(ns)
    mn.cluster.apply(deployment(ns, app, NODES, **kw))
    pods = ready_pods(mn.cluster, ns, app, NODES)
    assert sorted(p["spec"]["nodeName"] for p in pods) == sorted(n.name for n in mn.cluster.nodes), \
        "one pod per node expected from the spread constraint"
    return pods


# ------------------------------------------------------------------ what users do daily, on every node


def test_logs_exec_port_forward_and_pod_to_pod_on_every_node(mn: MultiNode, ns: str) -> None:
    cluster = mn.cluster
    server = ("import http.server,sys; print('serving on', sys.argv[1], flush=True); "
              "http.server.ThreadingHTTPServer(('', 8080), http.server.SimpleHTTPRequestHandler).serve_forever()")
    for node in cluster.nodes:
        cluster.apply({
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"web{node.index}", "namespace": ns},
            "spec": {"nodeSelector": {"kubernetes.io/hostname": node.name}, "terminationGracePeriodSeconds": 0,
                     "containers": [{"name": "app", "image": APP_IMAGE, "imagePullPolicy": "Never",
                                     "command": [PYTHON, "-u", "-c", server, node.name]}]}})
    cluster.wait_running(ns, *(f"web{n.index}" for n in cluster.nodes), timeout=180)
    for node in cluster.nodes:
        pod = f"web{node.index}"
        assert cluster.pod_node(ns, pod).name == node.name
        logs = wait_until(lambda: cluster.kubectl("logs", "-n", ns, pod, check=False), f"logs of {pod}", timeout=30)
        assert f"serving on {node.name}" in logs
        out = cluster.kubectl("exec", "-n", ns, pod, "--", PYTHON, "-c", "import socket; print(socket.gethostname())")
        assert out.strip() == pod
        with cluster.port_forward(ns, pod, 8080) as (port, _):
            def get() -> str:  # "" until the forward listens
                proc = subprocess.run(["curl", "-fsS", "-o", "/dev/null", "-w", "%{http_code}",
                                       f"http://127.0.0.1:{port}/"], capture_output=True, text=True, timeout=10)
                return proc.stdout if proc.returncode == 0 else ""
            got = wait_until(get, f"port-forward to {pod}", timeout=30)
            assert got == "200"
    # Pods on different nodes reach each other (ICMP echo), through their bridges and the host's routes.
    ips = {n.index: cluster.pod_ip(ns, f"web{n.index}") for n in cluster.nodes}
    for node in cluster.nodes:
        for other in cluster.nodes:
            if other.index != node.index:
                proc = icmp_echo(node, ns, f"web{node.index}", ips[other.index])
                assert proc.returncode == 0, f"{node.name} -> {other.name} ({ips[other.index]}): {proc.stderr}"


def test_a_container_using_its_claim_gets_the_drivers_cdi_edits_on_every_node(mn: MultiNode, ns: str) -> None:
    """The DRA driver writes its CDI spec to /var/run/cdi of its node; that node's containerd reads it."""
    cluster = mn.cluster
    cluster.claim_template(ns)
    for node in cluster.nodes:
        cluster.apply({
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"cdi{node.index}", "namespace": ns},
            "spec": {"nodeSelector": {"kubernetes.io/hostname": node.name}, "terminationGracePeriodSeconds": 0,
                     "resourceClaims": [{"name": "net", "resourceClaimTemplateName": "net"}],
                     "containers": [{"name": "app", "image": APP_IMAGE, "imagePullPolicy": "Never",
                                     "command": [PYTHON, "-c", "import time; time.sleep(100000)"],
                                     "resources": {"claims": [{"name": "net"}]}}]}})
    pods = [f"cdi{n.index}" for n in cluster.nodes]
    cluster.wait_running(ns, *pods, timeout=180)
    for pod in pods:
        claim = cluster.pod_claim(ns, pod)
        env = cluster.kubectl("exec", "-n", ns, pod, "--", PYTHON, "-c",
                              "import os; print('\\n'.join(f'{k}={v}' for k, v in os.environ.items()))")
        assert f"claim_{claim.replace('-', '_')}_nic=true" in env.splitlines(), \
            f"{pod}: the driver's CDI edit for {claim} is not in the container's environment"
    wait_statuses(cluster, ns, [cluster.get("pod", p, ns) for p in pods])


# ------------------------------------------------------------------ status from the pod's own node


def test_spread_deployment_each_claim_shows_its_pod_from_its_own_node(mn: MultiNode, ns: str) -> None:
    cluster = mn.cluster
    cluster.claim_template(ns)
    cluster.apply(deployment(ns, "web", 2 * NODES))
    pods = ready_pods(cluster, ns, "web", 2 * NODES)
    per_node = {n.name: sum(p["spec"]["nodeName"] == n.name for p in pods) for n in cluster.nodes}
    assert set(per_node.values()) == {2}, per_node
    got = wait_statuses(cluster, ns, pods)
    assert len({a.claim for a in got}) == 2 * NODES
    # Each node's pods are in that node's subnet: the IPs really are per node.
    for a in got:
        node = cluster.node_named(a.node)
        prefix = node.subnet.rsplit(".", 1)[0] + "."
        assert all(c.startswith(prefix) for c in a.cidrs), (a, node.subnet)


# ------------------------------------------------------------------ node-scoped authorization, real identities


def publisher_token(cluster: RealCluster, node: str) -> str:
    """The token the DaemonSet's publisher on `node` uses (its projected volume, read through kubectl exec)."""
    pod = daemonset_pods(cluster)[node]["metadata"]["name"]
    return cluster.kubectl("exec", "-n", NAMESPACE, pod, "-c", "publisher", "--", "/opt/netclaim/venv/bin/python",
                           "-c", "import sys; sys.stdout.write(open("
                           "'/var/run/secrets/kubernetes.io/serviceaccount/token').read())").strip()


def as_token(cluster: RealCluster, token: str) -> client.ApiClient:
    cfg = client.Configuration()
    cfg.host = cluster.values["NETCLAIM_APISERVER"]
    cfg.ssl_ca_cert = cluster.values["NETCLAIM_APISERVER_CA"]
    cfg.api_key = {"authorization": f"Bearer {token}"}
    return client.ApiClient(cfg)


def dry_apply(api: client.ApiClient, ns: str, claim: str, entries: list[dict], manager: str) -> None:
    """A forced apply (taking fields from their owners, as a compromised node would), never persisted."""
    body = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": claim, "namespace": ns}, "status": {"devices": entries}}
    client.ResourceV1Api(api).patch_namespaced_resource_claim_status(
        claim, ns, body, field_manager=manager, dry_run="All", force=True, _content_type=APPLY)


def refusal(exc: ApiException, driver: str) -> None:
    """kube-apiserver 1.37's answer to a write its per-driver, per-node check refuses (422, not 403)."""
    body = json.loads(exc.body)
    assert exc.status == 422, exc.body
    forbidden = [c for c in body["details"]["causes"] if c["reason"] == "FieldValueForbidden"]
    assert forbidden and all(c["field"] == "status.devices" for c in forbidden), exc.body
    assert any(f'"{driver}" is forbidden' in c["message"] for c in forbidden), exc.body


def test_a_nodes_publisher_token_cannot_write_another_nodes_claim(mn: MultiNode, ns: str) -> None:
    cluster = mn.cluster
    got = {a.node: a for a in wait_statuses(cluster, ns, spread(mn, ns, "web"))}
    node_a, node_b = cluster.nodes[0].name, cluster.nodes[1].name
    token = publisher_token(cluster, node_a)
    payload = json.loads(base64.urlsafe_b64decode(token.split(".")[1] + "=="))
    assert payload["kubernetes.io"]["node"]["name"] == node_a, "the DaemonSet's token is bound to its node"
    api = as_token(cluster, token)
    current = claims(cluster, ns)
    own = entries_of(current[got[node_a].claim], cluster.driver)
    other = entries_of(current[got[node_b].claim], cluster.driver)
    manager = f"netclaim/{node_a}"

    def changed(entry: dict) -> dict:
        # An apply of the very values already there is no write (the API server lets it through
        # whoever sends it): every attempt below changes the interface name.
        return {**entry, "networkData": {**entry["networkData"], "interfaceName": "changed0"}}
    # The credential is valid: a change of its own node's claim is accepted (a dry run changes nothing).
    dry_apply(api, ns, got[node_a].claim, [changed(own[0])], manager)
    # Another node's claim: refused for its own driver's entry ...
    with pytest.raises(ApiException) as exc:
        dry_apply(api, ns, got[node_b].claim, [changed(other[0])], manager)
    refusal(exc.value, cluster.driver)
    # ... and for an entry of another driver on that node.
    foreign = [{**changed(other[0]), "driver": "other.example.com"}]
    with pytest.raises(ApiException) as exc:
        dry_apply(api, ns, got[node_b].claim, foreign, manager)
    refusal(exc.value, "other.example.com")
    # Nothing changed on node B's claim.
    assert entries_of(claims(cluster, ns)[got[node_b].claim], cluster.driver) == other


# ------------------------------------------------------------------ the figure


def test_pod_create_to_claim_status_visible_on_3_nodes(mn: MultiNode, ns: str) -> None:
    cluster = mn.cluster
    cluster.claim_template(ns)
    api = api_client(cluster.kubeconfig)
    core = client.CoreV1Api(api)
    watcher = ClaimWatcher(api, ns, cluster.driver).start()
    lat: list[float] = []
    try:
        for i in range(12):
            node = cluster.nodes[i % NODES]
            manifest = pod_manifest(ns, f"p{i}", template="net")
            manifest["spec"]["nodeSelector"] = {"kubernetes.io/hostname": node.name}
            t0 = time.time()
            core.create_namespaced_pod(ns, manifest)
            claim = wait_until(lambda: claim_of(api.sanitize_for_serialization(core.read_namespaced_pod(f"p{i}", ns))),
                               f"p{i}'s claim", timeout=60, interval=0.05)

            def seen() -> float | None:
                times = [t for (name, _ips), t in list(watcher.seen.items()) if name == claim]
                return min(times) if times else None
            lat.append(wait_until(seen, f"the status of {claim}", timeout=60, interval=0.05) - t0)
    finally:
        watcher.stop()
    median = statistics.median(lat)
    print(f"pod create -> claim status visible on {NODES} nodes: median {median:.2f}s over {len(lat)} pods, "
          f"min {min(lat):.2f}s max {max(lat):.2f}s")
    assert len(lat) == 12


# ------------------------------------------------------------------ the DaemonSet rolls over the nodes


def test_daemonset_rolling_update_keeps_every_status_and_restarts_no_pod(mn: MultiNode, ns: str) -> None:
    cluster = mn.cluster
    want = wait_statuses(cluster, ns, spread(mn, ns, "web"))
    before = {node: p["metadata"]["uid"] for node, p in daemonset_pods(cluster).items()}
    errors: list[BaseException] = []

    def upgrade() -> None:
        try:
            install(cluster, mn.ports, "updateStrategy.maxUnavailable=1",
                    f"podAnnotations.roll=r-{uuid.uuid4().hex[:6]}", upgrade=True)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the test's thread
            errors.append(exc)
    least_ready = NODES
    with Sampler(cluster, ns, want) as sampler:
        roller = threading.Thread(target=upgrade)
        roller.start()
        # A pod created while the DaemonSet rolls (some node's publisher is being replaced) gets its status too.
        wait_until(lambda: set(before.values()) != {p["metadata"]["uid"] for p in daemonset_pods(cluster).values()}
                   or not roller.is_alive(), "the roll to begin", timeout=120, interval=0.2)
        cluster.pod(ns, "during", template="net")
        created_during_roll = roller.is_alive()
        while roller.is_alive():
            pods = daemonset_pods(cluster).values()
            least_ready = min(least_ready, sum(all(c.get("ready") for c in p["status"].get("containerStatuses") or
                                                   [{"ready": False}]) for p in pods))
            roller.join(timeout=0.5)
        assert not errors, errors
        cluster.kubectl("rollout", "status", "-n", NAMESPACE, "daemonset/netclaim", "--timeout=300s", timeout=320)
        time.sleep(3)  # a few samples after the last pod is back
    assert created_during_roll, "the pod was meant to start while the DaemonSet rolls"
    assert least_ready >= NODES - 1, f"maxUnavailable 1, yet only {least_ready} publishers were ready at once"
    cluster.wait_running(ns, "during")
    wait_statuses(cluster, ns, [cluster.get("pod", "during", ns)])
    after = daemonset_pods(cluster)
    assert set(after) == set(before) and all(after[n]["metadata"]["uid"] != before[n] for n in before), \
        "every node's DaemonSet pod was replaced"
    assert sampler.samples >= 5, sampler.samples
    assert sampler.problems == [], "\n".join(sampler.problems[:20])
    now = {p["metadata"]["uid"]: p for p in live_pods(cluster, ns, "web")}
    assert set(now) == {a.uid for a in want}, "no workload pod was replaced"
    for a in want:
        restarts = sum(c.get("restartCount", 0) for c in now[a.uid]["status"].get("containerStatuses") or [])
        assert restarts == a.restarts, f"{a.pod} restarted during the roll"


# ------------------------------------------------------------------ drain


def test_drain_moves_pods_with_their_new_nodes_status_nothing_stale(mn: MultiNode, ns: str) -> None:
    cluster = mn.cluster
    first = wait_statuses(cluster, ns, spread(mn, ns, "web"))
    drained = first[0].node
    try:
        cluster.kubectl("drain", drained, "--ignore-daemonsets", "--delete-emptydir-data", "--timeout=180s",
                        timeout=200)
        pods = ready_pods(cluster, ns, "web", NODES, avoid=drained)
        moved = wait_statuses(cluster, ns, pods)
        assert {a.uid for a in moved} & {a.uid for a in first} == {a.uid for a in first if a.node != drained}
        assert all(a.node != drained for a in moved)
        wait_until(lambda: set(claims(cluster, ns)) == {a.claim for a in moved},
                   "the evicted pod's claim to go", timeout=90)
        assert stale_entries(cluster, ns, moved) == []
    finally:
        cluster.kubectl("uncordon", drained, check=False)


# ------------------------------------------------------------------ a node lost, and back


def claimed_pods_on(cluster: RealCluster, node: str) -> int:
    """Pods with a claim that run (not terminating) on the node, in every namespace."""
    items = json.loads(cluster.kubectl("get", "pods", "-A", "--field-selector", f"spec.nodeName={node}",
                                       "-o", "json"))["items"]
    return sum(1 for p in items if p["spec"].get("resourceClaims") and not p["metadata"].get("deletionTimestamp"))


def publisher_status(cluster: RealCluster, node: str) -> dict:
    pod = daemonset_pods(cluster)[node]["metadata"]["name"]
    sock = f"{cluster.values['NETCLAIM_NODE_PATHS']}/netclaim-run/publisher.sock"
    out = cluster.kubectl("exec", "-n", NAMESPACE, pod, "-c", "publisher", "--", "/opt/netclaim/venv/bin/netclaim-publisher",
                          "status", "--socket", sock, "-o", "json")
    return json.loads(out)


def test_node_lost_pods_recreated_elsewhere_and_its_publisher_cleans_only_its_own(mn: MultiNode, ns: str) -> None:
    cluster = mn.cluster
    first = wait_statuses(cluster, ns, spread(mn, ns, "web", unreachable_seconds=2))
    lost = cluster.node_named(first[0].node)
    survivors = [a for a in first if a.node != lost.name]
    publisher = daemonset_pods(cluster)[lost.name]["metadata"]["name"]
    pid = lost.container_pid(NAMESPACE, publisher, "publisher")
    with Sampler(cluster, ns, survivors) as sampler:
        t0 = time.monotonic()
        cluster.node_sh(lost, "stop")          # kubelet and containerd
        os.kill(pid, signal.SIGKILL)           # and the node's publisher
        pods = ready_pods(cluster, ns, "web", NODES, avoid=lost.name, timeout=240)
        moved = wait_statuses(cluster, ns, pods)
        recreated = time.monotonic() - t0
        print(f"node lost -> pods recreated elsewhere with their status: {recreated:.1f}s")
        assert all(a.node != lost.name for a in moved)
        # The node comes back: it stops the pods that now run elsewhere; its publisher (restarted by the
        # kubelet) removes its own entries and nothing of the other nodes.
        cluster.node_sh(lost, "start")
        wait_until(lambda: "unreachable" not in cluster.kubectl("get", "node", lost.name, "-o",
                                                                "jsonpath={.spec.taints}"),
                   f"{lost.name} back without the unreachable taint", timeout=120)
        wait_until(lambda: {p["metadata"]["name"] for p in json.loads(cluster.kubectl(
            "get", "pods", "-n", ns, "-o", "json"))["items"]} == {a.pod for a in moved},
            "the lost node's old pods to be gone", timeout=180)
        wait_until(lambda: set(claims(cluster, ns)) == {a.claim for a in moved}, "the old claims to go", timeout=120)
        wait_until(lambda: daemonset_pods(cluster)[lost.name]["status"].get("containerStatuses") and all(
            c["ready"] for c in daemonset_pods(cluster)[lost.name]["status"]["containerStatuses"]),
            f"the publisher on {lost.name} ready again", timeout=120)
        # Its publisher's journal holds exactly the node's live claimed pods again (the old pods' DELs,
        # spooled while it was down, are applied; nothing pending).
        status = wait_until(lambda: (lambda s: s if s["journal_depth"] == 0
                                     and s["attachments"] == claimed_pods_on(cluster, lost.name) else None)(
            publisher_status(cluster, lost.name)), f"{lost.name}'s publisher journal drained", timeout=90)
        time.sleep(3)
    assert sampler.problems == [], "\n".join(sampler.problems[:20])
    assert wait_statuses(cluster, ns, live_pods(cluster, ns, "web"), timeout=10)
    assert stale_entries(cluster, ns, moved) == []
    old_claims = {f"{ns}/{a.claim}" for a in first if a.node == lost.name}
    left = {k: v for k, v in status.get("claims", {}).items() if k in old_claims and v.get("devices")}
    assert left == {}, f"{lost.name}'s publisher still holds {left}"
