"""scale: N real publishers, one node identity each, against one kube-apiserver: control-plane cost as N grows.

For each N in --nodes (default 10,30,50; publishers are added, never restarted,
so the N=50 point runs the 10 publishers of the first point too):

1. N `netclaim-publisher run` processes, each with its own Node object, a
   Node-bound ServiceAccount token under the shipped RBAC (conf/kubernetes/
   10-rbac.yaml), its own socket, journal, spool and pod watch (fieldSelector
   spec.nodeName), all against ONE kube-apiserver + etcd
   (scripts/control-plane.sh, NETCLAIM_CP_DIR).
2. idle: --idle seconds with nothing happening: the background cost of N
   publishers (watches, housekeeping). Subtracted from the phases below.
3. create: --pods-per-node pods per node with a claim allocated on that node's
   pool and reservedFor the pod, written by the admin client as the scheduler
   would. Its API server CPU per pod is the REFERENCE the publisher's cost is
   set against (the cost a cluster pays anyway to start such a pod).
4. ADD: a load generator hands each publisher the ADD wire events of its pods
   over its socket (cni_plugin.handoff.send: the plugin's own code) at
   --rate events/s cluster-wide; a watch on the claims records when each entry
   becomes visible. Hand-off = the moment the publisher acked (the plugin's
   wait ends there).
5. DEL: at least --lifetime s after its ADD, each pod's DEL event; wait until
   every journal is empty.

Measured per phase, from the servers' own metrics: kube-apiserver requests
(apiserver_request_total by verb/resource/subresource; non-resource URLs such
as /metrics are left out) and CPU (process_cpu_seconds_total), etcd puts and
deletes (etcd_mvcc_*), watches open (apiserver_longrunning_requests{verb=WATCH});
from the publishers: their own request counters, RSS and CPU (/proc).
Everything is bounded: a phase that does not finish within its deadline fails
the run with what was missing. Loopback only.

--tracked-idle S (with a short --resync-interval) adds an idle window while the
ADDed claims are tracked: what the periodic resync costs per claim and pass.
--apf adds kubelet-like and other-workload latencies under a flood of publisher
applies, without and with the shipped APF objects, on a second control plane
with lowered concurrency (tests/deploy/test_apf.py asserts the behaviour).
The output ends with an extrapolation to a large cluster (`Cluster`).
Results: docs/scale.md.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .publisher import BIN, CLASS, DRIVER, MERGE, Watcher, _free_port, _result
from .stats import paced, percentile

REPO = Path(__file__).resolve().parents[3]
NETWORK = "scalenet"
REQUEST = "nic"
NODE_PREFIX = "scale-"
PHASE_TIMEOUT = 300.0
CLK_TCK = os.sysconf("SC_CLK_TCK")
SAMPLE_RE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)')
LABEL_RE = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')
APISERVER_METRICS = ("apiserver_request_total", "process_cpu_seconds_total", "apiserver_longrunning_requests",
                     "apiserver_registered_watchers")
ETCD_METRICS = ("etcd_mvcc_put_total", "etcd_mvcc_delete_total", "etcd_mvcc_txn_total",
                "process_cpu_seconds_total")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--nodes", default="10,30,50", help="comma-separated publisher counts, ascending")
    parser.add_argument("--pods-per-node", type=int, default=6, help="pods churned per node at each point")
    parser.add_argument("--rate", type=float, default=20.0, help="ADD (and DEL) events per second, cluster-wide")
    parser.add_argument("--lifetime", type=float, default=5.0, help="least seconds between a pod's ADD and DEL")
    parser.add_argument("--idle", type=float, default=15.0, help="seconds of idle measurement at each point")
    parser.add_argument("--workers", type=int, default=2, help="publisher --workers")
    parser.add_argument("--start-batch", type=int, default=5, help="publishers started at once")
    parser.add_argument("--plot", default="", help="also write a PNG of cost against N here")
    parser.add_argument("--resync-interval", type=float, default=300.0,
                        help="publisher --resync-interval (default: the publisher's default)")
    parser.add_argument("--tracked-idle", type=float, default=0.0,
                        help="also measure this many idle seconds while the ADDed claims are tracked (to see "
                             "the resync cost, with a --resync-interval shorter than this)")
    parser.add_argument("--apf", action="store_true",
                        help="also: kubelet-like latency under a publisher flood, with and without the shipped "
                             "APF objects (on a second control plane with lowered concurrency limits)")


def _progress(text: str) -> None:
    print(f"[bench scale] {text}", file=sys.stderr, flush=True)


# ------------------------------------------------------------------ metrics


def scrape(url: str, names: tuple[str, ...], headers: dict[str, str] | None = None,
           context: Any = None) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """The samples of `names` at a Prometheus text endpoint: {(name, labels): value}."""
    req = urllib.request.Request(url, headers=headers or {})
    with urllib.request.urlopen(req, timeout=30, context=context) as resp:
        text = resp.read().decode()
    out: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for line in text.splitlines():
        if not line.startswith(names):
            continue
        m = SAMPLE_RE.match(line)
        if m and m.group(1) in names:
            labels = tuple(sorted(LABEL_RE.findall(m.group(2) or "")))
            out[(m.group(1), labels)] = float(m.group(3))
    return out


def total(samples: dict, name: str, **match: str) -> float:
    """Sum of `name`'s samples whose labels include `match`."""
    return sum(v for (n, labels), v in samples.items()
               if n == name and all(dict(labels).get(k) == want for k, want in match.items()))


def _api_requests(samples: dict) -> dict[str, float]:
    """apiserver_request_total by 'VERB resource[/subresource]', non-resource URLs left out."""
    out: dict[str, float] = {}
    for (n, labels), v in samples.items():
        lab = dict(labels)
        if n != "apiserver_request_total" or not lab.get("resource"):
            continue
        key = f"{lab.get('verb')} {lab['resource']}" + (f"/{lab['subresource']}" if lab.get("subresource") else "")
        out[key] = out.get(key, 0.0) + v
    return out


