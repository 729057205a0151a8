"""`kubectl netclaim` (scripts/operator/kubectl-netclaim): the no-install diagnosis an operator runs.

The plugin is one standard-library file: each run here copies nothing but it and a real kubectl
(scripts/build/components.sh kubectl) into an empty directory, with PATH limited to that directory and
/usr/bin (python3), and runs it as `kubectl netclaim ...`, as an operator who copied it onto the PATH would.

The real-cluster cases share one cluster of their own (NETCLAIM_KPLUG_CLUSTER_DIR, default /tmp/nc-kplug) with
the chart installed (the chart, not the systemd service: only the chart's publisher writes the node's heartbeat
Lease and a ConfigMap naming its drivers, which `why` reads). Each case makes one situation the way it arises on a
node (the publisher and the chain keeper report it themselves: no Event or Lease is made by hand) and checks the
verdict line `why` prints, and its exit code (0 all is well, 1 a cause). A case that changes the node puts it back
before the next (the unchained primary conflist) or comes late: the contest third to last, the stopped publisher
last.

The cluster runs with Kubernetes 1.37's workload gates on in all four components (GenericWorkload and
DRAWorkloadResourceClaims, NETCLAIM_CLUSTER_FEATURE_GATES of scripts/cluster.sh): every case holds with them, and
one shares a claim among the pods of a PodGroup (KEP-5729), reserved for the group by the scheduler itself.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.machinery
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from deploylib import REPO, own_cluster

sys.path.insert(0, str(REPO / "scripts" / "harness"))
from datetime import UTC

from runtime.realcluster import RealCluster, entries_of, pod_manifest, ready_status, wait_until

PLUGIN = REPO / "scripts" / "operator" / "kubectl-netclaim"
NAMESPACE = "netclaim-system"
OTHER_DRIVER = "gpu.example.com"
WORKLOAD_GATES = "GenericWorkload=true,DRAWorkloadResourceClaims=true"


def kubectl_binary() -> str:
    proc = subprocess.run([str(REPO / "scripts" / "build" / "components.sh"), "kubectl"], capture_output=True,
                          text=True, check=True, timeout=3600)
    return proc.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="module")
def plugin_dir() -> Iterator[Path]:
    """A directory holding only the plugin and kubectl: what an operator's PATH gets."""
    with tempfile.TemporaryDirectory(prefix="nc-kplug-bin-") as tmp:
        here = Path(tmp)
        (here / "kubectl-netclaim").write_bytes(PLUGIN.read_bytes())
        (here / "kubectl-netclaim").chmod(0o755)
        (here / "kubectl").symlink_to(kubectl_binary())
        yield here


def run_plugin(plugin_dir: Path, *args: str, kubeconfig: str = "", timeout: float = 300) -> subprocess.CompletedProcess:
    """`kubectl netclaim ARGS` from an empty working directory, PATH = the plugin's dir and /usr/bin."""
    env = {"PATH": f"{plugin_dir}:/usr/bin", "HOME": str(plugin_dir)}
    if kubeconfig:
        env["KUBECONFIG"] = kubeconfig
    with tempfile.TemporaryDirectory(prefix="nc-kplug-cwd-") as cwd:
        return subprocess.run(["kubectl", "netclaim", *args], capture_output=True, text=True, env=env, cwd=cwd,
                              timeout=timeout, check=False)


