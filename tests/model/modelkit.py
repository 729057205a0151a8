"""The node, the cluster and the expected claim status for the publisher's model test.

`Node` drives real parts only: the real netclaim plugin executable (env + stdin
with a prevResult, as a runtime runs a conflist) against real network
namespaces with a veth each (the plugin reads the MAC and MTU back from the
netns), the real `netclaim-publisher run` process (SIGKILLed and restarted with
its journal dir kept), a real TCP proxy in front of the real kube-apiserver
(cut = connections reset and refused), the real API server stopped and started,
and the publisher's credentials: a kubeconfig with a `tokenFile` holding a
service-account token bound to a Pod of the shipped identity, rotated by
minting a token bound to a new Pod and deleting the old one (the old token
then gets 401).

`Model` is what the node did, in the order it did it; `expected_devices` is the
invariant: a claim's netclaim entries are exactly the attachments
the publisher was told about (ADD not followed by a DEL or a GC that did not list
it), on devices allocated to this node, whose pod exists and is in the claim's
reservedFor, with the data of the latest sandbox of that pod.
"""

from __future__ import annotations

import json
import os
import selectors
import socket
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

from kubernetes import client
from kubernetes.client.exceptions import ApiException

REPO = Path(__file__).resolve().parents[2]
# Appended, never prepended: scripts/harness/runtime has a publisher.py that must not shadow the package.
sys.path.append(str(REPO / "scripts" / "harness" / "runtime"))
sys.path.append(str(REPO / "tests" / "publisher"))
import identity  # noqa: E402  (scripts/harness/runtime/identity.py: the shipped node identity)
from publisher_testkit import Publisher  # noqa: E402  (tests/publisher: the publisher subprocess)
from runtime.dataschema import check_entries  # noqa: E402  (put on the path by publisher_testkit)

BIN = Path(sys.executable).parent
DRIVER = "net.example.com"
NODE = "node-a"
OTHER_NODE = "node-b"
MERGE = "application/merge-patch+json"
# ifname -> (network name, request name): two networks in the conflist dir, one request each.
NETWORKS = {"eth0": ("neta", "a"), "net1": ("netb", "b")}
CLAIMS = {"ca": "a", "cb": "b"}  # claim base name -> its one request
RESYNC_INTERVAL = 0.3
QUIESCE_TIMEOUT = 60.0


