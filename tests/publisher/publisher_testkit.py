"""Builders and clients for publisher tests: cluster objects as the scheduler would leave
them, a running publisher subprocess, and the real plugin as the event source.

The lead may move the builders to a shared place later; they depend only on an
admin kubernetes ApiClient.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from cni_plugin.wire.event import Event, PodRef
from cni_plugin.wire.frame import encode_frame, event_request, read_frame

REPO = Path(__file__).resolve().parents[2]
if str(REPO / "scripts" / "harness") not in sys.path:  # as tests/conftest.py: appended, never shadowing
    sys.path.append(str(REPO / "scripts" / "harness"))
from runtime.dataschema import check_status, planted  # noqa: E402  every status read is held to data's schema
BIN = Path(sys.executable).parent
DRIVER = "net.example.com"
DEVICE_CLASS = "netclaim-publisher-test"
MERGE = "application/merge-patch+json"
# The sandbox path of events whose interface no test looks at: a directory the publisher never sees a netns in,
# so the live watch leaves the entry as the ADD said (a missing path there proves no sandbox gone).
NO_NETNS = "/var/run/netns-not-mounted/none"


def suffix() -> str:
    return uuid.uuid4().hex[:6]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ignore_exists(fn: Any, *args: Any) -> None:
    try:
        fn(*args)
    except ApiException as exc:
        if exc.status != 409:
            raise


# ---------------------------------------------------------------- cluster objects


@dataclass
class Cluster:
    """Objects in one test namespace, created as the scheduler/user would."""

    api: Any
    namespace: str
    node: str = "node-a"

    def __post_init__(self) -> None:
        self.core = client.CoreV1Api(self.api)
        self.resource = client.ResourceV1Api(self.api)

    def setup(self) -> "Cluster":
        self.core.create_namespace({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": self.namespace}})
        _ignore_exists(self.core.create_node, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": self.node}})
        _ignore_exists(self.resource.create_device_class, {
            "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": DEVICE_CLASS},
            "spec": {"selectors": [{"cel": {"expression": f"device.driver == '{DRIVER}'"}}]}})
        return self

    def teardown(self) -> None:
        try:
            self.core.delete_namespace(self.namespace)
        except ApiException:
            pass

    def claim(self, name: str, requests: tuple[str, ...] = ("nic",)) -> dict[str, Any]:
        body = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": name},
                "spec": {"devices": {"requests": [{"name": r, "exactly": {"deviceClassName": DEVICE_CLASS}}
                                                  for r in requests]}}}
        return self.resource.create_namespaced_resource_claim(self.namespace, body).to_dict()

    def pod(self, name: str, claims: list[str]) -> str:
        """A pod bound to our node that references the claims by name; returns its UID."""
        body = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
                "spec": {"nodeName": self.node,
                         "containers": [{"name": "c", "image": "local/pause:1",
                                         "resources": {"claims": [{"name": f"c{i}"} for i in range(len(claims))]}}],
                         "resourceClaims": [{"name": f"c{i}", "resourceClaimName": c} for i, c in enumerate(claims)]}}
        return self.core.create_namespaced_pod(self.namespace, body).metadata.uid

    def allocate(self, claim: str, devices: list[tuple[str, str]], pod: str | None = None, pod_uid: str = "",
                 node: str | None = None, pool: str | None = None) -> None:
        """Write status.allocation (+ reservedFor) as the scheduler would: devices = [(request, device)]."""
        node = node or self.node
        status: dict[str, Any] = {"allocation": {
            "devices": {"results": [{"request": r, "driver": DRIVER, "pool": pool or node, "device": d}
                                    for r, d in devices]},
            "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                {"key": "metadata.name", "operator": "In", "values": [node]}]}]}}}
        if pod:
            status["reservedFor"] = [{"resource": "pods", "name": pod, "uid": pod_uid}]
        self.resource.patch_namespaced_resource_claim_status(claim, self.namespace, {"status": status},
                                                              _content_type=MERGE)

    def pod_with_claim(self, name: str, devices: list[tuple[str, str]], claim: str | None = None) -> tuple[str, str]:
        """Claim + pod + allocation in one go; returns (claim name, pod uid)."""
        claim = claim or f"{name}-net"
        self.claim(claim, tuple(dict.fromkeys(r for r, _ in devices)))
        uid = self.pod(name, [claim])
        self.allocate(claim, devices, name, uid)
        return claim, uid

    def claim_status(self, claim: str) -> dict[str, Any]:
        obj = self.resource.read_namespaced_resource_claim(claim, self.namespace, _preload_content=False)
        return check_status(json.loads(obj.data).get("status") or {})

    def devices(self, claim: str) -> list[dict[str, Any]]:
        return self.claim_status(claim).get("devices") or []

    def warnings(self, controller: str = "netclaim.dev/publisher") -> list[dict[str, Any]]:
        """events.k8s.io/v1 Events of the namespace that `controller` reported, as JSON dicts."""
        resp = client.EventsV1Api(self.api).list_namespaced_event(self.namespace, _preload_content=False)
        return [e for e in json.loads(resp.data)["items"] if e.get("reportingController") == controller]

    def wait_warnings(self, predicate: Any, timeout: float = 20.0) -> list[dict[str, Any]]:
        deadline = time.time() + timeout
        events: list[dict[str, Any]] = []
        while time.time() < deadline:
            events = self.warnings()
            if predicate(events):
                return events
            time.sleep(0.1)
        raise AssertionError(f"events in {self.namespace} never matched; last: {events}")

    def wait_devices(self, claim: str, predicate: Any, timeout: float = 30.0) -> list[dict[str, Any]]:
        deadline = time.time() + timeout
        devices: list[dict[str, Any]] = []
        while time.time() < deadline:
            devices = self.devices(claim)
            if predicate(devices):
                return devices
            time.sleep(0.1)
        raise AssertionError(f"claim {self.namespace}/{claim} never matched; last devices: {devices}")


# ---------------------------------------------------------------- the publisher process


@dataclass
class Publisher:
    """`netclaim-publisher run` as a subprocess, with its own socket, state and spool dirs."""

    kubeconfig: str
    workdir: Path
    node: str = "node-a"
    extra: list[str] = field(default_factory=list)
    proc: subprocess.Popen | None = None
    port: int = 0
    prefix: list[str] = field(default_factory=list)  # e.g. in_boot(): run as if in another boot

    @property
    def socket(self) -> str:
        return str(self.workdir / "run" / "publisher.sock")

    @property
    def spool(self) -> str:
        return str(self.workdir / "spool")

    @property
    def state(self) -> str:
        return str(self.workdir / "state")

    @property
    def log_path(self) -> Path:
        return self.workdir / "publisher.log"

    def start(self, wait: bool = True) -> "Publisher":
        self.port = free_port()
        cmd = [*self.prefix, str(BIN / "netclaim-publisher"), "run", "--node-name", self.node, "--kubeconfig", self.kubeconfig,
               "--socket", self.socket, "--state-dir", self.state, "--spool-dir", self.spool,
               "--metrics-address", f"127.0.0.1:{self.port}", *self.extra]
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(cmd, stdout=log, stderr=log)
        log.close()
        if wait:
            self.wait_ready()
        return self

    def wait_ready(self, timeout: float = 30.0) -> None:
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc and self.proc.poll() is not None:
                raise AssertionError(f"publisher exited {self.proc.returncode}:\n{self.logs()[-3000:]}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/readyz", timeout=1) as r:
                    if r.status == 200 and os.path.exists(self.socket):
                        return
            except OSError:
                pass
            time.sleep(0.1)
        raise AssertionError(f"publisher not ready after {timeout}s:\n{self.logs()[-3000:]}")

    def logs(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def log_events(self) -> list[dict[str, Any]]:
        out = []
        for line in self.logs().splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                pass
        return out

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.kill()

    def metrics(self) -> dict[str, float]:
        """Sample name{labels} -> value from /metrics."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=5) as r:
            text = r.read().decode()
        out: dict[str, float] = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name, _, value = line.rpartition(" ")
                out[name] = float(value)
        return out

    def metric(self, prefix: str) -> float:
        return sum(v for k, v in self.metrics().items() if k.startswith(prefix))

    def status(self, brief: bool = False) -> dict[str, Any]:
        """The publisher's status; `brief`: only the counters (journal, spool, dirty claims, resync)."""
        return request(self.socket, {"kind": "status", "brief": brief})["status"]


