"""A publisher's token writes only its own node's heartbeat Lease, and no one else writes any, checked
on the real API server.

The chart's Role lets the publishers' service account create, get and update Leases in the release
namespace (RBAC cannot name the node's Lease: `create` takes no resourceNames); its
ValidatingAdmissionPolicy narrows every write to the Lease named for the node in the token
(authentication.kubernetes.io/node-name), held by that node, lasting at most three of the longest
heartbeat periods. A second policy refuses every other principal's creation or change of a node
Lease (named <release>-node-*, or labelled as a heartbeat); deletes pass, so an admin can clean up.
Set-up as a cluster has it: the chart's objects applied for real, Nodes node-a and node-b, tokens
minted through the TokenRequest API bound to a Node (a systemd node's credential) and to a pod on
node-a (the DaemonSet's).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from kubernetes.dynamic import DynamicClient

from chartlib import by_kind, one, render
from deploylib import DRIVER
from publisher import limits
from publisher.observe.nodelease import LABELS
from kubehelpers import apply_object, create_namespace, create_pod, ensure_node, tear_down, token_request
from test_rbac_node_scope import wait_for

POLICY_SAYS = "the Lease of the node in its token"
WRITERS_SAY = "only the netclaim publishers write node Leases"
TEN_YEARS = 315_360_000
KINDS = ("ServiceAccount", "Role", "RoleBinding", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")


@dataclass
class Setup:
    namespace: str
    prefix: str
    service_account: str
    nodes: dict[str, dict[str, Any]]
    pod: dict[str, Any]


def lease(name: str, holder: str, labelled: bool = False) -> dict[str, Any]:
    return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": name, **({"labels": dict(LABELS)} if labelled else {})},
            "spec": {"holderIdentity": holder, "leaseDurationSeconds": 180}}


@pytest.fixture(scope="module")
def setup(control_plane) -> Iterator[Setup]:
    api = control_plane.api_client()
    dyn = DynamicClient(api)
    sfx = uuid.uuid4().hex[:6]
    ns, release = f"nclease-{sfx}", f"netclaim-{sfx}"
    docs = [d for d in render(f"driverName={DRIVER}", release=release, namespace=ns) if d["kind"] in KINDS]
    try:
        nodes = {n: ensure_node(api, n) for n in ("node-a", "node-b", "node-c")}
        create_namespace(api, ns)
        for doc in docs:
            apply_object(dyn, doc, "netclaim-lease-test", dry_run=False)
        sa = by_kind(docs, "ServiceAccount")[0]["metadata"]["name"]
        pod = create_pod(api, ns, "netclaim-publisher-a", "node-a", service_account=sa)
        setup = Setup(ns, f"{release}-node-", sa, nodes, pod)
        # The policy is in force once the API server's policy informer has it: a dry run shows when.
        with as_token(control_plane, setup, "Node") as probe:
            as_a = client.CoordinationV1Api(probe)
            wait_for(lambda: POLICY_SAYS in refused(lambda: as_a.create_namespaced_lease(
                ns, lease(f"{setup.prefix}node-b", "node-b"), dry_run="All")), "the policy to be in force")
        admin = client.CoordinationV1Api(api)
        wait_for(lambda: WRITERS_SAY in refused(lambda: admin.create_namespaced_lease(
            ns, lease("zz", "node-b", labelled=True), dry_run="All")), "the writers' policy to be in force")
        yield setup
    finally:
        tear_down(api, dyn, ns, docs, lambda kind: kind.startswith("ValidatingAdmissionPolicy"))


def as_token(control_plane, setup: Setup, kind: str, node: str = "node-a") -> client.ApiClient:
    """An API client with a token of the publishers' account bound to a Node (or to the pod on node-a)."""
    admin = control_plane.api_client()
    try:
        bound = setup.nodes[node] if kind == "Node" else setup.pod
        token = token_request(admin, setup.namespace, setup.service_account, bound, kind, seconds=600)
    finally:
        admin.close()
    configuration = client.Configuration()
    configuration.host = control_plane.server
    configuration.ssl_ca_cert = control_plane.ca_file
    configuration.api_key = {"authorization": f"Bearer {token}"}
    return client.ApiClient(configuration)


def refused(call: Any) -> str:
    """The API's message when the call is refused with 403, else "" (it was allowed)."""
    try:
        call()
    except ApiException as exc:
        if exc.status == 403:
            return exc.body or "403"
        raise
    return ""


@pytest.fixture(params=["Node", "Pod"], ids=["node-bound-token", "pod-bound-token"])
def as_node_a(request, control_plane, setup: Setup) -> Iterator[client.CoordinationV1Api]:
    api = as_token(control_plane, setup, request.param)
    yield client.CoordinationV1Api(api)
    api.close()


