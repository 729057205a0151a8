"""The endpoints controller as a subprocess (`netclaim-publisher endpoints`) and the objects a scheduler, a
network driver and a user would leave for it: claims with entries, pods, an annotated Service."""

from __future__ import annotations

import json
import signal
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes import client
from publisher_testkit import BIN, DRIVER, Cluster

SLICE_MANAGER = "endpointslice.kubernetes.io/managed-by=netclaim"


@dataclass
class Controller:
    """One `netclaim-publisher endpoints` process, its log in `workdir`."""

    kubeconfig: str
    namespace: str
    workdir: Path
    identity: str
    extra: list[str] = field(default_factory=list)
    proc: subprocess.Popen | None = None

    @property
    def log_path(self) -> Path:
        return self.workdir / f"endpoints-{self.identity}.log"

    def start(self) -> "Controller":
        cmd = [str(BIN / "netclaim-publisher"), "endpoints", "--kubeconfig", self.kubeconfig,
               "--namespace", self.namespace, "--lease-namespace", self.namespace, "--identity", self.identity,
               *self.extra]
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=log)
        return self

    def messages(self) -> list[str]:
        out = []
        for line in self.log_path.read_text(errors="replace").splitlines() if self.log_path.exists() else []:
            try:
                out.append(json.loads(line).get("msg", ""))
            except ValueError:
                out.append(line)
        return out

    def signal(self, signo: int) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signo)
            self.proc.wait(20)

    def kill(self) -> None:
        self.signal(signal.SIGKILL)





def entry(device: str, ips: list[str], ready: bool = True, pool: str = "node-a") -> dict[str, Any]:
    """A status.devices entry as netclaim's publisher writes it."""
    return {"driver": DRIVER, "pool": pool, "device": device,
            "networkData": {"interfaceName": "net1", "ips": ips, "hardwareAddress": "02:00:00:00:00:01"},
            "conditions": [{"type": "Ready", "status": "True" if ready else "False",
                            "reason": "Configured" if ready else "LinkDown", "message": "",
                            "lastTransitionTime": "2026-12-06T07:00:00Z"}]}


def write_entries(cluster: Cluster, claim: str, entries: list[dict[str, Any]]) -> None:
    cluster.resource.patch_namespaced_resource_claim_status(
        claim, cluster.namespace,
        {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
         "metadata": {"name": claim, "namespace": cluster.namespace}, "status": {"devices": entries}},
        field_manager="netclaim/node-a", _content_type="application/apply-patch+yaml")


def server_pod(cluster: Cluster, name: str, ips: list[str], ready: bool = True,
               labels: dict[str, str] | None = None) -> str:
    """A pod with a claim of two devices (eth0's `nic`, net1's `macvlan`), both with entries; its UID."""
    claim, uid = cluster.pod_with_claim(name, [("nic", f"eth-{name}"), ("macvlan", f"mv-{name}")])
    cluster.core.patch_namespaced_pod(name, cluster.namespace, {"metadata": {"labels": labels or {"app": "web"}}})
    write_entries(cluster, claim, [entry(f"eth-{name}", ["10.244.0.9/24"]), entry(f"mv-{name}", ips, ready)])
    return uid


def annotated_service(cluster: Cluster, name: str = "web", selector: str = "app=web",
                      family: str = "") -> dict[str, Any]:
    # the documented names (docs/multi-network.md), spelled out: they are the users' contract
    annotations = {"netclaim.dev/endpoints-selector": selector, "netclaim.dev/endpoints-driver": DRIVER,
                   "netclaim.dev/endpoints-request": "macvlan"}
    if family:
        annotations["netclaim.dev/endpoints-family"] = family
    body = {"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": name, "annotations": annotations},
            "spec": {"clusterIP": "None",
                     "ports": [{"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP"}]}}
    return client.CoreV1Api(cluster.api).create_namespaced_service(cluster.namespace, body).to_dict()


def endpoint_slices(cluster: Cluster, service: str = "web") -> dict[str, dict[str, Any]]:
    """Our slices of the Service by name, as JSON."""
    resp = client.DiscoveryV1Api(cluster.api).list_namespaced_endpoint_slice(
        cluster.namespace, label_selector=f"{SLICE_MANAGER},kubernetes.io/service-name={service}",
        _preload_content=False)
    return {s["metadata"]["name"]: s for s in json.loads(resp.data)["items"]}


def endpoints_by_pod(cluster: Cluster, service: str = "web") -> dict[str, dict[str, Any]]:
    return {ep["targetRef"]["name"]: ep for s in endpoint_slices(cluster, service).values()
            for ep in s.get("endpoints") or []}
