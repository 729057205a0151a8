"""The Helm chart: lint, what values render to, the generated manifests, and the real API server.

One `driverName` value must reach the three places the API server and the
plugin compare: the ClusterRole's resourceNames (per-driver status check), the
ConfigMap the chain keeper reads, and so the conflist entry it writes (run
here for real against a scratch CNI conf dir).
"""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from pathlib import Path

import jsonschema
import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from kubernetes.dynamic import DynamicClient
import yaml

import cni_plugin
from chartlib import CHART, by_kind, driver_set, helm, helm_binary, kube_version, one, render
from cni_plugin.config import INT_SETTINGS, extended_resource_problem, parse_netconf
from deploylib import DRIVER, REPO, netclaim_publisher_bin, python_env
from kubehelpers import apply_object

VERSION = cni_plugin.__version__

MANAGER = "netclaim-chart-test"


def driver_rule(role: dict) -> dict:
    [rule] = [r for r in role["rules"] if r["resources"] == ["resourceclaims/driver"]]
    return rule


def test_helm_lint_passes_with_defaults_and_with_every_toggle() -> None:
    helm("lint", "--strict", str(CHART), "--kube-version", kube_version(), *driver_set())
    helm("lint", "--strict", str(CHART), "--kube-version", kube_version(), "--set", "namespace.create=true", "--set", "metrics.podMonitor.enabled=true",
         "--set", "metrics.serviceMonitor.enabled=true", "--set", "driverName={a.example.com,b.example.com}",
         "--set", "metrics.prometheusRule.enabled=true", "--set", "metrics.dashboard.enabled=true",
         "--set", "endpoints.enabled=true")


PRIMARY = {"cniVersion": "1.0.0", "name": "podnet", "plugins": [{"type": "bridge", "bridge": "cbr0"}]}