def load_plugin() -> ModuleType:
    """The plugin's file as a module (it has no .py suffix: it is a kubectl plugin)."""
    loader = importlib.machinery.SourceFileLoader("kubectl_netclaim", str(PLUGIN))
    spec = importlib.util.spec_from_loader("kubectl_netclaim", loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    loader.exec_module(module)
    return module


# ------------------------------------------------------------------------------------------ no cluster


def test_kubectl_finds_the_plugin_and_its_help_lists_the_subcommands(plugin_dir: Path) -> None:
    proc = run_plugin(plugin_dir, "--help")
    assert proc.returncode == 0, proc.stderr
    for sub in ("status", "why", "fleet", "bundle"):
        assert sub in proc.stdout, proc.stdout
    listed = subprocess.run(["kubectl", "plugin", "list"], capture_output=True, text=True, check=False,
                            env={"PATH": f"{plugin_dir}:/usr/bin", "HOME": str(plugin_dir)})
    assert f"{plugin_dir}/kubectl-netclaim" in listed.stdout, listed.stdout + listed.stderr


def test_the_bundle_scrubber_removes_a_bearer_token_and_a_pem_key() -> None:
    scrub = load_plugin().scrub
    token = "eyJhbGciOiJSUzI1NiIsImtpZCI6IjEifQ.eyJzdWIiOiJzeXN0ZW06c2VydmljZWFjY291bnQifQ.c2lnbmF0dXJlX2J5dGVz"
    key = "-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQC7\n-----END PRIVATE KEY-----"
    text = (f'level=info msg="api request" Authorization: Bearer opaque-Token_value.123==\n'
            f'{{"token": "{token}", "claim": "ns/net-abc"}}\nkey:\n{key}\nconflist=10-bridge.conflist ok\n')
    out = scrub(text)
    assert "opaque-Token_value.123" not in out and token not in out and "BEGIN PRIVATE KEY" not in out, out
    assert "MIIEvQIBADAN" not in out, out
    # What is not a credential stays, so the bundle still says what happened.
    assert "ns/net-abc" in out and "conflist=10-bridge.conflist ok" in out and 'msg="api request"' in out, out


# ------------------------------------------------------------------------------------------ a real cluster


@pytest.fixture(scope="module")
def cluster() -> Iterator[RealCluster]:
    yield from own_cluster("NETCLAIM_KPLUG_CLUSTER_DIR", os.path.join(tempfile.gettempdir(), "nc-kplug"),
                           env={"NETCLAIM_CLUSTER_FEATURE_GATES": WORKLOAD_GATES})


@pytest.fixture(scope="module")
def installed(cluster: RealCluster) -> RealCluster:
    """The chart installed as docs/install.md gives it, with a 10 s heartbeat (so a stopped publisher's Lease is
    stale 30 s later) and an extended resource named for the entry, netclaim chained."""
    from chartlib import CHART, helm
    from runtime.nodechart import build_image
    from test_daemonset_cluster import RELEASE, NodeFiles
    from test_kubernetes_versions import values

    files = NodeFiles(cluster)
    cluster.sh("import-image", build_image(), timeout=900)
    files.run.mkdir(parents=True, exist_ok=True)
    helm("upgrade", "--install", RELEASE, str(CHART), "-n", NAMESPACE, "--create-namespace",
         *values(cluster, files, files.run / "boot-id"), "--set", "nodeLease.period=10",
         "--set", f"extendedResourceName={EXTENDED_RESOURCE}", "--wait",
         "--timeout", "300s", kubeconfig=cluster.kubeconfig, timeout=400)
    wait_until(lambda: files.chained(files.conflist), "netclaim chained into the node's conflist", timeout=120)
    wait_until(lambda: cluster.kubectl("get", "lease", "-n", NAMESPACE, f"{RELEASE}-node-{cluster.node}",
                                       check=False).strip(), "the node's heartbeat Lease", timeout=120)
    return cluster


@pytest.fixture(scope="module")
def ns(installed: RealCluster) -> str:
    return installed.namespace(f"kp-{uuid.uuid4().hex[:6]}")


def why(plugin_dir: Path, cluster: RealCluster, ns: str, name: str) -> tuple[int, str]:
    proc = run_plugin(plugin_dir, "why", name, "-n", ns, kubeconfig=cluster.kubeconfig)
    assert proc.returncode in (0, 1), f"why {name}: exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    print(f"why {name}: exit {proc.returncode}: {proc.stdout.strip()}")
    return proc.returncode, proc.stdout


def verdict_until(plugin_dir: Path, cluster: RealCluster, ns: str, name: str, wanted: str,
                  timeout: float = 180) -> tuple[int, str]:
    """`why` run again until its verdict line holds `wanted` (the situation takes a while to arise)."""
    seen: list[str] = []

    def look() -> tuple[int, str] | None:
        code, out = why(plugin_dir, cluster, ns, name)
        seen[:] = [out]
        return (code, out) if wanted in out else None
    try:
        return wait_until(look, f"`why {name}` to say {wanted!r}", timeout=timeout, interval=2)
    except Exception:
        print("last verdict:", seen)
        raise


def published_pod(cluster: RealCluster, ns: str, name: str) -> dict[str, Any]:
    """A pod with a claim of netclaim's driver, Running, its entry Ready=True; the entry."""
    cluster.claim_template(ns, "net")
    cluster.pod(ns, name, template="net")
    cluster.wait_running(ns, name, timeout=180)
    claim = cluster.pod_claim(ns, name)

    def ready() -> dict[str, Any] | None:
        mine = entries_of(cluster.claim_yaml(ns, claim), cluster.driver)
        return mine[0] if len(mine) == 1 and ready_status(mine[0]) == "True" else None
    return wait_until(ready, f"{ns}/{claim}'s entry Ready=True", timeout=120)


@pytest.fixture(scope="module")
def healthy(installed: RealCluster, ns: str) -> dict[str, Any]:
    return published_pod(installed, ns, "healthy")


def test_why_says_all_is_well_for_a_published_pod(plugin_dir: Path, installed: RealCluster, ns: str,
                                                  healthy: dict[str, Any]) -> None:
    code, out = why(plugin_dir, installed, ns, "healthy")
    assert code == 0 and out.startswith("OK: pod healthy"), out


def test_status_shows_the_ips_and_mac_the_pods_netns_has(plugin_dir: Path, installed: RealCluster, ns: str,
                                                          healthy: dict[str, Any]) -> None:
    proc = run_plugin(plugin_dir, "status", "healthy", "-n", ns, "-o", "json", kubeconfig=installed.kubeconfig)
    assert proc.returncode == 0, proc.stderr
    (claim,) = json.loads(proc.stdout)["claims"]
    (device,) = claim["devices"]
    live = installed.interface(ns, "healthy", device["interface"])
    assert device["mac"].lower() == live.mac.lower(), (device, live)
    assert device["ips"] and set(device["ips"]) <= set(live.cidrs), (device, live)
    assert device["ready"] == "True" and not device["mismatch"], device
    table = run_plugin(plugin_dir, "status", "healthy", "-n", ns, kubeconfig=installed.kubeconfig)
    assert live.mac.lower() in table.stdout.lower() and device["ips"][0] in table.stdout, table.stdout


def test_bundle_holds_the_listed_parts_and_no_token(plugin_dir: Path, installed: RealCluster,
                                                    healthy: dict[str, Any]) -> None:
    from runtime.nodechart import daemonset_pods
    from test_daemonset_cluster import NodeFiles

    pod = daemonset_pods(installed)[installed.node]["metadata"]["name"]
    token = installed.kubectl("exec", "-n", NAMESPACE, pod, "-c", "publisher", "--",
                              "/opt/netclaim/venv/bin/python", "-c",
                              "print(open('/var/run/secrets/kubernetes.io/serviceaccount/token').read())").strip()
    assert len(token) > 100, "the publisher's token (the positive control of the grep below)"
    with tempfile.TemporaryDirectory(prefix="nc-kplug-out-") as out:
        archive = Path(out) / "b.tar.gz"
        proc = run_plugin(plugin_dir, "bundle", installed.node, "-o", str(archive), kubeconfig=installed.kubeconfig)
        assert proc.returncode == 0, proc.stderr
        with tarfile.open(archive) as tar:
            files = {m.name.split("/", 1)[1]: tar.extractfile(m).read().decode() for m in tar.getmembers()}
    for part in ("MANIFEST", "status.json", "journal-summary.json", "metrics.txt", "conflists.json",
                 "logs/publisher.log", "logs/chain-keeper.log", "lease.json", "events-node.json"):
        assert part in files, (part, sorted(files), files.get("MANIFEST"))
        assert part == "MANIFEST" or f"  {part} (" in files["MANIFEST"], files["MANIFEST"]
    assert "netclaim_journal_depth" in files["metrics.txt"]
    assert "journal_schema" in json.loads(files["journal-summary.json"])
    conflist = NodeFiles(installed).conflist
    (listed,) = [c for c in json.loads(files["conflists.json"]) if c["file"] == conflist.name]
    assert listed["sha256"] == hashlib.sha256(conflist.read_bytes()).hexdigest() and listed["netclaim"], listed
    everything = "\n".join(files.values())
    assert token not in everything and token[:40] not in everything
    assert "BEGIN" not in everything


def test_why_names_a_claim_that_is_not_allocated(plugin_dir: Path, installed: RealCluster, ns: str) -> None:
    installed.apply({"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": "nc-none"},
                     "spec": {"selectors": [{"cel": {"expression": 'device.driver == "none.example.com"'}}]}})
    installed.claim(ns, "nowhere", device_class="nc-none")
    installed.pod(ns, "pending", claim="nowhere")
    code, out = verdict_until(plugin_dir, installed, ns, "pending", "is not allocated")
    assert code == 1 and out.startswith("CAUSE: claim nowhere is not allocated"), out
    assert "FIX: " in out


