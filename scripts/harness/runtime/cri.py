"""A small CRI RuntimeService (v1) client that asks for pod sandboxes the way kubelet does.

kubelet calls RunPodSandbox with the pod's metadata (name, namespace, uid,
attempt); containerd turns that into CNI_ARGS (K8S_POD_NAME, ...) for every
plugin of the chain, which is how netclaim learns which pod an attachment
belongs to. PodSandboxStatus(verbose) tells us the netns path and the IPs the
runtime recorded, so tests can compare them with what the API shows.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from cri_api.v1 import api_pb2, api_pb2_grpc


@dataclass(frozen=True)
class PodMeta:
    """What kubelet sends about a pod in PodSandboxMetadata."""

    name: str
    namespace: str
    uid: str
    attempt: int = 0


@dataclass
class SandboxInfo:
    """What the runtime reports about a sandbox."""

    id: str
    state: str
    ip: str
    additional_ips: list[str] = field(default_factory=list)
    netns: str = ""
    pid: int = 0

    @property
    def ips(self) -> list[str]:
        return [ip for ip in [self.ip, *self.additional_ips] if ip]


class CriClient:
    """gRPC stub over containerd's unix socket, with per-call deadlines."""

    def __init__(self, socket: Path, timeout: float = 60.0) -> None:
        self.timeout = timeout
        self.channel = grpc.insecure_channel(f"unix://{socket}")
        self.stub = api_pb2_grpc.RuntimeServiceStub(self.channel)

    def close(self) -> None:
        self.channel.close()

    def version(self) -> str:
        reply = self.stub.Version(api_pb2.VersionRequest(version="v1"), timeout=self.timeout)
        return f"{reply.runtime_name} {reply.runtime_version} (CRI {reply.runtime_api_version})"

    def network_ready(self) -> tuple[bool, str]:
        """NetworkReady condition: false until containerd has loaded a CNI config."""
        reply = self.stub.Status(api_pb2.StatusRequest(verbose=False), timeout=self.timeout)
        for cond in reply.status.conditions:
            if cond.type == "NetworkReady":
                return cond.status, f"{cond.reason}: {cond.message}"
        return False, "no NetworkReady condition"

    def loaded_cni_config(self) -> dict:
        """The CNI config containerd has loaded now (Status verbose info "cniconfig")."""
        reply = self.stub.Status(api_pb2.StatusRequest(verbose=True), timeout=self.timeout)
        raw = reply.info.get("cniconfig", "{}")
        return json.loads(raw)

    def run_pod_sandbox(self, pod: PodMeta, log_dir: Path | None = None, cgroup_parent: str = "") -> str:
        config = self.sandbox_config(pod, log_dir, cgroup_parent)
        reply = self.stub.RunPodSandbox(api_pb2.RunPodSandboxRequest(config=config), timeout=self.timeout)
        return reply.pod_sandbox_id

    @staticmethod
    def sandbox_config(pod: PodMeta, log_dir: Path | None, cgroup_parent: str) -> api_pb2.PodSandboxConfig:
        return api_pb2.PodSandboxConfig(
            metadata=api_pb2.PodSandboxMetadata(name=pod.name, namespace=pod.namespace, uid=pod.uid, attempt=pod.attempt),
            hostname=pod.name[:63],
            log_directory=str(log_dir) if log_dir else "",
            labels={
                "io.kubernetes.pod.name": pod.name,
                "io.kubernetes.pod.namespace": pod.namespace,
                "io.kubernetes.pod.uid": pod.uid,
            },
            annotations={"kubernetes.io/config.source": "api"},
            linux=api_pb2.LinuxPodSandboxConfig(cgroup_parent=cgroup_parent),
        )

    def sandbox_status(self, sandbox_id: str) -> SandboxInfo:
        reply = self.stub.PodSandboxStatus(
            api_pb2.PodSandboxStatusRequest(pod_sandbox_id=sandbox_id, verbose=True), timeout=self.timeout
        )
        status = reply.status
        info = json.loads(reply.info.get("info", "{}") or "{}")
        netns = ""
        for ns in info.get("runtimeSpec", {}).get("linux", {}).get("namespaces", []):
            if ns.get("type") == "network":
                netns = ns.get("path", "")
        return SandboxInfo(
            id=status.id,
            state=api_pb2.PodSandboxState.Name(status.state),
            ip=status.network.ip,
            additional_ips=[a.ip for a in status.network.additional_ips],
            netns=netns,
            pid=int(info.get("pid", 0) or 0),
        )

    def stop_pod_sandbox(self, sandbox_id: str) -> None:
        self.stub.StopPodSandbox(api_pb2.StopPodSandboxRequest(pod_sandbox_id=sandbox_id), timeout=self.timeout)

    def remove_pod_sandbox(self, sandbox_id: str) -> None:
        self.stub.RemovePodSandbox(api_pb2.RemovePodSandboxRequest(pod_sandbox_id=sandbox_id), timeout=self.timeout)

    def list_sandboxes(self) -> list[str]:
        reply = self.stub.ListPodSandbox(api_pb2.ListPodSandboxRequest(), timeout=self.timeout)
        return [item.id for item in reply.items]
