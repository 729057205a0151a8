"""RBAC exactly as used: every grant is a call the code makes, every call has its grant.

Static half: the API calls are read out of publisher/kube/calls.py (the one module
that talks to the API server: method, path, watch) and compared with the
rules the chart renders. Live half: the real publisher, under the shipped
role with a Node-bound token (a systemd node's credential), goes through its
whole life on the real API server (start, ADD -> apply, DEL -> removal,
resync, a refusal -> Warning Event and its series, restart), and the chain
keeper asks for its DaemonSet; no request may come back 403.
"""

from __future__ import annotations

import ast
import json
import socket as pysocket
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from kubernetes.dynamic import DynamicClient

from chartlib import by_kind, render
from deploylib import DRIVER, REPO, netclaim_publisher_bin, python_env, terminate
from kubehelpers import (OTHER_DRIVER, allocated_claim, apply_object, create_namespace, create_pod, delete_object,
                         apply_status, device_entry, ensure_node, status_devices, tear_down, token_request)
from test_rbac_node_scope import metric, publisher_event, send, wait_for

KUBE_PY = REPO / "publisher" / "kube" / "calls.py"
METHOD_VERBS = {"POST": "create", "PATCH": "patch", "PUT": "update", "DELETE": "delete"}
Grant = tuple[str, str, str]  # (apiGroup, resource[/subresource], verb)


def path_grant(method: str, path: str, watch: bool) -> Grant:
    """What RBAC checks for one request path, e.g. /apis/G/V/namespaces/{ns}/R/{name}/S."""
    parts = path.strip("/").split("/")
    if parts[0] == "api":
        group, rest = "", parts[2:]
    else:
        group, rest = parts[1], parts[3:]
    if rest and rest[0] == "namespaces" and len(rest) > 2:
        rest = rest[2:]
    resource = rest[0] + (f"/{rest[2]}" if len(rest) > 2 else "")
    if method == "GET":
        verb = "watch" if watch else ("get" if len(rest) > 1 else "list")
    else:
        verb = METHOD_VERBS[method]
    return group, resource, verb


def code_grants() -> set[Grant]:
    """Every request Kube makes: the string arguments of its _request/_json calls."""
    tree = ast.parse(KUBE_PY.read_text())
    grants = set()
    for fn in ast.walk(tree):
        if not isinstance(fn, ast.FunctionDef) or fn.name.startswith("_"):
            continue
        for call in ast.walk(fn):
            if (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
                    and call.func.attr in ("_request", "_json") and len(call.args) >= 3):
                method = ast.literal_eval(call.args[1])
                path = "".join(v.value if isinstance(v, ast.Constant) else "{x}"
                               for v in (call.args[2].values if isinstance(call.args[2], ast.JoinedStr)
                                         else [call.args[2]]))
                watch = "('watch', 'true')" in ast.unparse(call)
                grants.add(path_grant(method, path, watch))
    # A server-side apply of status.devices is also checked per driver (1.36+),
    # as the synthetic subresource resourceclaims/driver with the associated-node verb.
    if ("resource.k8s.io", "resourceclaims/status", "patch") in grants:
        grants.add(("resource.k8s.io", "resourceclaims/driver", "associated-node:patch"))
    return grants


def role_grants(docs: list[dict[str, Any]]) -> set[Grant]:
    out = set()
    for role in by_kind(docs, "ClusterRole") + by_kind(docs, "Role"):
        for rule in role["rules"]:
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    for verb in rule["verbs"]:
                        out.add((group, resource, verb))
    return out


def test_the_code_makes_the_calls_this_test_reads() -> None:
    """The reader itself: it must find the calls everybody knows are there."""
    grants = code_grants()
    assert {("", "pods", "get"), ("", "pods", "watch"), ("resource.k8s.io", "resourceclaims/status", "patch"),
            ("events.k8s.io", "events", "create"), ("apps", "daemonsets", "get")} <= grants


def test_role_grants_exactly_what_the_code_calls() -> None:
    granted, called = role_grants(render()), code_grants()
    assert granted - called == set(), "granted but never called"
    assert called - granted == set(), "called but not granted"
    for role in by_kind(render(), "ClusterRole") + by_kind(render(), "Role"):
        for rule in role["rules"]:
            assert "*" not in rule["verbs"] and "*" not in rule["resources"], rule
            assert not any(v.startswith("arbitrary-node:") for v in rule["verbs"]), rule


# ---------------------------------------------------------------- the real publisher's whole life