def keeper_writes(config: dict[str, str], root: Path) -> dict:
    """The conflist the chain keeper (`--once`, as the init container runs it) writes with exactly the chart's
    ConfigMap as its environment, into a scratch conf dir under `root`."""
    net_d, bin_d = root / "net.d", root / "bin"
    net_d.mkdir()
    (net_d / "10-podnet.conflist").write_text(json.dumps(PRIMARY))
    plugin = root / "netclaim"
    plugin.write_bytes(Path(os.path.realpath("/bin/true")).read_bytes())  # this host's machine; only copied
    env = {**python_env(), **config}
    proc = subprocess.run([str(netclaim_publisher_bin()), "chain-keeper", "--once", f"--cni-conf-dir={net_d}",
                           f"--cni-bin-dir={bin_d}", f"--plugin-binary={plugin}"],
                          env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert (bin_d / "netclaim").read_bytes() == plugin.read_bytes()
    return json.loads((net_d / "10-podnet.conflist").read_text())


def test_one_driver_name_feeds_rbac_configmap_and_the_conflist_entry(tmp_root: Path) -> None:
    docs = render("driverName=nic.acme.io", "request=data", "failurePolicy=Fail")
    assert driver_rule(one(docs, "ClusterRole"))["resourceNames"] == ["nic.acme.io"]
    config = one(docs, "ConfigMap")["data"]
    assert config["NETCLAIM_DRIVER_NAME"] == "nic.acme.io"
    # The chain keeper with exactly that ConfigMap as its environment writes the entry.
    chained = keeper_writes(config, tmp_root)
    assert [p["type"] for p in chained["plugins"]] == ["bridge", "netclaim"]
    entry = chained["plugins"][-1]
    assert (entry["driverName"], entry["request"], entry["failurePolicy"]) == ("nic.acme.io", "data", "Fail")
    assert entry["socketPath"] == "/run/netclaim/publisher.sock" and entry["spoolDir"] == "/var/lib/netclaim/spool"
    # The plugin's own defaults: the chart writes no hand-off or spool setting it was not given.
    assert not {"ackTimeoutMs", "handoffWaitMs", "addressWaitMs", "spoolMaxFiles", "spoolMaxBytes"} & entry.keys()


PLUGIN_SETTINGS = {"cni.pluginAckTimeoutMs": "ackTimeoutMs", "cni.pluginHandoffWaitMs": "handoffWaitMs",
                   "cni.pluginAddressWaitMs": "addressWaitMs",
                   "cni.pluginSpoolMaxFiles": "spoolMaxFiles", "cni.pluginSpoolMaxBytes": "spoolMaxBytes"}


def test_plugin_spool_and_handoff_values_reach_the_keepers_entry_as_integers_the_plugin_parses(
        tmp_root: Path) -> None:
    """Three from a values file (a number there reaches the templates as a float; the largest cap must keep every
    digit), two from --set; both keeper containers read them, and the entry holds JSON integers that the
    plugin's own config parser reads as those caps, timeouts and waits."""
    values = tmp_root / "values.yaml"
    values.write_text("cni:\n  pluginSpoolMaxFiles: 500\n  pluginSpoolMaxBytes: 1099511627776\n"
                      "  pluginAddressWaitMs: 2000\n")
    out = helm("template", "netclaim", str(CHART), "--namespace", "netclaim-system", "--kube-version", kube_version(),
               *driver_set(), "-f", str(values), "--set", "cni.pluginAckTimeoutMs=250",
               "--set", "cni.pluginHandoffWaitMs=0").stdout
    docs = [d for d in yaml.safe_load_all(out) if d]
    config = one(docs, "ConfigMap")["data"]
    given = {"NETCLAIM_PLUGIN_ACK_TIMEOUT_MS": "250", "NETCLAIM_PLUGIN_HANDOFF_WAIT_MS": "0",
             "NETCLAIM_PLUGIN_ADDRESS_WAIT_MS": "2000",
             "NETCLAIM_PLUGIN_SPOOL_MAX_FILES": "500", "NETCLAIM_PLUGIN_SPOOL_MAX_BYTES": "1099511627776"}
    assert {k: config.get(k) for k in given} == given
    configmap = one(docs, "ConfigMap")["metadata"]["name"]
    for name in ("install", "chain-keeper"):  # the init container chains first, the keeper keeps it so
        assert {"configMapRef": {"name": configmap}} in containers(docs)[name]["envFrom"], name

    entry = keeper_writes(config, tmp_root)["plugins"][-1]
    assert {k: entry[k] for k in PLUGIN_SETTINGS.values()} == {
        "ackTimeoutMs": 250, "handoffWaitMs": 0, "addressWaitMs": 2000, "spoolMaxFiles": 500,
        "spoolMaxBytes": 1099511627776}
    conf = parse_netconf({**entry, "name": PRIMARY["name"], "cniVersion": PRIMARY["cniVersion"], "prevResult": {}},
                         PRIMARY["cniVersion"], "ADD")
    assert (conf.spool_max_files, conf.spool_max_bytes, conf.ack_timeout, conf.handoff_wait, conf.address_wait) == (
        500, 1099511627776, 0.25, 0.0, 2.0)


def test_the_schemas_plugin_setting_ranges_are_the_plugins_own() -> None:
    """The schema refuses at `helm install` what the keeper would refuse on every node later; its ranges must
    be the plugin's (cni_plugin/config.py INT_SETTINGS), not a copy that drifts."""
    cni = json.loads((CHART / "values.schema.json").read_text())["properties"]["cni"]["properties"]
    for value, key in PLUGIN_SETTINGS.items():
        [integer] = [alt for alt in cni[value.split(".", 1)[1]]["anyOf"] if alt.get("type") == "integer"]
        assert (integer["minimum"], integer["maximum"]) == INT_SETTINGS[key], value
    assert set(PLUGIN_SETTINGS.values()) == set(INT_SETTINGS), "a plugin integer setting the chart cannot set"


def test_the_extended_resource_value_reaches_the_configmap_and_the_keepers_entry(tmp_root: Path) -> None:
    """Pods that ask for a DRA extended resource in their containers' resources get a claim whose requests the
    scheduler names: the entry must name the resource for the publisher to find the interface's device there."""
    config = one(render("extendedResourceName=example.com/nic"), "ConfigMap")["data"]
    assert config["NETCLAIM_EXTENDED_RESOURCE_NAME"] == "example.com/nic"
    (tmp_root / "set").mkdir()
    entry = keeper_writes(config, tmp_root / "set")["plugins"][-1]
    assert (entry["extendedResourceName"], entry["request"]) == ("example.com/nic", "nic")

    default = one(render(), "ConfigMap")["data"]
    assert default["NETCLAIM_EXTENDED_RESOURCE_NAME"] == ""
    (tmp_root / "default").mkdir()
    assert "extendedResourceName" not in keeper_writes(default, tmp_root / "default")["plugins"][-1]


@pytest.mark.parametrize("value", ["", "example.com/nic", "deviceclass.resource.kubernetes.io/sriov-nic", "a/b",
                                   "nic.acme.io/VF_0.x", "example.com/" + "n" * 63, "example.com/" + "n" * 64,
                                   "nic", "Example.com/nic", "example.com/nic/0", "example.com/", "/nic",
                                   "example..com/nic", "-a.com/nic", "a-.com/nic", "a.com/-nic", "a.com/nic.",
                                   "a_b.com/nic", "example.com/n ic"])
def test_the_schema_takes_exactly_the_extended_resource_names_the_plugin_takes(value: str) -> None:
    """`helm install` refuses what the keeper would refuse on every node later (a domain over 253 characters,
    which a schema pattern cannot count apart from the name, is left to the keeper)."""
    schema = json.loads((CHART / "values.schema.json").read_text())["properties"]["extendedResourceName"]
    schema_takes = jsonschema.Draft7Validator(schema).is_valid(value)
    assert schema_takes == (value == "" or extended_resource_problem(value) is None), value


def test_a_list_of_drivers_is_authorized_and_the_first_is_the_entry() -> None:
    docs = render("driverName={a.example.com,b.example.com}")
    assert driver_rule(one(docs, "ClusterRole"))["resourceNames"] == ["a.example.com", "b.example.com"]
    assert one(docs, "ConfigMap")["data"]["NETCLAIM_DRIVER_NAME"] == "a.example.com"


def test_the_publisher_is_told_every_driver_of_the_list(monkeypatch: pytest.MonkeyPatch) -> None:
    """The publisher's unchained check looks only for pods of the drivers it is told: every driver of the
    list reaches its --driver-name, through the ConfigMap its container reads, as its own option parser
    reads that environment (nothing in its args or env overrides it)."""
    from publisher.cli import run

    docs = render("driverName={a.example.com,b.example.com}")
    configmap = one(docs, "ConfigMap")
    publisher = containers(docs)["publisher"]
    assert {"configMapRef": {"name": configmap["metadata"]["name"]}} in publisher["envFrom"]
    assert not [a for a in publisher.get("args", []) + publisher.get("command", []) if "--driver-name" in a]
    assert not [e for e in publisher.get("env", []) if e["name"] == "NETCLAIM_DRIVER_NAMES"]
    for key, value in configmap["data"].items():
        monkeypatch.setenv(key, value)
    params = run.make_context("run", ["--node-name", "node-a"]).params
    assert sorted(params["driver_names"]) == ["a.example.com", "b.example.com"]


TOKEN_PATH = "/var/run/secrets/kubernetes.io/serviceaccount"


def added_capabilities(container: dict) -> list[str]:
    caps = container["securityContext"]["capabilities"]
    assert caps["drop"] == ["ALL"], container["name"]
    return caps.get("add", [])


def test_no_container_that_listens_or_holds_the_token_has_a_capability() -> None:
    """SYS_ADMIN (setns for the live watch) is the netns opener's alone: it has no port, no API
    token, no host path but the netns dir (read-only, HostToContainer: a netns made after it started
    must appear) and the memory emptyDir of its socket, seccomp and AppArmor RuntimeDefault. The
    publisher, on the node's address with the token, holds no capability and is told the opener's
    socket. Off: no opener, no capability, no mount, and the publisher is told so."""
    def pod_of(*sets: str) -> dict:
        return one(render(*sets), "DaemonSet")["spec"]["template"]["spec"]

    pod = pod_of()
    volumes = {v["name"]: v for v in pod["volumes"]}
    everyone = pod["containers"] + pod["initContainers"]
    for c in everyone:
        token = any(m["mountPath"] == TOKEN_PATH for m in c.get("volumeMounts", []))
        if c.get("ports") or token or "--metrics-address" in " ".join(c.get("args", [])):
            assert added_capabilities(c) == [], c["name"]
    [opener] = [c for c in everyone if added_capabilities(c)]
    assert opener["name"] == "netns-opener" and added_capabilities(opener) == ["SYS_ADMIN"]
    assert not opener.get("ports") and not opener.get("env") and not opener.get("envFrom")
    assert opener["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    # No AppArmor profile asked for by default: a node without AppArmor would refuse the pod, and where the
    # node has it the runtime applies its default profile to an unprivileged container anyway.
    assert "appArmorProfile" not in opener["securityContext"]
    assert opener["securityContext"]["readOnlyRootFilesystem"] is True
    assert opener["securityContext"]["allowPrivilegeEscalation"] is False
    mounts = {m["name"]: m for m in opener["volumeMounts"]}
    assert set(mounts) == {"netns", "netns-opener"}
    assert mounts["netns"] == {"name": "netns", "mountPath": "/var/run/netns", "readOnly": True,
                               "mountPropagation": "HostToContainer"}
    assert volumes["netns"]["hostPath"]["path"] == "/var/run/netns"
    assert volumes["netns-opener"] == {"name": "netns-opener", "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}}
    assert pod["automountServiceAccountToken"] is False
    socket = next(a for a in opener["args"] if a.startswith("--socket="))[len("--socket="):]
    assert os.path.dirname(socket) == mounts["netns-opener"]["mountPath"]

    publisher = next(c for c in pod["containers"] if c["name"] == "publisher")
    assert f"--netns-opener={socket}" in publisher["args"] and "--netns-dir=/var/run/netns" in publisher["args"]
    assert "--no-live-watch" not in publisher["args"]
    assert {m["name"] for m in publisher["volumeMounts"]} >= {"netns", "netns-opener"}
    holders = {c["name"] for c in everyone for m in c.get("volumeMounts", []) if m["name"] in ("netns", "netns-opener")}
    assert holders == {"publisher", "netns-opener"}

    moved = pod_of("liveWatch.netnsDir=/run/containerd/io.containerd.grpc.v1.cri/netns")
    assert {v["name"]: v for v in moved["volumes"]}["netns"]["hostPath"]["path"].endswith("cri/netns")
    moved_opener = next(c for c in moved["containers"] if c["name"] == "netns-opener")
    assert "--netns-dir=/run/containerd/io.containerd.grpc.v1.cri/netns" in moved_opener["args"]
    required = next(c for c in pod_of("liveWatch.openerAppArmorProfile=RuntimeDefault")["containers"]
                    if c["name"] == "netns-opener")
    assert required["securityContext"]["appArmorProfile"] == {"type": "RuntimeDefault"}

    off = pod_of("liveWatch.enabled=false")
    assert [added_capabilities(c) for c in off["containers"] + off["initContainers"]] == [[]] * len(
        off["containers"] + off["initContainers"])
    assert "netns-opener" not in {c["name"] for c in off["containers"]}
    assert not {"netns", "netns-opener"} & {v["name"] for v in off["volumes"]}
    publisher = next(c for c in off["containers"] if c["name"] == "publisher")
    assert "--no-live-watch" in publisher["args"] and not any("--netns" in a for a in publisher["args"])


def test_shared_attachments_is_off_by_default_and_the_value_turns_the_publishers_option_on() -> None:
    """publisher.sharedAttachments: every pod on a shared device listed in its entry's data (opt-in)."""
    def publisher_args(*values: str) -> list[str]:
        return containers(render(*values))["publisher"]["args"]

    assert not any("shared-attachments" in a for a in publisher_args())
    assert "--shared-attachments" in publisher_args("publisher.sharedAttachments=true")
    with pytest.raises(AssertionError, match="values don.t meet the specifications"):
        render("publisher.sharedAttachments=maybe")  # the values schema: a boolean only


def test_values_reach_the_daemonset() -> None:
    docs = render("image.repository=registry.example/netclaim", "image.tag=9.9.9", "cni.confDir=/etc/cni/multus.d",
                  "cni.binDir=/var/lib/cni/bin", "cni.conflist=05-cilium.conflist", "metrics.port=19464",
                  "logFormat=text", "tolerations=null", "resources.publisher.limits.memory=512Mi")
    ds = one(docs, "DaemonSet")
    pod = ds["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["cni-conf"]["hostPath"]["path"] == "/etc/cni/multus.d"
    assert volumes["cni-bin"]["hostPath"]["path"] == "/var/lib/cni/bin"
    containers = {c["name"]: c for c in pod["containers"] + pod["initContainers"]}
    assert {c["image"] for c in containers.values()} == {"registry.example/netclaim:9.9.9"}
    publisher = containers["publisher"]
    assert "--metrics-address=$(HOST_IP):19464" in publisher["args"]
    assert publisher["ports"] == [{"name": "metrics", "containerPort": 19464, "protocol": "TCP"}]
    assert publisher["resources"]["limits"]["memory"] == "512Mi"
    assert "tolerations" not in pod
    config = one(docs, "ConfigMap")["data"]
    assert config["NETCLAIM_CNI_CONFLIST"] == "05-cilium.conflist" and config["NETCLAIM_LOG_FORMAT"] == "text"
    # Defaults: the image tag is the chart's appVersion; every node tolerated.
    default_pod = one(render(), "DaemonSet")["spec"]["template"]["spec"]
    app_version = (CHART / "Chart.yaml").read_text().split("appVersion:")[1].split()[0].strip('"')
    assert default_pod["containers"][0]["image"] == f"netclaim:{app_version}"
    assert default_pod["tolerations"] == [{"operator": "Exists"}]


def test_monitors_are_rendered_only_when_enabled() -> None:
    kinds = {d["kind"] for d in render()}
    assert not kinds & {"PodMonitor", "ServiceMonitor", "Service", "Namespace"}
    pm = render("metrics.podMonitor.enabled=true", "metrics.podMonitor.labels.release=kps")
    [monitor] = by_kind(pm, "PodMonitor")
    assert monitor["spec"]["podMetricsEndpoints"][0]["port"] == "metrics"
    assert monitor["metadata"]["labels"]["release"] == "kps"
    assert not by_kind(pm, "ServiceMonitor")
    sm = render("metrics.serviceMonitor.enabled=true")
    assert by_kind(sm, "ServiceMonitor") and one(sm, "Service")["spec"]["clusterIP"] == "None"
    assert not by_kind(sm, "PodMonitor")


def test_publisher_mounts_nothing_it_does_not_use() -> None:
    pod = one(render(), "DaemonSet")["spec"]["template"]["spec"]
    mounts = {c["name"]: {m["name"] for m in c["volumeMounts"]} for c in pod["containers"] + pod["initContainers"]}
    # netns: the live watch (read only: a removed netns is let go), netns-opener: the opener's socket.
    assert mounts["publisher"] == {"run", "state", "netns", "netns-opener", "api-token", "tmp"}
    assert mounts["install"] == {"cni-bin", "cni-conf", "state", "tmp"}  # state: the node lock only
    assert mounts["netns-opener"] == {"netns", "netns-opener"}
    assert {c for c, m in mounts.items() if "netns" in m} == {"publisher", "netns-opener"}


def test_generated_manifests_are_not_stale() -> None:
    proc = subprocess.run([str(REPO / "scripts" / "build" / "manifests.sh"), "--check"], capture_output=True, text=True,
                          env={**os.environ, "HELM": helm_binary()}, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]


# ---------------------------------------------------------------- the real API server


NON_DEFAULT = ("nameOverride=nc", "commonLabels.team=net", "podLabels.tier=node", "imagePullSecrets[0].name=regcred",
               "serviceAccount.annotations.owner=net", "updateStrategy.maxUnavailable=10%",
               "resourceQuota.enabled=true", "securityContext.privileged=true", "securityContext.seLinuxType=spc_t",
               "cni.pluginLogFile=/var/log/netclaim/plugin.log", "metrics.dashboard.enabled=true",
               "cni.pluginSpoolMaxFiles=500", "endpoints.enabled=true", "publisher.sharedAttachments=true",
               "affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0]"
               ".matchExpressions[0].key=netclaim",
               "affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0]"
               ".matchExpressions[0].operator=Exists")


@pytest.mark.controlplane
@pytest.mark.parametrize("values", [(), NON_DEFAULT], ids=["defaults", "every_value_set"])
def test_rendered_objects_pass_server_side_dry_run(api_client, values: tuple[str, ...]) -> None:
    ns = f"ncchart-{uuid.uuid4().hex[:6]}"
    docs = render("namespace.create=true", *values, release="netclaim", namespace=ns)
    dyn = DynamicClient(api_client)
    apply_object(dyn, one(docs, "Namespace"), MANAGER, dry_run=False)
    failures = []
    try:
        for doc in docs:
            try:
                got = apply_object(dyn, doc, MANAGER, dry_run=True)
            except Exception as exc:  # report every object, not only the first failure
                failures.append(f"{doc['kind']}/{doc['metadata']['name']}: {getattr(exc, 'body', exc)}")
                continue
            assert got.kind == doc["kind"]
    finally:
        client.CoreV1Api(api_client).delete_namespace(ns)
    assert not failures, "\n".join(failures)


@pytest.mark.controlplane
def test_helm_install_and_uninstall_against_the_real_api_server(control_plane, api_client) -> None:
    ns = f"ncchart-{uuid.uuid4().hex[:6]}"
    release = f"nc{uuid.uuid4().hex[:6]}"
    kubeconfig = control_plane.kubeconfig
    helm("install", release, str(CHART), "--namespace", ns, "--create-namespace", "--set", f"driverName={DRIVER}",
         kubeconfig=kubeconfig)
    rbac = client.RbacAuthorizationV1Api(api_client)
    name = f"{release}-netclaim"
    try:
        role = rbac.read_cluster_role(f"{name}-publisher")
        [rule] = [r for r in role.rules if r.resources == ["resourceclaims/driver"]]
        assert rule.resource_names == [DRIVER] and rule.verbs == ["associated-node:patch"]
        ds = client.AppsV1Api(api_client).read_namespaced_daemon_set(name, ns)
        assert ds.spec.template.spec.service_account_name == f"{name}-publisher"
        status = helm("status", release, "--namespace", ns, "-o", "json", kubeconfig=kubeconfig)
        assert json.loads(status.stdout)["info"]["status"] == "deployed"
        # NOTES as helm shows them after the install: the node-scoped commands, in the release's namespace.
        notes = helm("get", "notes", release, "--namespace", ns, kubeconfig=kubeconfig).stdout
        assert (f"kubectl -n {ns} get pods -l app.kubernetes.io/name=netclaim,app.kubernetes.io/instance={release} "
                "--field-selector spec.nodeName=NODE") in notes, notes
        assert f"kubectl -n {ns} exec POD -c publisher -- netclaim-publisher status" in notes, notes
    finally:
        helm("uninstall", release, "--namespace", ns, "--wait", "--timeout", "60s", kubeconfig=kubeconfig)
    with pytest.raises(ApiException) as err:
        rbac.read_cluster_role(f"{name}-publisher")
    assert err.value.status == 404
    with pytest.raises(ApiException) as err:
        client.AppsV1Api(api_client).read_namespaced_daemon_set(name, ns)
    assert err.value.status == 404
    client.CoreV1Api(api_client).delete_namespace(ns)


# ---------------------------------------------------------------- chart parity


def pod_spec(docs: list[dict]) -> dict:
    return one(docs, "DaemonSet")["spec"]["template"]["spec"]


def containers(docs: list[dict]) -> dict[str, dict]:
    pod = pod_spec(docs)
    return {c["name"]: c for c in pod["containers"] + pod["initContainers"]}


def test_every_new_value_reaches_the_rendered_objects() -> None:
    """helm template with each non-default value; the objects carry it."""
    docs = render("nameOverride=nc", "commonLabels.team=net", "podLabels.tier=node",
                  "imagePullSecrets[0].name=regcred", "serviceAccount.annotations.owner=net-team",
                  "affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0]"
                  ".matchExpressions[0].key=netclaim",
                  "affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0]"
                  ".matchExpressions[0].operator=Exists",
                  "updateStrategy.maxUnavailable=10%", "resourceQuota.enabled=true", "resourceQuota.pods=500",
                  "securityContext.seLinuxType=spc_t", release="edge")
    ds = one(docs, "DaemonSet")
    assert ds["metadata"]["name"] == "edge-nc"
    assert ds["spec"]["selector"]["matchLabels"]["app.kubernetes.io/name"] == "nc"
    for doc in docs:
        assert doc["metadata"]["labels"]["team"] == "net", f"{doc['kind']} lacks commonLabels"
    pod_labels = ds["spec"]["template"]["metadata"]["labels"]
    assert pod_labels["tier"] == "node" and pod_labels["team"] == "net"
    assert ds["spec"]["updateStrategy"] == {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "10%"}}
    pod = pod_spec(docs)
    assert pod["imagePullSecrets"] == [{"name": "regcred"}]
    term = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0]
    assert term["matchExpressions"] == [{"key": "netclaim", "operator": "Exists"}]
    assert one(docs, "ServiceAccount")["metadata"]["annotations"] == {"owner": "net-team"}
    quota = one(docs, "ResourceQuota")
    assert quota["spec"]["hard"] == {"pods": "500"}
    assert quota["spec"]["scopeSelector"]["matchExpressions"][0]["values"] == ["system-node-critical",
                                                                               "system-cluster-critical"]
    for name, c in containers(docs).items():
        assert c["securityContext"]["seLinuxOptions"] == {"type": "spc_t"}, name
        assert c["securityContext"]["allowPrivilegeEscalation"] is False, name
    # The chain keeper's Role names the overridden DaemonSet.
    [role] = [r for r in by_kind(docs, "Role") if r["metadata"]["name"].endswith("-chain-keeper")]
    assert role["rules"][0]["resourceNames"] == ["edge-nc"]
    assert one(render("fullnameOverride=node-net"), "DaemonSet")["metadata"]["name"] == "node-net"
    on_delete = one(render("updateStrategy.type=OnDelete"), "DaemonSet")["spec"]["updateStrategy"]
    assert on_delete == {"type": "OnDelete"}


def test_privileged_toggle_renders_a_valid_security_context() -> None:
    for name, c in containers(render("securityContext.privileged=true")).items():
        sc = c["securityContext"]
        # The API refuses privileged together with allowPrivilegeEscalation=false.
        assert sc["privileged"] is True and "allowPrivilegeEscalation" not in sc, name
    for name, c in containers(render()).items():
        sc = c["securityContext"]
        assert "privileged" not in sc and sc["allowPrivilegeEscalation"] is False, name
        assert "seLinuxOptions" not in sc, name


def test_defaults_have_no_cpu_limits_but_keep_requests() -> None:
    docs = render()
    assert not by_kind(docs, "ResourceQuota")
    for name, c in containers(docs).items():
        assert "cpu" not in c["resources"].get("limits", {}), name
        assert c["resources"]["requests"]["cpu"] and c["resources"]["limits"]["memory"], name
    ds = one(docs, "DaemonSet")
    assert ds["spec"]["updateStrategy"]["rollingUpdate"]["maxUnavailable"] == 1


def test_plugin_log_dir_is_mounted_and_emptied_on_uninstall_only_when_set() -> None:
    docs = render("cni.pluginLogFile=/var/log/netclaim/plugin.log")
    assert one(docs, "ConfigMap")["data"]["NETCLAIM_PLUGIN_LOG_FILE"] == "/var/log/netclaim/plugin.log"
    pod = pod_spec(docs)
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["plugin-log"]["hostPath"]["path"] == "/var/log/netclaim"
    keeper = containers(docs)["chain-keeper"]
    assert "--cleanup-dir=/host/netclaim/log" in keeper["args"]
    assert {"name": "plugin-log", "mountPath": "/host/netclaim/log"} in keeper["volumeMounts"]
    default = render()
    assert "plugin-log" not in {v["name"] for v in pod_spec(default)["volumes"]}
    assert "--cleanup-dir=/host/netclaim/log" not in containers(default)["chain-keeper"]["args"]


@pytest.mark.parametrize("bad", ["cni.confdir=/etc/cni/net.d", "resources.publisher.limit.cpu=1", "typo=1",
                                 "updateStrategy.maxUnavailable=0", "failurePolicy=ignore",
                                 # uninstall empties the log's directory: never a shared one
                                 "cni.pluginLogFile=/var/log/plugin.log", "apf.priorityLevel.queue=3",
                                 # a digest must be one; an option must look like one
                                 "image.digest=latest", "image.digest=sha256:abc",
                                 "publisher.extraArgs[0]=workers=8",
                                 # the plugin's ranges: the keeper would refuse these on every node
                                 "cni.pluginSpoolMaxFiles=0", "cni.pluginSpoolMaxBytes=1099511627777",
                                 "cni.pluginAckTimeoutMs=60001", "cni.pluginHandoffWaitMs=-1",
                                 "cni.pluginAddressWaitMs=3001",
                                 "cni.pluginSpoolMaxFiles=lots", "cni.pluginSpoolMaxFiles=1.5",
                                 # the plugin refuses these extended resource names (error 7 on every ADD)
                                 "extendedResourceName=Example.com/nic", "extendedResourceName=nic",
                                 # the endpoints controller: at least one replica, options that look like one
                                 "endpoints.replicas=0", "endpoints.extraArgs[0]=debug", "endpoints.leaseDuration=1"])
def test_a_typo_or_bad_value_is_refused(bad: str) -> None:
    for verb in ("template", "lint"):
        args = [verb, *(["x"] if verb == "template" else []), str(CHART), "--kube-version", kube_version(),
                *driver_set(), "--set", bad]
        if verb == "lint":
            args.insert(1, "--strict")
        proc = helm(*args, check=False)
        assert proc.returncode != 0, f"helm {verb} accepted {bad}"
        assert "values don't meet the specifications" in proc.stdout + proc.stderr or \
            "schema" in (proc.stdout + proc.stderr).lower(), proc.stdout + proc.stderr


def test_lint_strict_passes_with_every_non_default_value() -> None:
    helm("lint", "--strict", str(CHART), "--kube-version", kube_version(), *driver_set(),
         "--set", "nameOverride=nc", "--set", "fullnameOverride=node-net", "--set", "commonLabels.team=net",
         "--set", "podLabels.tier=node", "--set", "imagePullSecrets[0].name=regcred",
         "--set", "serviceAccount.annotations.owner=net", "--set", "affinity.podAntiAffinity=null",
         "--set", "updateStrategy.maxUnavailable=25%", "--set", "resourceQuota.enabled=true",
         "--set", "securityContext.privileged=true", "--set", "securityContext.seLinuxType=spc_t",
         "--set", "cni.pluginLogFile=/var/log/netclaim/plugin.log", "--set", "cni.pluginSpoolMaxFiles=500",
         "--set", "cni.pluginSpoolMaxBytes=1099511627776", "--set", "cni.pluginAckTimeoutMs=250",
         "--set", "cni.pluginHandoffWaitMs=0", "--set", "cni.pluginAddressWaitMs=3000")


def test_chart_label_survives_build_metadata(tmp_root: Path) -> None:
    """A chart version with build metadata ("+") must still render valid label values."""
    import re
    import shutil

    chart = tmp_root / "netclaim"
    shutil.copytree(CHART, chart)
    meta = chart / "Chart.yaml"
    meta.write_text(meta.read_text().replace(f"\nversion: {VERSION}\n", f"\nversion: {VERSION}+build.7\n"))
    docs = render(chart=chart)
    label_value = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
    for doc in docs:
        value = doc["metadata"]["labels"]["helm.sh/chart"]
        assert value == f"netclaim-{VERSION}_build.7" and label_value.match(value), (doc["kind"], value)


def test_offline_template_needs_only_the_documented_kube_version() -> None:
    """docs/install.md's offline command renders (helm's built-in default version is older than the chart's floor)."""
    install_md = (REPO / "docs" / "install.md").read_text()
    assert "--kube-version 1.34.0" in install_md
    proc = helm("template", "netclaim", str(CHART), "--namespace", "netclaim-system", "--kube-version", "1.34.0",
                *driver_set())
    assert "kind: DaemonSet" in proc.stdout
    without = helm("template", "netclaim", str(CHART), "--namespace", "netclaim-system", *driver_set(), check=False)
    assert without.returncode != 0 and "kubeVersion" in without.stderr


def test_the_keeper_is_observable_not_ready_while_unchained() -> None:
    """The keeper container reports per node: its node name (ChainContested Events on the Node),
    /metrics beside the publisher's, and a readiness probe on its /readyz, so a node where
    netclaim is out of the chain is a DaemonSet pod that is not ready."""
    docs = render("metrics.keeperPort=9999", "metrics.podMonitor.enabled=true")
    keeper = containers(docs)["chain-keeper"]
    assert "--node-name=$(NETCLAIM_NODE_NAME)" in keeper["args"]
    assert "--metrics-address=$(HOST_IP):9999" in keeper["args"]
    assert {e["name"] for e in keeper["env"]} >= {"NETCLAIM_NODE_NAME", "HOST_IP"}
    assert keeper["ports"] == [{"name": "keeper-metrics", "containerPort": 9999, "protocol": "TCP"}]
    assert keeper["readinessProbe"]["exec"]["command"][-2:] == ["/host/netclaim/run/keeper-probe.sock", "/readyz"]
    ports = {p["port"] for p in one(docs, "PodMonitor")["spec"]["podMetricsEndpoints"]}
    assert ports == {"metrics", "keeper-metrics"}


# The chart's exec probe: the image's interpreter runs publisher/observe/localprobe.py against SOCKET and PATH.
EXEC_PROBE = ["/opt/netclaim/venv/bin/python", "-I", "-m", "publisher.observe.localprobe"]


def test_kubelet_probes_ask_each_process_over_its_own_socket_by_default() -> None:
    """A loopback port is any local account's to bind first and answer 200 on (tests/publisher/
    test_probe_ports_another_account_holds.py): by default every probe of both containers is a command that
    asks the container's process over its unix socket in the run dir, where only root can serve; the
    publisher's heartbeat asks the keeper there too, never over TCP."""
    by_name = containers(render("hostPaths.run=/run/netclaim-b"))
    sockets = {"publisher": "/run/netclaim-b/publisher-probe.sock",
               "chain-keeper": "/host/netclaim/run/keeper-probe.sock"}
    for name, socket_path in sockets.items():
        container = by_name[name]
        assert f"--probe-socket={socket_path}" in container["args"], container["args"]
        probes = {k: v for k, v in container.items() if k.endswith("Probe")}
        assert set(probes) == {"startupProbe", "livenessProbe", "readinessProbe"}, name
        for kind, spec in probes.items():
            path = "/readyz" if kind == "readinessProbe" else "/healthz"
            assert spec["exec"]["command"] == [*EXEC_PROBE, socket_path, path], (name, kind, spec)
            assert "httpGet" not in spec and spec["timeoutSeconds"] >= 5, (name, kind, spec)
    args = by_name["publisher"]["args"]
    assert "--keeper-socket=/run/netclaim-b/keeper-probe.sock" in args
    assert not [a for a in args if a.startswith("--keeper-address")], args
    assert {"name": "run", "mountPath": "/host/netclaim/run"} in by_name["chain-keeper"]["volumeMounts"]


def test_kubelet_probes_go_to_a_loopback_probe_listener_not_the_metrics_port() -> None:
    """probes.mode=tcp: the metrics port is on the node's address, which every pod reaches: a pod holding slow
    connections there fills its handlers (tests/publisher/observe/test_probe_listener.py). Every probe of
    both containers goes to the container's own probe listener on the node's 127.0.0.1 instead."""
    for sets, ports in ((("probes.mode=tcp",), (9466, 9467)),
                        (("probes.mode=tcp", "metrics.probePort=19466", "metrics.keeperProbePort=19467"),
                         (19466, 19467))):
        by_name = containers(render(*sets))
        for name, port in zip(("publisher", "chain-keeper"), ports):
            container = by_name[name]
            assert f"--probe-address=127.0.0.1:{port}" in container["args"], container["args"]
            probes = {k: v for k, v in container.items() if k.endswith("Probe")}
            assert probes, name
            for kind, spec in probes.items():
                assert spec["httpGet"]["host"] == "127.0.0.1" and spec["httpGet"]["port"] == port, (name, kind, spec)
    assert set(k for k in by_name["publisher"] if k.endswith("Probe")) == {"startupProbe", "livenessProbe",
                                                                           "readinessProbe"}
    assert by_name["publisher"]["ports"] == [{"name": "metrics", "containerPort": 9464, "protocol": "TCP"}]


def test_probe_listeners_bind_the_node_address_only_when_asked_for_shared_loopback_test_nodes() -> None:
    """Nodes of a test cluster that share one host's loopback cannot each bind 127.0.0.1:9466;
    `metrics.probeHost=node` puts every probe listener on the node's address (still apart from
    /metrics) and the probes go to the pod's IP; anything else is refused."""
    by_name = containers(render("metrics.probeHost=node", "probes.mode=tcp"))
    for name, port in (("publisher", 9466), ("chain-keeper", 9467)):
        container = by_name[name]
        assert f"--probe-address=$(HOST_IP):{port}" in container["args"], container["args"]
        for kind, spec in ((k, v) for k, v in container.items() if k.endswith("Probe")):
            assert "host" not in spec["httpGet"] and spec["httpGet"]["port"] == port, (name, kind, spec)
    refused = helm("template", "netclaim", str(CHART), "--kube-version", kube_version(), *driver_set(),
                   "--set", "metrics.probeHost=0.0.0.0", check=False)
    assert refused.returncode != 0 and "probeHost" in refused.stderr, refused.stderr


def test_extra_env_reaches_the_publisher_and_the_chain_keeper_after_the_site_settings() -> None:
    docs = render("extraEnv[0].name=HTTPS_PROXY", "extraEnv[0].value=http://proxy.internal:3128")
    for name in ("publisher", "chain-keeper"):
        env = containers(docs)[name]["env"]
        assert env[-1] == {"name": "HTTPS_PROXY", "value": "http://proxy.internal:3128"}, name
    for name, container in containers(render()).items():
        assert all(e["name"] != "HTTPS_PROXY" for e in container.get("env", [])), name


def test_a_pinned_digest_and_a_registry_name_the_image_every_container_pulls() -> None:
    digest = "sha256:" + "ab" * 32
    for sets, image in [((), f"netclaim:{VERSION}"),
                        (("image.registry=registry.example.com:5000/platform",), f"registry.example.com:5000/platform/netclaim:{VERSION}"),
                        (("image.registry=registry.example.com", f"image.digest={digest}", "image.tag=ignored"),
                         f"registry.example.com/netclaim@{digest}")]:
        docs = render(*sets)
        assert {c["image"] for c in containers(docs).values()} == {image}, sets


def test_extra_args_reach_each_container_after_the_charts_own() -> None:
    docs = render("publisher.extraArgs[0]=--workers=8", "publisher.extraArgs[1]=--claim-window=90",
                  "chainKeeper.extraArgs[0]=--log-level=debug")
    found = containers(docs)
    assert found["publisher"]["args"][-2:] == ["--workers=8", "--claim-window=90"]
    assert found["chain-keeper"]["args"][-1] == "--log-level=debug"
    default = containers(render())
    assert not any(a.startswith("--workers") for a in default["publisher"]["args"])


def test_a_surge_rollout_renders_and_impossible_strategies_are_refused() -> None:
    docs = render("updateStrategy.maxSurge=1", "updateStrategy.maxUnavailable=0", "metrics.serviceMonitor.enabled=true")
    surge = one(docs, "DaemonSet")
    assert surge["spec"]["updateStrategy"] == {"type": "RollingUpdate",
                                               "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}}
    # A hostNetwork pod's declared port is a host port the scheduler gives one pod only: none is declared,
    # and the Service reaches the listeners by number.
    assert [c.get("ports") for c in surge["spec"]["template"]["spec"]["containers"]] == [None, None, None]
    assert [p["targetPort"] for p in one(docs, "Service")["spec"]["ports"]] == [9464, 9465]
    with pytest.raises(AssertionError, match="values don't meet the specifications"):
        render("updateStrategy.maxSurge=1", "updateStrategy.maxUnavailable=0", "metrics.podMonitor.enabled=true")
    for bad in (("updateStrategy.maxUnavailable=0",), ("updateStrategy.maxSurge=1",),
                ("updateStrategy.maxSurge=0%", "updateStrategy.maxUnavailable=0%")):
        with pytest.raises(AssertionError, match="values don't meet the specifications"):
            render(*bad)


def test_the_endpoints_controller_is_opt_in_and_renders_a_leader_elected_non_root_deployment() -> None:
    assert not by_kind(render(), "Deployment"), "off by default"
    docs = render("endpoints.enabled=true", "endpoints.replicas=3", "endpoints.leaseDuration=30",
                  "endpoints.extraArgs[0]=--log-level=debug", release="edge")
    (dep,) = by_kind(docs, "Deployment")
    assert dep["metadata"]["name"] == "edge-netclaim-endpoints" and dep["spec"]["replicas"] == 3
    pod = dep["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "edge-netclaim-endpoints"
    assert not pod.get("hostNetwork"), "no host access"
    assert pod["volumes"] == [{"name": "probe", "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}}], \
        "nothing mounted but its token and an empty directory for its probe socket"
    assert pod["securityContext"]["runAsNonRoot"] is True
    (c,) = pod["containers"]
    assert c["command"][-1] == "endpoints"
    assert c["args"][:4] == ["--lease-name=edge-netclaim-endpoints", "--lease-duration=30",
                             "--lease-renew-deadline=20", "--lease-retry=4"]
    assert c["args"][-1] == "--log-level=debug", "extraArgs come after the chart's own"
    assert {e["name"] for e in c["env"]} >= {"POD_NAME", "POD_NAMESPACE"}
    assert c["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert "cpu" not in c["resources"].get("limits", {})
    # the publisher's DaemonSet and account are the same as without it
    assert one(docs, "DaemonSet")["spec"]["template"]["spec"]["serviceAccountName"] == "edge-netclaim-publisher"


def test_the_endpoints_controller_is_probed_on_its_health_paths_in_either_probe_mode() -> None:
    """Liveness on /healthz (a watch that died or went quiet), readiness on /readyz (first lists done), asked as
    the publisher's are: exec over a socket only the pod's own containers reach (the default), or httpGet to
    the pod's IP where the controller listens (probes.mode=tcp); nothing else in the pod changes."""
    def container(*sets: str) -> dict:
        (dep,) = by_kind(render("endpoints.enabled=true", *sets), "Deployment")
        (c,) = dep["spec"]["template"]["spec"]["containers"]
        return c

    c = container()
    assert "--probe-socket=/run/netclaim-endpoints/probe.sock" in c["args"]
    assert c["volumeMounts"] == [{"name": "probe", "mountPath": "/run/netclaim-endpoints"}]
    for kind, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
        assert c[kind]["exec"]["command"][-3:] == ["publisher.observe.localprobe",
                                                   "/run/netclaim-endpoints/probe.sock", path]
        assert c[kind]["timeoutSeconds"] >= 5
    assert c["livenessProbe"]["failureThreshold"] * c["livenessProbe"]["periodSeconds"] >= 30

    c = container("probes.mode=tcp", "metrics.probePort=9470")
    assert "--probe-address=$(POD_IP):9470" in c["args"]
    assert {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}} in c["env"]
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": 9470}, "no host: the pod's IP"
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": 9470}
    assert "volumeMounts" not in c