@pytest.mark.controlplane
def test_node_a_writes_its_own_lease(setup: Setup, as_node_a, api_client) -> None:
    name = f"{setup.prefix}node-a"
    try:
        created = as_node_a.create_namespaced_lease(setup.namespace, lease(name, "node-a"))
    except ApiException as exc:
        if exc.status != 409:  # the other token's run created it
            raise
        created = as_node_a.read_namespaced_lease(name, setup.namespace)
    created.spec.lease_duration_seconds = 90
    replaced = as_node_a.replace_namespaced_lease(name, setup.namespace, created)
    assert replaced.spec.lease_duration_seconds == 90 and replaced.spec.holder_identity == "node-a"


@pytest.mark.controlplane
def test_node_a_cannot_stretch_its_lease_over_years(setup: Setup, as_node_a) -> None:
    """A Lease lasting ten years would keep a dead node fresh that long (fleet caps it as well)."""
    name = f"{setup.prefix}node-a"
    try:
        current = as_node_a.create_namespaced_lease(setup.namespace, lease(name, "node-a"))
    except ApiException as exc:
        if exc.status != 409:
            raise
        current = as_node_a.read_namespaced_lease(name, setup.namespace)
    current.spec.lease_duration_seconds = TEN_YEARS
    why = refused(lambda: as_node_a.replace_namespaced_lease(name, setup.namespace, current))
    assert "lasts at most 10800 seconds" in why, why
    assert as_node_a.read_namespaced_lease(name, setup.namespace).spec.lease_duration_seconds <= 10800
    # The longest a publisher writes (three periods of 3600 s) is still allowed.
    current.spec.lease_duration_seconds = limits.NODE_LEASE_DURATION_MAX
    assert as_node_a.replace_namespaced_lease(name, setup.namespace, current).spec.lease_duration_seconds == 10800


@pytest.mark.controlplane
def test_node_a_cannot_write_node_bs_lease(control_plane, setup: Setup, as_node_a, api_client) -> None:
    name = f"{setup.prefix}node-b"
    why = refused(lambda: as_node_a.create_namespaced_lease(setup.namespace, lease(name, "node-b")))
    assert POLICY_SAYS in why and name in why, why
    # node-b's Lease as node-b's own publisher left it: node-a can neither rewrite nor take it.
    with as_token(control_plane, setup, "Node", "node-b") as as_b:
        try:
            client.CoordinationV1Api(as_b).create_namespaced_lease(setup.namespace, lease(name, "node-b"))
        except ApiException as exc:
            if exc.status != 409:
                raise
    admin = client.CoordinationV1Api(api_client)
    current = admin.read_namespaced_lease(name, setup.namespace)
    current.spec.holder_identity = "node-a"
    assert refused(lambda: as_node_a.replace_namespaced_lease(name, setup.namespace, current))
    assert admin.read_namespaced_lease(name, setup.namespace).spec.holder_identity == "node-b"


@pytest.mark.controlplane
def test_no_one_but_the_publishers_writes_a_node_lease_and_an_admin_still_cleans_up(control_plane, setup: Setup,
                                                                                   api_client) -> None:
    """Another writer (here the cluster admin: no principal is exempt) cannot create a Lease that speaks for
    node-b, by name or by label, nor renew a node's Lease; it can delete one, and change metadata alone."""
    admin = client.CoordinationV1Api(api_client)
    ns = setup.namespace
    for body in (lease("zz", "node-b", labelled=True), lease(f"{setup.prefix}node-b", "node-b"),
                 lease(f"{setup.prefix}node-b", "node-b", labelled=True)):
        why = refused(lambda: admin.create_namespaced_lease(ns, body))  # noqa: B023 - called at once
        assert WRITERS_SAY in why, why
    # A Lease some other controller keeps, neither named nor labelled as a node's: not this policy's.
    admin.create_namespaced_lease(ns, lease("some-leader", "whoever"))
    admin.delete_namespaced_lease("some-leader", ns)
    # node-c's Lease as its publisher writes it: the admin can neither renew it nor relabel it ...
    name = f"{setup.prefix}node-c"
    with as_token(control_plane, setup, "Node", "node-c") as as_c:
        client.CoordinationV1Api(as_c).create_namespaced_lease(ns, lease(name, "node-c", labelled=True))
    current = admin.read_namespaced_lease(name, ns)
    current.spec.lease_duration_seconds = 170
    assert WRITERS_SAY in refused(lambda: admin.replace_namespaced_lease(name, ns, current))
    current = admin.read_namespaced_lease(name, ns)
    current.metadata.labels["app.kubernetes.io/component"] = "something-else"
    assert WRITERS_SAY in refused(lambda: admin.replace_namespaced_lease(name, ns, current))
    # ... but a change of metadata alone passes (a finalizer, as the garbage collector's own), and a delete.
    current = admin.read_namespaced_lease(name, ns)
    current.metadata.finalizers = ["netclaim.dev/test-hold"]
    current = admin.replace_namespaced_lease(name, ns, current)
    current.metadata.finalizers = []
    admin.replace_namespaced_lease(name, ns, current)
    admin.delete_namespaced_lease(name, ns)
    wait_for(lambda: not [x for x in admin.list_namespaced_lease(ns).items if x.metadata.name == name],
             "the cleaned-up Lease to be gone")