UNREACHABLE_KUBECONFIG = """apiVersion: v1
kind: Config
clusters:
- name: unreachable
  cluster: {server: "https://127.0.0.1:9"}
users:
- name: u
  user: {token: not-a-real-token}
contexts:
- name: c
  context: {cluster: unreachable, user: u}
current-context: c
"""


def unreachable_kubeconfig(workdir: Path) -> Path:
    """A kubeconfig whose API server never answers: for publishers tested without one."""
    path = workdir / "unreachable.kubeconfig"
    path.write_text(UNREACHABLE_KUBECONFIG)
    return path


def in_boot(workdir: Path, boot_id: str) -> list[str]:
    """A command prefix that runs a program as if the node were in boot `boot_id`.

    The program gets a mount namespace of its own in which the kernel's boot id file
    is replaced by one naming `boot_id` (bind mount): the publisher and the plugin
    read nothing else to tell boots apart. Needs root (the suite runs as root).
    The namespace is the host's slave, as a DaemonSet's HostToContainer mount is: a
    netns the test makes later (a bind mount under /run/netns) shows up in it, so the
    live-interface watch of a publisher started in this boot can enter it.
    """
    share_netns_dir()
    boot_file = workdir / f"boot_id-{boot_id}"
    boot_file.write_text(boot_id + "\n")
    script = f'mount --bind {boot_file} /proc/sys/kernel/random/boot_id && exec "$@"'
    return ["unshare", "--mount", "--propagation", "slave", "sh", "-c", script, "sh"]


