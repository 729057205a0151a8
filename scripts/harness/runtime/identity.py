"""The publisher's least-privilege node identity, made the way a cluster would make it.

The e2e tests, the demo and the benchmarks run netclaim-publisher with what the
project ships for it, not with the admin kubeconfig:

1. `apply_shipped_rbac` server-side applies conf/kubernetes/00-namespace.yaml and
   conf/kubernetes/10-rbac.yaml (ServiceAccount netclaim-publisher in
   netclaim-system, its ClusterRole and ClusterRoleBinding). The shipped
   ClusterRole names the placeholder driver `net.example.com` in the
   `resourceclaims/driver` rule's resourceNames. When the stack's driver is not
   in that list, the APPLIED COPY gets it added (the file is never changed):
   the rule's resourceNames become the shipped names, plus the names already in
   the cluster's ClusterRole (another run on the same control plane may use
   another driver), plus the stack's driver. The apply carries the read
   resourceVersion as a precondition and is retried on conflict, so two runs
   adding two drivers do not drop each other's. Every other rule, verb and
   name is exactly the shipped one.
2. `node_token` mints a service-account token bound to the Node object through
   the TokenRequest API (what a projected token volume gives a pod: the token
   carries the node name in `authentication.kubernetes.io/node-name`, which the
   `associated-node:` verbs require). The Node must exist; `ensure_node`
   creates it when absent.
3. `write_kubeconfig` writes a kubeconfig (mode 0600) with that token and the
   control plane's server and CA.

`publisher_kubeconfig` does all three and returns the kubeconfig's path.
Nodes, pods, claims and allocations (the scheduler's and kubelet's writes)
stay with the admin client; only the publisher runs as the node identity.
"""

from __future__ import annotations

import base64
import copy
import json
import os
import time
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client, dynamic
from kubernetes.client.exceptions import ApiException

REPO = Path(__file__).resolve().parents[3]
MANIFESTS = (REPO / "conf" / "kubernetes" / "00-namespace.yaml", REPO / "conf" / "kubernetes" / "10-rbac.yaml")
FIELD_MANAGER = "netclaim-demo"
NAMESPACE = "netclaim-system"
SERVICE_ACCOUNT = "netclaim-publisher"
DRIVER_RESOURCE = "resourceclaims/driver"


def shipped_manifests() -> list[dict[str, Any]]:
    """The namespace and RBAC documents exactly as shipped, in apply order."""
    docs: list[dict[str, Any]] = []
    for path in MANIFESTS:
        with path.open() as fh:
            docs.extend(doc for doc in yaml.safe_load_all(fh) if doc)
    return docs


def _driver_rules(role: dict[str, Any]) -> list[dict[str, Any]]:
    return [r for r in role.get("rules") or [] if DRIVER_RESOURCE in (r.get("resources") or [])]


def with_drivers(role: dict[str, Any], drivers: list[str]) -> dict[str, Any]:
    """A copy of the ClusterRole whose resourceclaims/driver rule also names `drivers`."""
    role = copy.deepcopy(role)
    rules = _driver_rules(role)
    if len(rules) != 1:
        raise ValueError(f"expected one {DRIVER_RESOURCE} rule in the shipped ClusterRole, found {len(rules)}")
    names = list(rules[0].get("resourceNames") or [])
    for driver in drivers:
        if driver not in names:
            names.append(driver)
    rules[0]["resourceNames"] = names
    return role


def _apply(dyn: dynamic.DynamicClient, doc: dict[str, Any]) -> Any:
    resource = dyn.resources.get(api_version=doc["apiVersion"], kind=doc["kind"])
    kwargs: dict[str, Any] = {"body": doc, "name": doc["metadata"]["name"], "field_manager": FIELD_MANAGER,
                              "force_conflicts": True}
    if resource.namespaced:
        kwargs["namespace"] = doc["metadata"].get("namespace", "default")
    return resource.server_side_apply(**kwargs)


def _apply_role(api: client.ApiClient, dyn: dynamic.DynamicClient, role: dict[str, Any], driver: str) -> None:
    rbac = client.RbacAuthorizationV1Api(api)
    name = role["metadata"]["name"]
    for _ in range(20):
        try:
            live = api.sanitize_for_serialization(rbac.read_cluster_role(name))
        except ApiException as exc:
            if exc.status != 404:
                raise
            live = None
        extra = [n for r in _driver_rules(live or {}) for n in (r.get("resourceNames") or [])]
        doc = with_drivers(role, [*extra, driver])
        if live is not None:  # precondition: nobody changed it since we read it
            doc["metadata"]["resourceVersion"] = live["metadata"]["resourceVersion"]
        try:
            _apply(dyn, doc)
            return
        except ApiException as exc:
            if exc.status != 409:
                raise
        time.sleep(0.1)
    raise RuntimeError(f"ClusterRole {name}: kept conflicting with another writer")


def apply_documents(api: client.ApiClient, docs: list[dict[str, Any]]) -> None:
    """Server-side apply each document as it is (objects the harness owns, such as a peer's RBAC)."""
    dyn = dynamic.DynamicClient(api)
    for doc in docs:
        _apply(dyn, doc)


