"""publisher: ADD-to-visible latency, API requests per ADD, drain vs a bare apply loop, RSS.

Against the real local API server (scripts/control-plane.sh up):
1. latency: N pod sandboxes (default 200) at R/s (default 20): the real plugin
   binary runs ADD for each (prevResult with MAC, as after bridge+host-local);
   a watch on the claims records when the entry becomes visible. Figures are
   from the hand-off (the journal commit the plugin waits for: the publisher's
   share), from the start of the plugin's exec, and from the plugin's return.
2. API requests per ADD (from the publisher's own metrics), and the writes
   caused by repeating identical ADDs (target 0).
3. drain: M events (default 1000) queued in the spool while the publisher is
   stopped; time from its /readyz to an empty journal. Its reference is the
   publisher's own request budget (limits.API_QPS after an API_BURST): a node
   draining a backlog after an outage must not send more, because every node
   of the cluster drains at once then. A bare loop of the same server-side
   applies (the API server's own limit, no budget) is measured beside it.
4. RSS of the publisher with all attachments tracked.
5. CPU of the idle publisher holding those attachments (% of one core over a
   quiet window), and API requests per resync pass per tracked claim
   (publisher restarted with a short --resync-interval; requests counted
   between the ends of two complete passes).
6. IO pressure (node_costs.py): hand-off-to-visible against a bare apply loop under
   the same load, and the plugin's ADD p99 under it against its quiet p99 (step 1).
7. burst (publisher_burst.py): --burst ADDs at once through the real plugin to a
   publisher whose every apply takes --burst-apply-delay s longer (a TLS proxy in
   front of the API server); API requests per ADD. `--burst-only` runs just this.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from . import node_costs, publisher_burst
from .stats import paced, percentile

REPO = Path(__file__).resolve().parents[3]
BIN = Path(sys.executable).parent
DRIVER = "net.example.com"
CLASS = "netclaim-bench"
MERGE = "application/merge-patch+json"
APPLY = "application/apply-patch+yaml"
TARGETS = {"p99_ms": 150.0, "api_requests_per_add": 2.0, "identical_add_writes": 0,
           "drain_ratio": 0.8, "rss_mib": 100.0, "idle_cpu_percent": 1.0,
           "api_requests_per_ordinary_pod": 0, "warning_events_per_ordinary_pod": 0, "contended_p99_ratio": 2.0,
           "contended_plugin_add_p99_ratio": 1.5, "burst_api_requests_per_add": publisher_burst.TARGET_REQUESTS_PER_ADD}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--sandboxes", type=int, default=200, help="pod sandboxes for the latency run")
    parser.add_argument("--rate", type=float, default=20.0, help="sandboxes per second")
    parser.add_argument("--queued", type=int, default=1000, help="events queued for the drain run")
    parser.add_argument("--workers", type=int, default=4, help="publisher --workers")
    parser.add_argument("--ordinary", type=int, default=50, help="pods without a claim (ADD + DEL each)")
    parser.add_argument("--contended", type=int, default=100, help="sandboxes handed over under IO pressure")
    parser.add_argument("--contended-rate", type=float, default=10.0, help="sandboxes per second under IO pressure")
    parser.add_argument("--burst", type=int, default=200, help="ADDs sent at once for the slow-apply burst (0: skip)")
    parser.add_argument("--burst-apply-delay", type=float, default=0.3,
                        help="seconds a proxy holds each status apply during the burst")
    parser.add_argument("--burst-only", action="store_true", help="run only the slow-apply burst")


def _progress(text: str) -> None:
    print(f"[bench publisher] {text}", file=sys.stderr, flush=True)



def _control_plane() -> dict[str, str]:
    script = REPO / "scripts" / "control-plane.sh"
    subprocess.run([str(script), "up"], check=True, stdout=subprocess.DEVNULL)
    out = subprocess.run([str(script), "env"], check=True, capture_output=True, text=True).stdout
    env = {}
    for line in out.splitlines():
        if line.startswith("export "):
            k, _, v = line[7:].partition("=")
            env[k] = v.strip("'\"")
    return env


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Bench:
    def __init__(self, kubeconfig: str, workers: int) -> None:
        from kubernetes import client, config

        cfg = client.Configuration()
        config.load_kube_config(config_file=kubeconfig, client_configuration=cfg)
        cfg.connection_pool_maxsize = 16
        self.api = client.ApiClient(cfg)
        self.core = client.CoreV1Api(self.api)
        self.res = client.ResourceV1Api(self.api)
        self.kubeconfig = kubeconfig
        self.publisher_kubeconfig = kubeconfig  # the publisher's own (the burst points it at a proxy)
        self.workers = workers
        self.ns = f"bench-{uuid.uuid4().hex[:6]}"
        self.dir = Path(tempfile.mkdtemp(prefix="netclaim-bench-"))
        self.proc: subprocess.Popen | None = None
        self.port = 0

    # -------------------------------------------------------- cluster
    def setup(self) -> None:
        self.core.create_namespace({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": self.ns}})
        for fn, body in ((self.core.create_node, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-a"}}),
                         (self.res.create_device_class, {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
                                                         "metadata": {"name": CLASS}, "spec": {}})):
            try:
                fn(body)
            except Exception as exc:  # already there
                if getattr(exc, "status", None) != 409:
                    raise

    def pod(self, i: int) -> tuple[str, str, str]:
        """Claim + pod + allocation (as the scheduler would); returns (pod, claim, uid)."""
        pod, claim = f"p{i}", f"p{i}-net"
        self.res.create_namespaced_resource_claim(self.ns, {
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": claim},
            "spec": {"devices": {"requests": [{"name": "nic", "exactly": {"deviceClassName": CLASS}}]}}},
            _preload_content=False)
        resp = self.core.create_namespaced_pod(self.ns, {
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": pod},
            "spec": {"nodeName": "node-a", "containers": [{"name": "c", "image": "local/pause:1"}],
                     "resourceClaims": [{"name": "net", "resourceClaimName": claim}]}}, _preload_content=False)
        uid = json.loads(resp.data)["metadata"]["uid"]
        self.res.patch_namespaced_resource_claim_status(claim, self.ns, {"status": {
            "allocation": {"devices": {"results": [{"request": "nic", "driver": DRIVER, "pool": "node-a",
                                                    "device": "nic0"}]},
                           "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                               {"key": "metadata.name", "operator": "In", "values": ["node-a"]}]}]}},
            "reservedFor": [{"resource": "pods", "name": pod, "uid": uid}]}},
            _content_type=MERGE, _preload_content=False)
        return pod, claim, uid

    def pods(self, start: int, n: int) -> list[tuple[str, str, str]]:
        with ThreadPoolExecutor(8) as pool:
            return list(pool.map(self.pod, range(start, start + n)))

    def teardown(self) -> None:
        self.stop()
        try:
            self.core.delete_namespace(self.ns)
        except Exception:
            pass
        shutil.rmtree(self.dir, ignore_errors=True)

    # -------------------------------------------------------- publisher
    def start(self, extra: list[str] | None = None) -> float:
        self.port = _free_port()
        log = open(self.dir / "publisher.log", "ab")
        self.proc = subprocess.Popen(
            [str(BIN / "netclaim-publisher"), "run", "--node-name", "node-a", "--kubeconfig", self.publisher_kubeconfig,
             "--socket", str(self.dir / "run" / "p.sock"), "--state-dir", str(self.dir / "state"),
             "--spool-dir", str(self.dir / "spool"), "--metrics-address", f"127.0.0.1:{self.port}",
             "--workers", str(self.workers), "--log-level", "warning", *(extra or [])], stdout=log, stderr=log)
        log.close()
        deadline = time.time() + 60
        while time.time() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/readyz", timeout=1) as r:
                    if r.status == 200:
                        return time.time()
            except OSError:
                time.sleep(0.02)
        raise RuntimeError("publisher did not become ready")

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(30)

    def metrics(self) -> dict[str, float]:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=5) as r:
            out = {}
            for line in r.read().decode().splitlines():
                if line and not line.startswith("#"):
                    k, _, v = line.rpartition(" ")
                    out[k] = float(v)
            return out

    def status(self, brief: bool = False) -> dict[str, Any]:
        from cni_plugin.wire.frame import encode_frame, read_frame

        with socket.socket(socket.AF_UNIX) as s:
            s.connect(str(self.dir / "run" / "p.sock"))
            s.sendall(encode_frame({"kind": "status", "brief": brief}))
            return read_frame(s)["status"]

    def cpu_seconds(self) -> float:
        """utime + stime of the publisher process so far."""
        assert self.proc is not None
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def rss_mib(self) -> float:
        assert self.proc is not None
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return 0.0

    # -------------------------------------------------------- plugin
    def plugin_add(self, cid: str, pod: str, uid: str, i: int) -> tuple[float, float]:
        return self.plugin_run("ADD", cid, pod, uid, i)

    def plugin_run(self, command: str, cid: str, pod: str, uid: str, i: int) -> tuple[float, float]:
        conf = {"cniVersion": "1.1.0", "name": "benchnet", "type": "netclaim", "driverName": DRIVER,
                "request": "nic", "socketPath": str(self.dir / "run" / "p.sock"), "spoolDir": str(self.dir / "spool"),
                "stateDir": str(self.dir / "plugin-state"), "logFile": str(self.dir / "plugin.log"),
                "prevResult": _result(i)}
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "CNI_COMMAND": command, "CNI_CONTAINERID": cid,
               "CNI_NETNS": "/var/run/netns/bench", "CNI_IFNAME": "eth0", "CNI_PATH": "/usr/lib/cni",
               "CNI_ARGS": f"IgnoreUnknown=1;K8S_POD_NAMESPACE={self.ns};K8S_POD_NAME={pod};K8S_POD_UID={uid}"}
        t0 = time.time()
        # close_fds=False lets subprocess use posix_spawn (vfork): launching like a Go
        # runtime does, instead of forking this large Python process 20 times a second.
        out = subprocess.run([str(BIN / "netclaim")], input=json.dumps(conf), env=env, capture_output=True,
                             text=True, close_fds=False)
        if out.returncode != 0:
            raise RuntimeError(f"plugin {command} failed: {out.stdout}")
        return t0, time.time()

    def wait_drained(self) -> float:
        return _wait_drained(self)


def _result(i: int) -> dict[str, Any]:
    return {"cniVersion": "1.1.0",
            "interfaces": [{"name": "cni0", "mac": "aa:aa:aa:aa:aa:01"},
                           {"name": "eth0", "mac": f"0a:58:0a:50:{i // 256:02x}:{i % 256:02x}", "mtu": 1500,
                            "sandbox": "/var/run/netns/bench"}],
            "ips": [{"address": f"10.80.{i // 250}.{i % 250 + 2}/16", "interface": 1},
                    {"address": f"fd00:80::{i + 2:x}/64", "interface": 1}],
            "routes": [{"dst": "0.0.0.0/0"}], "dns": {}}


class Watcher:
    """A watch on the namespace's claims, in its own process (so the bench's
    plugin-launching threads cannot delay its clock readings through the GIL):
    reports when each claim first shows our entry, and for which containerID.

    A thread of the bench reads the watch process's reports as they come. Read only
    later (after all the ADDs were sent), they filled the pipe between the two
    processes after about 1,200 reports: the watch process then blocked, stopped
    reading its watch, and stamped every later entry when the bench finally read,
    seconds late (the "30 pods per node" p99 of 14 s, and at 3,000 ADDs a watch
    kube-apiserver closed as unresponsive)."""

    def __init__(self, bench: Bench) -> None:
        import multiprocessing
        import threading

        resp = bench.res.list_namespaced_resource_claim(bench.ns, _preload_content=False)
        rv = json.loads(resp.data)["metadata"]["resourceVersion"]
        ctx = multiprocessing.get_context("fork")
        self.queue = ctx.SimpleQueue()
        self.proc = ctx.Process(target=_watch_claims, args=(bench.kubeconfig, bench.ns, rv, self.queue), daemon=True)
        self.proc.start()
        self.reports: list[tuple[str, str, float]] = []  # (claim, containerID, first seen), in arrival order
        self.reconnects: list[str] = []  # why the watch had to be opened again, each time
        self._lock = threading.Lock()
        threading.Thread(target=self._read, name="claim-watch-reader", daemon=True).start()

    def _read(self) -> None:
        while True:
            try:
                name, detail, t = self.queue.get()
            except (EOFError, OSError):  # the watch process was stopped
                return
            with self._lock:
                if name is None:  # the watch ended (detail says why) and was opened again
                    self.reconnects.append(detail)
                else:
                    self.reports.append((name, detail, t))

    def collect(self, want: dict[str, str], timeout: float) -> dict[str, float]:
        """claim -> first time the entry written for want[claim] (a containerID) was seen."""
        deadline = time.time() + timeout
        while True:
            with self._lock:
                done: dict[str, float] = {}
                for name, cid, t in self.reports:
                    if want.get(name) == cid and name not in done:
                        done[name] = t
            if len(done) == len(want) or time.time() >= deadline:
                return done
            time.sleep(0.05)

    def stop(self) -> None:
        self.proc.kill()
        self.proc.join(5)


def _watch_claims(kubeconfig: str, ns: str, rv: str, queue: Any) -> None:
    """Follow the namespace's claims from `rv` for as long as the bench runs.

    A watch the API server ends (its timeout, or a watcher too slow for its buffer) is opened
    again from the last resourceVersion seen, and relisted when that is too old (410): an
    entry is never missed because the bench's own watch lagged. Each reopening is reported
    (name None), so a figure that needed one says so."""
    from kubernetes import client, config

    cfg = client.Configuration()
    config.load_kube_config(config_file=kubeconfig, client_configuration=cfg)
    res = client.ResourceV1Api(client.ApiClient(cfg))
    reported: set[tuple[str, str]] = set()

    def report(obj: dict[str, Any], now: float) -> None:
        name = (obj.get("metadata") or {}).get("name", "")
        for d in (obj.get("status") or {}).get("devices") or []:
            cid = (d.get("data") or {}).get("containerID", "")
            if d.get("driver") == DRIVER and (name, cid) not in reported:
                reported.add((name, cid))
                queue.put((name, cid, now))

    while True:
        resp = res.list_namespaced_resource_claim(ns, watch=True, resource_version=rv, timeout_seconds=900,
                                                  allow_watch_bookmarks=True, _preload_content=False)
        buf, why = b"", "ended by the API server"
        for chunk in resp.stream(65536):
            now = time.time()
            buf += chunk
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                ev = json.loads(line)
                obj = ev.get("object") or {}
                if ev.get("type") == "ERROR":
                    why = f"error {obj.get('code')}: {obj.get('message', '')}"
                    rv = "" if obj.get("code") == 410 else rv
                    continue
                rv = (obj.get("metadata") or {}).get("resourceVersion", rv)
                report(obj, now)
        if not rv:  # too old to resume: list again (every entry listed counts as seen now)
            listed = json.loads(res.list_namespaced_resource_claim(ns, _preload_content=False).data)
            now = time.time()
            for obj in listed["items"]:
                report(obj, now)
            rv = listed["metadata"]["resourceVersion"]
        queue.put((None, why, time.time()))


def _latency(bench: Bench, pods: list[tuple[str, str, str]], rate: float) -> dict[str, Any]:
    watcher = Watcher(bench)
    try:
        return _latency_run(bench, pods, rate, watcher)
    finally:
        watcher.stop()


def _latency_run(bench: Bench, pods: list[tuple[str, str, str]], rate: float, watcher: "Watcher") -> dict[str, Any]:
    times: dict[str, tuple[float, float]] = {}
    cids: dict[str, str] = {}
    before = bench.metrics()

    def one(i: int) -> None:
        pod, claim, uid = pods[i]
        cid = f"lat{i}-{uuid.uuid4().hex[:8]}"
        cids[claim] = cid
        times[claim] = bench.plugin_add(cid, pod, uid, i)

    paced(range(len(pods)), rate, one)
    seen = watcher.collect(cids, timeout=60)
    _wait_drained(bench)
    after = bench.metrics()
    received = _journal_received(bench)
    from_handoff = [(seen[c] - received[cids[c]]) * 1000 for c in times
                    if c in seen and cids[c] in received]
    from_start = [(seen[c] - times[c][0]) * 1000 for c in times if c in seen]
    from_return = [(seen[c] - times[c][1]) * 1000 for c in times if c in seen]
    plugin_ms = [(t[1] - t[0]) * 1000 for t in times.values()]
    api = _api(after) - _api(before)
    # repeated identical ADDs (runtime retries): same containerID, same result
    before_rep = bench.metrics()
    repeats = min(20, len(pods))
    for i in range(repeats):
        pod, claim, uid = pods[i]
        bench.plugin_add(cids[claim], pod, uid, i)
    _wait_drained(bench)
    after_rep = bench.metrics()
    writes = _api(after_rep, "apply") - _api(before_rep, "apply")
    return {
        "sandboxes": len(pods), "visible": len(from_start),
        "handoff_to_visible_ms": {"p50": round(percentile(from_handoff, .5), 1), "p90": round(percentile(from_handoff, .9), 1),
                                  "p99": round(percentile(from_handoff, .99), 1), "max": round(max(from_handoff), 1),
                                  "over_150": sum(1 for v in from_handoff if v > 150)},
        "exec_to_visible_ms": {"p50": round(percentile(from_start, .5), 1), "p99": round(percentile(from_start, .99), 1)},
        "add_return_to_visible_ms": {"p50": round(percentile(from_return, .5), 1), "p99": round(percentile(from_return, .99), 1)},
        "plugin_add_ms": {"p50": round(percentile(plugin_ms, .5), 1), "p99": round(percentile(plugin_ms, .99), 1)},
        "api_requests_per_add": round(api / len(pods), 2),
        "identical_add_repeats": repeats, "identical_add_writes": int(writes),
    }


def _journal_received(bench: Bench) -> dict[str, float]:
    """containerID -> when the publisher committed the ADD (the moment it acked the plugin)."""
    import sqlite3

    db = sqlite3.connect(str(bench.dir / "state" / "journal.db"))
    try:
        rows = dict(db.execute("SELECT container_id, MIN(received) FROM events WHERE op='ADD' GROUP BY container_id"))
    finally:
        db.close()
    # The journal keeps receipt times on the node's boot clock (durations must not step with the
    # wall clock); the watcher reads the wall clock. Both are this machine's: shift by their offset.
    shift = time.time() - time.clock_gettime(time.CLOCK_BOOTTIME)
    return {cid: (t + shift if t < 1e9 else t) for cid, t in rows.items()}


def _api(m: dict[str, float], verb: str = "") -> float:
    return sum(v for k, v in m.items() if k.startswith("netclaim_api_requests_total") and f'verb="{verb}' in k)


def _wait_drained(bench: Bench, timeout: float = 600) -> float:
    """Until quiescent: no pending event, no spool file, no claim waiting for its apply."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if bench.status(brief=True)["quiescent"]:  # brief: the poll must not load the publisher
            return time.time()
        time.sleep(0.02)
    raise RuntimeError("journal did not drain")