def run(*cmd: str, check: bool = True, input: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(list(cmd), capture_output=True, text=True, check=check, input=input, timeout=60)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---------------------------------------------------------------- a real TCP proxy


class Proxy:
    """Plain TCP relay 127.0.0.1:port -> the API server; `cut` resets every connection and
    refuses new ones until `restore` (what a network partition looks like to a client)."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.port = free_port()
        self.listener: socket.socket | None = None
        self.conns: set[socket.socket] = set()
        self.lock = threading.Lock()
        self.stopping = False

    def start(self) -> "Proxy":
        ls = socket.socket()
        ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        ls.bind(("127.0.0.1", self.port))
        ls.listen(64)
        self.listener = ls
        threading.Thread(target=self._accept, args=(ls,), daemon=True).start()
        return self

    @property
    def up(self) -> bool:
        return self.listener is not None

    def _accept(self, ls: socket.socket) -> None:
        while True:
            try:
                conn, _ = ls.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.upstream, timeout=5)
            except OSError:
                conn.close()
                continue
            with self.lock:
                self.conns |= {conn, upstream}
            threading.Thread(target=self._pump, args=(conn, upstream), daemon=True).start()

    def _pump(self, a: socket.socket, b: socket.socket) -> None:
        sel = selectors.DefaultSelector()
        sel.register(a, selectors.EVENT_READ, b)
        sel.register(b, selectors.EVENT_READ, a)
        try:
            while True:
                for key, _ in sel.select():
                    data = key.fileobj.recv(65536)  # type: ignore[union-attr]
                    if not data:
                        return
                    key.data.sendall(data)
        except OSError:
            return
        finally:
            sel.close()
            with self.lock:
                self.conns -= {a, b}
            for s in (a, b):
                s.close()

    def cut(self) -> None:
        if self.listener:
            try:  # wakes the accept() thread; close() alone leaves the port listening
                self.listener.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            self.listener.close()
            self.listener = None
        with self.lock:
            conns = list(self.conns)
        for s in conns:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def restore(self) -> None:
        if not self.listener:
            self.start()


# ---------------------------------------------------------------- the publisher process


class PublisherProc(Publisher):
    """`netclaim-publisher run` (the publisher tests' runner) with the model test's flags; its
    state dir is kept across SIGKILLs. Starts without waiting for /readyz: it may be started
    while the API is cut, and the model only needs its socket."""

    def __init__(self, workdir: Path, kubeconfig: str) -> None:
        super().__init__(kubeconfig, workdir, node=NODE, extra=[
            "--resync-interval", str(RESYNC_INTERVAL), "--retry-max-delay", "1", "--workers", "2",
            "--no-emit-events", *spool_interval_flag()])

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self, wait: bool = True) -> "PublisherProc":
        super().start(wait=False)
        deadline = time.time() + 60
        while time.time() < deadline:
            if not self.running:
                raise AssertionError(f"publisher exited: {self.log_tail()}")
            if os.path.exists(self.socket) and self.metric("netclaim_") is not None:
                return self
            time.sleep(0.05)
        raise AssertionError(f"publisher did not come up: {self.log_tail()}")

    def log_tail(self, n: int = 4000) -> str:
        return self.logs()[-n:]

    def metric(self, prefix: str) -> float | None:  # type: ignore[override]
        try:
            return super().metric(prefix)
        except OSError:
            return None

    def status(self) -> dict[str, Any] | None:  # type: ignore[override]
        try:
            return super().status()
        except (OSError, EOFError, ValueError, KeyError):
            return None

    def spooled(self) -> list[str]:
        try:
            return sorted(n for n in os.listdir(self.spool) if n.endswith(".event.json"))
        except FileNotFoundError:
            return []

    @property
    def journal_db(self) -> Path:
        return Path(self.state) / "journal.db"

    def log_size(self) -> int:
        try:
            return self.log_path.stat().st_size
        except FileNotFoundError:
            return 0

    def crashed_since(self, offset: int) -> set[str]:
        """The threads whose crash the supervisor logged after byte `offset` of the log."""
        try:
            with open(self.log_path, "rb") as fh:
                fh.seek(offset)
                text = fh.read().decode(errors="replace")
        except FileNotFoundError:
            return set()
        crashed = set()
        for line in text.splitlines():
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if event.get("msg") == "thread crashed, restarting":
                crashed.add(str(event.get("component")))
        return crashed

    def quiescent(self) -> bool:
        """Journal, spool, dirty claims and the live watch's reads and writes all done."""
        return bool((self.status() or {}).get("quiescent"))


_SPOOL_FLAG: list[list[str]] = []


def spool_interval_flag() -> list[str]:
    """`--spool-interval 0.2` when this publisher has the flag (it reads the spool every 5 s by default)."""
    if not _SPOOL_FLAG:
        out = run(str(BIN / "netclaim-publisher"), "run", "--help", check=False)
        _SPOOL_FLAG.append(["--spool-interval", "0.2"] if "--spool-interval" in out.stdout else [])
    return _SPOOL_FLAG[0]


# ---------------------------------------------------------------- another process on the journal

HOLDER = """
import sqlite3, sys
db = sqlite3.connect(sys.argv[1], timeout=60, isolation_level=None)
db.execute("BEGIN IMMEDIATE")
print("locked", flush=True)
sys.stdin.read()  # until the test closes our stdin (or dies)
db.execute("ROLLBACK")
"""


class JournalLock:
    """Another process (a backup tool, an sqlite3 shell) holds the journal's SQLite write lock
    (BEGIN IMMEDIATE) from `with` until the block ends: every journal write of the publisher
    waits SQLite's busy timeout and then fails. Released by closing the holder's stdin, so a
    step holds it exactly as long as it needs (the soak and the publisher tests hold it for a
    fixed time)."""

    def __init__(self, db: Path) -> None:
        self.db = db
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> Self:
        self.proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(self.db)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        first = self.proc.stdout.readline().strip()
        if first != "locked":
            self.__exit__()
            raise AssertionError(f"the journal's write lock was not taken: {first!r}")
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc is None:
            return
        try:
            self.proc.communicate(input="", timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()  # the lock goes with the process
            self.proc.wait(10)
        self.proc = None


# ---------------------------------------------------------------- credentials


@dataclass
class Credentials:
    """A tokenFile kubeconfig whose token is bound to a Pod of the shipped identity."""

    api: client.ApiClient
    workdir: Path
    server: str
    ca_file: str
    generation: int = 0
    pod: dict[str, str] = field(default_factory=dict)
    token: str = ""

    @property
    def token_file(self) -> Path:
        return self.workdir / "token"

    @property
    def kubeconfig(self) -> str:
        return str(self.workdir / "publisher.kubeconfig")

    def setup(self) -> "Credentials":
        identity.apply_shipped_rbac(self.api, DRIVER)
        identity.ensure_node(self.api, NODE)
        self._mint()
        text = json.dumps({
            "apiVersion": "v1", "kind": "Config",
            "clusters": [{"name": "local", "cluster": {"server": self.server, "certificate-authority": self.ca_file}}],
            "users": [{"name": "publisher", "user": {"tokenFile": str(self.token_file)}}],
            "contexts": [{"name": "local", "context": {"cluster": "local", "user": "publisher"}}],
            "current-context": "local"})
        fd = os.open(self.kubeconfig, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
        return self

    def _mint(self) -> None:
        """A new Pod on our node running as the publisher's ServiceAccount, a token bound to it,
        written to the token file as kubelet writes a projected token (atomic replace)."""
        self.generation += 1
        core = client.CoreV1Api(self.api)
        name = f"netclaim-publisher-model-{uuid.uuid4().hex[:6]}-{self.generation}"
        pod = core.create_namespaced_pod(identity.NAMESPACE, {
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"nodeName": NODE, "serviceAccountName": identity.SERVICE_ACCOUNT,
                     "containers": [{"name": "publisher", "image": "local/pause:1"}]}})
        self.pod = {"name": name, "uid": pod.metadata.uid}
        self.token = identity.bound_token(self.api, "Pod", self.pod)
        tmp = self.token_file.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(self.token)
        os.replace(tmp, self.token_file)

    def rotate(self) -> None:
        """New token on disk, old one invalidated; returns once the server refuses the old token."""
        old_pod, old_token = self.pod, self.token
        self._mint()
        delete_pod(self.api, identity.NAMESPACE, old_pod["name"])
        deadline = time.time() + 30
        while time.time() < deadline:  # the server caches a valid token for about 10 s
            if not identity.authenticated(self.api, old_token):
                return
            time.sleep(0.5)
        raise AssertionError("the old token still authenticates 30 s after its pod was deleted")

    def cleanup(self) -> None:
        if self.pod:
            delete_pod(self.api, identity.NAMESPACE, self.pod["name"])


def delete_pod(api: client.ApiClient, namespace: str, name: str) -> None:
    """Immediate deletion (grace 0): no kubelet runs here to confirm a graceful one."""
    try:
        client.CoreV1Api(api).delete_namespaced_pod(name, namespace, grace_period_seconds=0)
    except ApiException as exc:
        if exc.status != 404:
            raise


# ---------------------------------------------------------------- sandboxes (real netns + veth)


@dataclass
class Sandbox:
    """One pod sandbox: a real netns with one veth per network, addressed as IPAM would."""

    index: int
    slot: int
    pod_name: str
    pod_uid: str
    cid: str
    netns: str
    ips: dict[str, list[str]] = field(default_factory=dict)

    @property
    def path(self) -> str:
        return f"/var/run/netns/{self.netns}"

    def create(self) -> None:
        run("ip", "netns", "add", self.netns)
        tag = self.netns[-6:]
        for n, ifname in enumerate(NETWORKS):
            host = f"mh{n}{tag}"
            run("ip", "link", "add", host, "type", "veth", "peer", "name", ifname, "netns", self.netns)
            run("ip", "link", "set", host, "up")  # as the bridge plugin leaves it: the pod side has carrier
            v4 = f"10.{80 + n}.{self.index // 250}.{self.index % 250 + 2}/16"
            v6 = f"fd00:{80 + n}::{self.index + 2:x}/64"
            self.ips[ifname] = [v4, v6]
            batch = (f"addr add {v4} dev {ifname}\naddr add {v6} dev {ifname} nodad\n"
                     f"link set {ifname} up\nlink set lo up\n")
            run("ip", "-n", self.netns, "-batch", "-", input=batch)

    def mac(self, ifname: str) -> str:
        out = run("ip", "-n", self.netns, "-j", "link", "show", "dev", ifname)
        return json.loads(out.stdout)[0]["address"].lower()

    def drift(self, ifname: str) -> None:
        """Take the IPv4 address away: CHECK must report drift."""
        run("ip", "-n", self.netns, "addr", "del", self.ips[ifname][0], "dev", ifname)

    def set_carrier(self, ifname: str, up: bool) -> None:
        """The host side of the interface's veth up or down: the pod side gains or loses its carrier."""
        host = f"mh{list(NETWORKS).index(ifname)}{self.netns[-6:]}"
        run("ip", "link", "set", host, "up" if up else "down")

    def destroy(self) -> None:
        run("ip", "netns", "del", self.netns, check=False)

    def prev_result(self, ifname: str) -> dict[str, Any]:
        """What bridge + host-local would hand on: host veth, sandbox interface without MAC/MTU
        (so the plugin reads them back from the netns), the addresses."""
        v4, v6 = self.ips[ifname]
        return {"cniVersion": "1.1.0",
                "interfaces": [{"name": f"mh{self.netns[-6:]}"}, {"name": ifname, "sandbox": self.path}],
                "ips": [{"address": v4, "gateway": v4.split("/")[0].rsplit(".", 1)[0] + ".1", "interface": 1},
                        {"address": v6, "interface": 1}],
                "routes": [], "dns": {}}


# ---------------------------------------------------------------- the plugin as a runtime runs it


@dataclass
class PluginRunner:
    workdir: Path
    publisher: PublisherProc
    prefix: list[str] = field(default_factory=list)  # set by a reboot: the plugin runs in the node's new boot

    def conf(self, ifname: str, channel: str, prev: dict | None) -> dict[str, Any]:
        network, request = NETWORKS[ifname]
        socket_path = self.publisher.socket if channel == "socket" else str(self.workdir / "no-such.sock")
        spool = str(self.workdir / "a-file" / "spool") if channel == "lost" else self.publisher.spool
        conf: dict[str, Any] = {"cniVersion": "1.1.0", "name": network, "type": "netclaim", "driverName": DRIVER,
                                "request": request, "socketPath": socket_path, "spoolDir": spool,
                                "stateDir": str(self.workdir / "plugin-state"),
                                "logFile": str(self.workdir / "plugin.log"), "failurePolicy": "Ignore"}
        if prev is not None:
            conf["prevResult"] = prev
        return conf

    def invoke(self, command: str, conf: dict[str, Any], cid: str = "", ifname: str = "", netns: str = "",
               pod: tuple[str, str, str] | None = None) -> subprocess.CompletedProcess:
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "CNI_COMMAND": command, "CNI_PATH": "/usr/lib/cni"}
        if cid:
            env.update(CNI_CONTAINERID=cid, CNI_IFNAME=ifname, CNI_NETNS=netns)
        if pod:
            env["CNI_ARGS"] = (f"IgnoreUnknown=1;K8S_POD_NAMESPACE={pod[0]};K8S_POD_NAME={pod[1]};"
                               f"K8S_POD_INFRA_CONTAINER_ID={cid};K8S_POD_UID={pod[2]}")
        return subprocess.run([*self.prefix, str(BIN / "netclaim")], input=json.dumps(conf), env=env, capture_output=True,
                              text=True, timeout=60)


# ---------------------------------------------------------------- the model


@dataclass
class Known:
    """An attachment the publisher was told is live."""

    cid: str
    ifname: str
    pod_uid: str
    seq: int  # node order of its ADD
    ready: bool
    ips: list[str]
    mac: str
    drifted: bool = False  # its IPv4 address taken away in the netns: the live watch shows that
    no_carrier: bool = False  # its veth's host side set down: Ready=False (NoCarrier) until it is up again


@dataclass
class ClaimModel:
    name: str
    request: str
    device: str = ""
    node: str = ""
    reserved: dict[str, str] = field(default_factory=dict)  # pod uid -> name, in reservedFor order


@dataclass
class Model:
    namespace: str
    known: dict[tuple[str, str], Known] = field(default_factory=dict)
    claims: dict[str, ClaimModel] = field(default_factory=dict)
    live_pods: dict[str, str] = field(default_factory=dict)  # uid -> name
    seq: int = 0

    def tick(self) -> int:
        self.seq += 1
        return self.seq

    def expected_devices(self, claim: str) -> dict[str, dict[str, Any]]:
        """device -> the entry netclaim must have on it (the invariant)."""
        c = self.claims[claim]
        if not c.device or c.node != NODE:
            return {}
        # A shared claim (several pods reserved) still has one entry per device: the live
        # attachment with the latest ADD among all its pods (docs/publisher.md "Shared devices").
        pods = {uid for uid in c.reserved if uid in self.live_pods}
        candidates = [k for k in self.known.values() if k.pod_uid in pods and NETWORKS[k.ifname][1] == c.request]
        if not candidates:
            return {}
        latest = max(candidates, key=lambda k: k.seq)
        # A drifted interface (its IPv4 address removed) is shown as the netns has it, CHECK or not:
        # the address gone from networkData, Ready=False (publisher/live/).
        ips = latest.ips[1:] if latest.drifted else latest.ips
        ready = latest.ready and not latest.drifted and not latest.no_carrier
        return {c.device: {"interfaceName": latest.ifname, "ips": sorted(ips), "hardwareAddress": latest.mac,
                           "ready": "True" if ready else "False", "containerID": latest.cid}}


def observed_devices(entries: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Our driver's entries in the same shape as Model.expected_devices (duplicates kept visible); each
    entry's data held to its shipped schema first (scripts/harness/runtime/dataschema.py)."""
    out: dict[str, dict[str, Any]] = {}
    for e in check_entries(entries):
        if e.get("driver") != DRIVER:
            continue
        net = e.get("networkData") or {}
        ready = next((c.get("status") for c in e.get("conditions") or [] if c.get("type") == "Ready"), None)
        key = e.get("device", "")
        if e.get("pool") != NODE:
            key = f"{e.get('pool')}/{key}"
        if e.get("shareID"):
            key += f"#{e['shareID']}"
        out[key] = {"interfaceName": net.get("interfaceName"), "ips": sorted(net.get("ips") or []),
                    "hardwareAddress": net.get("hardwareAddress"), "ready": ready,
                    "containerID": (e.get("data") or {}).get("containerID")}
    return out
