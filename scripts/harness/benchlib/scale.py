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

--tracked-idle S adds, at the largest N, an idle window while its ADDed claims
are tracked (their claim windows closed): what netclaim costs at rest per
tracked claim, from the API server's own request counts.
--apf adds kubelet-like and other-workload latencies under a flood of publisher
applies, without and with the shipped APF objects, on a second control plane
with lowered concurrency (tests/deploy/test_apf.py asserts the behaviour).
The output ends with an extrapolation to a large cluster (`Cluster`).
Results: docs/scale.md.
"""

from __future__ import annotations

import argparse
import os
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

from .publisher import BIN, DRIVER, Watcher, _free_port, _result
from .scale_apf import apf_phase
from .scale_metrics import APISERVER_METRICS, ETCD_METRICS, Delta, Snapshot, proc_usage, scrape, total
from .scale_objects import NETWORK, REQUEST, PodSpec, ensure_device_class, scheduled_pod
from .scale_report import Cluster, extrapolate, growth, markdown, plot
from .stats import paced, percentile

REPO = Path(__file__).resolve().parents[3]
NODE_PREFIX = "scale-"
PHASE_TIMEOUT = 300.0
LATE_S = 1.0  # an ADD whose entry took longer to show is diagnosed (its journal row)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--nodes", default="10,30,50", help="comma-separated publisher counts, ascending")
    parser.add_argument("--pods-per-node", type=int, default=6, help="pods churned per node at each point")
    parser.add_argument("--rate", type=float, default=20.0, help="ADD (and DEL) events per second, cluster-wide")
    parser.add_argument("--lifetime", type=float, default=5.0, help="least seconds between a pod's ADD and DEL")
    parser.add_argument("--idle", type=float, default=15.0, help="seconds of idle measurement at each point")
    parser.add_argument("--workers", type=int, default=2, help="publisher --workers")
    parser.add_argument("--start-batch", type=int, default=5, help="publishers started at once")
    parser.add_argument("--plot", default="", help="also write a PNG of cost against N here")
    parser.add_argument("--publisher-arg", action="append", default=[],
                        help="an extra flag for every publisher (repeatable, e.g. --publisher-arg=--verify-after=600)")
    parser.add_argument("--tracked-idle", type=float, default=0.0,
                        help="at the largest N, also measure this many idle seconds while its ADDed claims are "
                             "tracked: what netclaim costs at rest per tracked claim (claim windows closed, the "
                             "safety net's share included when it falls in the window)")
    parser.add_argument("--apf", action="store_true",
                        help="also: kubelet-like latency under a publisher flood, with and without the shipped "
                             "APF objects (on a second control plane with lowered concurrency limits)")


def _progress(text: str) -> None:
    print(f"[bench scale] {text}", file=sys.stderr, flush=True)



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
        from runtime.statedir import DEFAULT_CP_DIR, read_state_file

        ports = dict(line.split("=", 1) for line in
                     read_state_file(Path(handle.env.get("NETCLAIM_CP_DIR") or DEFAULT_CP_DIR, "ports.env")).split())
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

    def start(self, kubeconfig: str, workers: int, extra: list[str]) -> None:
        self.port = _free_port()
        with open(self.dir / "publisher.log", "ab") as log:
            self.proc = subprocess.Popen(
                [str(BIN / "netclaim-publisher"), "run", "--node-name", self.node, "--kubeconfig", kubeconfig,
                 "--socket", self.socket, "--state-dir", str(self.dir / "state"),
                 "--spool-dir", str(self.dir / "spool"), "--metrics-address", f"127.0.0.1:{self.port}",
                 "--workers", str(workers), "--log-level", "warning", *extra],
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
class Scale:
    """The bench's state: control plane, namespace, publishers."""

    cp: ControlPlane
    args: argparse.Namespace
    ns: str = field(default_factory=lambda: f"scale-{uuid.uuid4().hex[:6]}")
    dir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="netclaim-scale-")))
    publishers: dict[str, Publisher] = field(default_factory=dict)
    pod_count: int = 0
    baseline_watches: float = 0.0  # the API server's own informers, open before any publisher
    claim_watches_before: float = 0.0  # claim watches open before a point's ADDs (the bench's own are closed)

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
                pub.start(kubeconfig, self.args.workers, self.args.publisher_arg)
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
        from cni_plugin.wire import event as wire_event

        return wire_event.Event(op=op, container_id=spec.cid, ifname="eth0", driver=DRIVER,
                          netns=f"/var/run/netns/{spec.cid}", network=NETWORK, request=REQUEST,
                          pod=wire_event.PodRef(self.ns, spec.name, spec.uid), cni_version="1.1.0",
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


def measure_point(bench: Scale, n: int, last: bool = True) -> dict[str, Any]:
    cp = bench.cp
    _progress(f"N={n}: starting publishers")
    start_s = bench.grow(n)
    time.sleep(3)  # initial resyncs and pod lists settle
    s0 = cp.snapshot(bench.publishers)
    time.sleep(bench.args.idle)
    s1 = cp.snapshot(bench.publishers)
    idle = Delta.between(s0, s1)
    watches = cp.watches()
    bench.claim_watches_before = watches.get("resourceclaims", 0.0)
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
    missing = [s for s in specs if s.claim not in seen]
    if missing:
        raise RuntimeError(f"N={n}: {len(missing)} claims never showed their entry (watch reopened "
                           f"{len(watcher.reconnects)}x: {watcher.reconnects[:3]}); the publishers' journals "
                           f"say: {_journal_rows(bench, missing[:5])}")
    _until(bench.drained, PHASE_TIMEOUT, "journals to drain after the ADDs")
    # Each ADD's claim watch stays open for the publisher's claim window after its apply, and the
    # API server counts a WATCH when it ends: the ADD phase ends when the last window has closed.
    _until(lambda: cp.watches().get("resourceclaims", 0.0) <= bench.claim_watches_before, PHASE_TIMEOUT,
           "the claim windows of the ADDs to close")
    s4 = cp.snapshot(bench.publishers)
    add = Delta.between(s3, s4)
    add.requests["WATCH resourceclaims"] = add.requests.get("WATCH resourceclaims", 0) - 1  # the bench's own
    tracked = _tracked_idle(bench, idle, len(specs)) if bench.args.tracked_idle > 0 and last else {}
    if tracked:
        s4 = cp.snapshot(bench.publishers)  # the DEL phase starts after the at-rest window
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
    late = sorted((s for s in specs if seen[s.claim] - acked[s.claim] > LATE_S),
                  key=lambda s: acked[s.claim] - seen[s.claim])
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
        "late": {"over_s": LATE_S, "count": len(late), "watch_reopened": watcher.reconnects,
                 "slowest": [{"ms": round((seen[s.claim] - acked[s.claim]) * 1000), **row}
                             for s, row in zip(late[:10], _journal_rows(bench, late[:10]))]},
        "publisher_rss_mib": {"mean": round(sum(rss) / len(rss), 1), "max": round(max(rss), 1),
                              "total": round(sum(rss), 1)},
        "host_mem_available_mib": _mem_available_mib(),
        "host_load_1m": round(os.getloadavg()[0], 2),  # the machine is shared: how busy it was
    }


