"""Every Kubernetes manifest shipped in conf/ is accepted by the real API server.

conf/kubernetes/NN-*.yaml are generated from the Helm chart
(scripts/build/manifests.sh; tests/deploy/test_chart.py fails when they are stale).

Server-side apply with dryRun=All runs the full admission and validation
chain without persisting anything, which is what `kubectl apply
--server-side --dry-run=server -f conf/kubernetes/` would tell an operator.
Namespaced objects need their namespace to exist, so the shipped Namespace is
applied for real first (and left: there is nothing to clean up in it).
"""

from __future__ import annotations

import json

import pytest
from kubernetes.dynamic import DynamicClient

from deploylib import CONF, DRIVER, load_yaml_docs, manifest_files
from kubehelpers import apply_object

pytestmark = pytest.mark.controlplane

MANAGER = "netclaim-deploy-test"


def all_docs() -> list[tuple[str, dict]]:
    return [(str(path.relative_to(CONF)), doc) for path in manifest_files() for doc in load_yaml_docs(path)]


def test_manifests_cover_what_an_operator_needs() -> None:
    kinds = {doc["kind"] for _, doc in all_docs()}
    assert {"Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "ConfigMap",
            "DaemonSet", "DeviceClass", "ResourceClaimTemplate", "Pod"} <= kinds


def test_every_manifest_applies_with_server_side_dry_run(api_client) -> None:
    dyn = DynamicClient(api_client)
    namespaces = [doc for _, doc in all_docs() if doc["kind"] == "Namespace"]
    for ns in namespaces:
        apply_object(dyn, ns, MANAGER, dry_run=False)

    failures = []
    for name, doc in all_docs():
        try:
            got = apply_object(dyn, doc, MANAGER, dry_run=True)
        except Exception as exc:  # report every manifest, not only the first failure
            failures.append(f"{name} {doc['kind']}/{doc['metadata']['name']}: {getattr(exc, 'body', exc)}")
            continue
        assert got.kind == doc["kind"] and got.metadata.name == doc["metadata"]["name"]
    assert not failures, "\n".join(failures)


def test_daemonset_as_the_api_server_defaults_it(api_client) -> None:
    """What the API server stores for the DaemonSet: the security-relevant parts."""
    dyn = DynamicClient(api_client)
    [doc] = [d for _, d in all_docs() if d["kind"] == "DaemonSet"]
    apply_object(dyn, next(d for _, d in all_docs() if d["kind"] == "Namespace"), MANAGER, dry_run=False)
    got = apply_object(dyn, doc, MANAGER, dry_run=True).to_dict()
    pod = got["spec"]["template"]["spec"]
    assert pod["hostNetwork"] is True
    assert not pod.get("hostPID") and not pod.get("hostIPC")
    assert pod["automountServiceAccountToken"] is False
    for c in pod["containers"] + pod["initContainers"]:
        sc = c["securityContext"]
        assert not sc.get("privileged"), c["name"]
        assert sc["allowPrivilegeEscalation"] is False and sc["capabilities"]["drop"] == ["ALL"], c["name"]
        assert c["resources"]["requests"] and c["resources"]["limits"], c["name"]
    publisher = pod["containers"][0]
    env = {e["name"]: e for e in publisher["env"]}
    assert env["NETCLAIM_NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert publisher["livenessProbe"]["exec"]["command"][-1] == "/healthz"
    assert publisher["readinessProbe"]["exec"]["command"][-1] == "/readyz"
    volumes = {v["name"]: v for v in pod["volumes"]}
    token = volumes["api-token"]["projected"]["sources"][0]["serviceAccountToken"]
    assert token["expirationSeconds"] == 3600
    mounts = {m["name"]: m for m in publisher["volumeMounts"]}
    # The live-interface watch: the runtime's netns directory, read only, and new namespaces must show up in it.
    assert mounts["netns"]["readOnly"] is True and mounts["netns"]["mountPropagation"] == "HostToContainer"
    assert volumes["netns"]["hostPath"]["path"] == "/var/run/netns"
    # The publisher, on the node's address with the API token, keeps no capability: setns(2) into a pod's
    # netns is the netns opener's, its one capability, with seccomp as the API server stores it.
    assert not publisher["securityContext"]["capabilities"].get("add")
    opener = next(c for c in pod["containers"] if c["name"] == "netns-opener")
    assert opener["securityContext"]["capabilities"]["add"] == ["SYS_ADMIN"]
    assert "appArmorProfile" not in opener["securityContext"]  # the plain manifests run on nodes without AppArmor too
    assert opener["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
    assert not opener.get("ports") and not opener.get("envFrom")
    assert all(not c["securityContext"]["capabilities"].get("add") for c in pod["containers"] + pod["initContainers"]
               if c is not opener), "only the netns opener has a capability"
    assert "cni-bin" not in mounts and "cni-conf" not in mounts  # only the installer and the keeper write those
    keeper = next(c for c in pod["containers"] if c["name"] == "chain-keeper")
    assert {"cni-bin", "cni-conf"} <= {m["name"] for m in keeper["volumeMounts"]}


def test_shipped_daemonset_has_no_cpu_limit_and_labels_are_valid() -> None:
    """A node-critical agent is not CFS-throttled by default; requests stay; every label value is valid."""
    import re

    docs = [d for _, d in all_docs()]
    [ds] = [d for d in docs if d["kind"] == "DaemonSet"]
    pod = ds["spec"]["template"]["spec"]
    for c in pod["containers"] + pod["initContainers"]:
        assert "cpu" not in c["resources"].get("limits", {}), c["name"]
        assert c["resources"]["requests"]["cpu"] and c["resources"]["limits"]["memory"], c["name"]
    label_value = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
    for doc in docs:
        for key, value in (doc.get("metadata", {}).get("labels") or {}).items():
            assert len(value) <= 63 and label_value.match(value), (doc["kind"], key, value)


def test_rbac_driver_names_match_the_plugin_configuration() -> None:
    """The resourceNames the API server checks are the driverName the plugin reports."""
    docs = [d for _, d in all_docs()]
    role = next(d for d in docs if d["kind"] == "ClusterRole")
    driver_rules = [r for r in role["rules"] if r["resources"] == ["resourceclaims/driver"]]
    assert driver_rules == [{
        "apiGroups": ["resource.k8s.io"],
        "resources": ["resourceclaims/driver"],
        "resourceNames": [DRIVER],
        "verbs": ["associated-node:patch"],  # server-side apply is a PATCH; update is never sent
    }]
    assert not any(v.startswith("arbitrary-node") for r in role["rules"] for v in r["verbs"])
    assert not any("*" in r["verbs"] or "*" in r["resources"] for r in role["rules"])
    config = next(d for d in docs if d["kind"] == "ConfigMap")
    assert config["data"]["NETCLAIM_DRIVER_NAME"] == DRIVER
    for conflist in (CONF / "cni").glob("*.conflist"):
        assert json.loads(conflist.read_text())["plugins"][-1]["driverName"] == DRIVER, conflist.name