def apply_shipped_rbac(api: client.ApiClient, driver: str) -> None:
    """Server-side apply the shipped namespace + RBAC, with `driver` in the driver rule (see module doc)."""
    dyn = dynamic.DynamicClient(api)
    for doc in shipped_manifests():
        if doc["kind"] == "ClusterRole":
            _apply_role(api, dyn, doc, driver)
        else:
            _apply(dyn, doc)


def ensure_node(api: client.ApiClient, name: str) -> dict[str, str]:
    """The Node object (created when absent): name and uid, for a bound token."""
    core = client.CoreV1Api(api)
    try:
        core.create_node({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}})
    except ApiException as exc:
        if exc.status != 409:
            raise
    node = core.read_node(name)
    return {"name": node.metadata.name, "uid": node.metadata.uid}


def bound_token(api: client.ApiClient, kind: str, bound: dict[str, str], seconds: int = 3600,
                namespace: str = NAMESPACE, service_account: str = SERVICE_ACCOUNT) -> str:
    """A service-account token bound to a Pod or a Node (TokenRequest API).

    Bound tokens carry the object's node name, which is what lets the API server
    grant `associated-node` verbs; they die with the object."""
    body = {
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenRequest",
        "spec": {
            "audiences": [],  # empty: the API server's own audience
            "expirationSeconds": seconds,
            "boundObjectRef": {"kind": kind, "apiVersion": "v1", "name": bound["name"], "uid": bound["uid"]},
        },
    }
    core = client.CoreV1Api(api)
    for attempt in range(50):  # the service account may be seconds old
        try:
            return core.create_namespaced_service_account_token(service_account, namespace, body).status.token
        except ApiException as exc:
            if exc.status != 404 or attempt == 49:
                raise
            time.sleep(0.1)
    raise AssertionError("unreachable")


def node_token(api: client.ApiClient, node: dict[str, str], seconds: int = 3600,
               namespace: str = NAMESPACE, service_account: str = SERVICE_ACCOUNT) -> str:
    """A token of the service account bound to the Node."""
    return bound_token(api, "Node", node, seconds, namespace, service_account)


def write_kubeconfig(path: str | os.PathLike[str], server: str, ca_file: str, token: str,
                     user: str = f"{NAMESPACE}:{SERVICE_ACCOUNT}") -> str:
    """A kubeconfig (mode 0600) that authenticates with `token` (as `user`); returns its path."""
    text = yaml.safe_dump({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "local", "cluster": {"server": server, "certificate-authority": str(ca_file)}}],
        "users": [{"name": user, "user": {"token": token}}],
        "contexts": [{"name": "local", "context": {"cluster": "local", "user": user}}],
        "current-context": "local",
    }, sort_keys=False)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    os.chmod(path, 0o600)  # O_CREAT's mode does not apply to an existing file
    return str(path)


def publisher_kubeconfig(api: client.ApiClient, *, server: str, ca_file: str, node: str, driver: str,
                         path: str | os.PathLike[str], seconds: int = 3600) -> str:
    """Shipped RBAC applied, Node ensured, Node-bound token minted, kubeconfig written: its path."""
    apply_shipped_rbac(api, driver)
    token = node_token(api, ensure_node(api, node), seconds)
    return write_kubeconfig(path, server, ca_file, token)


def kubeconfig_token(path: str | os.PathLike[str]) -> str:
    """The bearer token of a kubeconfig's current context."""
    cfg = yaml.safe_load(Path(path).read_text())
    ctx = next(c["context"] for c in cfg["contexts"] if c["name"] == cfg["current-context"])
    return next(u["user"]["token"] for u in cfg["users"] if u["name"] == ctx["user"])


def jwt_claims(token: str) -> dict[str, Any]:
    payload = token.split(".")[1]
    payload += "=" * (-len(payload) % 4)
    return json.loads(base64.urlsafe_b64decode(payload))


def authenticated(api: client.ApiClient, token: str) -> bool:
    """Whether the API server accepts `token` now (a revoked one is refused as soon as its cache lets go)."""
    review = client.AuthenticationV1Api(api).create_token_review(
        {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": token}},
        _request_timeout=10)
    return bool(review.status.authenticated)


def token_holder(api: client.ApiClient, namespace: str, name: str, service_account: str, node: str, image: str,
                 labels: dict[str, str] | None = None) -> dict[str, str]:
    """A pause pod of `service_account` on `node` with no token of its own, to bind tokens to: they carry the
    node's name, as the kubelet's projected token does, and deleting the pod revokes them. {name, uid}."""
    spec = {"containers": [{"name": "hold", "image": image, "imagePullPolicy": "Never"}],
            "terminationGracePeriodSeconds": 0, "serviceAccountName": service_account, "nodeName": node,
            "automountServiceAccountToken": False}
    pod = client.CoreV1Api(api).create_namespaced_pod(
        namespace, {"metadata": {"name": name, "labels": labels or {}}, "spec": spec})
    return {"name": pod.metadata.name, "uid": pod.metadata.uid}


def token_review(api: client.ApiClient, token: str) -> dict[str, Any]:
    """How the API server authenticates `token`: username, groups, extra."""
    review = client.AuthenticationV1Api(api).create_token_review(
        {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": token}}
    )
    if not review.status.authenticated:
        raise RuntimeError(f"token not authenticated: {review.status.error}")
    user = review.status.user
    return {"username": user.username, "groups": user.groups or [], "extra": user.extra or {}}
