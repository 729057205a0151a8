"""The shipped RBAC lets a node write only its own claims, checked on the real API server.

Set-up, as a cluster would have it: Nodes node-a and node-b, the shipped
ServiceAccount/ClusterRole/ClusterRoleBinding applied for real, a publisher
pod on node-a and a token for it minted through the TokenRequest API (the
token a kubelet puts in the DaemonSet's projected volume). The same checks
run with a Node-bound token, the credential of a systemd install.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from kubernetes.dynamic import DynamicClient

from deploylib import DRIVER, suffix
from kubehelpers import (
    OTHER_DRIVER,
    Claim,
    allocated_claim,
    assert_driver_refusal,
    apply_object,
    apply_status,
    create_namespace,
    create_pod,
    device_entry,
    ensure_node,
    jwt_claims,
    shipped_rbac,
    status_devices,
    tear_down,
    token_request,
    token_review,
)

pytestmark = pytest.mark.controlplane

SA = "netclaim-publisher"
NODE_NAME_EXTRA = "authentication.kubernetes.io/node-name"


@dataclass
class Cluster:
    namespace: str
    nodes: dict[str, dict[str, Any]]
    publisher_pod: dict[str, Any]
    claim_a: Claim
    claim_b: Claim
    pods: dict[str, dict[str, Any]]


@pytest.fixture(scope="module")
def cluster(control_plane) -> Iterator[Cluster]:
    api = control_plane.api_client()
    dyn = DynamicClient(api)
    sfx = suffix()
    ns = f"ncrbac-{sfx}"
    rbac = shipped_rbac(ns, f"-{sfx}")
    try:
        nodes = {n: ensure_node(api, n) for n in ("node-a", "node-b")}
        create_namespace(api, ns)
        for doc in rbac:
            apply_object(dyn, doc, "netclaim-deploy-test", dry_run=False)
        publisher = create_pod(api, ns, "netclaim-publisher-a", "node-a", service_account=SA)
        pod_a = create_pod(api, ns, "web-a", "node-a", claim="claim-a")
        pod_b = create_pod(api, ns, "web-b", "node-b", claim="claim-b")
        claim_a = allocated_claim(api, ns, "claim-a", "node-a", pod_a, [
            {"request": "nic", "driver": DRIVER, "pool": "node-a", "device": "nic0"},
            {"request": "other", "driver": OTHER_DRIVER, "pool": "node-a", "device": "dev0"},
        ])
        claim_b = allocated_claim(api, ns, "claim-b", "node-b", pod_b, [
            {"request": "nic", "driver": DRIVER, "pool": "node-b", "device": "nic0"},
        ])
        yield Cluster(ns, nodes, publisher, claim_a, claim_b, {"web-a": pod_a, "web-b": pod_b})
    finally:
        tear_down(api, dyn, ns, rbac, lambda kind: kind != "ServiceAccount")


@pytest.fixture(params=["Pod", "Node"], ids=["pod-bound-token", "node-bound-token"])
def node_a_token(request, cluster: Cluster, control_plane) -> str:
    api = control_plane.api_client()
    try:
        bound = cluster.publisher_pod if request.param == "Pod" else cluster.nodes["node-a"]
        return token_request(api, cluster.namespace, SA, bound, request.param, seconds=600)
    finally:
        api.close()


@pytest.fixture()
def as_node_a(node_a_token: str, control_plane, tmp_root) -> Iterator[client.ApiClient]:
    kubeconfig = control_plane.kubeconfig_for_token(node_a_token, tmp_root / "kubeconfig")
    api = control_plane.api_client(kubeconfig)
    yield api
    api.close()


def test_token_carries_the_node_name(cluster: Cluster, node_a_token: str, control_plane) -> None:
    claims = jwt_claims(node_a_token)
    assert claims["kubernetes.io"]["node"]["name"] == "node-a"
    assert claims["kubernetes.io"]["serviceaccount"]["name"] == SA
    admin = control_plane.api_client()
    try:
        user = token_review(admin, node_a_token)
    finally:
        admin.close()
    assert user["username"] == f"system:serviceaccount:{cluster.namespace}:{SA}"
    # This extra is what the API server's associated-node check reads.
    assert user["extra"][NODE_NAME_EXTRA] == ["node-a"]


def test_node_a_writes_status_of_a_claim_allocated_to_node_a(cluster: Cluster, as_node_a) -> None:
    result = cluster.claim_a.results[0]
    ip = f"10.88.{len(status_devices(as_node_a, cluster.claim_a))}.5/16"
    apply_status(as_node_a, cluster.claim_a, [device_entry(cluster.claim_a, result, ip)], "netclaim/node-a")

    entries = [d for d in status_devices(as_node_a, cluster.claim_a) if d["driver"] == DRIVER]
    assert [(d["device"], d["network_data"]["ips"]) for d in entries] == [("nic0", [ip])]


def test_node_a_is_refused_a_claim_allocated_to_node_b(cluster: Cluster, as_node_a) -> None:
    result = cluster.claim_b.results[0]
    with pytest.raises(ApiException) as err:
        apply_status(as_node_a, cluster.claim_b, [device_entry(cluster.claim_b, result)], "netclaim/node-a")
    assert_driver_refusal(err.value, DRIVER)
    assert "arbitrary-node:patch" in err.value.body  # node-b's claim: associated-node not even considered
    assert status_devices(as_node_a, cluster.claim_b) == []


def test_node_a_is_refused_another_drivers_entry(cluster: Cluster, as_node_a) -> None:
    other = cluster.claim_a.results[1]
    assert other["driver"] == OTHER_DRIVER
    with pytest.raises(ApiException) as err:
        apply_status(as_node_a, cluster.claim_a, [device_entry(cluster.claim_a, other)], "netclaim/other")
    assert_driver_refusal(err.value, OTHER_DRIVER)
    assert OTHER_DRIVER not in {d["driver"] for d in status_devices(as_node_a, cluster.claim_a)}


def test_node_a_cannot_rewrite_allocation_or_use_update(cluster: Cluster, as_node_a) -> None:
    """Least privilege: no `update` on status, no binding (allocation/reservedFor) rights."""
    resource = client.ResourceV1Api(as_node_a)
    current = resource.read_namespaced_resource_claim(cluster.claim_a.name, cluster.claim_a.namespace)
    with pytest.raises(ApiException) as err:
        resource.replace_namespaced_resource_claim_status(cluster.claim_a.name, cluster.claim_a.namespace, current)
    assert err.value.status == 403, err.value.body  # RBAC: no `update` on resourceclaims/status
    with pytest.raises(ApiException) as err:
        resource.patch_namespaced_resource_claim_status(
            cluster.claim_a.name, cluster.claim_a.namespace, {"status": {"reservedFor": []}},
            _content_type="application/merge-patch+json",
        )
    body = json.loads(err.value.body)
    assert err.value.status == 422 and "resourceclaims/binding" in body["message"], err.value.body


# ---------------------------------------------------------------- the real publisher


def publisher_event(pod: dict[str, Any], driver: str, request: str, container_id: str, ifname: str,
                    address: str) -> Any:
    from cni_plugin.wire.event import Event, PodRef

    return Event(
        op="ADD", container_id=container_id, ifname=ifname, driver=driver, request=request,
        netns=f"/var/run/netns/cni-{container_id}", network="podnet", cni_version="1.1.0",
        pod=PodRef(pod["namespace"], pod["name"], pod["uid"]),
        result={
            "cniVersion": "1.1.0",
            "interfaces": [{"name": ifname, "mac": "0a:58:0a:58:00:07", "sandbox": f"/var/run/netns/cni-{container_id}"}],
            "ips": [{"address": address, "interface": 0}],
        },
    )


def send(socket_path: str, event: Any) -> dict[str, Any]:
    import socket as pysocket

    from cni_plugin.wire.frame import encode_frame, event_request, read_frame

    with pysocket.socket(pysocket.AF_UNIX, pysocket.SOCK_STREAM) as sock:
        sock.settimeout(10)
        sock.connect(socket_path)
        sock.sendall(encode_frame(event_request(event)))
        return read_frame(sock)


def metric(port: int, name: str, labels: str) -> float:
    import urllib.request

    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    for line in text.splitlines():
        if line.startswith(f"{name}{{{labels}}} "):
            return float(line.split()[-1])
    return 0.0


def wait_for(check, what: str, timeout: float = 30.0) -> Any:
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.2)
    pytest.fail(f"timed out waiting for {what}")


def test_real_publisher_logs_and_counts_the_refusal_and_keeps_serving(cluster: Cluster, control_plane,
                                                                      tmp_root) -> None:
    """The publisher of node-a, with its pod-bound token and the shipped RBAC."""
    import socket as pysocket
    import subprocess

    from deploylib import netclaim_publisher_bin, python_env, terminate

    admin = control_plane.api_client()
    token = token_request(admin, cluster.namespace, SA, cluster.publisher_pod, "Pod", seconds=600)
    kubeconfig = control_plane.kubeconfig_for_token(token, tmp_root / "kubeconfig")
    with pysocket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    sock = tmp_root / "run" / "publisher.sock"
    log_path = tmp_root / "publisher.log"
    argv = [str(netclaim_publisher_bin()), "run", "--node-name", "node-a", "--kubeconfig", kubeconfig,
            "--socket", str(sock), "--state-dir", str(tmp_root / "state"), "--spool-dir", str(tmp_root / "spool"),
            "--metrics-address", f"127.0.0.1:{port}", "--log-format", "json"]
    with log_path.open("w") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=python_env())
    try:
        wait_for(lambda: sock.exists() or proc.poll() is not None, "the publisher's socket")
        assert proc.poll() is None, log_path.read_text()
        web_a = cluster.pods["web-a"]

        # 1. An entry for a driver this node may not write: refused by the API server.
        reply = send(str(sock), publisher_event(web_a, OTHER_DRIVER, "other", "c0ffee01", "net1", "10.99.0.7/24"))
        assert reply.get("ok"), reply
        refused = wait_for(lambda: metric(port, "netclaim_apply_errors_total", 'code="422"'),
                           "the refusal to be counted")
        assert refused >= 1
        lines = [json.loads(line) for line in log_path.read_text().splitlines() if line.startswith("{")]
        refusal = [line for line in lines if "resourceclaims/driver" in json.dumps(line)]
        assert refusal, log_path.read_text()
        assert "claim-a" in json.dumps(refusal[0])
        # The pod-bound token may also tell kubectl users: one Warning Event on the claim.
        created = wait_for(lambda: metric(port, "netclaim_k8s_events_total", 'result="created"'),
                           "the Warning Event to be created")
        assert created == 1, log_path.read_text()
        assert metric(port, "netclaim_k8s_events_total", 'result="failed"') == 0
        events = client.EventsV1Api(admin).list_namespaced_event(cluster.namespace).items
        [warning] = [e for e in events if e.reporting_controller == "netclaim.dev/publisher"]
        assert (warning.type, warning.reason, warning.regarding.kind, warning.regarding.name) == (
            "Warning", "ApplyRejected", "ResourceClaim", "claim-a")
        assert "resourceclaims/driver" in warning.note and warning.related.name == "web-a"

        # 2. It keeps serving: a later event for its own driver is published.
        reply = send(str(sock), publisher_event(web_a, DRIVER, "nic", "c0ffee02", "eth0", "10.88.77.7/16"))
        assert reply.get("ok"), reply

        def published() -> bool:
            entries = [d for d in status_devices(admin, cluster.claim_a) if d["driver"] == DRIVER]
            return any(d["network_data"] and d["network_data"]["ips"] == ["10.88.77.7/16"] for d in entries)

        wait_for(published, "the good event to be published")
        assert OTHER_DRIVER not in {d["driver"] for d in status_devices(admin, cluster.claim_a)}
        assert proc.poll() is None, "the publisher exited after a refusal"
    finally:
        admin.close()
        terminate(proc)
