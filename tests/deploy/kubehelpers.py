"""API-side set-up for the deployment tests, done as the cluster would do it.

No scheduler or controller-manager runs on the test control plane, so these
helpers do their jobs by hand with the admin client: create Nodes, write a
claim's status.allocation / reservedFor (the scheduler's write) and mint
service-account tokens through the TokenRequest API (the kubelet's job for a
projected token volume).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from deploylib import CONF, DRIVER, load_yaml_docs

from runtime.dataschema import check_entries  # noqa: E402
from runtime.identity import bound_token, ensure_node, jwt_claims, token_review  # noqa: E402,F401  (one copy, shared with the demo)

MERGE = "application/merge-patch+json"
APPLY = "application/apply-patch+yaml"
OTHER_DRIVER = "other.example.com"




def create_namespace(api: client.ApiClient, name: str) -> None:
    client.CoreV1Api(api).create_namespace({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})


def shipped_rbac(namespace: str, name_suffix: str) -> list[dict[str, Any]]:
    """conf/kubernetes/10-rbac.yaml with only names moved, so parallel runs do not collide.

    The rules, verbs and resourceNames are exactly the shipped ones: the
    ServiceAccount goes to `namespace`, the cluster-scoped role and binding get
    `name_suffix`.
    """
    docs = load_yaml_docs(CONF / "kubernetes" / "10-rbac.yaml")
    out = []
    for doc in docs:
        doc = json.loads(json.dumps(doc))
        kind = doc["kind"]
        if kind in ("ServiceAccount", "Role"):
            doc["metadata"]["namespace"] = namespace
        elif kind == "RoleBinding":
            doc["metadata"]["namespace"] = namespace
            for subject in doc["subjects"]:
                subject["namespace"] = namespace
        elif kind == "ClusterRole":
            doc["metadata"]["name"] += name_suffix
        elif kind == "ClusterRoleBinding":
            doc["metadata"]["name"] += name_suffix
            doc["roleRef"]["name"] += name_suffix
            for subject in doc["subjects"]:
                subject["namespace"] = namespace
        else:
            raise AssertionError(f"unexpected kind {kind} in 10-rbac.yaml")
        out.append(doc)
    return out


def apply_object(dyn: Any, doc: dict[str, Any], manager: str, dry_run: bool) -> Any:
    """Server-side apply of one manifest through the dynamic client."""
    resource = dyn.resources.get(api_version=doc["apiVersion"], kind=doc["kind"])
    kwargs: dict[str, Any] = {"body": doc, "name": doc["metadata"]["name"], "field_manager": manager,
                              "force_conflicts": True}
    if resource.namespaced:
        kwargs["namespace"] = doc["metadata"].get("namespace", "default")
    if dry_run:
        kwargs["dry_run"] = "All"
    return resource.server_side_apply(**kwargs)


def delete_object(dyn: Any, doc: dict[str, Any]) -> None:
    resource = dyn.resources.get(api_version=doc["apiVersion"], kind=doc["kind"])
    kwargs: dict[str, Any] = {"name": doc["metadata"]["name"]}
    if resource.namespaced:
        kwargs["namespace"] = doc["metadata"]["namespace"]
    try:
        resource.delete(**kwargs)
    except ApiException as exc:
        if exc.status != 404:
            raise


def tear_down(api: client.ApiClient, dyn: Any, namespace: str, docs: list[dict[str, Any]],
              kinds: Callable[[str], bool]) -> None:
    """Delete the objects of `docs` whose kind `kinds` selects, then the test's namespace (left to
    terminate: no namespace controller runs here), and close the client. Cluster-scoped objects
    must go: they outlive the namespace and would meet the next test."""
    for doc in docs:
        if kinds(doc["kind"]):
            delete_object(dyn, doc)
    try:
        client.CoreV1Api(api).delete_namespace(namespace)
    except ApiException:
        pass
    api.close()


def create_pod(api: client.ApiClient, namespace: str, name: str, node: str, *,
               service_account: str | None = None, claim: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"nodeName": node, "containers": [{"name": "c", "image": "netclaim-test:0"}]}
    if service_account:
        spec["serviceAccountName"] = service_account
    if claim:
        spec["resourceClaims"] = [{"name": "nic", "resourceClaimName": claim}]
        spec["containers"][0]["resources"] = {"claims": [{"name": "nic"}]}
    pod = client.CoreV1Api(api).create_namespaced_pod(
        namespace, {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}
    )
    return {"namespace": namespace, "name": name, "uid": pod.metadata.uid}


@dataclass
class Claim:
    namespace: str
    name: str
    node: str
    results: list[dict[str, str]]


def allocated_claim(api: client.ApiClient, namespace: str, name: str, node: str, pod: dict[str, Any],
                    results: list[dict[str, str]]) -> Claim:
    """A claim allocated to `node` and reserved for `pod`, as the scheduler leaves it."""
    resource = client.ResourceV1Api(api)
    requests = sorted({r["request"] for r in results})
    resource.create_namespaced_resource_claim(namespace, {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": {"devices": {"requests": [
            {"name": req, "exactly": {"deviceClassName": DRIVER, "allocationMode": "ExactCount", "count": 1}}
            for req in requests
        ]}},
    })
    status = {"status": {
        "allocation": {
            "devices": {"results": results},
            # The one shape the API server recognises as "allocated to node X".
            "nodeSelector": {"nodeSelectorTerms": [
                {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
            ]},
        },
        "reservedFor": [{"resource": "pods", "name": pod["name"], "uid": pod["uid"]}],
    }}
    resource.patch_namespaced_resource_claim_status(name, namespace, status, _content_type=MERGE)
    return Claim(namespace, name, node, results)


def token_request(api: client.ApiClient, namespace: str, service_account: str, bound: dict[str, Any],
                  kind: str, seconds: int = 3600) -> str:
    """A token bound to a Pod or a Node, minted through the TokenRequest API."""
    return bound_token(api, kind, bound, seconds, namespace, service_account)






def device_entry(claim: Claim, result: dict[str, str], ip: str = "10.88.0.5/16") -> dict[str, Any]:
    return {
        "driver": result["driver"],
        "pool": result["pool"],
        "device": result["device"],
        "networkData": {"interfaceName": "eth0", "ips": [ip], "hardwareAddress": "0a:58:0a:58:00:05"},
        "conditions": [{
            "type": "Ready", "status": "True", "reason": "NetworkConfigured",
            "message": "eth0 configured", "lastTransitionTime": "2026-11-29T12:00:00Z",
        }],
    }


def apply_status(api: client.ApiClient, claim: Claim, devices: list[dict[str, Any]], manager: str) -> Any:
    body = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": claim.name, "namespace": claim.namespace},
        "status": {"devices": devices},
    }
    return client.ResourceV1Api(api).patch_namespaced_resource_claim_status(
        claim.name, claim.namespace, body, field_manager=manager, _content_type=APPLY
    )


def status_devices(api: client.ApiClient, claim: Claim) -> list[dict[str, Any]]:
    """The claim's entries, each netclaim `data` among them held to its shipped schema (runtime/dataschema.py)."""
    got = client.ResourceV1Api(api).read_namespaced_resource_claim(claim.name, claim.namespace)
    return check_entries([d.to_dict() for d in (got.status.devices or [])])


def assert_driver_refusal(exc: ApiException, driver: str) -> None:
    """How kube-apiserver 1.37 refuses a status.devices write without the driver permission.

    Not a 403: the per-driver check runs in the claim's status strategy, after
    RBAC let the PATCH on resourceclaims/status through, so it comes back as
    422 Invalid with a FieldValueForbidden cause on status.devices.
    """
    body = json.loads(exc.body)
    assert exc.status == 422, exc.body
    causes = body["details"]["causes"]
    assert [c["reason"] for c in causes] == ["FieldValueForbidden"], exc.body
    assert causes[0]["field"] == "status.devices"
    assert 'resource="resourceclaims/driver"' in causes[0]["message"]
    assert f'"{driver}" is forbidden' in causes[0]["message"]