def _drain(bench: Bench, pods: list[tuple[str, str, str]], offset: int) -> dict[str, Any]:
    from cni_plugin.wire.event import Event, PodRef
    from cni_plugin.wire.spool import write_spool

    bench.stop()
    for i, (pod, claim, uid) in enumerate(pods):
        write_spool(str(bench.dir / "spool"), Event(
            op="ADD", container_id=f"drain{i}-{uuid.uuid4().hex[:8]}", ifname="eth0", driver=DRIVER,
            network="benchnet", request="nic", pod=PodRef(bench.ns, pod, uid), result=_result(offset + i),
            cni_version="1.1.0"))
    ready = bench.start()
    done = _wait_drained(bench)
    publisher_s = done - ready
    m = bench.metrics()
    rss = bench.rss_mib()
    attachments = bench.status()["attachments"]
    # The bare loop: the same applies (bodies read back from the claims), one after
    # the other with a plain client, under another field manager (so each is a real write).
    bodies = []
    for pod, claim, uid in pods:
        resp = bench.res.read_namespaced_resource_claim(claim, bench.ns, _preload_content=False)
        devs = [d for d in json.loads(resp.data)["status"].get("devices", []) if d["driver"] == DRIVER]
        bodies.append((claim, devs))
    bare_s = _bare_loop(bench, bodies, "bench-bare-loop", workers=1)
    # The same again with as many parallel clients as the publisher has workers: the
    # fair reference for a publisher that applies in parallel.
    bare_par_s = _bare_loop(bench, bodies, "bench-bare-loop-parallel", workers=bench.workers)
    return {
        "queued": len(pods), "publisher_drain_s": round(publisher_s, 2),
        "publisher_events_per_s": round(len(pods) / publisher_s, 1),
        "bare_apply_loop_s": round(bare_s, 2), "bare_applies_per_s": round(len(pods) / bare_s, 1),
        "bare_parallel_loop_s": round(bare_par_s, 2), "bare_parallel_workers": bench.workers,
        "bare_parallel_applies_per_s": round(len(pods) / bare_par_s, 1),
        "drain_ratio_vs_sequential": round(bare_s / publisher_s, 2),
        "drain_ratio_vs_bare_parallel": round(bare_par_s / publisher_s, 2),
        # The fastest drain the token bucket allows for the requests it took: the target's reference.
        "request_budget_s": round(budget_s(_api(m)), 2),
        "drain_ratio": round(budget_s(_api(m)) / publisher_s, 2) if budget_s(_api(m)) else None,
        "api_requests_during_drain": int(_api(m)),
        "rss_mib": round(rss, 1), "tracked_attachments": attachments,
    }


