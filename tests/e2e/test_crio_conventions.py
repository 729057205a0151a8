"""The netclaim chain run the way CRI-O runs it, through libcni's own tool.

CRI-O cannot be installed on these machines, but it executes CNI plugins
through libcni (github.com/containernetworking/cni), exactly like containerd.
cnitool is libcni's command-line runner: it is given what CRI-O's ocicni
layer passes for a pod sandbox - CNI_ARGS with `IgnoreUnknown=1` and the
K8S_POD_* keys (the infra container's id included), and capability args
(runtimeConfig: portMappings, cgroupPath, pod annotations) - and runs
ADD, CHECK and DEL through bridge + host-local + netclaim (installed with
scripts/install.sh). The claim status is read from the real API server.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from pathlib import Path
from typing import Iterator

import pytest

from runtime.cluster import Cluster, ready
from runtime.cni_conf import Network, NetclaimInstall, base_conflist, delete_bridge, install_netclaim
from runtime.cni_conf import link_reference_plugins, write_conflist
from runtime.harness import Harness

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def cnitool() -> str:
    proc = subprocess.run([str(REPO / "scripts" / "build" / "components.sh"), "cnitool"], capture_output=True,
                          text=True, timeout=3600)
    if proc.returncode != 0:
        pytest.fail(f"cnitool could not be built: {proc.stderr[-2000:]}", pytrace=False)
    return proc.stdout.strip()


@pytest.fixture
def netns() -> Iterator[str]:
    name = f"nccrio-{os.urandom(3).hex()}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    yield f"/var/run/netns/{name}"
    subprocess.run(["ip", "netns", "delete", name], check=False)


def crio_env(conf_dir: Path, bin_dir: Path, pod_ns: str, pod_name: str, pod_uid: str, infra_id: str) -> dict[str, str]:
    """What CRI-O's ocicni hands libcni for a sandbox: CNI_ARGS and capability args."""
    cni_args = ";".join([
        "IgnoreUnknown=1",
        f"K8S_POD_NAMESPACE={pod_ns}",
        f"K8S_POD_NAME={pod_name}",
        f"K8S_POD_INFRA_CONTAINER_ID={infra_id}",
        f"K8S_POD_UID={pod_uid}",
    ])
    cap_args = {
        "portMappings": [],
        "cgroupPath": f"/kubepods/besteffort/pod{pod_uid}",
        "io.kubernetes.cri.pod-annotations": {"kubernetes.io/config.source": "api"},
    }
    return {**os.environ, "CNI_PATH": str(bin_dir), "NETCONFPATH": str(conf_dir), "CNI_ARGS": cni_args,
            "CAP_ARGS": json.dumps(cap_args), "CNI_IFNAME": "eth0"}


def cnitool_container_id(netns: str) -> str:
    """cnitool names the container after its netns path; CRI-O's infra id plays that role."""
    return "cnitool-" + hashlib.sha512(os.path.abspath(netns).encode()).hexdigest()[:20]


def run(cnitool: str, verb: str, net: str, netns: str, env: dict[str, str]) -> str:
    proc = subprocess.run([cnitool, verb, net, netns], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, f"cnitool {verb} failed ({proc.returncode}): {proc.stderr}{proc.stdout}"
    return proc.stdout


def test_add_check_del_with_crio_args_through_libcni(cnitool: str, cluster: Cluster, publisher,
                                                      node_dirs: NetclaimInstall, netns: str, tmp_path: Path) -> None:
    bin_dir, conf_dir = tmp_path / "bin", tmp_path / "net.d"
    link_reference_plugins(bin_dir)
    net = Network.pick(os.urandom(3).hex(), tmp_path / "ipam")
    conflist = write_conflist(conf_dir / "10-crio.conflist", base_conflist(net))
    install_netclaim(bin_dir, conflist, node_dirs)
    pod = cluster.pod_with_claim("crio")
    env = crio_env(conf_dir, bin_dir, pod.namespace, pod.name, pod.uid, cnitool_container_id(netns))
    try:
        result = json.loads(run(cnitool, "add", net.name, netns, env))
        eth0 = Harness.interface_in_netns(netns, "eth0")
        assert [ip["address"] for ip in result["ips"]] == eth0.cidrs
        entries = cluster.wait_for_entries(pod.claim, lambda es: any(
            e.get("driver") == cluster.driver and ready(e) == "True" for e in es))
        (entry,) = [e for e in entries if e["driver"] == cluster.driver]
        assert entry["networkData"] == {"interfaceName": "eth0", "ips": eth0.cidrs, "hardwareAddress": eth0.mac}
        assert entry["device"] == pod.device

        run(cnitool, "check", net.name, netns, env)  # CHECK through the whole chain: netclaim agrees

        run(cnitool, "del", net.name, netns, env)
        cluster.wait_for_entries(pod.claim, lambda es: not [e for e in es if e.get("driver") == cluster.driver])
        run(cnitool, "del", net.name, netns, env)  # a second DEL (runtime retry) succeeds too
    finally:
        subprocess.run([cnitool, "del", net.name, netns], env=env, capture_output=True, check=False)
        delete_bridge(net.bridge)