def chart_rbac(namespace: str, release: str) -> list[dict[str, Any]]:
    docs = render(f"driverName={DRIVER}", release=release, namespace=namespace)
    return [d for d in docs if d["kind"] in ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role",
                                             "RoleBinding", "DaemonSet", "ConfigMap", "ValidatingAdmissionPolicy",
                                             "ValidatingAdmissionPolicyBinding")]


class Publisher:
    """The real netclaim-publisher process, started with KUBECONFIG (not --kubeconfig)."""

    def __init__(self, root: Path, kubeconfig: str, extra: tuple[str, ...] = ()) -> None:
        self.root, self.kubeconfig, self.extra = root, kubeconfig, extra
        self.sock = root / "run" / "publisher.sock"
        self.log = root / "publisher.log"
        self.proc: subprocess.Popen[bytes] | None = None
        with pysocket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]

    def start(self) -> None:
        argv = [str(netclaim_publisher_bin()), "run", "--node-name", "node-a", "--socket", str(self.sock),
                "--state-dir", str(self.root / "state"), "--spool-dir", str(self.root / "spool"),
                "--metrics-address", f"127.0.0.1:{self.port}", "--resync-interval", "2", "--log-format", "json", *self.extra]
        env = {**python_env(), "KUBECONFIG": self.kubeconfig}
        with self.log.open("a") as log:
            self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env)
        wait_for(lambda: self.ready() or self.proc.poll() is not None, "the publisher to be ready")
        assert self.proc.poll() is None, self.log.read_text()

    def ready(self) -> bool:
        import urllib.request

        try:
            return urllib.request.urlopen(f"http://127.0.0.1:{self.port}/readyz", timeout=2).status == 200
        except OSError:
            return False

    def stop(self) -> None:
        if self.proc is not None:
            terminate(self.proc)
            self.proc = None

    def forbidden(self) -> list[str]:
        """Log lines about a 403 (RBAC said no). A 422 from the per-driver check is not one."""
        out = []
        for line in self.log.read_text().splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                if "403" in line:
                    out.append(line)
                continue
            if record.get("code") == 403 or "403 Forbidden" in str(record.get("error", "")):
                out.append(line)
        return out


def with_role(control_plane: Any, api: Any, dyn: Any, ns: str, docs: list[dict[str, Any]], tmp_root: Path) -> str:
    """The chart's RBAC documents applied in `ns`; a kubeconfig of their ServiceAccount's Node-bound token."""
    node = ensure_node(api, "node-a")
    create_namespace(api, ns)
    for doc in docs:
        apply_object(dyn, doc, "netclaim-rbac-test", dry_run=False)
    sa = by_kind(docs, "ServiceAccount")[0]["metadata"]["name"]
    token = token_request(api, ns, sa, node, "Node", seconds=900)
    return control_plane.kubeconfig_for_token(token, tmp_root / "kubeconfig")


@pytest.fixture()
def node_a(control_plane, tmp_root: Path) -> Iterator[dict[str, Any]]:
    api = control_plane.api_client()
    dyn = DynamicClient(api)
    sfx = uuid.uuid4().hex[:6]
    ns = f"ncexact-{sfx}"
    docs = chart_rbac(ns, f"netclaim-{sfx}")
    try:
        kubeconfig = with_role(control_plane, api, dyn, ns, docs, tmp_root)
        # The node's heartbeat Lease, under the chart's Role and admission policy (the DaemonSet's arguments).
        lease = ("--node-lease-namespace", ns, "--node-lease-prefix", f"netclaim-{sfx}-node-",
                 "--node-lease-period", "2")
        yield {"api": api, "ns": ns, "docs": docs, "kubeconfig": kubeconfig, "dyn": dyn, "lease": lease,
               "lease_name": f"netclaim-{sfx}-node-node-a"}
    finally:
        tear_down(api, dyn, ns, docs, lambda kind: kind in ("ClusterRole", "ClusterRoleBinding", "ValidatingAdmissionPolicy",
                                                            "ValidatingAdmissionPolicyBinding"))


def own_entry(api: Any, claim: Any) -> list[dict[str, Any]]:
    return [d for d in status_devices(api, claim) if d["driver"] == DRIVER]