def _journal_rows(bench: Scale, specs: list[PodSpec]) -> list[dict[str, Any]]:
    """What each pod's publisher recorded about its ADD: tries, seconds from receipt to the end of
    the event, the last error. Tells a publisher that was slow from a watch that saw it late."""
    import sqlite3

    out = []
    for spec in specs:
        db = sqlite3.connect(f"file:{bench.publishers[spec.node].dir / 'state' / 'journal.db'}?mode=ro", uri=True)
        try:
            row = db.execute("SELECT attempts, finished - received, state, error FROM events "
                             "WHERE container_id = ? AND op = 'ADD'", (spec.cid,)).fetchone()
        finally:
            db.close()
        out.append({"node": spec.node, "claim": spec.claim, **(
            dict(zip(("attempts", "handled_s", "state", "error"), row)) if row else {"journal": "no row"})})
    return out


def _tracked_idle(bench: Scale, idle: Delta, claims: int) -> dict[str, Any]:
    """Idle seconds with `claims` tracked, their claim windows closed: what tracking costs at rest.

    Net of the same publishers' idle rate before their claims existed (the pod watches' renewals, the
    API server's own lease updates), so what remains is what grows with the number of claims."""
    _progress(f"at rest for {bench.args.tracked_idle:.0f}s with {claims} claims tracked")
    a = bench.cp.snapshot(bench.publishers)
    time.sleep(bench.args.tracked_idle)
    b = bench.cp.snapshot(bench.publishers)
    d = Delta.between(a, b)
    extra = {k: v - idle.requests.get(k, 0.0) * d.seconds / idle.seconds for k, v in d.requests.items()}
    claim_requests = sum(v for k, v in d.requests.items() if "resourceclaims" in k)
    return {"seconds": round(d.seconds, 1), "claims": claims,
            "requests": {k: int(v) for k, v in sorted(d.requests.items()) if v},
            "requests_net_of_idle": {k: round(v, 1) for k, v in extra.items() if abs(v) > 0.5},
            "claim_requests": int(claim_requests),
            "claim_requests_per_s_per_1000_claims": round(claim_requests / d.seconds / claims * 1000, 4),
            "all_requests_per_s": round(sum(d.requests.values()) / d.seconds, 3),
            "publisher_requests": int(d.publisher_requests)}


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


def assumed(args: argparse.Namespace) -> Cluster:
    """The extrapolation's cluster, with the claim window the bench's publishers ran with."""
    window = 0.0
    for arg in args.publisher_arg:
        name, _, value = arg.partition("=")
        if name == "--claim-window" and value:
            window = float(value)
    return Cluster(claim_window_s=window)


def run(args: argparse.Namespace) -> dict[str, Any]:
    sys.path.insert(0, str(REPO / "scripts" / "harness"))
    levels = sorted(int(x) for x in args.nodes.split(",") if x.strip())
    points, error = measure_points(args, levels) if levels else ([], "")
    if args.apf:
        _progress("APF: kubelet-like latency under a publisher flood, without and with the shipped objects")
        apf = apf_phase()
    else:
        apf = {}
    cluster = assumed(args)
    figures = {"points": points, "error": error, "cpus": os.cpu_count(), "apf": apf,
               "options": {k: getattr(args, k) for k in ("nodes", "pods_per_node", "rate", "lifetime", "idle",
                                                        "workers", "publisher_arg", "tracked_idle")},
               "growth": growth(points),
               "extrapolation": {"assumptions": cluster.__dict__,
                                 "figures": extrapolate(points[-1], cluster) if points else {}}}
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
                points.append(measure_point(bench, n, last=n == levels[-1]))
            except (RuntimeError, OSError, MemoryError) as exc:
                error = f"N={n}: {type(exc).__name__}: {exc}"
                _progress(f"stopped: {error}")
                break
    finally:
        bench.teardown()
        cp.handle.down()
    return points, error
