"""The containerd harness: a private runtime that runs real pod sandboxes.

Usage (tests, demo, benchmarks):

    with Harness() as h:
        h.start()
        sandbox = h.run_pod(PodMeta("web", "default", uid))
        iface = h.interface_in_netns(sandbox.netns, "eth0")

`close()` (also on exceptions through the context manager) stops and removes
every sandbox, stops containerd and the shims it spawned (found by pid, via
our socket path in their command line), detaches mounts under the base dir,
deletes the bridge and cgroups it created, and removes the base dir.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from . import pause_image
from .cni_conf import (
    Network,
    NetclaimInstall,
    base_conflist,
    delete_bridge,
    install_netclaim,
    link_reference_plugins,
    write_conflist,
)
from .containerd import Containerd, ContainerdPaths, require_binaries
from .cri import CriClient, PodMeta, SandboxInfo
from .jsonlog import log
from .mounts import detach_all

DEBIAN_PACKAGES = ("containerd", "runc", "containernetworking-plugins", "gcc", "libc6-dev", "iproute2")
ACTIVE_CONFLIST = "10-netclaim-e2e.conflist"


def ensure_packages() -> None:
    """Install the Debian packages the harness needs when one of them is missing."""
    try:
        require_binaries()
        if shutil.which("gcc") and Path("/usr/lib/cni/bridge").exists() and shutil.which("nsenter"):
            return
    except RuntimeError:
        pass
    log("packages.install", packages=list(DEBIAN_PACKAGES))
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(["apt-get", "update", "-qq"], check=True, env=env)
    subprocess.run(["apt-get", "install", "-y", "-qq", "--no-install-recommends", *DEBIAN_PACKAGES], check=True, env=env)


@dataclass(frozen=True)
class Interface:
    """An interface as seen from inside a pod's network namespace."""

    name: str
    mac: str
    cidrs: list[str]


