"""What tests/cluster/test_multinode.py builds on: workloads spread over the nodes and the checks of their claims.

The cluster is `scripts/cluster.sh up --nodes 3` with the chart's DaemonSet
(scripts/harness/runtime/nodechart.py installs it as an operator would).
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts" / "harness"))

from runtime.clusternode import ClusterNode  # noqa: E402
from runtime.nodechart import NAMESPACE, daemonset_pods, free_port, install, install_everywhere, version  # noqa: E402,F401
from runtime.realcluster import PAUSE_IMAGE, RealCluster, entries_of, ready_status, wait_until  # noqa: E402

APP_IMAGE = f"netclaim:{version()}"  # has python3.11: the workload for logs/exec/port-forward
PYTHON = "/usr/bin/python3.11"


# ------------------------------------------------------------------ workloads


def deployment(ns: str, name: str, replicas: int, *, unreachable_seconds: int | None = None) -> dict[str, Any]:
    """Pause pods with a claim each (from a template), spread evenly over the nodes by hostname.

    nodeTaintsPolicy Honor: a cordoned or unreachable node (tainted) is no domain of the spread, so
    after a drain or a node loss the pods still fit on the other nodes."""
    spec: dict[str, Any] = {
        "containers": [{"name": "app", "image": PAUSE_IMAGE, "imagePullPolicy": "Never"}],
        "terminationGracePeriodSeconds": 0,
        "resourceClaims": [{"name": "net", "resourceClaimTemplateName": "net"}],
        "topologySpreadConstraints": [{
            "maxSkew": 1, "topologyKey": "kubernetes.io/hostname",
            "whenUnsatisfiable": "DoNotSchedule", "nodeTaintsPolicy": "Honor",
            "labelSelector": {"matchLabels": {"app": name}},
        }],
    }
    if unreachable_seconds is not None:
        spec["tolerations"] = [
            {"key": key, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": unreachable_seconds}
            for key in ("node.kubernetes.io/unreachable", "node.kubernetes.io/not-ready")]
    return {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "namespace": ns},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
                 "template": {"metadata": {"labels": {"app": name}}, "spec": spec}},
    }


def live_pods(cluster: RealCluster, ns: str, app: str) -> list[dict[str, Any]]:
    """The app's pods that are not terminating."""
    items = json.loads(cluster.kubectl("get", "pods", "-n", ns, "-l", f"app={app}", "-o", "json"))["items"]
    return [p for p in items if not p["metadata"].get("deletionTimestamp")]


def ready_pods(cluster: RealCluster, ns: str, app: str, count: int, timeout: float = 180,
               avoid: str = "") -> list[dict[str, Any]]:
    """Wait for exactly `count` live Ready pods of the app (none on node `avoid`)."""
    def ok() -> list[dict[str, Any]] | None:
        pods = live_pods(cluster, ns, app)
        ready = [p for p in pods if any(c["type"] == "Ready" and c["status"] == "True"
                                        for c in p.get("status", {}).get("conditions", []))]
        if len(pods) == count == len(ready) and not any(p["spec"].get("nodeName") == avoid for p in pods):
            return pods
        return None
    return wait_until(ok, f"{count} Ready pods of {ns}/{app}", timeout=timeout, interval=0.5)


def claim_of(pod: dict[str, Any]) -> str:
    statuses = pod.get("status", {}).get("resourceClaimStatuses") or []
    return statuses[0]["resourceClaimName"] if statuses else ""


def claims(cluster: RealCluster, ns: str) -> dict[str, dict[str, Any]]:
    items = json.loads(cluster.kubectl("get", "resourceclaims", "-n", ns, "-o", "json", "--show-managed-fields"))["items"]
    return {c["metadata"]["name"]: c for c in items}


@dataclass
class Attachment:
    """A pod's interface as its netns shows it, and the node it runs on."""

    pod: str
    uid: str
    node: str
    claim: str
    ifname: str
    mac: str
    cidrs: list[str]
    restarts: int = 0


def attachment(cluster: RealCluster, ns: str, pod: dict[str, Any]) -> Attachment:
    name = pod["metadata"]["name"]
    node = cluster.node_named(pod["spec"]["nodeName"])
    iface = node.interface(ns, name)
    restarts = sum(c.get("restartCount", 0) for c in pod.get("status", {}).get("containerStatuses") or [])
    return Attachment(name, pod["metadata"]["uid"], node.name, claim_of(pod), iface.name, iface.mac, iface.cidrs,
                      restarts)


def status_problem(claim: dict[str, Any] | None, want: Attachment, driver: str) -> str:
    """Empty when the claim shows exactly the pod's attachment, written by its own node's publisher."""
    if claim is None:
        return f"{want.pod}: claim {want.claim} is gone"
    mine = entries_of(claim, driver)
    if len(mine) != 1:
        return f"{want.pod}: {len(mine)} entries of {driver} in {want.claim}"
    entry = mine[0]
    net = entry.get("networkData") or {}
    got = (entry.get("pool"), net.get("interfaceName"), sorted(net.get("ips") or []),
           (net.get("hardwareAddress") or "").lower(), ready_status(entry))
    expected = (want.node, want.ifname, sorted(want.cidrs), want.mac, "True")
    if got != expected:
        return f"{want.pod}: claim {want.claim} shows {got}, the pod's netns on {want.node} {expected}"
    managers = {m["manager"] for m in claim["metadata"].get("managedFields") or []
                if "f:devices" in ((m.get("fieldsV1") or {}).get("f:status") or {})}
    if managers != {f"netclaim/{want.node}"}:
        return f"{want.pod}: status.devices of {want.claim} written by {sorted(managers)}, not netclaim/{want.node}"
    return ""


