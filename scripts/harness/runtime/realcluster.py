"""Drive the real single-node cluster of scripts/cluster.sh from Python (tests, demo, benchmark).

Everything goes through the cluster's own tools, the way a user would look:
the built kubectl (admin kubeconfig) for API objects, crictl for the
runtime's view of a sandbox, nsenter for what the pod itself sees in its
network namespace. No object here plays the scheduler or the kubelet: pods
are created with a ResourceClaimTemplate or a claim name and the cluster does
the rest.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import yaml

from .clusternode import ClusterNode
from .dataschema import check_entries
from .statedir import DEFAULT_CLUSTER_DIR, UnsafeStateDir, secure_state_dir

REPO = Path(__file__).resolve().parents[3]
CLUSTER_SH = REPO / "scripts" / "cluster.sh"
PAUSE_IMAGE = "netclaim.local/pause:e2e"


class ClusterError(RuntimeError):
    """A cluster.sh step failed; the message carries its stderr tail."""


def cluster_sh(*args: str, env: dict[str, str], timeout: float = 3600) -> str:
    """Run scripts/cluster.sh as root on a state dir that is ours alone (runtime/statedir.py)."""
    try:
        secure_state_dir(env.get("NETCLAIM_CLUSTER_DIR") or DEFAULT_CLUSTER_DIR, create=False)
    except UnsafeStateDir as exc:
        raise ClusterError(str(exc)) from None
    proc = subprocess.run([str(CLUSTER_SH), *args], env=env, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise ClusterError(f"scripts/cluster.sh {' '.join(args)} failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
    return proc.stdout


def parse_env(text: str) -> dict[str, str]:
    values = {}
    for line in text.splitlines():
        if line.startswith("export "):
            key, _, value = line[len("export "):].partition("=")
            values[key] = shlex.split(value)[0] if value else ""
    return values


@dataclass(frozen=True)
class Interface:
    name: str
    mac: str
    cidrs: list[str]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class RealCluster:
    """A running cluster.sh cluster: its env (paths, node, driver) and the calls tests need."""

    dir: str
    values: dict[str, str]
    env: dict[str, str] = field(repr=False)

    @classmethod
    def up(cls, directory: str, base_env: dict[str, str] | None = None, with_dranet: bool = False,
           nodes: int = 0, kube_version: str = "") -> "RealCluster":
        """`cluster.sh up` (with `--with-dranet`: containerd's NRI on and dranet running on the node), or
        `up --nodes N` when nodes is given; `kube_version` ("1.34") runs that Kubernetes minor."""
        env = dict(base_env or os.environ)
        env["NETCLAIM_CLUSTER_DIR"] = directory
        args = ["--with-dranet"] if with_dranet else []
        if nodes:
            args = ["--nodes", str(nodes)]
        if kube_version:
            args += ["--kube-version", kube_version]
        values = parse_env(cluster_sh("up", *args, env=env))
        return cls(directory, values, env)

    def sh(self, *args: str, timeout: float = 600) -> str:
        return cluster_sh(*args, env=self.env, timeout=timeout)

    def down(self) -> None:
        self.sh("down")

    @contextlib.contextmanager
    def second_driver(self, name: str = "gpu.example.com", devices: int = 2) -> Iterator[str]:
        """A second real DRA driver on the node (the same test driver under another name, with a DeviceClass
        of that name): not netclaim's. Stops with the block; its slice and class stay."""
        v = self.values
        kubeconfig = str(Path(v["NETCLAIM_CP_DIR"]) / f"{self.node}.kubeconfig")
        root = v["NETCLAIM_KUBELET_ROOT"]
        (Path(root) / "plugins" / name).mkdir(parents=True, exist_ok=True)
        with open(Path(self.dir) / f"driver-{name}.log", "ab") as log:
            proc = subprocess.Popen(
                [v["NETCLAIM_DRA_DRIVER"], "--kubeconfig", kubeconfig, "--drivername", name, "-v=2", "kubelet-plugin",
                 "--node-name", self.node, "--plugin-registration-path", f"{root}/plugins_registry",
                 "--datadir", f"{root}/plugins", "--cdi-dir", v["NETCLAIM_CDI_DIR"], "--num-devices", str(devices)],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
            try:
                self.apply({"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": name},
                            "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{name}"'}}]}})
                wait_until(lambda: name in self.kubectl("get", "resourceslices", "-o",
                                                        "jsonpath={.items[*].spec.driver}"),
                           f"{name}'s ResourceSlice", timeout=60)
                yield name
            finally:
                proc.terminate()
                proc.wait(timeout=30)

    # ------------------------------------------------------------------ facts

    @property
    def node(self) -> str:
        return self.values["NETCLAIM_NODE"]

    # ------------------------------------------------------------------ a multi-node cluster (up --nodes N)

    @property
    def nodes(self) -> list[ClusterNode]:
        """Every node of a multi-node cluster, in index order (empty for the single-node cluster)."""
        count = int(self.values.get("NETCLAIM_NODE_COUNT", "0"))
        return [ClusterNode.from_env(self.values, i) for i in range(1, count + 1)]

    def node_named(self, name: str) -> ClusterNode:
        (node,) = [n for n in self.nodes if n.name == name]
        return node

    def pod_node(self, namespace: str, pod: str) -> ClusterNode:
        """The node the pod runs on (spec.nodeName)."""
        return self.node_named(self.get("pod", pod, namespace)["spec"]["nodeName"])

    def node_sh(self, node: ClusterNode, *args: str, timeout: float = 300) -> str:
        """`cluster.sh node I COMMAND...` for one node's components."""
        return self.sh("node", str(node.index), *args, timeout=timeout)

    @property
    def driver(self) -> str:
        return self.values["NETCLAIM_DRIVER"]

    @property
    def kubeconfig(self) -> str:
        return self.values["KUBECONFIG"]

    # ------------------------------------------------------------------ kubectl

    def kubectl(self, *args: str, stdin: str | None = None, check: bool = True, timeout: float = 120) -> str:
        cmd = [self.values["NETCLAIM_KUBECTL"], "--kubeconfig", self.kubeconfig, *args]
        proc = subprocess.run(cmd, input=stdin, capture_output=True, text=True, timeout=timeout)
        if check and proc.returncode != 0:
            raise ClusterError(f"kubectl {' '.join(args)} failed: {proc.stderr.strip()}")
        return proc.stdout

    @contextlib.contextmanager
    def port_forward(self, namespace: str, pod: str, port: int) -> Iterator[tuple[int, subprocess.Popen]]:
        """`kubectl port-forward` to the pod's `port` while the block runs: the local port and the process
        (which has not necessarily started listening yet)."""
        local = free_port()
        proc = subprocess.Popen([self.values["NETCLAIM_KUBECTL"], "--kubeconfig", self.kubeconfig, "port-forward",
                                 "-n", namespace, f"pod/{pod}", f"{local}:{port}"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            yield local, proc
        finally:
            proc.terminate()
            proc.wait(timeout=10)

    def apply(self, *docs: dict[str, Any]) -> None:
        self.kubectl("apply", "-f", "-", stdin=yaml.safe_dump_all(docs))

    def get(self, kind: str, name: str, namespace: str = "") -> dict[str, Any]:
        ns = ["-n", namespace] if namespace else []
        return json.loads(self.kubectl("get", kind, name, *ns, "-o", "json"))

    def claim_yaml(self, namespace: str, name: str) -> dict[str, Any]:
        """What `kubectl get resourceclaim NAME -o yaml` shows, parsed."""
        return yaml.safe_load(self.kubectl("get", "resourceclaim", name, "-n", namespace, "-o", "yaml"))

    def namespace(self, name: str) -> str:
        """Create a namespace and wait for its `default` ServiceAccount (pods need it to be admitted)."""
        self.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
        wait_until(lambda: self.kubectl("get", "sa", "default", "-n", name, check=False).strip() != "",
                   f"ServiceAccount {name}/default", timeout=60)
        return name

    # ------------------------------------------------------------------ pods and claims

    def claim_template(self, namespace: str, name: str = "net", device_class: str = "") -> dict[str, Any]:
        doc = {
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"spec": claim_spec(device_class or self.values["NETCLAIM_DEVICE_CLASS"])},
        }
        self.apply(doc)
        return doc

    def claim(self, namespace: str, name: str, device_class: str = "") -> dict[str, Any]:
        doc = {
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": namespace},
            "spec": claim_spec(device_class or self.values["NETCLAIM_DEVICE_CLASS"]),
        }
        self.apply(doc)
        return doc

    def pod(self, namespace: str, name: str, *, template: str = "", claim: str = "") -> None:
        self.apply(pod_manifest(namespace, name, template=template, claim=claim))

    def wait_running(self, namespace: str, *names: str, timeout: float = 120) -> None:
        pods = [f"pod/{n}" for n in names]
        out = self.kubectl("wait", "-n", namespace, "--for=condition=Ready", *pods, f"--timeout={int(timeout)}s",
                           check=False, timeout=timeout + 10)
        if out.count("condition met") != len(names):
            detail = self.kubectl("get", "-n", namespace, *pods, "-o", "wide", check=False)
            events = self.kubectl("get", "events", "-n", namespace, "--sort-by=.lastTimestamp", check=False)
            raise AssertionError(f"pods not Ready within {timeout}s:\n{detail}\n{events[-3000:]}")

    def delete_pod(self, namespace: str, name: str, wait: bool = True) -> None:
        self.kubectl("delete", "pod", name, "-n", namespace, f"--wait={str(wait).lower()}", timeout=180)

    def pod_claim(self, namespace: str, pod: str) -> str:
        """The generated claim's name (the controller-manager writes it to the pod status)."""
        def name() -> str:
            statuses = self.get("pod", pod, namespace).get("status", {}).get("resourceClaimStatuses") or []
            return statuses[0].get("resourceClaimName", "") if statuses else ""
        return wait_until(name, f"pod {namespace}/{pod}'s generated claim", timeout=60)

    def pod_ip(self, namespace: str, pod: str) -> str:
        return self.get("pod", pod, namespace)["status"]["podIP"]

    # ------------------------------------------------------------------ the runtime's and the pod's view

    def crictl(self, *args: str) -> str:
        env = {**os.environ, "CONTAINER_RUNTIME_ENDPOINT": self.values["CONTAINER_RUNTIME_ENDPOINT"]}
        return subprocess.run([self.values["NETCLAIM_CRICTL"], *args], env=env, capture_output=True, text=True,
                              check=True, timeout=60).stdout

    def loaded_cni_types(self) -> list[str]:
        """The plugin types of the CNI config containerd has loaded now (crictl info), in chain order."""
        info = json.loads(self.crictl("info", "-o", "json"))
        networks = (info.get("cniconfig") or {}).get("Networks") or []
        return [p["Network"]["type"] for n in networks for p in (n.get("Config") or {}).get("Plugins") or []]

    def sandbox(self, namespace: str, pod: str) -> dict[str, Any]:
        """The pod's ready sandbox as containerd reports it (crictl inspectp)."""
        ids = self.crictl("pods", "--namespace", namespace, "--name", f"^{pod}$", "--state", "ready", "-q").split()
        if len(ids) != 1:
            raise AssertionError(f"expected one ready sandbox for {namespace}/{pod}, crictl shows {ids}")
        info = json.loads(self.crictl("inspectp", "-o", "json", ids[0]))
        return {"id": ids[0], **info}

    def netns(self, namespace: str, pod: str) -> str:
        spec = self.sandbox(namespace, pod)["info"]["runtimeSpec"]
        (path,) = [n["path"] for n in spec["linux"]["namespaces"] if n["type"] == "network"]
        return path

    def interface(self, namespace: str, pod: str, ifname: str = "eth0") -> Interface:
        """An interface as the pod sees it, read inside its network namespace."""
        out = subprocess.run(["nsenter", f"--net={self.netns(namespace, pod)}", "ip", "-j", "addr", "show",
                              "dev", ifname], capture_output=True, text=True, check=True).stdout
        (link,) = json.loads(out)
        cidrs = [f"{a['local']}/{a['prefixlen']}" for a in link.get("addr_info", []) if a.get("scope") == "global"]
        return Interface(link["ifname"], link.get("address", "").lower(), cidrs)

    def kubelet_metrics(self) -> str:
        """The kubelet's /metrics, read where it serves (the node IP) with the admin token (webhook authn +
        authz), its certificate verified against the cluster CA."""
        token = yaml.safe_load(Path(self.kubeconfig).read_text())["users"][0]["user"]["token"]
        url = f"https://{self.values['NETCLAIM_NODE_IP']}:{self.values['NETCLAIM_KUBELET_PORT']}/metrics"
        proc = subprocess.run(["curl", "-fsS", "--cacert", self.values["NETCLAIM_APISERVER_CA"], "--config", "-", url],
                              input=f'header = "Authorization: Bearer {token}"\n', capture_output=True, text=True,
                              timeout=30)
        if proc.returncode != 0:
            raise ClusterError(f"kubelet metrics: {proc.stderr.strip()}")
        return proc.stdout


def claim_spec(device_class: str) -> dict[str, Any]:
    return {"devices": {"requests": [{"name": "nic", "exactly": {"deviceClassName": device_class}}]}}


def pod_manifest(namespace: str, name: str, *, template: str = "", claim: str = "") -> dict[str, Any]:
    """A pause pod on the pod network; its claim stays at pod level (no CDI edits to containers)."""
    spec: dict[str, Any] = {
        "containers": [{"name": "app", "image": PAUSE_IMAGE, "imagePullPolicy": "Never"}],
        "terminationGracePeriodSeconds": 0,
    }
    if template:
        spec["resourceClaims"] = [{"name": "net", "resourceClaimTemplateName": template}]
    elif claim:
        spec["resourceClaims"] = [{"name": "net", "resourceClaimName": claim}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace}, "spec": spec}


def entries_of(claim: dict[str, Any], driver: str, previous_release: bool = False) -> list[dict[str, Any]]:
    """The claim's entries of `driver`, each netclaim `data` among them held to its schema (dataschema.py;
    `previous_release`: the cluster may run the release before it, whose data has no apiVersion)."""
    entries = [d for d in (claim.get("status") or {}).get("devices") or [] if d.get("driver") == driver]
    return check_entries(entries, previous_release)


def entries_of_any_release(claim: dict[str, Any], driver: str) -> list[dict[str, Any]]:
    """entries_of on a cluster that may run the previous release (tests/deploy/test_release.py)."""
    return entries_of(claim, driver, previous_release=True)


def ready_status(entry: dict[str, Any]) -> str:
    return next((c.get("status", "") for c in entry.get("conditions") or [] if c.get("type") == "Ready"), "")


def wait_until(fn: Callable[[], Any], what: str, timeout: float = 60, interval: float = 0.2) -> Any:
    """Poll fn until it returns something truthy; fail with what was awaited and the last value."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        try:
            last = fn()
        except (ClusterError, subprocess.CalledProcessError, AssertionError, KeyError) as exc:
            last = exc
        else:
            if last:
                return last
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}; last: {last!r}")
        time.sleep(interval)