@pytest.mark.controlplane
def test_publisher_whole_life_under_the_shipped_role_has_no_403(node_a, tmp_root: Path) -> None:
    api, ns = node_a["api"], node_a["ns"]
    pod = create_pod(api, ns, "web", "node-a", claim="claim-a")
    claim = allocated_claim(api, ns, "claim-a", "node-a", pod, [
        {"request": "nic", "driver": DRIVER, "pool": "node-a", "device": "nic0"},
        {"request": "other", "driver": OTHER_DRIVER, "pool": "node-a", "device": "dev0"},
    ])
    # The refusals go to a claim of their own: a refused entry stays in that
    # claim's desired state (and is refused again on every replay).
    pod_b = create_pod(api, ns, "web-b", "node-a", claim="claim-b")
    allocated_claim(api, ns, "claim-b", "node-a", pod_b, [
        {"request": "other", "driver": OTHER_DRIVER, "pool": "node-a", "device": "dev0"}])
    pub = Publisher(tmp_root, node_a["kubeconfig"], node_a["lease"])
    pub.start()
    try:
        # The heartbeat: created, then renewed (every 2 s here).
        leases = client.CoordinationV1Api(api)
        renewed = wait_for(lambda: lease_renew_time(leases, ns, node_a["lease_name"]), "the node's Lease")
        wait_for(lambda: lease_renew_time(leases, ns, node_a["lease_name"]) != renewed, "the Lease renewed")
        # ADD -> applied.
        assert send(str(pub.sock), publisher_event(pod, DRIVER, "nic", "c0ffee01", "eth0", "10.88.9.7/16"))["ok"]
        wait_for(lambda: own_entry(api, claim), "the ADD to be published")
        # DEL -> removed.
        from cni_plugin.wire.event import Event, PodRef

        dele = Event(op="DEL", container_id="c0ffee01", ifname="eth0", driver=DRIVER, request="nic",
                     pod=PodRef(pod["namespace"], pod["name"], pod["uid"]))
        assert send(str(pub.sock), dele)["ok"]
        wait_for(lambda: not own_entry(api, claim), "the DEL to remove the entry")
        # A refusal (another driver's entry), twice: one Event, the repeat counted.
        # The second ADD is sent once the first is refused: two ADDs for one claim
        # that are both queued before the worker runs are coalesced into one apply.
        for n, cid in enumerate(("c0ffee02", "c0ffee03"), start=1):
            assert send(str(pub.sock), publisher_event(pod_b, OTHER_DRIVER, "other", cid, "net1", "10.99.0.7/24"))["ok"]
            wait_for(lambda: metric(pub.port, "netclaim_apply_errors_total", 'code="422"') >= n, f"refusal {n}")
        wait_for(lambda: metric(pub.port, "netclaim_k8s_events_total", 'result="created"') >= 1, "the Event")
        # Resync passes (every 2 s here).
        wait_for(lambda: metric(pub.port, "netclaim_resyncs_total", "") >= 1 or
                 "netclaim_resyncs_total 1" in metrics_text(pub.port), "a resync")
        # Restart: stopping flushes the series; starting replays the journal and resyncs.
        pub.stop()
        [warning] = [e for e in client.EventsV1Api(api).list_namespaced_event(ns).items
                     if e.reporting_controller == "netclaim.dev/publisher"]
        assert warning.series is not None and warning.series.count == 2, warning
        pub.start()
        assert send(str(pub.sock), publisher_event(pod, DRIVER, "nic", "c0ffee04", "eth0", "10.88.9.8/16"))["ok"]
        try:
            wait_for(lambda: own_entry(api, claim), "the ADD after the restart to be published")
        except BaseException:
            raise AssertionError("not published after the restart:\n" + pub.log.read_text()[-6000:]) from None
        text = metrics_text(pub.port)
        assert 'code="403"' not in text, text
    finally:
        pub.stop()
    assert pub.forbidden() == [], "\n".join(pub.forbidden())


def lease_renew_time(leases: Any, namespace: str, name: str) -> Any:
    try:
        return leases.read_namespaced_lease(name, namespace).spec.renew_time
    except ApiException as exc:
        if exc.status != 404:
            raise
        return None


def metrics_text(port: int) -> str:
    import urllib.request

    return urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()


def keeper_kube(node_a: dict[str, Any]) -> tuple[Any, list[tuple[str, str]], dict[str, Any]]:
    """The keeper's API client with the shipped role's token, every call recorded; and its DaemonSet."""
    from publisher.kube.calls import Kube, load_client

    [ds] = by_kind(node_a["docs"], "DaemonSet")
    calls: list[tuple[str, str]] = []
    return Kube(load_client(node_a["kubeconfig"], 3), lambda verb, code: calls.append((verb, code))), calls, ds