def budget_s(requests: float) -> float:
    """Seconds a client holding the publisher's token bucket needs for `requests` (the burst goes at once)."""
    from publisher import limits

    return max(0.0, requests - limits.API_BURST) / limits.API_QPS


def _bare_loop(bench: Bench, bodies: list[tuple[str, list[dict[str, Any]]]], manager: str, workers: int) -> float:
    """Seconds for the same server-side applies from `workers` plain clients.

    A field manager of its own makes each apply a real write (managedFields change)."""
    from concurrent.futures import ThreadPoolExecutor

    t0 = time.time()
    with ThreadPoolExecutor(max_workers=workers) as pool:
        list(pool.map(lambda item: _bare_apply(bench, item[0], item[1], manager), bodies))
    return time.time() - t0


def _bare_apply(bench: Bench, claim: str, devs: list[dict[str, Any]], manager: str) -> None:
    """One server-side apply of a claim's entries with a plain client: the bare reference."""
    bench.res.patch_namespaced_resource_claim_status(
        claim, bench.ns, {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                          "metadata": {"name": claim, "namespace": bench.ns}, "status": {"devices": devs}},
        field_manager=manager, _content_type=APPLY, _preload_content=False)


def _idle_and_resync(bench: Bench, idle_s: float = 20.0) -> dict[str, Any]:
    """Idle CPU with every attachment tracked, then API requests per resync per claim."""
    time.sleep(2.0)  # let the drain's last log lines and gauges settle
    cpu0, t0 = bench.cpu_seconds(), time.time()
    time.sleep(idle_s)
    idle_cpu = (bench.cpu_seconds() - cpu0) / (time.time() - t0) * 100
    attachments = bench.status()["attachments"]
    bench.stop()
    bench.start(["--resync-interval", "3"])

    def next_pass(after: float) -> float:
        deadline = time.time() + 300
        while time.time() < deadline:
            done = bench.status().get("last_resync") or 0
            if done > after:
                return done
            time.sleep(0.05)
        raise RuntimeError("no resync pass")

    first = next_pass(0)
    m1 = bench.metrics()
    next_pass(first)
    m2 = bench.metrics()
    claims = bench.status()["claims_total"]
    return {"idle_cpu_percent": round(idle_cpu, 2), "idle_window_s": idle_s, "idle_attachments": attachments,
            "resync_claims": claims, "resync_requests": int(_api(m2) - _api(m1)),
            "api_requests_per_resync_per_claim": round((_api(m2) - _api(m1)) / max(1, claims), 3)}