def test_why_names_a_claim_of_another_driver_only(plugin_dir: Path, installed: RealCluster, ns: str) -> None:
    with installed.second_driver(OTHER_DRIVER):
        installed.claim(ns, "gpu", device_class=OTHER_DRIVER)
        installed.pod(ns, "gpu-pod", claim="gpu")
        installed.wait_running(ns, "gpu-pod", timeout=180)
        code, out = why(plugin_dir, installed, ns, "gpu-pod")
    assert code == 1, out
    assert f"CAUSE: claim gpu is allocated only to {OTHER_DRIVER}, which netclaim does not serve" in out, out


def test_why_names_an_entry_that_is_not_ready_and_what_it_means(plugin_dir: Path, installed: RealCluster,
                                                                ns: str) -> None:
    published_pod(installed, ns, "downed")
    subprocess.run(["nsenter", f"--net={installed.netns(ns, 'downed')}", "ip", "link", "set", "eth0", "down"],
                   check=True, timeout=30)
    code, out = verdict_until(plugin_dir, installed, ns, "downed", "reason LinkDown")
    assert code == 1 and "Ready=False reason LinkDown" in out, out
    assert "FIX: the interface is administratively down" in out, out


EXTENDED_RESOURCE = "example.com/nic"  # the chart's extendedResourceName on this cluster (`installed`)
OTHER_RESOURCE = "example.com/other"  # one the entry does not name


def extended_pod(installed: RealCluster, ns: str, name: str, resource: str) -> tuple[str, dict[str, Any]]:
    """A pod asking for one `resource` in its container's resources, no claim in its spec, running: the claim the
    scheduler made for it (named in the pod's status with its requestMappings) and that claim's one result."""
    pod = pod_manifest(ns, name)
    pod["spec"]["containers"][0]["resources"] = {"limits": {resource: "1"}, "requests": {resource: "1"}}
    installed.apply(pod)
    installed.wait_running(ns, name, timeout=180)
    status = installed.get("pod", name, ns)["status"]
    made = status.get("extendedResourceClaimStatus") or {}
    claim = made.get("resourceClaimName", "")
    assert claim and not status.get("resourceClaimStatuses"), status  # the scheduler's claim, the pod's only
    (mapping,) = made["requestMappings"]
    assert (mapping["containerName"], mapping["resourceName"]) == ("app", resource), made
    allocation = installed.get("resourceclaim", claim, ns)["status"]
    (result,) = allocation["allocation"]["devices"]["results"]
    # The scheduler names the request itself (container-0-request-0): no entry's `request` is that.
    assert result["driver"] == installed.driver and result["request"] == mapping["requestName"] != "nic", result
    assert [r["name"] for r in allocation["reservedFor"]] == [name], allocation
    return claim, result