def share_netns_dir() -> None:
    """/run/netns as a shared mount, the way `ip netns add` leaves it (idempotent).

    A slave mount namespace made before the directory was a mount point of its own
    would not receive the netns bind mounts made in it later."""
    netns_dir = "/run/netns"
    os.makedirs(netns_dir, exist_ok=True)
    if subprocess.run(["mountpoint", "-q", netns_dir], check=False).returncode != 0:
        subprocess.run(["mount", "--bind", netns_dir, netns_dir], check=True)
    subprocess.run(["mount", "--make-shared", netns_dir], check=True)


def request(path: str, message: dict[str, Any], timeout: float = 10.0) -> dict[str, Any]:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        sock.connect(path)
        sock.sendall(encode_frame(message))
        return read_frame(sock)


def wire_event(op: str, container_id: str, pod: PodRef | None, result: dict | None = None, ifname: str = "eth0",
               request_name: str = "nic", network: str = "testnet", **kw: Any) -> Event:
    return Event(op=op, container_id=container_id, ifname=ifname, driver=DRIVER, network=network,
                 request=request_name, pod=pod, result=result, cni_version="1.1.0", **kw)


# ---------------------------------------------------------------- the real plugin


def cni_result(ifname: str = "eth0", ipv4: str = "10.77.0.5/24", ipv6: str | None = "fd00:77::5/64",
               mac: str = "0a:58:0a:4d:00:05") -> dict[str, Any]:
    """A 1.1.0 result as bridge + host-local leave it (host side + sandbox side)."""
    ips = [{"address": ipv4, "gateway": ipv4.split("/")[0].rsplit(".", 1)[0] + ".1", "interface": 2}]
    if ipv6:
        ips.append({"address": ipv6, "interface": 2})
    return {"cniVersion": "1.1.0",
            "interfaces": [{"name": "br-x", "mac": "aa:aa:aa:aa:aa:01"},
                           {"name": "vethx", "mac": "aa:aa:aa:aa:aa:02"},
                           {"name": ifname, "mac": mac, "mtu": 1500, "sandbox": NO_NETNS}],
            "ips": ips, "routes": [], "dns": {}}


@dataclass
class Plugin:
    """Runs the REAL netclaim binary exactly as a runtime does (env + stdin)."""

    socket: str
    spool: str
    workdir: Path
    request: str = "nic"
    network: str = "testnet"

    def conf(self, prev_result: dict | None, request_name: str | None = None) -> dict[str, Any]:
        conf: dict[str, Any] = {
            "cniVersion": "1.1.0", "name": self.network, "type": "netclaim", "driverName": DRIVER,
            "request": self.request if request_name is None else request_name,
            "socketPath": self.socket, "spoolDir": self.spool,
            "stateDir": str(self.workdir / "plugin-state"), "logFile": str(self.workdir / "plugin.log"),
        }
        if prev_result is not None:
            conf["prevResult"] = prev_result
        return conf

    def run(self, command: str, container_id: str, pod: PodRef | None, prev_result: dict | None = None,
            ifname: str = "eth0", netns: str = "", request_name: str | None = None,
            conf: dict | None = None) -> subprocess.CompletedProcess:
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "CNI_COMMAND": command,
               "CNI_CONTAINERID": container_id, "CNI_NETNS": netns, "CNI_IFNAME": ifname,
               "CNI_PATH": "/usr/lib/cni"}
        if pod is not None:
            env["CNI_ARGS"] = (f"IgnoreUnknown=1;K8S_POD_NAMESPACE={pod.namespace};K8S_POD_NAME={pod.name};"
                               f"K8S_POD_INFRA_CONTAINER_ID={container_id};K8S_POD_UID={pod.uid}")
        stdin = json.dumps(conf or self.conf(prev_result, request_name))
        return subprocess.run([str(BIN / "netclaim")], input=stdin, env=env, capture_output=True, text=True,
                              timeout=60)