@dataclass
class Snapshot:
    """Every counter the bench reads, at one moment."""

    t: float
    apiserver: dict
    etcd: dict
    publishers: dict[str, dict[str, float]]  # node -> {"cpu_s", "rss_mib", "api_requests"}


@dataclass
class Delta:
    """What changed between two snapshots."""

    seconds: float
    apiserver_cpu_s: float
    etcd_cpu_s: float
    etcd_puts: float
    etcd_deletes: float
    requests: dict[str, float]
    publisher_cpu_s: float
    publisher_requests: float

    @staticmethod
    def between(a: Snapshot, b: Snapshot) -> "Delta":
        ra, rb = _api_requests(a.apiserver), _api_requests(b.apiserver)
        requests = {k: rb[k] - ra.get(k, 0.0) for k in rb if rb[k] - ra.get(k, 0.0) > 0}
        nodes = [n for n in b.publishers if n in a.publishers]
        return Delta(
            seconds=b.t - a.t,
            apiserver_cpu_s=total(b.apiserver, "process_cpu_seconds_total") - total(a.apiserver, "process_cpu_seconds_total"),
            etcd_cpu_s=total(b.etcd, "process_cpu_seconds_total") - total(a.etcd, "process_cpu_seconds_total"),
            etcd_puts=total(b.etcd, "etcd_mvcc_put_total") - total(a.etcd, "etcd_mvcc_put_total"),
            etcd_deletes=total(b.etcd, "etcd_mvcc_delete_total") - total(a.etcd, "etcd_mvcc_delete_total"),
            requests=requests,
            publisher_cpu_s=sum(b.publishers[n]["cpu_s"] - a.publishers[n]["cpu_s"] for n in nodes),
            publisher_requests=sum(b.publishers[n]["api_requests"] - a.publishers[n]["api_requests"] for n in nodes),
        )

    def net_of_idle(self, idle: "Delta", count: int) -> dict[str, float]:
        """Per-event figures with the idle background for the same duration taken off."""
        scale = self.seconds / idle.seconds if idle.seconds else 0.0
        requests = sum(self.requests.values()) - scale * sum(idle.requests.values())
        return {
            "api_requests": round(requests / count, 2),
            "apiserver_cpu_ms": round((self.apiserver_cpu_s - scale * idle.apiserver_cpu_s) / count * 1000, 2),
            "etcd_cpu_ms": round((self.etcd_cpu_s - scale * idle.etcd_cpu_s) / count * 1000, 2),
            "etcd_writes": round((self.etcd_puts + self.etcd_deletes
                                  - scale * (idle.etcd_puts + idle.etcd_deletes)) / count, 2),
            "publisher_cpu_ms": round((self.publisher_cpu_s - scale * idle.publisher_cpu_s) / count * 1000, 2),
            "publisher_api_requests": round((self.publisher_requests - scale * idle.publisher_requests) / count, 2),
        }