class Harness:
    """Everything one private containerd needs, created under one temp dir."""

    def __init__(self, prefix: str = "nce2e", image_ref: str = pause_image.DEFAULT_IMAGE_REF) -> None:
        self.suffix = os.urandom(3).hex()
        self.base = Path(tempfile.mkdtemp(prefix=f"{prefix}-{self.suffix}-"))
        self.paths = ContainerdPaths(self.base)
        self.network = Network.pick(self.suffix, self.base / "ipam")
        self.cgroup_parent = f"/{prefix}-{self.suffix}"
        self.image_ref = image_ref
        self.containerd = Containerd(self.paths, image_ref)
        self.cri: CriClient | None = None
        self.active_conflist: dict | None = None
        self.last_run_seconds = 0.0
        log("harness.created", base=str(self.base), bridge=self.network.bridge, subnet=self.network.subnet)

    # ------------------------------------------------------------ lifecycle

    def __enter__(self) -> "Harness":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self, conflist: Path | None = None, timeout: float = 60.0) -> None:
        """Build the image, link the plugins, start containerd, import the image."""
        link_reference_plugins(self.paths.cni_bin_dir)
        first = conflist or self.stage_conflist("plain")
        self._install_active(first)
        archive = pause_image.build(self.base, self.image_ref)
        self.containerd.start()
        self.containerd.import_image(archive)
        self.cri = CriClient(self.paths.socket)
        log("harness.started", runtime=self.cri.version(), conflist=str(first))
        self.wait_for_conflist(timeout)

    def close(self) -> None:
        """Tear down in reverse order; each step runs even when the one before failed."""
        errors: list[str] = []
        if self.cri is not None and self.containerd.running:
            try:
                for sandbox_id in self.cri.list_sandboxes():
                    self._forget_sandbox(sandbox_id, errors)
            except Exception as exc:  # containerd may already be gone
                errors.append(f"list sandboxes: {exc}")
        if self.cri is not None:
            self.cri.close()
            self.cri = None
        for step, fn in (
            ("stop containerd", self.containerd.stop),
            ("detach mounts", self._detach_mounts),
            ("delete bridge", lambda: delete_bridge(self.network.bridge)),
            ("remove cgroups", self._remove_cgroups),
            ("remove base dir", self._remove_base),
        ):
            try:
                fn()
            except Exception as exc:
                errors.append(f"{step}: {exc}")
        log("harness.closed", base=str(self.base), errors=errors or None)
        if errors:
            raise RuntimeError("harness teardown incomplete: " + "; ".join(errors))

    def _forget_sandbox(self, sandbox_id: str, errors: list[str]) -> None:
        assert self.cri is not None
        for call in (self.cri.stop_pod_sandbox, self.cri.remove_pod_sandbox):
            try:
                call(sandbox_id)
            except Exception as exc:
                errors.append(f"{call.__name__} {sandbox_id[:12]}: {exc}")

    def _detach_mounts(self) -> None:
        left = detach_all(self.base)
        if left:
            raise RuntimeError(f"still mounted: {left}")

    def _remove_cgroups(self, timeout: float = 10.0) -> None:
        """rmdir our cgroup parent in every hierarchy, children first.

        A cgroup can only be removed once its processes are reaped; killed
        sandboxes may take a moment, hence the retry.
        """
        root = Path("/sys/fs/cgroup")
        name = self.cgroup_parent.strip("/")
        tops = [p for p in [root / name] + [d / name for d in root.iterdir() if d.is_dir()] if p.is_dir()]
        deadline = time.monotonic() + timeout
        while tops:
            for top in list(tops):
                dirs = sorted((d for d in top.rglob("*") if d.is_dir()), key=lambda d: len(d.parts), reverse=True)
                try:
                    for d in [*dirs, top]:
                        d.rmdir()
                    tops.remove(top)
                except OSError as exc:
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"cgroup {top} not removable: {exc}") from None
            time.sleep(0.1)

    def _remove_base(self) -> None:
        if detach_all(self.base):
            raise RuntimeError("mounts remain, not deleting " + str(self.base))
        shutil.rmtree(self.base)

    # ------------------------------------------------------------ CNI config

    def stage_conflist(self, name: str, netclaim: NetclaimInstall | None = None) -> Path:
        """Write a conflist outside containerd's conf dir; optionally install netclaim into it."""
        path = write_conflist(self.base / "conflists" / f"{name}.conflist", base_conflist(self.network))
        if netclaim is not None:
            install_netclaim(self.paths.cni_bin_dir, path, netclaim)
        return path

    def _install_active(self, conflist: Path) -> None:
        self.paths.cni_conf_dir.mkdir(parents=True, exist_ok=True)
        tmp = self.paths.cni_conf_dir / f".{ACTIVE_CONFLIST}.tmp"
        tmp.write_text(conflist.read_text())
        os.rename(tmp, self.paths.cni_conf_dir / ACTIVE_CONFLIST)  # containerd sees one complete file
        self.active_conflist = json.loads(conflist.read_text())

    def activate(self, conflist: Path, timeout: float = 30.0) -> None:
        """Make `conflist` the chain containerd runs, and wait until it has reloaded it."""
        self._install_active(conflist)
        self.wait_for_conflist(timeout)

    def wait_for_conflist(self, timeout: float) -> None:
        """containerd reloads its CNI config asynchronously (fsnotify); poll until it matches."""
        assert self.cri is not None and self.active_conflist is not None
        want = [p.get("type") for p in self.active_conflist["plugins"]]
        deadline = time.monotonic() + timeout
        loaded: list[str] = []
        while time.monotonic() < deadline:
            loaded = self._loaded_plugin_types()
            if loaded == want:
                return
            time.sleep(0.05)
        raise RuntimeError(f"containerd did not load the CNI chain {want} within {timeout}s (loaded {loaded})")

    def _loaded_plugin_types(self) -> list[str]:
        assert self.cri is not None
        for net in self.cri.loaded_cni_config().get("Networks") or []:
            config = net.get("Config") or {}
            if config.get("Name") == self.network.name:
                return [json.loads(p["Source"]).get("type") for p in config.get("Plugins") or []]
        return []

    # ------------------------------------------------------------ pods

    def run_pod(self, pod: PodMeta) -> SandboxInfo:
        assert self.cri is not None, "start() first"
        started = time.monotonic()
        sandbox_id = self.cri.run_pod_sandbox(pod, cgroup_parent=self.cgroup_parent)
        elapsed = time.monotonic() - started
        self.last_run_seconds = elapsed  # RunPodSandbox alone, for the benchmark
        info = self.cri.sandbox_status(sandbox_id)
        log("pod.sandbox_ready", pod=f"{pod.namespace}/{pod.name}", uid=pod.uid, containerID=sandbox_id,
            ips=info.ips, netns=info.netns, seconds=round(elapsed, 4))
        return info

    def stop_pod(self, sandbox_id: str) -> None:
        assert self.cri is not None
        self.cri.stop_pod_sandbox(sandbox_id)
        log("pod.sandbox_stopped", containerID=sandbox_id)

    def remove_pod(self, sandbox_id: str) -> None:
        assert self.cri is not None
        self.cri.remove_pod_sandbox(sandbox_id)
        log("pod.sandbox_removed", containerID=sandbox_id)

    @staticmethod
    def interface_in_netns(netns: str, ifname: str) -> Interface:
        """Read an interface from inside the pod's netns (what the pod itself sees)."""
        out = subprocess.run(
            ["nsenter", f"--net={netns}", "ip", "-j", "addr", "show", "dev", ifname],
            capture_output=True, text=True, check=True,
        ).stdout
        (link,) = json.loads(out)
        cidrs = [
            f"{a['local']}/{a['prefixlen']}"
            for a in link.get("addr_info", [])
            if a.get("scope") == "global"
        ]
        return Interface(name=link["ifname"], mac=link.get("address", "").lower(), cidrs=cidrs)