@pytest.mark.controlplane
def test_keeper_watches_its_daemonset_under_the_shipped_role(node_a) -> None:
    """Present -> keep the node (upgrade); deleted -> the watch sees it and the node is cleaned; never a 403."""
    from publisher.keeper.ownerwatch import OwnerWatch

    kube, calls, ds = keeper_kube(node_a)
    owner = OwnerWatch(kube, node_a["ns"], ds["metadata"]["name"])
    owner.start()
    try:
        wait_for(lambda: owner.observation().state == "present", "the keeper to see its DaemonSet")
        assert owner.decide(within=3, pause=0.2) == "present"
        owner = OwnerWatch(kube, node_a["ns"], ds["metadata"]["name"])
        owner.start()
        wait_for(lambda: calls.count(("watch", "200")) >= 2, "the second watch to be open")
        delete_object(node_a["dyn"], ds)
        wait_for(lambda: owner.observation().evidence == "watch: DELETED", "the watch to deliver the deletion")
        assert owner.decide(within=3, pause=0.2) == "gone"
    finally:
        owner.stop()
    assert {verb for verb, _ in calls} == {"list", "watch", "get"}
    assert not [c for c in calls if c[1] in ("401", "403")], calls


@pytest.mark.controlplane
def test_refused_token_is_no_proof_of_uninstall(node_a) -> None:
    """The keeper's Role gone (RBAC replaced, an authorizer not synced yet): 403 keeps the node; a
    deletion seen by the watch opened before the Role went is still proof (what helm uninstall does)."""
    from publisher.keeper.ownerwatch import OwnerWatch

    kube, calls, ds = keeper_kube(node_a)
    [binding] = [d for d in by_kind(node_a["docs"], "RoleBinding") if d["metadata"]["name"].endswith("-chain-keeper")]
    owner = OwnerWatch(kube, node_a["ns"], ds["metadata"]["name"])
    owner.start()
    try:
        wait_for(lambda: ("watch", "200") in calls, "the watch to be open")
        delete_object(node_a["dyn"], binding)
        wait_for(lambda: kube_refuses(kube, node_a["ns"], ds["metadata"]["name"]), "the Role's grant to be gone")
        assert owner.decide(within=2, pause=0.2) == "unknown"  # seen present, then only 403s: keep the node
        refused = OwnerWatch(kube, node_a["ns"], ds["metadata"]["name"])  # never saw it: only 403s
        assert refused.decide(within=2, pause=0.2) == "unknown"
        # helm uninstall: the watch is open, then the RBAC goes, then the DaemonSet.
        owner = OwnerWatch(kube, node_a["ns"], ds["metadata"]["name"])
        apply_object(node_a["dyn"], binding, "netclaim-rbac-test", dry_run=False)
        wait_for(lambda: not kube_refuses(kube, node_a["ns"], ds["metadata"]["name"]), "the grant to be back")
        owner.start()
        wait_for(lambda: owner.observation().state == "present", "the keeper to see its DaemonSet")
        wait_for(lambda: calls.count(("watch", "200")) >= 2, "the second watch to be open")
        delete_object(node_a["dyn"], binding)
        wait_for(lambda: kube_refuses(kube, node_a["ns"], ds["metadata"]["name"]), "the Role's grant to be gone")
        delete_object(node_a["dyn"], ds)
        wait_for(lambda: owner.observation().state == "gone", "the open watch to deliver the deletion")
        assert owner.decide(within=2, pause=0.2) == "gone"
    finally:
        owner.stop()
    assert ("get", "403") in calls


def kube_refuses(kube: Any, namespace: str, name: str) -> bool:
    from publisher.keeper.ownerwatch import ask_once

    return ask_once(lambda: kube.get_daemonset(namespace, name)).evidence.startswith("get: 403")


# ---------------------------------------------------------------- the endpoints controller (endpoints.enabled)

# What publisher/endpoints/ calls: list+watch of Services, pods and claims (the caches, no GET per object),
# server-side apply (PATCH, which creates a missing slice: create too) and DELETE of its slices, and
# the Lease read, made once and renewed (PUT). The live test below shows none of it is refused.
ENDPOINTS_GRANTS: set[Grant] = {
    ("", "services", "list"), ("", "services", "watch"), ("", "pods", "list"), ("", "pods", "watch"),
    ("resource.k8s.io", "resourceclaims", "list"), ("resource.k8s.io", "resourceclaims", "watch"),
    ("discovery.k8s.io", "endpointslices", "list"), ("discovery.k8s.io", "endpointslices", "watch"),
    ("discovery.k8s.io", "endpointslices", "create"), ("discovery.k8s.io", "endpointslices", "patch"),
    ("discovery.k8s.io", "endpointslices", "delete"),
    ("coordination.k8s.io", "leases", "get"), ("coordination.k8s.io", "leases", "create"),
    ("coordination.k8s.io", "leases", "update"),
}