@pytest.mark.controlplane
def test_node_a_cannot_hold_its_lease_for_another_node_or_write_other_leases(setup: Setup, as_node_a) -> None:
    why = refused(lambda: as_node_a.create_namespaced_lease(setup.namespace, lease(f"{setup.prefix}node-a", "node-b")))
    assert "held by the node named in the writer's token" in why, why
    # A leader-election Lease of some controller in the same namespace: not the publisher's to write.
    assert refused(lambda: as_node_a.create_namespaced_lease(setup.namespace, lease("some-controller", "node-a")))
    # RBAC: no delete, no list.
    assert refused(lambda: as_node_a.delete_namespaced_lease(f"{setup.prefix}node-a", setup.namespace))
    assert refused(lambda: as_node_a.list_namespaced_lease(setup.namespace))


@pytest.mark.controlplane
def test_a_token_without_a_node_writes_no_lease(control_plane, setup: Setup) -> None:
    """A token of the account that no pod or Node is bound to carries no node name: refused."""
    admin = control_plane.api_client()
    try:
        body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {"expirationSeconds": 600}}
        token = client.CoreV1Api(admin).create_namespaced_service_account_token(
            setup.service_account, setup.namespace, body).status.token
    finally:
        admin.close()
    configuration = client.Configuration()
    configuration.host, configuration.ssl_ca_cert = control_plane.server, control_plane.ca_file
    configuration.api_key = {"authorization": f"Bearer {token}"}
    with client.ApiClient(configuration) as api:
        why = refused(lambda: client.CoordinationV1Api(api).create_namespaced_lease(
            setup.namespace, lease(f"{setup.prefix}node-a", "node-a")))
    assert "token bound to a pod or a Node" in why, why


@pytest.mark.controlplane
def test_other_writers_are_not_judged_by_the_policy(setup: Setup, api_client) -> None:
    admin = client.CoordinationV1Api(api_client)
    admin.create_namespaced_lease(setup.namespace, lease("some-controller", "whoever"))
    admin.delete_namespaced_lease("some-controller", setup.namespace)


def test_the_chart_renders_the_lease_role_and_policy_and_the_publisher_flags_only_when_enabled() -> None:
    def publisher_args(docs: list[dict[str, Any]]) -> list[str]:
        [publisher] = [c for c in one(docs, "DaemonSet")["spec"]["template"]["spec"]["containers"]
                       if c["name"] == "publisher"]
        return publisher["args"]

    on = render(release="edge", namespace="net")
    assert {d["kind"] for d in on} >= {"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}
    [role] = [r for r in by_kind(on, "Role") if r["metadata"]["name"] == "edge-netclaim-node-lease"]
    assert role["rules"] == [{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
                              "verbs": ["create", "get", "update"]}]
    policies = {p["metadata"]["name"]: json.dumps(p) for p in by_kind(on, "ValidatingAdmissionPolicy")}
    bindings = {b["spec"]["policyName"] for b in by_kind(on, "ValidatingAdmissionPolicyBinding")}
    assert set(policies) == bindings == {"edge-netclaim-node-lease", "edge-netclaim-node-lease-writers"}
    policy, writers = policies["edge-netclaim-node-lease"], policies["edge-netclaim-node-lease-writers"]
    assert "'edge-netclaim-node-' + variables.nodeNames[0]" in policy
    assert "system:serviceaccount:net:edge-netclaim-publisher" in policy
    assert f"leaseDurationSeconds <= {limits.NODE_LEASE_DURATION_MAX}" in policy
    assert "startsWith('edge-netclaim-node-')" in writers and "request.namespace == 'net'" in writers
    assert "!= 'system:serviceaccount:net:edge-netclaim-publisher'" in writers
    args = publisher_args(on)
    assert {"--node-lease-namespace=net", "--node-lease-prefix=edge-netclaim-node-", "--node-lease-period=600",
            "--keeper-socket=/run/netclaim/keeper-probe.sock"} <= set(args)
    off = render("nodeLease.enabled=false", release="edge", namespace="net")
    assert not {d["kind"] for d in off} & {"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}
    assert not [r for r in by_kind(off, "Role") if r["metadata"]["name"].endswith("-node-lease")]
    assert "--no-node-lease" in publisher_args(off)