def test_a_claim_the_scheduler_makes_for_the_named_extended_resource_is_published(plugin_dir: Path,
                                                                                 installed: RealCluster,
                                                                                 ns: str) -> None:
    """DRA extended resources (KEP-5004): DeviceClasses of netclaim's driver's devices name extended resources, and
    pods ask for one in their container's resources, with no claim in their spec. With the chart's default
    `request: nic` and `extendedResourceName: example.com/nic`, the claim the scheduler makes for a pod asking for
    example.com/nic gets the pod's eth0 (Ready=True, its MAC and IPs) and `why` says OK. A pod asking for
    example.com/other, which the entry does not name, gets no entry, and `why` names the setting rather than a
    missing Warning. The classes and the pods go at the end (the devices back to the node)."""
    for name, resource in (("nc-extended", EXTENDED_RESOURCE), ("nc-other", OTHER_RESOURCE)):
        installed.apply({"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": name},
                         "spec": {"extendedResourceName": resource, "selectors": [
                             {"cel": {"expression": f'device.driver == "{installed.driver}"'}}]}})
    try:
        claim, result = extended_pod(installed, ns, "extended", EXTENDED_RESOURCE)
        entry = wait_until(lambda: shows(installed, ns, claim, "extended"),
                           f"{ns}/{claim}'s entry Ready=True with the pod's eth0", timeout=120)
        assert (entry["pool"], entry["device"]) == (result["pool"], result["device"]), (entry, result)
        code, out = verdict_until(plugin_dir, installed, ns, "extended", "OK: ")
        assert code == 0 and out.startswith("OK: pod extended"), out
        proc = run_plugin(plugin_dir, "status", "extended", "-n", ns, "-o", "json", kubeconfig=installed.kubeconfig)
        assert proc.returncode == 0, proc.stderr
        (listed,) = json.loads(proc.stdout)["claims"]
        (device,) = listed["devices"]
        assert listed["claim"] == claim and device["device"] == f"{result['pool']}/{result['device']}", listed
        assert device["ready"] == "True" and device["mac"].lower() == installed.interface(ns, "extended").mac, device

        other, result = extended_pod(installed, ns, "other", OTHER_RESOURCE)
        code, out = verdict_until(plugin_dir, installed, ns, "other", "extended resources")
        assert code == 1 and out.startswith(f"CAUSE: claim {other} is the one the scheduler made for the pod's "
                                            f"extended resources ({OTHER_RESOURCE})"), out
        assert f"request '{result['request']}'" in out and f"extended resource '{EXTENDED_RESOURCE}'" in out, out
        assert "FIX: set the chart's `extendedResourceName`" in out, out
        assert entries_of(installed.claim_yaml(ns, other), installed.driver) == []
    finally:
        for pod in ("extended", "other"):
            installed.kubectl("delete", "pod", pod, "-n", ns, "--ignore-not-found", timeout=180, check=False)
        installed.kubectl("delete", "deviceclass", "nc-extended", "nc-other", "--ignore-not-found", check=False)


def endpoints_pods(installed: RealCluster) -> list[dict[str, Any]]:
    return [p for p in json.loads(installed.kubectl(
        "get", "pod", "-n", NAMESPACE, "-l", "app.kubernetes.io/component=endpoints", "-o", "json"))["items"]
        if not p["metadata"].get("deletionTimestamp")]


def pod_ready(pod: dict[str, Any]) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True" for c in pod["status"].get("conditions") or [])


def readiness_failures(installed: RealCluster, pod: str) -> list[str]:
    """The kubelet's `Readiness probe failed` notes for the pod (its Unhealthy Events)."""
    events = json.loads(installed.kubectl("get", "events", "-n", NAMESPACE, "--field-selector",
                                          f"involvedObject.name={pod},reason=Unhealthy", "-o", "json"))["items"]
    return [e.get("message", "") for e in events if "Readiness probe failed" in e.get("message", "")]


