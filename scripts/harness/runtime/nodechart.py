"""netclaim on every node of a multi-node cluster.sh cluster: the image and the chart's DaemonSet.

As an operator installs it on a real cluster: the image built by
scripts/build-image.sh (no registry) imported into every node's containerd,
then `helm upgrade --install` of the chart. The chart's host paths name the
cluster's NETCLAIM_NODE_PATHS, which on every node is that node's own
directory (each node runs in its own mount namespace), so one DaemonSet with
one set of values serves every node, as /etc/cni/net.d does on real nodes.
Used by tests/cluster/test_multinode.py and `scripts/bench.py cluster --nodes N`.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from .realcluster import ClusterError, RealCluster, free_port  # noqa: F401  (free_port: for the tests)

REPO = Path(__file__).resolve().parents[3]
CHART = REPO / "conf" / "helm" / "netclaim"
RELEASE = "netclaim"
NAMESPACE = "netclaim-system"


def version() -> str:
    import cni_plugin

    return cni_plugin.__version__


def build_image(tag: str = "") -> str:
    """The OCI archive of scripts/build-image.sh (cached by its inputs)."""
    proc = subprocess.run([str(REPO / "scripts" / "build-image.sh"), "--tag", tag or version()], capture_output=True,
                          text=True, timeout=3600)
    if proc.returncode != 0:
        raise ClusterError(f"scripts/build-image.sh failed:\n{proc.stderr[-3000:]}")
    return proc.stdout.strip().splitlines()[-1]


def helm(*args: str, kubeconfig: str, timeout: float = 400) -> str:
    """The helm built by scripts/build/components.sh, with its own state dirs."""
    binary = subprocess.run([str(REPO / "scripts" / "build" / "components.sh"), "helm"], capture_output=True,
                            text=True, check=True, timeout=3600).stdout.strip().splitlines()[-1]
    tmp = tempfile.gettempdir()
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": os.environ.get("HOME", ""),
           "KUBECONFIG": kubeconfig, "HELM_CACHE_HOME": f"{tmp}/netclaim-helm-cache",
           "HELM_CONFIG_HOME": f"{tmp}/netclaim-helm-config", "HELM_DATA_HOME": f"{tmp}/netclaim-helm-data"}
    proc = subprocess.run([binary, *args], capture_output=True, text=True, env=env, timeout=timeout)
    if proc.returncode != 0:
        raise ClusterError(f"helm {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc.stdout


def helm_values(cluster: RealCluster, ports: tuple[int, int], *extra: str) -> list[str]:
    """--set flags: every host path under NETCLAIM_NODE_PATHS; `extra` are more KEY=VALUE pairs."""
    paths = cluster.values["NETCLAIM_NODE_PATHS"]
    sets = {
        "driverName": cluster.driver, "image.pullPolicy": "Never", "priorityClassName": "",
        "cni.confDir": f"{paths}/cni/net.d", "cni.binDir": f"{paths}/cni/bin",
        "hostPaths.run": f"{paths}/netclaim-run", "hostPaths.state": f"{paths}/netclaim-state",
        # hostNetwork pods of every node share the host's ports: each binds its own node IP.
        "metrics.port": str(ports[0]), "metrics.keeperPort": str(ports[1]),
        # ... and its own probe ports there: 127.0.0.1 is one loopback for all of them here.
        "metrics.probeHost": "node",
        # No kube-proxy here: the API server as the nodes see it.
        "apiServer.host": "127.0.0.1",
        # This kernel has no AppArmor: the kubelet refuses a pod that asks for a profile.
        "liveWatch.openerAppArmorProfile": "",
    }
    strings = {"image.tag": version(), "cni.pollInterval": "0.5",
               "apiServer.port": cluster.values["NETCLAIM_APISERVER"].rsplit(":", 1)[1]}
    out = []
    for key, value in sets.items():
        out += ["--set", f"{key}={value}"]
    for key, value in strings.items():
        out += ["--set-string", f"{key}={value}"]
    for item in extra:
        out += ["--set", item]
    return out


def install(cluster: RealCluster, ports: tuple[int, int], *extra: str, upgrade: bool = False) -> None:
    """`helm upgrade --install` (first time; a kept cluster has the release) or `helm upgrade`, --wait."""
    verb = ["upgrade", RELEASE] if upgrade else ["upgrade", "--install", RELEASE, "--create-namespace"]
    helm(*verb, str(CHART), "-n", NAMESPACE, *helm_values(cluster, ports, *extra), "--wait", "--timeout", "300s",
         kubeconfig=cluster.kubeconfig)


def daemonset_pods(cluster: RealCluster) -> dict[str, dict[str, Any]]:
    """The chart's pods (not terminating) by node name."""
    items = json.loads(cluster.kubectl("get", "pods", "-n", NAMESPACE, "-l", "app.kubernetes.io/name=netclaim",
                                       "-o", "json"))["items"]
    return {p["spec"].get("nodeName", ""): p for p in items if not p["metadata"].get("deletionTimestamp")}


def install_everywhere(cluster: RealCluster, *extra: str) -> tuple[int, int]:
    """Image into every node, the chart installed, its pod Ready on every node; the metrics ports used."""
    from .realcluster import wait_until

    cluster.sh("import-image", build_image(), timeout=900)
    ports = (free_port(), free_port())
    install(cluster, ports, *extra)
    wait_until(lambda: len(daemonset_pods(cluster)) == len(cluster.nodes), "the DaemonSet's pod on every node",
               timeout=120)
    return ports