def _burst(env: dict[str, str], args: argparse.Namespace) -> dict[str, Any]:
    """The slow-apply burst in a namespace, state dir and publisher of its own, through the proxy."""
    bench = Bench(env["KUBECONFIG"], args.workers)
    proxy = None
    try:
        bench.setup()
        _progress(f"burst: creating {args.burst} pods with allocated claims")
        pods = bench.pods(0, args.burst)
        proxy = publisher_burst.slow_proxy(env["NETCLAIM_APISERVER"], env["NETCLAIM_APISERVER_CA"], bench.dir,
                                           args.burst_apply_delay)
        bench.publisher_kubeconfig = publisher_burst.proxy_kubeconfig(env["KUBECONFIG"], proxy,
                                                                       bench.dir / "proxy.kubeconfig")
        bench.start()
        _progress(f"burst: {args.burst} ADDs at once, each apply {args.burst_apply_delay} s slower")
        figures = publisher_burst.burst(bench, pods, proxy, Watcher, _api, _journal_received)
    finally:
        bench.teardown()
        if proxy is not None:
            proxy.stop()
    figures["load_average"] = _loadavg()
    return figures


def _loadavg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def run(args: argparse.Namespace) -> dict[str, Any]:
    env = _control_plane()
    if args.burst_only:
        figures = {"burst": _burst(env, args), "targets": TARGETS, "cpus": os.cpu_count(),
                   "result_name": "publisher-burst"}
        _burst_table(figures["burst"])
        return figures
    bench = Bench(env["KUBECONFIG"], args.workers)
    load: dict[str, list[float]] = {"start": _loadavg()}
    try:
        bench.setup()
        _progress(f"creating {args.sandboxes + args.queued} pods with allocated claims")
        lat_pods = bench.pods(0, args.sandboxes)
        drain_pods = bench.pods(args.sandboxes, args.queued)
        cont_pods = bench.pods(args.sandboxes + args.queued, args.contended)
        bench.start()
        time.sleep(1)
        rss_idle = bench.rss_mib()
        _progress(f"latency: {args.sandboxes} sandboxes at {args.rate}/s")
        latency = _latency(bench, lat_pods, args.rate)
        latency["rss_mib_after"] = round(bench.rss_mib(), 1)
        latency["rss_mib_idle_before"] = round(rss_idle, 1)
        load["latency"] = _loadavg()
        _progress(f"drain: {args.queued} queued events vs a bare apply loop")
        drain = _drain(bench, drain_pods, args.sandboxes)
        _progress("idle CPU and resync cost")
        idle = _idle_and_resync(bench)
        load["idle"] = _loadavg()
        bench.stop()  # the idle run left a publisher resyncing every 3 s: its GETs must not count below
        bench.start()
        _progress(f"ordinary pods: {args.ordinary} without a claim")
        ordinary = node_costs.ordinary_pods(bench, args.ordinary, _api)
        _progress(f"IO pressure: {args.contended} sandboxes at {args.contended_rate}/s vs a bare apply loop")
        contended = node_costs.contended(bench, cont_pods, args.contended_rate, _latency,
                                         lambda claim, devs: _bare_apply(bench, claim, devs, "bench-bare-contended"))
        load["contended"] = _loadavg()
    finally:
        bench.teardown()
    # The plugin's ADD under IO pressure against its own quiet p99 (the latency run above).
    contended["plugin_add_p99_ratio_vs_quiet"] = round(
        contended["plugin_add_ms"]["p99"] / max(0.1, latency["plugin_add_ms"]["p99"]), 2)
    figures = {"latency": latency, "drain": drain, "idle": idle, "ordinary": ordinary, "contended": contended,
               "targets": TARGETS, "cpus": os.cpu_count(), "load_average": load}
    if args.burst > 0:
        figures["burst"] = _burst(env, args)
    _table(figures)
    if "burst" in figures:
        _burst_table(figures["burst"])
    return figures