def wait_statuses(cluster: RealCluster, ns: str, pods: list[dict[str, Any]], timeout: float = 90) -> list[Attachment]:
    """Every pod's claim shows its pod's attachment (from its node's publisher); the attachments."""
    want = [attachment(cluster, ns, p) for p in pods]

    def problems() -> list[str]:
        current = claims(cluster, ns)
        return [p for a in want if (p := status_problem(current.get(a.claim), a, cluster.driver))]

    last: list[str] = []

    def ok() -> bool:
        nonlocal last
        last = problems()
        return not last
    try:
        wait_until(ok, f"the status of {len(want)} claims in {ns}", timeout=timeout, interval=0.5)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\nproblems: {last}") from None
    return want


def stale_entries(cluster: RealCluster, ns: str, live: list[Attachment]) -> list[str]:
    """Entries in the namespace's claims that name no live pod's attachment."""
    wanted = {a.claim for a in live}
    out = []
    for name, claim in claims(cluster, ns).items():
        for entry in entries_of(claim, cluster.driver):
            if name not in wanted:
                out.append(f"{name}: entry for {entry.get('pool')}/{entry.get('device')} of no live pod")
    return out


@dataclass
class Sampler:
    """Samples the claims of a set of attachments every `interval` s in the background; keeps every problem."""

    cluster: RealCluster
    ns: str
    want: list[Attachment]
    interval: float = 0.5
    problems: list[str] = field(default_factory=list)
    samples: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __enter__(self) -> "Sampler":
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        assert self._thread is not None
        self._thread.join(timeout=30)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                current = claims(self.cluster, self.ns)
            except Exception as exc:  # an API hiccup is no claim problem; it is kept for the report
                self.problems.append(f"sample failed: {exc}")
            else:
                self.samples += 1
                stamp = time.strftime("%H:%M:%S")
                for a in self.want:
                    if problem := status_problem(current.get(a.claim), a, self.cluster.driver):
                        self.problems.append(f"{stamp} {problem}")
            self._stop.wait(self.interval)


def icmp_echo(node: ClusterNode, ns: str, pod: str, target: str) -> subprocess.CompletedProcess[str]:
    """A real ICMP echo request from inside the pod's netns (a raw socket, as ping sends it) and its reply."""
    code = (
        "import socket,struct,sys,time\n"
        "t=sys.argv[1]; s=socket.socket(socket.AF_INET,socket.SOCK_RAW,socket.IPPROTO_ICMP); s.settimeout(5)\n"
        "def ck(b):\n"
        " b+=b'\\0'*(len(b)%2); v=sum(struct.unpack('!%dH'%(len(b)//2),b)); v=(v>>16)+(v&0xffff); v+=v>>16\n"
        " return ~v&0xffff\n"
        "h=struct.pack('!BBHHH',8,0,0,0x4e43,1); p=b'netclaim'; h=struct.pack('!BBHHH',8,0,ck(h+p),0x4e43,1)\n"
        "s.sendto(h+p,(t,0)); end=time.time()+5\n"
        "while time.time()<end:\n"
        " d,a=s.recvfrom(2048); i=(d[0]&15)*4\n"
        " if a[0]==t and d[i]==0 and struct.unpack('!H',d[i+4:i+6])[0]==0x4e43: print('reply from',t); sys.exit(0)\n"
        "sys.exit(1)\n"
    )
    return node.in_pod_netns(ns, pod, sys.executable, "-c", code, target)


def host_traces(directory: str) -> list[str]:
    """What a cluster in `directory` leaves on the host: links named by its id, mounts below it, cgroups, processes.

    The id is the one scripts/cluster.sh derives from the directory (the first 6 hex digits of the sha256 of
    its real path); other clusters on the host have other ids and directories, so this sees only ours.
    """
    import hashlib
    import os
    import re

    real = os.path.realpath(directory)
    ident = hashlib.sha256(real.encode()).hexdigest()[:6]
    out = [f"link {name}" for name in re.findall(r"^\d+: ([^:@]+)", subprocess.run(
        ["ip", "-o", "link"], capture_output=True, text=True, check=True).stdout, re.M) if ident in name]
    with open("/proc/self/mountinfo") as fh:
        out += [f"mount {f[4]}" for f in (line.split() for line in fh) if f[4] == real or f[4].startswith(real + "/")]
    with open("/proc/mounts") as fh:
        hierarchies = [f[1] for f in (line.split() for line in fh) if f[2] in ("cgroup", "cgroup2")]
    out += [f"cgroup {h}/{d}" for h in hierarchies for d in os.listdir(h) if d.startswith(f"nc-{ident}")]
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmd = open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if real + "/" in cmd and pid != str(os.getpid()):
            out.append(f"process {pid}: {cmd[:120]}")
    if os.path.exists(real):
        out.append(f"directory {real}")
    return out