def test_the_charts_endpoints_controller_is_ready_only_where_it_reaches_the_api_and_then_serves_a_service(
        installed: RealCluster, ns: str) -> None:
    """The chart's opt-in EndpointSlice controller (endpoints.enabled), turned on by `helm upgrade` on this
    module's cluster. On the pod network its replicas cannot reach this test cluster's API server (it listens on
    the host's loopback only), so they run, live, and are NOT ready, the kubelet's probe saying why. Then, for
    this test cluster only, the Deployment is put on the host's network (where the API server is): both replicas
    pass their readiness probes (one leads, one stands by), and a Service without a selector, annotated for
    netclaim's driver and request, gets an EndpointSlice of the selected pod's published address, ready, naming
    the pod and the node."""
    from chartlib import CHART, helm
    from test_daemonset_cluster import RELEASE

    helm("upgrade", RELEASE, str(CHART), "-n", NAMESPACE, "--reuse-values", "--set", "endpoints.enabled=true",
         kubeconfig=installed.kubeconfig, timeout=300)
    def cut_off() -> list[str]:
        return [m for p in endpoints_pods(installed) if p["status"].get("phase") == "Running"
                for m in readiness_failures(installed, p["metadata"]["name"]) if "has not answered the election" in m]
    wait_until(cut_off, "an endpoints replica running, its readiness probe naming the unanswered election",
               timeout=240)
    assert not any(pod_ready(p) for p in endpoints_pods(installed))

    # Test cluster only: the pod network has no route to the API server here.
    installed.kubectl("patch", "deployment", f"{RELEASE}-endpoints", "-n", NAMESPACE, "--type", "merge", "-p",
                      json.dumps({"spec": {"template": {"spec": {"hostNetwork": True}}}}))
    installed.kubectl("rollout", "status", f"deployment/{RELEASE}-endpoints", "-n", NAMESPACE, "--timeout=240s",
                      timeout=300)
    ready = wait_until(lambda: (lambda ps: ps if len(ps) == 2 and all(map(pod_ready, ps)) else None)(
        endpoints_pods(installed)), "both endpoints replicas Ready", timeout=120)
    assert all(p["spec"].get("hostNetwork") for p in ready)
    installed.claim_template(ns, "served-net")
    pod = pod_manifest(ns, "served", template="served-net")
    pod["metadata"]["labels"] = {"app": "served"}
    try:
        installed.apply(pod)
        installed.wait_running(ns, "served", timeout=180)
        claim = installed.pod_claim(ns, "served")
        entry = wait_until(lambda: shows(installed, ns, claim, "served"), f"{ns}/{claim}'s entry Ready=True",
                           timeout=120)
        address = entry["networkData"]["ips"][0].split("/")[0]
        installed.apply({"apiVersion": "v1", "kind": "Service", "metadata": {
            "name": "served", "namespace": ns, "annotations": {
                "netclaim.dev/endpoints-selector": "app=served", "netclaim.dev/endpoints-driver": installed.driver,
                "netclaim.dev/endpoints-request": "nic"}},
            "spec": {"ports": [{"name": "web", "port": 80, "protocol": "TCP"}]}})

        def endpoints() -> list[dict[str, Any]] | None:
            slices = json.loads(installed.kubectl("get", "endpointslice", "-n", ns, "-l",
                                                  "kubernetes.io/service-name=served", "-o", "json"))["items"]
            return [e for sl in slices for e in sl.get("endpoints") or []] or None
        (endpoint,) = wait_until(endpoints, "the Service's EndpointSlice from the chart's controller", timeout=120)
        assert endpoint["addresses"] == [address] and endpoint["conditions"]["ready"] is True, endpoint
        assert endpoint["targetRef"]["name"] == "served" and endpoint["nodeName"] == installed.node, endpoint
    finally:  # the device back to the node for the module's later cases, and the controller's pods gone
        installed.kubectl("delete", "service", "served", "-n", ns, "--ignore-not-found", check=False)
        installed.kubectl("delete", "pod", "served", "-n", ns, "--ignore-not-found", timeout=180, check=False)
        helm("upgrade", RELEASE, str(CHART), "-n", NAMESPACE, "--reuse-values", "--set", "endpoints.enabled=false",
             kubeconfig=installed.kubeconfig, timeout=300)


NAD_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
    "metadata": {"name": "network-attachment-definitions.k8s.cni.cncf.io"},
    "spec": {"group": "k8s.cni.cncf.io", "scope": "Namespaced",
             "names": {"plural": "network-attachment-definitions", "singular": "network-attachment-definition",
                       "kind": "NetworkAttachmentDefinition", "shortNames": ["net-attach-def"]},
             "versions": [{"name": "v1", "served": True, "storage": True, "schema": {"openAPIV3Schema": {
                 "type": "object", "properties": {"spec": {"type": "object", "properties": {
                     "config": {"type": "string"}}}}}}}]},
}


def test_why_names_a_network_attachment_whose_chain_lacks_netclaim(plugin_dir: Path, installed: RealCluster,
                                                                  ns: str) -> None:
    # Multus's NetworkAttachmentDefinition CRD as Multus installs it, a NAD whose chain ends without netclaim,
    # and a claimed pod that asks for that network: the secondary network's entry can never be published.
    installed.apply(NAD_CRD)
    config = {"cniVersion": "1.0.0", "name": "storage", "plugins": [
        {"type": "macvlan", "master": "eth0", "ipam": {"type": "host-local", "subnet": "10.88.0.0/24"}}]}
    wait_until(lambda: installed.kubectl("apply", "-f", "-", check=False, stdin=json.dumps({
        "apiVersion": "k8s.cni.cncf.io/v1", "kind": "NetworkAttachmentDefinition",
        "metadata": {"name": "storage", "namespace": ns}, "spec": {"config": json.dumps(config)}})).strip(),
        "the NetworkAttachmentDefinition created (once the CRD is served)", timeout=60)
    published_pod(installed, ns, "multi")
    installed.kubectl("annotate", "pod", "multi", "-n", ns, "k8s.v1.cni.cncf.io/networks=storage")
    code, out = verdict_until(plugin_dir, installed, ns, "multi", "NetworkAttachmentDefinition")
    assert code == 1, out
    assert f"CAUSE: NetworkAttachmentDefinition {ns}/storage" in out and "has no netclaim plugin" in out, out
    assert "macvlan" in out and "FIX: add" in out, out