def _table(f: dict[str, Any]) -> None:
    lat, dr, idle = f["latency"], f["drain"], f["idle"]
    rows = [
        ("ADD hand-off-to-visible p50 / p90 / p99 (ms)",
         f"{lat['handoff_to_visible_ms']['p50']} / {lat['handoff_to_visible_ms']['p90']} / "
         f"{lat['handoff_to_visible_ms']['p99']}", "p99 <= 150"),
        ("  ADDs over 150 ms", f"{lat['handoff_to_visible_ms']['over_150']} of {lat['visible']}", ""),
        ("ADD exec-start-to-visible p50 / p99 (ms)",
         f"{lat['exec_to_visible_ms']['p50']} / {lat['exec_to_visible_ms']['p99']}", ""),
        ("ADD-return-to-visible p50 / p99 (ms)",
         f"{lat['add_return_to_visible_ms']['p50']} / {lat['add_return_to_visible_ms']['p99']}", ""),
        ("plugin ADD p50 / p99 (ms)", f"{lat['plugin_add_ms']['p50']} / {lat['plugin_add_ms']['p99']}", ""),
        ("API requests per ADD", lat["api_requests_per_add"], "<= 2"),
        ("writes for repeated identical ADDs", f"{lat['identical_add_writes']} of {lat['identical_add_repeats']}", "0"),
        (f"drain {dr['queued']} events (s)", f"{dr['publisher_drain_s']} ({dr['publisher_events_per_s']}/s)", ""),
        ("bare apply loop, 1 client (s)", f"{dr['bare_apply_loop_s']} ({dr['bare_applies_per_s']}/s)", ""),
        (f"bare apply loop, {dr['bare_parallel_workers']} clients (s)",
         f"{dr['bare_parallel_loop_s']} ({dr['bare_parallel_applies_per_s']}/s)", ""),
        (f"drain vs its request budget ({dr['api_requests_during_drain']} requests: {dr['request_budget_s']} s)",
         f"{dr['drain_ratio']}x", ">= 0.8x"),
        ("drain throughput vs parallel bare loop (no budget)", f"{dr['drain_ratio_vs_bare_parallel']}x", ""),
        ("drain throughput vs 1-client bare loop (no budget)", f"{dr['drain_ratio_vs_sequential']}x", ""),
        (f"RSS with {dr['tracked_attachments']} attachments (MiB)", dr["rss_mib"], "<= 100"),
        (f"idle CPU with {idle['idle_attachments']} attachments (% of a core)", idle["idle_cpu_percent"], "<= 1"),
        ("API requests per resync per claim", idle["api_requests_per_resync_per_claim"], ""),
        (f"API requests per ordinary pod ({f['ordinary']['ordinary_pods']} pods, ADD+DEL)",
         f["ordinary"]["api_requests_per_ordinary_pod"], "0"),
        ("Warning Events per ordinary pod", f["ordinary"]["warning_events_per_ordinary_pod"], "0"),
        ("IO pressure: hand-off-to-visible p50 / p99 (ms)",
         f"{f['contended']['handoff_to_visible_ms']['p50']} / {f['contended']['handoff_to_visible_ms']['p99']}", ""),
        ("IO pressure: bare apply p50 / p99 (ms)",
         f"{f['contended']['bare_apply_ms']['p50']} / {f['contended']['bare_apply_ms']['p99']}", ""),
        ("IO pressure: netclaim p99 / bare apply p99", f"{f['contended']['p99_ratio_vs_bare']}x", "<= 2x"),
        ("IO pressure: plugin ADD p50 / p99 (ms)",
         f"{f['contended']['plugin_add_ms']['p50']} / {f['contended']['plugin_add_ms']['p99']}", ""),
        ("IO pressure: plugin ADD p99 / its quiet p99", f"{f['contended']['plugin_add_p99_ratio_vs_quiet']}x", "<= 1.5x"),
    ]
    _print_rows(rows)
    print(f"load average (1, 5, 15 min) by part: {f['load_average']}")


def _burst_table(b: dict[str, Any]) -> None:
    _print_rows([
        (f"burst: {b['adds']} ADDs at once, applies +{b['apply_delay_s']} s: API requests per ADD",
         b["api_requests_per_add"], f"<= {b['target_api_requests_per_add']}"),
        ("  requests by verb", b["requests_by_verb"], ""),
        ("  status PATCHes seen by the proxy / ADDs spooled", f"{b['status_patches_at_proxy']} / {b['events_spooled']}", ""),
        ("  first ADD to last entry visible (s)", b["first_add_to_last_visible_s"], ""),
        ("  plugin ADD p50 / p99 (ms)", f"{b['plugin_add_ms']['p50']} / {b['plugin_add_ms']['p99']}", ""),
        ("  publisher warnings", b["publisher_warnings"] or "none", ""),
    ])
    print(f"load average (1, 5, 15 min) after the burst: {b['load_average']}")


def _print_rows(rows: list[tuple[str, Any, str]]) -> None:
    print(f"{'figure':<45} {'measured':>22}  target")
    for name, value, target in rows:
        print(f"{name:<45} {str(value):>22}  {target}")