def proc_usage(pid: int) -> tuple[float, float]:
    """(CPU seconds user+system, RSS MiB) of a live process, from /proc."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2:].split()
    cpu = (int(fields[11]) + int(fields[12])) / CLK_TCK
    rss = 0.0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            rss = int(line.split()[1]) / 1024
    return cpu, rss


# ------------------------------------------------------------------ control plane


@dataclass
class ControlPlane:
    """The running kube-apiserver + etcd: clients and metrics endpoints."""

    handle: Any
    api: Any
    token: str
    etcd_url: str

    @staticmethod
    def up() -> "ControlPlane":
        from runtime import controlplane
        from runtime.identity import kubeconfig_token

        handle = controlplane.up()
        api = controlplane.api_client(handle.kubeconfig)
        ports = dict(line.split("=", 1) for line in
                     Path(handle.env.get("NETCLAIM_CP_DIR", "/tmp/netclaim-cp"), "ports.env").read_text().split())
        return ControlPlane(handle, api, kubeconfig_token(handle.kubeconfig),
                            f"http://127.0.0.1:{ports['ETCD_PORT']}/metrics")

    def snapshot(self, publishers: dict[str, "Publisher"]) -> Snapshot:
        import ssl

        ctx = ssl.create_default_context(cafile=self.handle.ca_file)
        apiserver = scrape(f"{self.handle.server}/metrics", APISERVER_METRICS,
                           {"Authorization": f"Bearer {self.token}"}, ctx)
        etcd = scrape(self.etcd_url, ETCD_METRICS)
        return Snapshot(time.time(), apiserver, etcd, {n: p.usage() for n, p in publishers.items()})

    def watches(self) -> dict[str, float]:
        """Watches open now, by resource, from apiserver_longrunning_requests."""
        import ssl

        ctx = ssl.create_default_context(cafile=self.handle.ca_file)
        samples = scrape(f"{self.handle.server}/metrics", APISERVER_METRICS,
                         {"Authorization": f"Bearer {self.token}"}, ctx)
        out: dict[str, float] = {}
        for (n, labels), v in samples.items():
            lab = dict(labels)
            if n == "apiserver_longrunning_requests" and lab.get("verb") == "WATCH" and v:
                out[lab.get("resource", "")] = out.get(lab.get("resource", ""), 0.0) + v
        registered = total(samples, "apiserver_registered_watchers")
        if registered:
            out["registered_watchers_total"] = registered
        return out


# ------------------------------------------------------------------ publishers


@dataclass
class Publisher:
    """One `netclaim-publisher run` with its own node identity, socket, journal and spool."""

    node: str
    dir: Path
    proc: subprocess.Popen | None = None
    port: int = 0

    @property
    def socket(self) -> str:
        return str(self.dir / "run" / "p.sock")

    def start(self, kubeconfig: str, workers: int, resync: float) -> None:
        self.port = _free_port()
        with open(self.dir / "publisher.log", "ab") as log:
            self.proc = subprocess.Popen(
                [str(BIN / "netclaim-publisher"), "run", "--node-name", self.node, "--kubeconfig", kubeconfig,
                 "--socket", self.socket, "--state-dir", str(self.dir / "state"),
                 "--spool-dir", str(self.dir / "spool"), "--metrics-address", f"127.0.0.1:{self.port}",
                 "--workers", str(workers), "--resync-interval", str(resync), "--log-level", "warning"],
                stdout=log, stderr=log, start_new_session=True)

    def ready(self) -> bool:
        if self.proc is None or self.proc.poll() is not None:
            raise RuntimeError(f"publisher {self.node} exited: {(self.dir / 'publisher.log').read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/readyz", timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    def api_requests(self) -> float:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=10) as r:
            return sum(float(line.rpartition(" ")[2]) for line in r.read().decode().splitlines()
                       if line.startswith("netclaim_api_requests_total"))

    def usage(self) -> dict[str, float]:
        assert self.proc is not None
        cpu, rss = proc_usage(self.proc.pid)
        return {"cpu_s": cpu, "rss_mib": rss, "api_requests": self.api_requests()}

    def journal_depth(self) -> int:
        from publisher.cli import request_status

        return int(request_status(self.socket)["journal_depth"])

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


# ------------------------------------------------------------------ the cluster side


@dataclass
class PodSpec:
    node: str
    name: str
    claim: str
    uid: str = ""
    cid: str = ""
    index: int = 0


@dataclass
class Scale:
    """The bench's state: control plane, namespace, publishers."""

    cp: ControlPlane
    args: argparse.Namespace
    ns: str = field(default_factory=lambda: f"scale-{uuid.uuid4().hex[:6]}")
    dir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="netclaim-scale-")))
    publishers: dict[str, Publisher] = field(default_factory=dict)
    pod_count: int = 0
    baseline_watches: float = 0.0  # the API server's own informers, open before any publisher

    def setup(self) -> None:
        from kubernetes import client
        from runtime.identity import apply_shipped_rbac

        apply_shipped_rbac(self.cp.api, DRIVER)
        client.CoreV1Api(self.cp.api).create_namespace({"metadata": {"name": self.ns}})
        ensure_device_class(self.cp.api)
        self.baseline_watches = _watch_count(self.cp.watches())

    def grow(self, n: int) -> float:
        """Start publishers until n run (a batch at a time); returns the seconds it took."""
        from runtime.identity import ensure_node, node_token, write_kubeconfig

        t0 = time.time()
        names = [f"{NODE_PREFIX}{i:03d}" for i in range(len(self.publishers), n)]
        for start in range(0, len(names), self.args.start_batch):
            batch = []
            for node in names[start:start + self.args.start_batch]:
                pdir = self.dir / node
                pdir.mkdir(mode=0o700)
                kubeconfig = write_kubeconfig(pdir / "kubeconfig", self.cp.handle.server, self.cp.handle.ca_file,
                                              node_token(self.cp.api, ensure_node(self.cp.api, node)))
                pub = Publisher(node, pdir)
                pub.start(kubeconfig, self.args.workers, self.args.resync_interval)
                self.publishers[node] = pub
                batch.append(pub)
            _until(lambda: all(p.ready() for p in batch), 120, f"publishers {[p.node for p in batch]} ready")
        return time.time() - t0

    def create_pods(self) -> list[PodSpec]:
        """pods-per-node pods on every node, each with an allocated claim (the scheduler's writes)."""
        specs = []
        for node in self.publishers:
            for _ in range(self.args.pods_per_node):
                i = self.pod_count
                self.pod_count += 1
                specs.append(PodSpec(node, f"p{i}", f"p{i}-net", index=i))
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(self._create_pod, specs))
        return specs

    def _create_pod(self, spec: PodSpec) -> None:
        scheduled_pod(self.cp.api, self.ns, spec)

    def delete_pods(self, specs: list[PodSpec]) -> None:
        from kubernetes import client

        core, res = client.CoreV1Api(self.cp.api), client.ResourceV1Api(self.cp.api)

        def one(spec: PodSpec) -> None:
            core.delete_namespaced_pod(spec.name, self.ns, grace_period_seconds=0, _preload_content=False)
            res.delete_namespaced_resource_claim(spec.claim, self.ns, _preload_content=False)

        with ThreadPoolExecutor(8) as pool:
            list(pool.map(one, specs))

    # ------------------------------------------------------------ wire events

    def event(self, spec: PodSpec, op: str) -> Any:
        """The event the plugin would send for this pod's sandbox (cni_plugin/commands.py's fields)."""
        from cni_plugin import wire

        return wire.Event(op=op, container_id=spec.cid, ifname="eth0", driver=DRIVER,
                          netns=f"/var/run/netns/{spec.cid}", network=NETWORK, request=REQUEST,
                          pod=wire.PodRef(self.ns, spec.name, spec.uid), cni_version="1.1.0",
                          result=_result(spec.index))

    def send(self, specs: list[PodSpec], op: str) -> dict[str, float]:
        """Hand every pod's `op` event to its node's publisher at --rate/s; claim -> time of the ack."""
        from cni_plugin.handoff import send

        acked: dict[str, float] = {}

        def one(spec: PodSpec) -> None:
            send(self.publishers[spec.node].socket, self.event(spec, op), 10.0)
            acked[spec.claim] = time.time()

        paced(specs, self.args.rate, one)
        return acked

    def drained(self) -> bool:
        return all(p.journal_depth() == 0 for p in self.publishers.values())

    def teardown(self) -> None:
        import shutil

        from kubernetes import client

        for pub in self.publishers.values():
            pub.stop()
        core = client.CoreV1Api(self.cp.api)
        for call, arg in [(core.delete_namespace, self.ns), *((core.delete_node, n) for n in self.publishers)]:
            try:
                call(arg, _preload_content=False)
            except Exception:  # best effort: the control plane may be going down anyway
                pass
        shutil.rmtree(self.dir, ignore_errors=True)