def test_why_names_an_apply_the_api_server_refuses(plugin_dir: Path, installed: RealCluster, ns: str) -> None:
    """Another writer of netclaim's entry: a driver that applies its own interfaceName for the same device,
    forcing, as a DRA driver writing the status of its devices does. netclaim applies without force, so its next
    apply of that claim (the interface goes down: Ready must turn False) is refused with a 409 naming the other
    field manager, and reported as an ApplyRejected Warning on the claim."""
    entry = published_pod(installed, ns, "contended")
    claim = installed.pod_claim(ns, "contended")
    theirs = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
              "metadata": {"name": claim, "namespace": ns},
              "status": {"devices": [{"driver": entry["driver"], "pool": entry["pool"], "device": entry["device"],
                                      "networkData": {"interfaceName": "net9"}}]}}
    installed.kubectl("apply", "--server-side", "--force-conflicts", "--field-manager=nic-driver",
                      "--subresource=status", "-f", "-", stdin=json.dumps(theirs))
    subprocess.run(["nsenter", f"--net={installed.netns(ns, 'contended')}", "ip", "link", "set", "eth0", "down"],
                   check=True, timeout=30)
    code, out = verdict_until(plugin_dir, installed, ns, "contended", "ApplyRejected")
    assert code == 1 and out.startswith(f"CAUSE: Warning ApplyRejected on claim {claim}: "), out
    assert "(409)" in out and '"nic-driver"' in out and "interfaceName" in out, out  # the Event's note
    assert "FIX: docs/troubleshooting.md '409 or 422 in the logs'" in out, out


def test_why_names_an_interface_two_allocated_devices_fit(plugin_dir: Path, installed: RealCluster,
                                                          ns: str) -> None:
    """A claim whose one request gets two devices of netclaim's driver, for a pod with one interface: the
    publisher cannot tell which device eth0 is (no device ID, no interfaceName attribute in the slice), so it
    guesses nothing and posts AmbiguousDevice on the claim, naming both."""
    installed.apply({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                     "metadata": {"name": "pair", "namespace": ns},
                     "spec": {"devices": {"requests": [{"name": "nic", "exactly": {
                         "deviceClassName": installed.values["NETCLAIM_DEVICE_CLASS"],
                         "allocationMode": "ExactCount", "count": 2}}]}}})
    installed.pod(ns, "paired", claim="pair")
    try:
        installed.wait_running(ns, "paired", timeout=180)
        results = installed.get("resourceclaim", "pair", ns)["status"]["allocation"]["devices"]["results"]
        assert len(results) == 2 and {r["driver"] for r in results} == {installed.driver}, results
        code, out = verdict_until(plugin_dir, installed, ns, "paired", "AmbiguousDevice")
    finally:  # its two devices back to the node for the cases that follow
        installed.kubectl("delete", "pod", "paired", "-n", ns, "--wait=false", check=False)
    assert code == 1 and out.startswith("CAUSE: Warning AmbiguousDevice on claim pair: "), out
    for r in results:
        assert f"{r['pool']}/{r['device']}" in out, (r, out)
    assert "FIX: set `request` in netclaim's entry" in out, out


def without_netclaim(conflist: bytes) -> bytes:
    """The conflist as its own writer has it: the same chain without netclaim's entry."""
    doc = json.loads(conflist)
    doc["plugins"] = [p for p in doc["plugins"] if p.get("type") != "netclaim"]
    return json.dumps(doc, indent=2).encode()


def replace_file(path: Path, make: Callable[[Path], None]) -> None:
    """`make` a new file (or link) beside `path` under a name no runtime reads, renamed over it: as installers
    write, so neither the runtime nor the keeper ever reads half a file."""
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:6]}.tmp")
    make(tmp)
    os.replace(tmp, path)


@pytest.fixture(scope="module")
def unchained_for_a_while(plugin_dir: Path, installed: RealCluster, ns: str,
                          healthy: dict[str, Any]) -> dict[str, Any]:
    """The node out of the chain for a while, as config management does it: the primary conflist replaced by a
    link to a file it maintains (in a directory of the conf dir, which no runtime reads as a network), without
    netclaim. The keeper never edits a linked primary, so the node stays unchained. Meanwhile `why healthy` is
    asked until it names the node, and a claimed pod starts (its sandbox runs the chain without netclaim).
    Then the file is put back as it was, and the runtime's chain holds netclaim again before the cases that
    follow."""
    from test_daemonset_cluster import NodeFiles

    files = NodeFiles(installed)
    original = files.conflist.read_bytes()
    maintained = files.conf / "maintained"
    maintained.mkdir(exist_ok=True)
    (maintained / files.conflist.name).write_bytes(without_netclaim(original))
    replace_file(files.conflist, lambda tmp: tmp.symlink_to(f"maintained/{files.conflist.name}"))
    try:
        wait_until(lambda: "netclaim" not in installed.loaded_cni_types(), "the runtime's chain without netclaim",
                   timeout=120)
        installed.pod(ns, "unchained", template="net")
        verdict = verdict_until(plugin_dir, installed, ns, "healthy", "not chained")
        installed.wait_running(ns, "unchained", timeout=180)
    finally:
        replace_file(files.conflist, lambda tmp: tmp.write_bytes(original))
        shutil.rmtree(maintained)
    wait_until(lambda: files.chained(files.conflist) and "netclaim" in installed.loaded_cni_types(),
               "netclaim back in the runtime's chain", timeout=120)
    return {"verdict": verdict, "conflist": files.conflist.name}


def test_why_names_a_node_that_is_not_chained(installed: RealCluster,
                                              unchained_for_a_while: dict[str, Any]) -> None:
    code, out = unchained_for_a_while["verdict"]
    conflist = unchained_for_a_while["conflist"]
    assert code == 1 and out.startswith(f"CAUSE: node {installed.node}: not chained in {conflist}: "), out
    assert "is a symlink to maintained/" in out, out  # the keeper's reason, as the Lease carries it
    assert "FIX: docs/troubleshooting.md 'Is netclaim in the chain?'" in out, out