# ---------------------------------------------------------------- scenarios


def add(plugin: Plugin, cid: str, pod: PodRef, **kw: Any) -> None:
    """The real plugin's ADD, with a prevResult that already carries the MAC (no netns needed)."""
    out = plugin.run("ADD", cid, pod, kw.pop("prev", None) or cni_result(**kw.pop("res", {})),
                     netns=NO_NETNS, **kw)
    assert out.returncode == 0, f"plugin ADD failed: {out.stdout} {out.stderr}"


def wait_until(what: str, probe: Callable[[], Any], timeout: float = 60.0) -> Any:
    """Poll `probe` until it returns something true (no timed assertion: the timeout is generous)."""
    deadline = time.monotonic() + timeout
    value = None
    while time.monotonic() < deadline:
        value = probe()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"{what}: never true; last {value!r}")


def drained(publisher: Publisher, timeout: float = 30.0) -> dict[str, Any]:
    """Wait until the publisher is quiescent: no pending event, no spool file, no claim left to reconcile."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        st = publisher.status()
        if st["quiescent"]:
            # Every event is handled, so every claim the journal knows has a state: a "pending"
            # one here is a status snapshot that raced a reconcile (seen once in CI).
            pending = [k for k, v in st["claims"].items() if v["state"] == "pending"]
            assert not pending, f"quiescent, yet claims shown as pending: {pending}"
            return st
        time.sleep(0.1)
    raise AssertionError(f"publisher not quiescent: {publisher.status()}")


def resynced(publisher: Publisher, timeout: float = 30.0) -> dict[str, Any]:
    """Quiescent, and a whole resync pass ran after this call (needs a short --resync-interval)."""
    since = time.time()
    deadline = since + timeout
    while time.time() < deadline:
        st = publisher.status()
        if st["quiescent"] and (st["last_resync"] or 0) > since:
            return st
        time.sleep(0.1)
    raise AssertionError(f"no resync after {timeout}s: {publisher.status()}")


def apply_as(cluster: Cluster, claim: str, manager: str, devices: list[dict[str, Any]]) -> None:
    """Server-side apply of status.devices as another field manager (another driver or node).
    What it writes is the test's own, not netclaim's: the schema check of reads leaves it be."""
    for device in devices:
        if "data" in device:
            planted(device["data"])
    cluster.resource.patch_namespaced_resource_claim_status(
        claim, cluster.namespace,
        {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
         "metadata": {"name": claim, "namespace": cluster.namespace}, "status": {"devices": devices}},
        field_manager=manager, _content_type="application/apply-patch+yaml")


def reallocate_elsewhere(cluster: Cluster, claim: str, pod: str, uid: str, device: str = "nic9") -> None:
    """Deallocate and allocate again with another device (as after a reschedule): the
    publisher's recorded entry still names the old device, which the API now refuses (422)."""
    cluster.resource.patch_namespaced_resource_claim_status(
        claim, cluster.namespace, {"status": {"reservedFor": None, "allocation": None}}, _content_type=MERGE)
    cluster.allocate(claim, [("nic", device)], pod, uid)


def take_interface_name(cluster: Cluster, claim: str, device: str = "nic0") -> None:
    """Another manager takes our entry's interfaceName (force): our next apply that differs
    is refused with 409 Conflict, since the publisher never forces."""
    cluster.resource.patch_namespaced_resource_claim_status(
        claim, cluster.namespace,
        {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
         "metadata": {"name": claim, "namespace": cluster.namespace},
         "status": {"devices": [{"driver": DRIVER, "pool": cluster.node, "device": device,
                                 "networkData": {"interfaceName": "taken0"}}]}},
        field_manager="someone-else", force=True, _content_type="application/apply-patch+yaml")


def send_check(publisher: Publisher, cid: str, pod: PodRef, check_error: str = "mtu differs") -> None:
    """A CHECK that found drift: it re-applies the attachment's entry."""
    ev = wire_event("CHECK", cid, pod, cni_result(), check_error=check_error)
    assert request(publisher.socket, event_request(ev))["ok"] is True