def endpoints_rbac(namespace: str, release: str) -> list[dict[str, Any]]:
    docs = render(f"driverName={DRIVER}", "endpoints.enabled=true", release=release, namespace=namespace)
    return [d for d in docs if d["kind"] in ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")
            and d["metadata"]["name"].endswith("-endpoints")]


def test_the_endpoints_controllers_role_grants_exactly_its_calls_and_nothing_of_the_publishers() -> None:
    docs = endpoints_rbac("netclaim-system", "netclaim")
    assert role_grants(docs) == ENDPOINTS_GRANTS
    (sa,) = by_kind(docs, "ServiceAccount")
    bindings = by_kind(docs, "ClusterRoleBinding") + by_kind(docs, "RoleBinding")
    assert {s["name"] for b in bindings for s in b["subjects"]} == {sa["metadata"]["name"]}
    (lease_role,) = by_kind(docs, "Role")
    assert lease_role["metadata"]["namespace"] == "netclaim-system"
    # off by default: no account, no role of the controller
    assert not [d for d in render() if d["metadata"]["name"].endswith("-endpoints")]


@pytest.mark.controlplane
def test_the_endpoints_controller_under_its_chart_role_writes_slices_with_no_403(control_plane, tmp_root: Path) -> None:
    import signal

    api = control_plane.api_client()
    dyn = DynamicClient(api)
    sfx = uuid.uuid4().hex[:6]
    ns = f"ncexact-ep-{sfx}"
    docs = endpoints_rbac(ns, f"netclaim-{sfx}")
    proc = None
    try:
        kubeconfig = with_role(control_plane, api, dyn, ns, docs, tmp_root)
        pod = create_pod(api, ns, "web", "node-a", claim="claim-a")
        client.CoreV1Api(api).patch_namespaced_pod("web", ns, {"metadata": {"labels": {"app": "web"}}})
        result = {"request": "nic", "driver": DRIVER, "pool": "node-a", "device": "nic0"}
        claim = allocated_claim(api, ns, "claim-a", "node-a", pod, [result])
        apply_status(api, claim, [device_entry(claim, result, ip="10.88.0.5/16")], "netclaim/node-a")
        client.CoreV1Api(api).create_namespaced_service(ns, {"metadata": {"name": "web", "annotations": {
            "netclaim.dev/endpoints-selector": "app=web", "netclaim.dev/endpoints-driver": DRIVER,
            "netclaim.dev/endpoints-request": "nic"}}, "spec": {"clusterIP": "None", "ports": [{"port": 80}]}})
        log = tmp_root / "endpoints.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen([str(netclaim_publisher_bin()), "endpoints", "--kubeconfig", kubeconfig,
                                     "--namespace", ns, "--lease-namespace", ns, "--lease-name", f"netclaim-{sfx}-endpoints"],
                                    stdout=out, stderr=out, env=python_env())
        disc = client.DiscoveryV1Api(api)

        def addresses() -> list[str]:
            found = disc.list_namespaced_endpoint_slice(ns, label_selector="kubernetes.io/service-name=web")
            return [a for s in found.items for ep in s.endpoints or [] for a in ep.addresses]

        wait_for(lambda: addresses() == ["10.88.0.5"], "the Service's slice with the pod's address", timeout=60)
        client.CoreV1Api(api).delete_namespaced_service("web", ns)  # its slices are deleted (no GC runs here)
        wait_for(lambda: not disc.list_namespaced_endpoint_slice(ns).items, "the slices of the deleted Service gone")
        proc.send_signal(signal.SIGTERM)  # gives the Lease up: an update
        proc.wait(30)
        assert proc.returncode == 0, log.read_text()[-3000:]
        lease = client.CoordinationV1Api(api).read_namespaced_lease(f"netclaim-{sfx}-endpoints", ns)
        assert not lease.spec.holder_identity
        text = log.read_text()
        assert "released the lease" in text
        refused = [line for line in text.splitlines() if "403" in line or "forbidden" in line.lower()]
        assert not refused, refused
    finally:
        if proc is not None and proc.poll() is None:
            terminate(proc)
        tear_down(api, dyn, ns, docs, lambda kind: kind in ("ClusterRole", "ClusterRoleBinding"))