def test_why_names_a_pod_started_while_netclaim_was_not_chained(plugin_dir: Path, installed: RealCluster, ns: str,
                                                                unchained_for_a_while: dict[str, Any]) -> None:
    """The pod started while the node was unchained still has no status after the chain is back (nothing sent an
    ADD for its sandbox): the publisher finds it and posts NetclaimNotChained on the pod."""
    code, out = verdict_until(plugin_dir, installed, ns, "unchained", "NetclaimNotChained")
    assert code == 1 and out.startswith("CAUSE: Warning NetclaimNotChained on pod unchained: the pod's sandbox was "
                                        "created while netclaim was not in the node's CNI chain"), out
    assert "FIX: chain the node" in out and "then re-create the pod" in out, out


@contextlib.contextmanager
def another_writer(path: Path, content: bytes) -> Iterator[None]:
    """While the block runs, a writer that wants `path` its own way, as Cilium's agent (cni.exclusive) does: a
    few times a second, when the file is not what it writes, it writes it again (renamed into place)."""
    stop = threading.Event()
    failed: list[BaseException] = []

    def loop() -> None:
        while not stop.wait(0.1):
            try:
                if path.read_bytes() != content:
                    replace_file(path, lambda tmp: tmp.write_bytes(content))
            except OSError as exc:
                failed.append(exc)
                return
    writer = threading.Thread(target=loop, name="other-conflist-writer", daemon=True)
    writer.start()
    try:
        yield
    finally:
        stop.set()
        writer.join(timeout=10)
    assert not failed, failed


def test_why_names_a_chain_another_writer_keeps_undoing(plugin_dir: Path, installed: RealCluster, ns: str,
                                                        healthy: dict[str, Any]) -> None:
    """Third to last. Another writer undoes each of the keeper's edits of the primary conflist: after a few
    writes in a minute the keeper calls the conflist contested and backs off (so the node is also not chained):
    `why` names the contest, not the missing entry. Once the writer stops, the keeper's next retry chains
    netclaim again (the Lease says contested until a minute passes without a keeper write: the PodGroup case
    that follows waits for `why` to say OK, the stale case does not mind)."""
    from test_daemonset_cluster import NodeFiles

    files = NodeFiles(installed)
    with another_writer(files.conflist, without_netclaim(files.conflist.read_bytes())):
        code, out = verdict_until(plugin_dir, installed, ns, "healthy", "contested")
    wait_until(lambda: files.chained(files.conflist), "the keeper's retry chaining netclaim again", timeout=180)
    assert code == 1 and out.startswith(f"CAUSE: node {installed.node}: contested: {files.conflist.name}"), out
    assert "FIX: docs/troubleshooting.md 'The chain is contested': stop the other writer" in out, out


def group_pod(cluster: RealCluster, ns: str, name: str, group: str, claim: str) -> None:
    """A pod of PodGroup `group` that uses the group's claim (the same name and claim as the group lists)."""
    pod = pod_manifest(ns, name, claim=claim)
    pod["spec"]["schedulingGroup"] = {"podGroupName": group}
    cluster.apply(pod)


def shows(cluster: RealCluster, ns: str, claim: str, pod: str) -> dict[str, Any] | None:
    """The claim's one entry of netclaim's driver when it is Ready=True and carries the pod's eth0 (MAC, IPs)."""
    mine = entries_of(cluster.claim_yaml(ns, claim), cluster.driver)
    if len(mine) != 1 or ready_status(mine[0]) != "True":
        return None
    data, live = mine[0].get("networkData") or {}, cluster.interface(ns, pod, "eth0")
    same = (str(data.get("hardwareAddress", "")).lower() == live.mac and data.get("ips")
            and set(data["ips"]) <= set(live.cidrs))
    return mine[0] if same else None


def test_a_podgroups_two_pods_share_a_claim_and_each_pods_interface_is_published(plugin_dir: Path,
                                                                                 installed: RealCluster,
                                                                                 ns: str) -> None:
    """KEP-5729 done by the cluster itself: a PodGroup lists one claim of netclaim's driver (one device), and two
    pods of the group use it. The scheduler reserves the claim for the group, not for a pod (the gates really
    are on), the kubelet runs both pods on the one device, and the claim's single entry for that device shows
    the newest sandbox: the first pod's eth0, then, once the second runs, the second's. `why` says OK for each
    pod, and `status` of the claim names the group it is reserved for."""
    installed.claim(ns, "team")
    installed.apply({"apiVersion": "scheduling.k8s.io/v1beta1", "kind": "PodGroup",
                     "metadata": {"name": "team", "namespace": ns},
                     "spec": {"schedulingPolicy": {"basic": {}},
                              "resourceClaims": [{"name": "net", "resourceClaimName": "team"}]}})
    group = installed.get("podgroup", "team", ns)
    group_pod(installed, ns, "team-a", "team", "team")
    installed.wait_running(ns, "team-a", timeout=180)
    wait_until(lambda: shows(installed, ns, "team", "team-a"), "the claim's entry showing team-a's eth0",
               timeout=120)
    group_pod(installed, ns, "team-b", "team", "team")
    installed.wait_running(ns, "team-b", timeout=180)
    wait_until(lambda: shows(installed, ns, "team", "team-b"), "the claim's entry showing team-b's eth0 (the "
               "newest sandbox)", timeout=120)
    claim = installed.get("resourceclaim", "team", ns)
    assert claim["status"]["reservedFor"] == [{"apiGroup": "scheduling.k8s.io", "resource": "podgroups",
                                               "name": "team", "uid": group["metadata"]["uid"]}], claim["status"]
    assert installed.interface(ns, "team-a").mac != installed.interface(ns, "team-b").mac
    for pod in ("team-a", "team-b"):
        # The contest case before this one leaves the Lease saying contested for up to a minute.
        code, out = verdict_until(plugin_dir, installed, ns, pod, "OK: ", timeout=240)
        assert code == 0 and out.startswith(f"OK: pod {pod}"), out
    proc = run_plugin(plugin_dir, "status", "resourceclaim/team", "-n", ns, kubeconfig=installed.kubeconfig)
    assert proc.returncode == 0 and "claim team: reserved for podgroup/team" in proc.stdout, proc.stdout + proc.stderr