def scheduled_pod(api: Any, ns: str, spec: PodSpec) -> None:
    """A claim, a pod bound to spec.node using it, and the allocation on that node's pool reserved
    for the pod: the scheduler's writes. Fills spec.uid."""
    from kubernetes import client

    res, core = client.ResourceV1Api(api), client.CoreV1Api(api)
    res.create_namespaced_resource_claim(ns, {"metadata": {"name": spec.claim}, "spec": {"devices": {
        "requests": [{"name": REQUEST, "exactly": {"deviceClassName": CLASS}}]}}}, _preload_content=False)
    resp = core.create_namespaced_pod(ns, {"metadata": {"name": spec.name}, "spec": {
        "nodeName": spec.node, "containers": [{"name": "c", "image": "local/pause:1"}],
        "resourceClaims": [{"name": "net", "resourceClaimName": spec.claim}]}}, _preload_content=False)
    spec.uid = json.loads(resp.data)["metadata"]["uid"]
    res.patch_namespaced_resource_claim_status(spec.claim, ns, {"status": {
        "allocation": {"devices": {"results": [{"request": REQUEST, "driver": DRIVER, "pool": spec.node,
                                                "device": "nic0"}]},
                       "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                           {"key": "metadata.name", "operator": "In", "values": [spec.node]}]}]}},
        "reservedFor": [{"resource": "pods", "name": spec.name, "uid": spec.uid}]}},
        _content_type=MERGE, _preload_content=False)


def ensure_device_class(api: Any) -> None:
    from kubernetes import client

    try:
        client.ResourceV1Api(api).create_device_class({"metadata": {"name": CLASS}, "spec": {}})
    except client.ApiException as exc:
        if exc.status != 409:
            raise


def _watch_count(watches: dict[str, float]) -> float:
    return sum(v for k, v in watches.items() if k != "registered_watchers_total")


def _until(ok: Any, timeout: float, what: str) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if ok():
            return
        time.sleep(0.1)
    raise RuntimeError(f"timed out after {timeout:.0f}s waiting for {what}")


# ------------------------------------------------------------------ one point


def measure_point(bench: Scale, n: int) -> dict[str, Any]:
    cp = bench.cp
    _progress(f"N={n}: starting publishers")
    start_s = bench.grow(n)
    time.sleep(3)  # initial resyncs and pod lists settle
    s0 = cp.snapshot(bench.publishers)
    time.sleep(bench.args.idle)
    s1 = cp.snapshot(bench.publishers)
    idle = Delta.between(s0, s1)
    watches = cp.watches()
    _progress(f"N={n}: creating {n * bench.args.pods_per_node} pods with allocated claims")
    specs = bench.create_pods()
    s2 = cp.snapshot(bench.publishers)
    create = Delta.between(s1, s2)
    for spec in specs:
        spec.cid = f"c{spec.index}-{uuid.uuid4().hex[:8]}"
    watcher = Watcher(_WatchTarget(cp.api, cp.handle.kubeconfig, bench.ns))
    try:
        _progress(f"N={n}: {len(specs)} ADDs at {bench.args.rate}/s")
        s3 = cp.snapshot(bench.publishers)
        acked = bench.send(specs, "ADD")
        seen = watcher.collect({s.claim: s.cid for s in specs}, timeout=PHASE_TIMEOUT)
    finally:
        watcher.stop()
    missing = [s.claim for s in specs if s.claim not in seen]
    if missing:
        raise RuntimeError(f"N={n}: {len(missing)} claims never showed their entry, e.g. {missing[:5]}")
    _until(bench.drained, PHASE_TIMEOUT, "journals to drain after the ADDs")
    s4 = cp.snapshot(bench.publishers)
    add = Delta.between(s3, s4)
    add.requests["WATCH resourceclaims"] = add.requests.get("WATCH resourceclaims", 0) - 1  # the bench's own
    tracked = _tracked_idle(bench, idle, len(specs)) if bench.args.tracked_idle > 0 else {}
    rest = bench.args.lifetime - (time.time() - min(acked.values()))
    if rest > 0:
        time.sleep(rest)
    _progress(f"N={n}: {len(specs)} DELs")
    bench.send(specs, "DEL")
    _until(bench.drained, PHASE_TIMEOUT, "journals to drain after the DELs")
    s5 = cp.snapshot(bench.publishers)
    dele = Delta.between(s4, s5)
    bench.delete_pods(specs)
    latency = [(seen[s.claim] - acked[s.claim]) * 1000 for s in specs]
    rss = [u["rss_mib"] for u in s5.publishers.values()]
    return {
        "nodes": n, "adds": len(specs), "publishers_start_s": round(start_s, 1),
        "watches_open": watches, "watches_total": _watch_count(watches),
        "watches_added": _watch_count(watches) - bench.baseline_watches,
        "idle": {"seconds": round(idle.seconds, 1),
                 "apiserver_cpu_pct": round(idle.apiserver_cpu_s / idle.seconds * 100, 2),
                 "api_requests_per_s": round(sum(idle.requests.values()) / idle.seconds, 2),
                 "publisher_cpu_pct_each": round(idle.publisher_cpu_s / idle.seconds * 100 / n, 3)},
        "reference_create_per_pod": create.net_of_idle(idle, len(specs)),
        "create_requests": {k: int(v) for k, v in sorted(create.requests.items())},
        "per_add": add.net_of_idle(idle, len(specs)),
        "add_requests": {k: int(v) for k, v in sorted(add.requests.items())},
        "per_del": dele.net_of_idle(idle, len(specs)),
        "tracked_idle": tracked,
        "del_requests": {k: int(v) for k, v in sorted(dele.requests.items())},
        "handoff_to_visible_ms": {"p50": round(percentile(latency, .5), 1), "p99": round(percentile(latency, .99), 1),
                                  "max": round(max(latency), 1)},
        "publisher_rss_mib": {"mean": round(sum(rss) / len(rss), 1), "max": round(max(rss), 1),
                              "total": round(sum(rss), 1)},
        "host_mem_available_mib": _mem_available_mib(),
        "host_load_1m": round(os.getloadavg()[0], 2),  # the machine is shared: how busy it was
    }


def _tracked_idle(bench: Scale, idle: Delta, claims: int) -> dict[str, Any]:
    """Idle seconds with `claims` tracked: what the periodic resync costs, per claim and pass."""
    a = bench.cp.snapshot(bench.publishers)
    time.sleep(bench.args.tracked_idle)
    b = bench.cp.snapshot(bench.publishers)
    d = Delta.between(a, b)
    extra = {k: v - idle.requests.get(k, 0.0) * d.seconds / idle.seconds for k, v in d.requests.items()}
    passes = d.seconds / bench.args.resync_interval
    return {"seconds": round(d.seconds, 1), "claims": claims, "resync_interval": bench.args.resync_interval,
            "requests": {k: round(v, 1) for k, v in extra.items() if v > 0.5},
            "requests_per_claim_per_resync": round(sum(extra.values()) / claims / passes, 2)}


@dataclass
class _WatchTarget:
    """What publisher.Watcher reads from its bench: a client, the kubeconfig and the namespace."""

    api: Any
    kubeconfig: str
    ns: str

    @property
    def res(self) -> Any:
        from kubernetes import client

        return client.ResourceV1Api(self.api)


def _mem_available_mib() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return round(int(line.split()[1]) / 1024)
    return 0.0


# ------------------------------------------------------------------ run, report


def run(args: argparse.Namespace) -> dict[str, Any]:
    sys.path.insert(0, str(REPO / "scripts" / "harness"))
    levels = sorted(int(x) for x in args.nodes.split(",") if x.strip())
    points, error = measure_points(args, levels) if levels else ([], "")
    if args.apf:
        _progress("APF: kubelet-like latency under a publisher flood, without and with the shipped objects")
        apf = apf_phase()
    else:
        apf = {}
    figures = {"points": points, "error": error, "cpus": os.cpu_count(), "apf": apf,
               "options": {k: getattr(args, k) for k in ("nodes", "pods_per_node", "rate", "lifetime", "idle",
                                                        "workers", "resync_interval", "tracked_idle")},
               "growth": growth(points),
               "extrapolation": {"assumptions": Cluster().__dict__,
                                 "figures": extrapolate(points[-1]) if points else {}}}
    print(markdown(figures))
    if args.plot and points:
        plot(figures, args.plot)
    return figures


def measure_points(args: argparse.Namespace, levels: list[int]) -> tuple[list[dict[str, Any]], str]:
    """Every N in `levels`, publishers added from one to the next; stops at the first N that fails."""
    cp = ControlPlane.up()
    bench = Scale(cp, args)
    points: list[dict[str, Any]] = []
    error = ""
    try:
        bench.setup()
        for n in levels:
            try:
                points.append(measure_point(bench, n))
            except (RuntimeError, OSError, MemoryError) as exc:
                error = f"N={n}: {type(exc).__name__}: {exc}"
                _progress(f"stopped: {error}")
                break
    finally:
        bench.teardown()
        cp.handle.down()
    return points, error


GROWTH_KEYS = (("per_add", "api_requests"), ("per_add", "apiserver_cpu_ms"), ("per_add", "etcd_writes"),
               ("handoff_to_visible_ms", "p50"), ("handoff_to_visible_ms", "p99"), ("publisher_rss_mib", "mean"))


def growth(points: list[dict[str, Any]]) -> dict[str, float]:
    """Largest N's figure over the smallest N's: 1.0 = flat per-node cost."""
    if len(points) < 2:
        return {}
    first, last = points[0], points[-1]
    out = {}
    for a, b in GROWTH_KEYS:
        if first[a][b]:
            out[f"{a}.{b}"] = round(last[a][b] / first[a][b], 2)
    out["watches_added_per_node"] = round((last["watches_added"] / last["nodes"]) /
                                          max(first["watches_added"] / first["nodes"], 1e-9), 2)
    return out


def markdown(f: dict[str, Any]) -> str:
    pts = f["points"]
    rows: list[tuple[str, Any]] = [
        ("publishers (N)", lambda p: p["nodes"]),
        ("ADDs (pod sandboxes) at this point", lambda p: p["adds"]),
        ("API requests per ADD (server count, net of idle)", lambda p: p["per_add"]["api_requests"]),
        ("  of which from the publishers (their counters)", lambda p: p["per_add"]["publisher_api_requests"]),
        ("API requests per DEL", lambda p: p["per_del"]["api_requests"]),
        ("kube-apiserver CPU ms per ADD", lambda p: p["per_add"]["apiserver_cpu_ms"]),
        ("kube-apiserver CPU ms per DEL", lambda p: p["per_del"]["apiserver_cpu_ms"]),
        ("reference: kube-apiserver CPU ms to create the pod+claim+allocation",
         lambda p: p["reference_create_per_pod"]["apiserver_cpu_ms"]),
        ("etcd writes per ADD / per DEL",
         lambda p: f"{p['per_add']['etcd_writes']} / {p['per_del']['etcd_writes']}"),
        ("reference: etcd writes to create the pod+claim+allocation",
         lambda p: p["reference_create_per_pod"]["etcd_writes"]),
        ("watches open: all / added since no publisher ran", lambda p: f"{p['watches_total']} / {p['watches_added']}"),
        ("idle: kube-apiserver CPU %", lambda p: p["idle"]["apiserver_cpu_pct"]),
        ("idle: API requests/s", lambda p: p["idle"]["api_requests_per_s"]),
        ("hand-off-to-visible p50 / p99 (ms)",
         lambda p: f"{p['handoff_to_visible_ms']['p50']} / {p['handoff_to_visible_ms']['p99']}"),
        ("publisher CPU ms per ADD", lambda p: p["per_add"]["publisher_cpu_ms"]),
        ("publisher idle CPU % (each)", lambda p: p["idle"]["publisher_cpu_pct_each"]),
        ("publisher RSS MiB mean / max", lambda p: f"{p['publisher_rss_mib']['mean']} / {p['publisher_rss_mib']['max']}"),
        ("host load average (1 min, 2 cores shared)", lambda p: p.get("host_load_1m", "")),
    ]
    lines = ["| figure | " + " | ".join(f"N={p['nodes']}" for p in pts) + " |",
             "|---|" + "---:|" * len(pts)]
    for name, get in rows:
        lines.append(f"| {name} | " + " | ".join(str(get(p)) for p in pts) + " |")
    if f.get("error"):
        lines.append(f"\nstopped early: {f['error']}")
    if f.get("extrapolation", {}).get("figures"):
        lines.append("")
        lines.append("| extrapolated (largest N's per-event costs) | value |")
        lines.append("|---|---:|")
        lines.extend(f"| {k} | {v} |" for k, v in f["extrapolation"]["figures"].items())
    if f.get("apf"):
        lines.append("")
        lines.extend(apf_markdown(f["apf"]))
    return "\n".join(lines)


def apf_markdown(a: dict[str, Any]) -> list[str]:
    cases = [("alone", a["alone"]), ("publisher flood, no netclaim APF objects", a["flood_without_apf_objects"]),
             ("publisher flood, shipped APF objects", a["flood_with_apf_objects"])]
    seats = ", ".join(f"{k} {v:g}" for k, v in sorted(a.get("nominal_seats", {}).items()))
    lines = [f"kube-apiserver {a['apiserver_args']}; flood: {a['flood_requests']} publisher applies from "
             f"{a['flood_threads']} connections; nominal seats per level: {seats}", "",
             "| case | kubelet p50 / p99 ms (429s) | other workload p50 / p99 ms (429s) | flood applies/s (429s) |",
             "|---|---:|---:|---:|"]
    for name, c in cases:
        k, o, fl = c["kubelet"], c["other_workload"], c.get("flood")
        lines.append(f"| {name} | {k['p50_ms']} / {k['p99_ms']} ({k['rejected_429']}) | "
                     f"{o['p50_ms']} / {o['p99_ms']} ({o['rejected_429']}) | "
                     + (f"{fl['applied_per_s']} ({fl['rejected_429']})" if fl else "-") + " |")
    return lines


def plot(f: dict[str, Any], path: str) -> None:
    """Per-ADD cost and latency against N (matplotlib Agg: no display)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pts = f["points"]
    ns = [p["nodes"] for p in pts]
    fig, axes = plt.subplots(1, 4, figsize=(17, 3.8))
    series = [
        (axes[0], "per ADD", [("API requests", [p["per_add"]["api_requests"] for p in pts]),
                              ("etcd writes", [p["per_add"]["etcd_writes"] for p in pts])]),
        (axes[1], "kube-apiserver CPU ms", [("per ADD", [p["per_add"]["apiserver_cpu_ms"] for p in pts]),
                                           ("per pod create (reference)",
                                            [p["reference_create_per_pod"]["apiserver_cpu_ms"] for p in pts])]),
        (axes[2], "hand-off-to-visible ms", [("p50", [p["handoff_to_visible_ms"]["p50"] for p in pts]),
                                             ("p99", [p["handoff_to_visible_ms"]["p99"] for p in pts])]),
        (axes[3], "per node, idle", [("watches added / node", [p["watches_added"] / p["nodes"] for p in pts]),
                                     ("publisher RSS / 50 MiB", [p["publisher_rss_mib"]["mean"] / 50 for p in pts]),
                                     ("publisher CPU % x10", [p["idle"]["publisher_cpu_pct_each"] * 10 for p in pts])]),
    ]
    for ax, title, lines in series:
        for label, ys in lines:
            ax.plot(ns, ys, marker="o", label=label)
        ax.set_title(title)
        ax.set_xlabel("publishers (nodes)")
        ax.set_ylim(bottom=0)
        ax.legend()
        ax.grid(alpha=.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ------------------------------------------------------------------ API Priority and Fairness
#
# Shared by tests/deploy/test_apf.py (which asserts on classification and
# rejections) and the `--apf` phase of this bench (which reports latencies).

APF_KINDS = ("PriorityLevelConfiguration", "FlowSchema")
PF_FLOW_SCHEMA = "X-Kubernetes-PF-FlowSchema-UID"
PF_PRIORITY_LEVEL = "X-Kubernetes-PF-PriorityLevel-UID"
APPLY = "application/apply-patch+yaml"


@dataclass
class Reply:
    """One answered request: status, the APF classification headers, and how long it took."""

    status: int
    flow_schema: str
    priority_level: str
    seconds: float


class Endpoint:
    """Raw HTTPS requests with one bearer token over one kept-alive connection (one per thread)."""

    def __init__(self, server: str, ca_file: str, token: str) -> None:
        import ssl
        from urllib.parse import urlsplit

        url = urlsplit(server)
        self.host, self.port = url.hostname or "127.0.0.1", url.port or 443
        self.context = ssl.create_default_context(cafile=ca_file)
        self.token = token
        self.conn: Any = None

    def request(self, method: str, path: str, body: Any = None, content_type: str = "application/json") -> Reply:
        import http.client

        headers = {"Authorization": f"Bearer {self.token}", "Accept": "application/json"}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = content_type
        for attempt in (0, 1):  # one reconnect: the server may close an idle kept-alive connection
            if self.conn is None:
                self.conn = http.client.HTTPSConnection(self.host, self.port, context=self.context, timeout=60)
            t0 = time.perf_counter()
            try:
                self.conn.request(method, path, body=data, headers=headers)
                resp = self.conn.getresponse()
                resp.read()
            except (http.client.HTTPException, OSError):
                self.close()
                if attempt:
                    raise
                continue
            return Reply(resp.status, resp.getheader(PF_FLOW_SCHEMA, ""), resp.getheader(PF_PRIORITY_LEVEL, ""),
                         time.perf_counter() - t0)
        raise AssertionError("unreachable")

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None


def apf_documents() -> list[dict[str, Any]]:
    """The shipped FlowSchema and PriorityLevelConfiguration, from conf/kubernetes (whatever file holds them)."""
    import yaml

    docs = []
    for path in sorted((REPO / "conf" / "kubernetes").glob("*.yaml")):
        with path.open() as fh:
            docs.extend(d for d in yaml.safe_load_all(fh) if d and d.get("kind") in APF_KINDS)
    return docs


def apply_apf(api: Any) -> dict[str, str]:
    """Server-side apply the shipped APF objects; returns {kind: uid}."""
    from kubernetes import dynamic

    dyn = dynamic.DynamicClient(api)
    uids = {}
    for doc in apf_documents():
        resource = dyn.resources.get(api_version=doc["apiVersion"], kind=doc["kind"])
        obj = resource.server_side_apply(body=doc, name=doc["metadata"]["name"], field_manager="netclaim-bench",
                                         force_conflicts=True)
        uids[doc["kind"]] = obj.metadata.uid
    return uids


def claim_status_apply(ns: str, claim: str, node: str, seq: int) -> tuple[str, dict[str, Any]]:
    """(path, body) of the publisher's server-side apply of one claim's status.devices entry."""
    path = (f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims/{claim}/status"
            f"?fieldManager=netclaim%2F{node}&force=true")
    body = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": claim, "namespace": ns},
            "status": {"devices": [{"driver": DRIVER, "pool": node, "device": "nic0", "data": {"seq": seq}}]}}
    return path, body


def flood(make: Any, requests: list[tuple[str, dict[str, Any]]], threads: int) -> list[Reply]:
    """Send `requests` (server-side applies) from `threads` concurrent connections made by `make()`."""
    from queue import Empty, SimpleQueue

    todo: SimpleQueue = SimpleQueue()
    for item in requests:
        todo.put(item)
    replies: list[Reply] = []

    def worker() -> None:
        ep = make()
        try:
            while True:
                try:
                    path, body = todo.get_nowait()
                except Empty:
                    return
                replies.append(ep.request("PATCH", path, body, APPLY))
        finally:
            ep.close()

    with ThreadPoolExecutor(threads) as pool:
        for f in [pool.submit(worker) for _ in range(threads)]:
            f.result()
    return replies


def kubelet_probe(ep: Endpoint, node: str, ns: str, claim: str, rounds: int, stop: Any = None) -> list[Reply]:
    """What a kubelet does all the time: GET its Node, LIST its pods, GET a claim of one of its pods."""
    out = []
    for _ in range(rounds):
        if stop is not None and stop.is_set():
            break
        out.append(ep.request("GET", f"/api/v1/nodes/{node}"))
        out.append(ep.request("GET", f"/api/v1/pods?fieldSelector=spec.nodeName%3D{node}"))
        out.append(ep.request("GET", f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims/{claim}"))
    return out


# ------------------------------------------------------------------ the --apf phase

APF_APISERVER_ARGS = "--max-requests-inflight=20 --max-mutating-requests-inflight=10"
APF_NODE = "node-a"  # a static node identity of scripts/control-plane.sh


def apf_phase(flood_requests: int = 480, threads: int = 24, rounds: int = 40) -> dict[str, Any]:
    """Latency of kubelet-like requests and of another workload's requests: alone, under a flood
    of publisher writes without the shipped APF objects, and with them.

    Its own control plane (NETCLAIM_CP_DIR + "-apf", concurrency lowered to 30 seats) so the
    flood exceeds the levels' seats on a 2-core machine; stopped at the end."""
    from kubernetes import client
    from runtime import controlplane
    from runtime.identity import apply_shipped_rbac, bound_token, ensure_node, node_token

    saved = dict(os.environ)
    os.environ["NETCLAIM_CP_DIR"] = os.environ.get("NETCLAIM_CP_DIR", "/tmp/netclaim-cp") + "-apf"
    os.environ["NETCLAIM_CP_APISERVER_ARGS"] = APF_APISERVER_ARGS
    try:
        subprocess.run([str(REPO / "scripts" / "harness" / "control-plane.sh"), "down"], check=True, capture_output=True)
        handle = controlplane.up()
    finally:
        os.environ.clear()
        os.environ.update(saved)
    try:
        api = controlplane.api_client(handle.kubeconfig)
        apply_shipped_rbac(api, DRIVER)
        ns = f"apf-{uuid.uuid4().hex[:6]}"
        core = client.CoreV1Api(api)
        core.create_namespace({"metadata": {"name": ns}})
        ensure_device_class(api)
        specs = [PodSpec(APF_NODE, f"p{i}", f"p{i}-net", index=i) for i in range(8)]
        for spec in specs:
            scheduled_pod(api, ns, spec)
        publisher = node_token(api, ensure_node(api, APF_NODE))
        # another workload: a ServiceAccount of its own namespace (an operator, say), allowed to read nodes
        _other_workload(api, ns)
        other = bound_token(api, "Node", ensure_node(api, APF_NODE), namespace=ns, service_account="operator")
        kubelet = next(line.split(",")[0] for line in
                       Path(handle.env["NETCLAIM_CP_DIR"], "tokens.csv").read_text().splitlines()
                       if line.split(",")[1] == f"system:node:{APF_NODE}")
        ep = lambda token: Endpoint(handle.server, handle.ca_file, token)  # noqa: E731
        out: dict[str, Any] = {"apiserver_args": APF_APISERVER_ARGS, "flood_requests": flood_requests,
                               "flood_threads": threads}
        out["alone"] = _probe_latency(ep(kubelet), ep(other), ns, specs[0].claim, rounds)
        seq = iter(range(1, 10 ** 9))
        for label, with_apf in (("flood_without_apf_objects", False), ("flood_with_apf_objects", True)):
            if with_apf:
                apply_apf(api)
                time.sleep(2)  # the API server's APF config controller picks the objects up
            requests = [claim_status_apply(ns, specs[i % len(specs)].claim, APF_NODE, next(seq))
                        for i in range(flood_requests)]
            out[label] = _flood_with_probes(ep, publisher, kubelet, other, ns, specs[0].claim, requests, threads)
        out["nominal_seats"] = _nominal_seats(handle)
        return out
    finally:
        subprocess.run([str(REPO / "scripts" / "harness" / "control-plane.sh"), "down"], capture_output=True, env=handle.env)


def _nominal_seats(handle: Any) -> dict[str, float]:
    """Seats the API server gives each priority level now (apiserver_flowcontrol_nominal_limit_seats)."""
    import ssl

    from runtime.identity import kubeconfig_token

    ctx = ssl.create_default_context(cafile=handle.ca_file)
    samples = scrape(f"{handle.server}/metrics", ("apiserver_flowcontrol_nominal_limit_seats",),
                     {"Authorization": f"Bearer {kubeconfig_token(handle.kubeconfig)}"}, ctx)
    return {dict(labels).get("priority_level", ""): v for (_, labels), v in samples.items()}


def _other_workload(api: Any, ns: str) -> None:
    from kubernetes import client

    client.CoreV1Api(api).create_namespaced_service_account(ns, {"metadata": {"name": "operator"}})
    rbac = client.RbacAuthorizationV1Api(api)
    name = f"{ns}-operator"
    rbac.create_cluster_role({"metadata": {"name": name},
                              "rules": [{"apiGroups": [""], "resources": ["nodes", "pods"], "verbs": ["get", "list"]},
                                        {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims"],
                                         "verbs": ["get"]}]})
    rbac.create_cluster_role_binding({"metadata": {"name": name},
                                      "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                                                  "name": name},
                                      "subjects": [{"kind": "ServiceAccount", "name": "operator", "namespace": ns}]})


def _latency_summary(replies: list[Reply]) -> dict[str, Any]:
    ms = [r.seconds * 1000 for r in replies]
    return {"requests": len(replies), "p50_ms": round(percentile(ms, .5), 1), "p99_ms": round(percentile(ms, .99), 1),
            "rejected_429": sum(1 for r in replies if r.status == 429),
            "errors": sum(1 for r in replies if r.status not in (200, 429))}


def _probe_latency(kubelet: Endpoint, other: Endpoint, ns: str, claim: str, rounds: int,
                   stop: Any = None) -> dict[str, Any]:
    """Kubelet-like and other-workload probes, interleaved, until `stop` or `rounds`."""
    k, o = [], []
    try:
        for _ in range(rounds):
            if stop is not None and stop.is_set():
                break
            k.extend(kubelet_probe(kubelet, APF_NODE, ns, claim, 1))
            o.extend(kubelet_probe(other, APF_NODE, ns, claim, 1))
    finally:
        kubelet.close()
        other.close()
    return {"kubelet": _latency_summary(k), "other_workload": _latency_summary(o)}


def _flood_with_probes(ep: Any, publisher: str, kubelet: str, other: str, ns: str, claim: str,
                       requests: list[tuple[str, dict[str, Any]]], threads: int) -> dict[str, Any]:
    import threading

    stop = threading.Event()
    result: dict[str, Any] = {}

    def probe() -> None:
        result.update(_probe_latency(ep(kubelet), ep(other), ns, claim, 10 ** 6, stop))

    t = threading.Thread(target=probe)
    t.start()
    t0 = time.time()
    try:
        replies = flood(lambda: ep(publisher), requests, threads)
    finally:
        stop.set()
        t.join(300)
    seconds = time.time() - t0
    result["flood"] = {**_latency_summary(replies), "seconds": round(seconds, 2),
                       "applied_per_s": round(sum(1 for r in replies if r.status == 200) / seconds, 1)}
    return result


# ------------------------------------------------------------------ extrapolation on paper


@dataclass
class Cluster:
    """The assumptions of the extrapolation (docs/scale.md names and argues each)."""

    nodes: int = 5000
    churn_per_s: float = 100.0          # pod starts per second, cluster-wide; as many deletions (steady state)
    netclaim_share: float = 1.0         # share of pods with a netclaim claim: 1 = every pod (upper bound)
    claims_per_node: int = 30           # claims a publisher tracks at any time (the safety net reads each)
    resync_s: float = 108000.0          # safety net: mean of --verify-after + uniform[0, --verify-spread] (24 h + 6 h)
    claim_window_s: float = 90.0        # an ADD's claim watch stays open this long after the apply (--claim-window)
    watch_timeout_s: float = 300.0      # the pod watch's timeoutSeconds: one new WATCH per node per period
    apiserver_seats: int = 600          # --max-requests-inflight 400 + --max-mutating-requests-inflight 200
    other_shares: int = 245             # nominal shares of the default priority levels (exempt excluded)
    netclaim_shares: int = 10           # the shipped PriorityLevelConfiguration


def extrapolate(point: dict[str, Any], c: Cluster | None = None) -> dict[str, float]:
    """Cluster-wide figures from one measured point's per-event costs."""
    c = c or Cluster()
    add, dele = point["per_add"], point["per_del"]
    pods = c.churn_per_s * c.netclaim_share
    event_qps = pods * (add["api_requests"] + dele["api_requests"])
    resync_qps = c.nodes * c.claims_per_node / c.resync_s
    rewatch_qps = c.nodes / c.watch_timeout_s
    cpu = pods * (add["apiserver_cpu_ms"] + dele["apiserver_cpu_ms"]) / 1000
    return {
        "api_qps_events": round(event_qps, 1),
        "api_qps_resync_gets": round(resync_qps, 1),
        "api_qps_rewatch": round(rewatch_qps, 1),
        "api_qps_total": round(event_qps + resync_qps + rewatch_qps, 1),
        "etcd_writes_per_s": round(pods * (add["etcd_writes"] + dele["etcd_writes"]), 1),
        "etcd_writes_per_s_pod_create_reference": round(c.churn_per_s * point["reference_create_per_pod"]["etcd_writes"], 1),
        "watches_added": c.nodes * point["watches_added"] / point["nodes"],
        "claim_watches_open": round(pods * c.claim_window_s),
        "apiserver_cpu_cores_events": round(cpu, 2),
        "netclaim_seats": -(-c.apiserver_seats * c.netclaim_shares // (c.other_shares + c.netclaim_shares)),
        "publisher_memory_gib_cluster": round(c.nodes * point["publisher_rss_mib"]["mean"] / 1024, 1),
    }
