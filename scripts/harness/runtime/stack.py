"""The whole story on one machine: control plane, containerd with netclaim, publisher, a Node.

Used by the demo and the e2e benchmark. `down()` undoes `up()` in reverse
order, whatever step failed, and `save()`/`load()` let `demo.sh --keep` leave it
running and clean it up from a later process.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from .cluster import Cluster
from .cni_conf import NetclaimInstall, delete_bridge
from .controlplane import ControlPlaneHandle, api_client
from .controlplane import up as control_plane_up
from .harness import Harness
from .identity import publisher_kubeconfig
from .jsonlog import log
from .publisher import PublisherProcess

DRIVER = "demo.netclaim.example.com"


@dataclass
class Stack:
    prefix: str = "ncdemo"
    driver: str = DRIVER
    progress: Callable[[str], None] = lambda msg: None
    cp: ControlPlaneHandle | None = None
    harness: Harness | None = None
    publisher: PublisherProcess | None = None
    cluster: Cluster | None = None
    install: NetclaimInstall | None = None
    plain_conflist: Path | None = None
    netclaim_conflist: Path | None = None
    socket_dir: Path | None = None
    publisher_kubeconfig: str = ""
    _api: object = field(default=None, repr=False)

    def up(self) -> None:
        try:
            self._up()
        except BaseException:
            self.down()
            raise

    def _up(self) -> None:
        self.progress("starting the control plane (etcd + kube-apiserver)")
        self.cp = control_plane_up()
        self._api = api_client(self.cp.kubeconfig)

        self.progress("starting containerd with its own config, root, state and socket")
        self.harness = Harness(prefix=self.prefix)
        self.harness.start()

        self.progress("installing netclaim into containerd's CNI chain (scripts/install.sh)")
        netclaim_dir = self.harness.base / "netclaim"
        self.socket_dir = Path(f"/run/{self.prefix}-{self.harness.suffix}")
        self.socket_dir.mkdir(mode=0o700, exist_ok=True)
        self.install = NetclaimInstall(
            driver_name=self.driver,
            socket=self.socket_dir / "publisher.sock",
            spool_dir=netclaim_dir / "spool",
            state_dir=netclaim_dir / "state",
            log_file=netclaim_dir / "plugin.log",
            python=sys.executable,
        )
        self.plain_conflist = self.harness.stage_conflist("plain")
        self.netclaim_conflist = self.harness.stage_conflist("netclaim", self.install)
        self.harness.activate(self.netclaim_conflist)

        self.cluster = Cluster(self._api, self.driver, suffix=self.harness.suffix, prefix=self.prefix)
        self.progress(f"creating Node {self.cluster.node} and namespace {self.cluster.namespace}")
        self.cluster.setup()

        self.progress(
            "applying the shipped RBAC (conf/kubernetes) and minting a Node-bound token for "
            "serviceaccount netclaim-system/netclaim-publisher"
        )
        self.publisher_kubeconfig = publisher_kubeconfig(
            self._api, server=self.cp.server, ca_file=self.cp.ca_file, node=self.cluster.node,
            driver=self.driver, path=netclaim_dir / "publisher.kubeconfig",
        )

        self.progress("starting netclaim-publisher for the node (least-privilege node identity, not admin)")
        self.publisher = PublisherProcess(
            node_name=self.cluster.node,
            kubeconfig=self.publisher_kubeconfig,
            socket=self.install.socket,
            state_dir=self.install.state_dir,
            spool_dir=self.install.spool_dir,
            log_file=netclaim_dir / "publisher.log",
        )
        self.publisher.start()

    def down(self) -> None:
        """Reverse order; every step runs, errors are collected and raised at the end."""
        errors = []
        steps: list[tuple[str, Callable[[], None]]] = []
        if self.publisher is not None:
            steps.append(("stopping netclaim-publisher", self.publisher.stop))
        if self.cluster is not None:
            steps.append(("deleting the Node and namespace", self.cluster.teardown))
        if self.harness is not None:
            steps.append(("stopping containerd and removing its files", self.harness.close))
        if self.socket_dir is not None:
            steps.append(("removing the socket dir", lambda: shutil.rmtree(self.socket_dir, ignore_errors=True)))
        if self.cp is not None:
            steps.append(("stopping the control plane" if self.cp.started_here else "leaving the control plane running (it was up before)", self.cp.down))
        for text, fn in steps:
            self.progress(text)
            try:
                fn()
            except Exception as exc:
                errors.append(f"{text}: {exc}")
        if errors:
            raise RuntimeError("; ".join(errors))

    # ------------------------------------------------------------ --keep

    def save(self, path: Path) -> None:
        """What a later `cleanup` needs to find everything we leave running."""
        assert self.harness and self.publisher and self.cluster and self.cp
        state = {
            "base": str(self.harness.base),
            "bridge": self.harness.network.bridge,
            "cgroup_parent": self.harness.cgroup_parent,
            "containerd_pid": self.harness.containerd.proc.pid if self.harness.containerd.proc else 0,
            "containerd_socket": str(self.harness.paths.socket),
            "publisher_pid": self.publisher.proc.pid if self.publisher.proc else 0,
            "socket_dir": str(self.socket_dir),
            "namespace": self.cluster.namespace,
            "node": self.cluster.node,
            "kubeconfig": self.cp.kubeconfig,
            "control_plane_started_here": self.cp.started_here,
        }
        path.write_text(json.dumps(state, indent=2) + "\n")


def cleanup_saved(path: Path, progress: Callable[[str], None]) -> None:
    """Tear down what `demo.sh --keep` left running, from its state file."""
    from .cluster import Cluster as _Cluster
    from .containerd import Containerd, ContainerdPaths
    from .controlplane import _run
    from .cri import CriClient
    from .mounts import detach_all

    state = json.loads(path.read_text())
    _stop_pid(state["publisher_pid"], progress, "netclaim-publisher")
    base = Path(state["base"])
    if Path(state["containerd_socket"]).exists() and _alive(state["containerd_pid"]):
        progress("stopping and removing pod sandboxes")
        cri = CriClient(Path(state["containerd_socket"]))
        for sandbox_id in cri.list_sandboxes():
            cri.stop_pod_sandbox(sandbox_id)
            cri.remove_pod_sandbox(sandbox_id)
        cri.close()
    _stop_pid(state["containerd_pid"], progress, "containerd")
    shims = Containerd(ContainerdPaths(base), "")
    from .containerd import kill_tree

    for pid in shims.shim_pids():
        kill_tree(pid)
    progress("detaching mounts, deleting the bridge and the files")
    left = detach_all(base)
    delete_bridge(state["bridge"])
    for top in Path("/sys/fs/cgroup").glob("*/" + state["cgroup_parent"].strip("/")):
        for d in sorted((d for d in top.rglob("*") if d.is_dir()), key=lambda d: len(d.parts), reverse=True):
            d.rmdir()
        top.rmdir()
    if not left:
        shutil.rmtree(base, ignore_errors=True)
    shutil.rmtree(state["socket_dir"], ignore_errors=True)
    try:
        cluster = _Cluster(api_client(state["kubeconfig"]), DRIVER, "x")
        cluster.namespace, cluster.node = state["namespace"], state["node"]
        progress(f"deleting Node {cluster.node} and namespace {cluster.namespace}")
        cluster.teardown()
    except Exception as exc:  # the control plane may be gone already
        log("cleanup.api_skipped", error=str(exc))
    if state["control_plane_started_here"]:
        progress("stopping the control plane")
        _run("down", env=dict(os.environ))
    path.unlink()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def _stop_pid(pid: int, progress: Callable[[str], None], what: str) -> None:
    if not pid or not _alive(pid):
        return
    progress(f"stopping {what} (pid {pid})")
    os.kill(pid, signal.SIGTERM)
    for _ in range(150):
        if not _alive(pid):
            return
        time.sleep(0.1)
    os.kill(pid, signal.SIGKILL)