def publisher_pid(cluster: RealCluster) -> int:
    """The host pid of the publisher container's process on the node (crictl, this cluster's runtime)."""
    from runtime.nodechart import daemonset_pods

    pod = daemonset_pods(cluster)[cluster.node]["metadata"]["name"]
    (container,) = cluster.crictl("ps", "--name", "^publisher$", "--pod",
                                  cluster.crictl("pods", "--name", pod, "-q").split()[0], "-q").split()
    return int(json.loads(cluster.crictl("inspect", container))["info"]["pid"])


def test_why_names_a_stopped_publisher_by_its_stale_lease(plugin_dir: Path, installed: RealCluster, ns: str,
                                                          healthy: dict[str, Any]) -> None:
    """Last. The publisher's process is stopped (SIGSTOP: hung, as a publisher stuck in the kernel or starved
    is); its pod stays, and with it the Lease (owned by the pod), which nothing renews: stale 30 s later
    (nodeLease.period 10 s, three periods). The kubelet's liveness probe restarts the container a while after
    (3 failures 10 s apart, then the termination grace): `why` is asked until then."""
    pid = publisher_pid(installed)
    os.kill(pid, signal.SIGSTOP)
    try:
        code, out = verdict_until(plugin_dir, installed, ns, "healthy", "stale", timeout=240)
    finally:
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass  # restarted by the kubelet meanwhile
    assert code == 1 and out.startswith(f"CAUSE: node {installed.node}: stale: last heartbeat"), out
    assert "FIX: the publisher on" in out, out


def lease(name: str, holder: str, renewed_ago: float, duration: int, state: dict[str, Any]) -> dict[str, Any]:
    from datetime import datetime, timedelta

    renew = (datetime.now(UTC) - timedelta(seconds=renewed_ago)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return {"metadata": {"name": name, "annotations": {"netclaim.dev/node-state": json.dumps(state)}},
            "spec": {"holderIdentity": holder, "renewTime": renew, "leaseDurationSeconds": duration}}


# Each case's Lease, made when the case runs: a renewTime taken at collection would age with the suite.
LEASES: dict[str, Callable[[], dict[str, Any]]] = {
    "fresh and chained": lambda: lease("netclaim-node-a", "a", 5, 1800, {"chained": "yes", "keeper": "answered"}),
    "stale": lambda: lease("netclaim-node-b", "b", 1900, 1800, {"chained": "yes", "keeper": "answered"}),
    "stale by the cap": lambda: lease("netclaim-node-c", "c", 11000, 10**8, {"chained": "yes", "keeper": "answered"}),
    "not chained": lambda: lease("netclaim-node-d", "d", 5, 1800, {
        "chained": "no", "conflist": "10-x.conflist", "keeper": "answered",
        "chain": "not chained conflist=10-x.conflist problem=no network config"}),
    "contested": lambda: lease("netclaim-node-e", "e", 5, 1800, {"chained": "yes", "contested": ["10-x.conflist"]}),
    "keeper unreachable": lambda: lease("netclaim-node-f", "f", 5, 1800,
                                        {"chained": "unknown", "keeper": "unreachable"}),
    "in the future": lambda: lease("netclaim-node-g", "g", -3600, 1800, {"chained": "yes", "keeper": "answered"}),
    "foreign": lambda: lease("netclaim-node-h", "i", 5, 1800, {"chained": "yes"}),
    "control characters": lambda: lease("netclaim-node-j", "j", 5, 1800, {"chained": "yes", "version": "0.2\x1b[2J"}),
}


@pytest.mark.parametrize("case", list(LEASES))
def test_the_plugins_fleet_judges_a_lease_as_netclaim_publisher_fleet_does(case: str) -> None:
    """The plugin carries its own copy of the judgement (it imports nothing of netclaim's): the same problems."""
    from publisher.observe.fleet import row_of

    made = LEASES[case]()
    ours = load_plugin().judge_lease(made, "netclaim-node-", time.time())
    theirs = row_of(made, time.time(), "netclaim-node-")
    assert [p.split(":")[0] for p in ours.problems] == [p.split(":")[0] for p in theirs.problems], (ours, theirs)
    assert ours.stale == theirs.stale and ours.node == theirs.node
    assert bool(ours.problems) == (case != "fresh and chained"), ours  # each case but the first is a problem
