"""One node of a multi-node cluster.sh cluster (`up --nodes N`), as tests look at it.

Each node has its own containerd and mount namespace: what a pod's sandbox
holds is read through that node's crictl, and the pod's network namespace is
entered through the sandbox's pid (its netns mount lives in the node's mount
namespace, not the host's).
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class NodeInterface:
    name: str
    mac: str
    cidrs: list[str]


@dataclass(frozen=True)
class ClusterNode:
    """The `NETCLAIM_NODE<i>_*` facts of `cluster.sh env` for node i, and the calls on that node."""

    index: int
    name: str
    ip: str
    dir: str
    containerd_address: str
    subnet: str
    bridge: str
    cni_conf: str
    kubelet_port: int
    crictl_bin: str = field(repr=False)

    @classmethod
    def from_env(cls, values: dict[str, str], index: int) -> "ClusterNode":
        p = f"NETCLAIM_NODE{index}_"
        return cls(index, values[p + "NAME"], values[p + "IP"], values[p + "DIR"], values[p + "CONTAINERD_ADDRESS"],
                   values[p + "SUBNET"], values[p + "BRIDGE"], values[p + "CNI_CONF"], int(values[p + "KUBELET_PORT"]),
                   values["NETCLAIM_CRICTL"])

    def crictl(self, *args: str, check: bool = True) -> str:
        env = {**os.environ, "CONTAINER_RUNTIME_ENDPOINT": f"unix://{self.containerd_address}"}
        return subprocess.run([self.crictl_bin, *args], env=env, capture_output=True, text=True, check=check,
                              timeout=60).stdout

    def sandbox(self, namespace: str, pod: str) -> dict[str, Any]:
        """The pod's ready sandbox on this node, as its containerd reports it."""
        ids = self.crictl("pods", "--namespace", namespace, "--name", f"^{pod}$", "--state", "ready", "-q").split()
        if len(ids) != 1:
            raise AssertionError(f"expected one ready sandbox for {namespace}/{pod} on {self.name}, crictl shows {ids}")
        return {"id": ids[0], **json.loads(self.crictl("inspectp", "-o", "json", ids[0]))}

    def sandbox_ids(self) -> set[str]:
        return set(self.crictl("pods", "--state", "ready", "-q").split())

    def container_pid(self, namespace: str, pod: str, container: str) -> int:
        """The host pid of a running container of a pod on this node."""
        ids = self.crictl("ps", "--namespace", namespace, "--pod", self.sandbox(namespace, pod)["id"],
                          "--name", f"^{container}$", "--state", "running", "-q").split()
        if len(ids) != 1:
            raise AssertionError(f"expected one running {container} in {namespace}/{pod}, crictl shows {ids}")
        return int(json.loads(self.crictl("inspect", "-o", "json", ids[0]))["info"]["pid"])

    def interface(self, namespace: str, pod: str, ifname: str = "eth0") -> NodeInterface:
        """An interface as the pod sees it, read inside its network namespace (entered by the sandbox's pid)."""
        pid = self.sandbox(namespace, pod)["info"]["pid"]
        out = subprocess.run(["nsenter", f"--net=/proc/{pid}/ns/net", "ip", "-j", "addr", "show", "dev", ifname],
                             capture_output=True, text=True, check=True, timeout=30).stdout
        (link,) = json.loads(out)
        cidrs = [f"{a['local']}/{a['prefixlen']}" for a in link.get("addr_info", []) if a.get("scope") == "global"]
        return NodeInterface(link["ifname"], link.get("address", "").lower(), cidrs)

    def in_pod_netns(self, namespace: str, pod: str, *cmd: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
        """Run a host command inside the pod's network namespace."""
        pid = self.sandbox(namespace, pod)["info"]["pid"]
        return subprocess.run(["nsenter", f"--net=/proc/{pid}/ns/net", *cmd], capture_output=True, text=True,
                              timeout=timeout)
