"""soak: a node's life on a real cluster - pods scale up and down while faults are injected; invariants checked all the time.

`scripts/bench.py soak --minutes N` brings up its own scripts/cluster.sh
cluster (default dir /tmp/nc-soak), with the publisher's spool and state dir
each on a small tmpfs (so they can be made read-only and full), installs
netclaim the operator way plus the chain keeper, and runs three Deployments:
two of ordinary pods and one whose pods get a claim from a
ResourceClaimTemplate of the DRA test driver (at least 80 % of pod starts are
ordinary). Faults run one at a time, each followed by a recovery window
(soak_faults.py): publisher SIGKILL/SIGTERM, the spool read-only across a
publisher restart, a reboot with the clock an hour behind then an NTP step,
kubelet and containerd SIGKILL/SIGTERM, a credential rotation (the
publisher's and the keeper's token files replaced the way kubelet rotates a
projected token, the old token revoked, neither process restarted; once per
cycle, twice in runs of 10 minutes or more; soak_tokens.py), an API server
restart, the journal's write lock held by another process for 10 s, the state
disk full, and a primary-CNI conflist rewrite. The faults that restart the
publisher come first (and, in runs of 10 minutes or more, repeat in the first
half), so that the last publisher process lives long enough for its RSS,
threads and fds to be judged. The run lasts N minutes and at least one full
cycle.

Invariants (soak_checks.py): every Running pod with a claim shows its own
sandbox's eth0 (IPs, MAC, containerID, Ready) within 10 s; no entry names a
sandbox that is gone for more than 10 s; no Warning Event and no failed event
about an ordinary pod; RSS/threads/fds of the last publisher process flat
(<= 5 %); /readyz not ready while a fault blocks the publisher and ready
within 10 s after; no node service dies on its own; netclaim re-chained
within 10 s of a conflist rewrite; no ADD spooled outside a fault; after
each rotation the publisher reloads its credentials and the claimed pods
started after it get their status, the keeper lists again with the new
token, and neither is refused (401) for longer than the re-read interval +
10 s; every netclaim entry's `data` at every look matches the schema netclaim
ships (conf/schema/netclaim.dev_v1_CNIResult.schema.json), with no grace:
entries written while a publisher restarts mid-apply, a token rotates or the
API server restarts are held to it like any other. Results:
<out>/soak.json, a summary on stdout, --plot PNG, --doc markdown section.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from runtime.controlplane import api_client  # noqa: E402
from runtime.realcluster import RealCluster, cluster_sh, pod_manifest  # noqa: E402

from . import soak_checks as checks  # noqa: E402
from . import soak_faults as faults  # noqa: E402
from . import soak_report as report  # noqa: E402
from . import soak_tokens as tokens  # noqa: E402

NS = "soak"
DEPLOYMENTS = {"plain-a": checks.ORDINARY, "plain-b": checks.ORDINARY, "net": checks.CLAIMED}
TMPFS = {"spool": "16m", "state": "64m"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--minutes", type=float, default=float(os.environ.get("NETCLAIM_SOAK_MINUTES", "5")),
                        help="length of the run (at least one full fault cycle runs in any case)")
    parser.add_argument("--dir", default=os.environ.get("NETCLAIM_SOAK_CLUSTER_DIR", "/tmp/nc-soak"),
                        help="the soak's own cluster directory (scripts/cluster.sh); taken down first and after")
    parser.add_argument("--recovery", type=float, default=15.0, help="seconds of quiet after each fault")
    parser.add_argument("--interval", type=float, default=2.0, help="seconds between samples and checks")
    parser.add_argument("--step", type=float, default=12.0, help="seconds between scaling steps")
    parser.add_argument("--seed", type=int, default=16, help="the scaling schedule's random seed")
    parser.add_argument("--plot", default="", help="write a PNG of RSS/threads/fds over time here")
    parser.add_argument("--doc", default="", help="write the figures as a section of this markdown file")
    parser.add_argument("--keep", action="store_true", help="leave the cluster up afterwards")


def progress(text: str) -> None:
    print(f"[soak {time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


class Workload:
    """Three Deployments scaled on a seeded schedule; claimed pods only while ordinary starts stay >= 80 %."""

    def __init__(self, cluster: RealCluster, seed: int) -> None:
        from kubernetes import client

        self.cluster = cluster
        self.apps = client.AppsV1Api(api_client(cluster.kubeconfig))
        self.rng = random.Random(seed)
        self.replicas = {"plain-a": 2, "plain-b": 1, "net": 1}
        self.started: dict[str, set[str]] = {checks.ORDINARY: set(), checks.CLAIMED: set()}
        self.lock = threading.Lock()
        self.steps = 0

    def create(self) -> None:
        self.cluster.namespace(NS)
        self.cluster.claim_template(NS, "net")
        for name, kind in DEPLOYMENTS.items():
            pod = pod_manifest(NS, name, template="net" if kind == checks.CLAIMED else "")
            template = {"metadata": {"labels": {"app": name, "soak": kind}}, "spec": pod["spec"]}
            self.cluster.apply({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "namespace": NS},
                                "spec": {"replicas": self.replicas[name], "selector": {"matchLabels": {"app": name}},
                                         "template": template}})

    def seen(self, pods: list[dict[str, Any]]) -> None:
        with self.lock:
            for pod in pods:
                kind = checks.pod_kind(pod["metadata"].get("labels"))
                if kind in self.started:
                    self.started[kind].add(pod["metadata"]["uid"])

    def share(self) -> float:
        with self.lock:
            o, c = len(self.started[checks.ORDINARY]), len(self.started[checks.CLAIMED])
        return o / (o + c) if o + c else 1.0

    def scale(self, name: str, replicas: int) -> None:
        try:
            self.apps.patch_namespaced_deployment_scale(name, NS, {"spec": {"replicas": replicas}}, _request_timeout=5)
            self.replicas[name] = replicas
        except Exception:  # noqa: BLE001 - the API may be restarting: the next step tries again
            pass

    def step(self) -> None:
        self.steps += 1
        self.scale("plain-a", self.rng.randint(1, 4))
        self.scale("plain-b", self.rng.randint(0, 3))
        with self.lock:
            o, c = len(self.started[checks.ORDINARY]), len(self.started[checks.CLAIMED])
        if self.steps % 3 == 0:
            want = 1 if self.replicas["net"] == 2 else 2
            if want < self.replicas["net"] or o >= 4 * (c + 1):
                self.scale("net", want)

    def claimed_start(self) -> str:
        """A claimed pod started now: the newest pod of the claimed Deployment deleted (it makes another)."""
        from kubernetes import client

        core = client.CoreV1Api(self.apps.api_client)
        try:
            pods = core.list_namespaced_pod(NS, label_selector="app=net", _request_timeout=5).items
            pods = [p for p in pods if not p.metadata.deletion_timestamp]
            if not pods:
                return ""
            newest = max(pods, key=lambda p: p.metadata.creation_timestamp)
            core.delete_namespaced_pod(newest.metadata.name, NS, _request_timeout=5)
            return f"replacing {newest.metadata.name}"
        except Exception as exc:  # noqa: BLE001 - the next scaling step starts claimed pods too
            return f"could not delete a claimed pod: {type(exc).__name__}"

    def nudge(self) -> None:
        """A pod start now (during a fault), in the background: the API may be slow."""
        threading.Thread(target=self.scale, args=("plain-b", min(self.replicas["plain-b"] + 1, 5)), daemon=True).start()


class Observer:
    """Samples the publisher and looks at the node every interval; feeds the persistence rules."""

    def __init__(self, node: faults.Node, workload: Workload, interval: float) -> None:
        from kubernetes import client

        self.node, self.workload, self.interval = node, workload, interval
        api = api_client(node.cluster.kubeconfig)
        self.core, self.custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
        self.driver = node.cluster.driver
        self.window = checks.FaultWindow()
        self.own = checks.Persistence("claim shows its pod's own sandbox")
        self.stale = checks.Persistence("no entry names a gone sandbox")
        self.schema = checks.SchemaRecord()  # every netclaim entry's data against its shipped schema
        self.samples: list[checks.Sample] = []
        self.sandboxes: dict[str, checks.Sandbox] = {}  # every sandbox ever seen
        self.pids: dict[str, int] = {}
        self.warnings: dict[str, dict[str, Any]] = {}
        self.failed: dict[str, dict[str, Any]] = {}
        self.counters = checks.Counters()
        self.creds: list[tokens.CredScrape] = []  # the publisher's credential reloads and consecutive 401s
        self.shown: dict[str, tuple[float, float]] = {}  # claimed sandbox id -> (created, first shown by its claim)
        self.plugin_log = checks.PluginLog(node.nc / "plugin.log")
        self.looks = self.incomplete = 0
        self.last_errors: list[str] = []
        self.stop = threading.Event()

    # ------------------------------------------------------------ publisher

    def metrics_port(self) -> int | None:
        try:
            return int((self.node.nc / "metrics.port").read_text().strip())
        except (OSError, ValueError):
            return None

    def sample(self, tick: int) -> None:
        pid = self.node.pid("publisher")
        alive = pid is not None and faults.pid_alive(pid)
        port = self.metrics_port()
        s = checks.Sample(time.time(), pid if alive else None, checks.readyz(port) if alive else "down")
        figures = checks.proc_figures(pid) if alive and pid else None
        if figures:
            s.rss_kib, s.threads, s.fds = figures
        self.samples.append(s)
        self.plugin_log.poll()
        if alive and pid and tick % 5 == 0:
            self.scrape(pid, port)

    def scrape(self, pid: int, port: int | None) -> None:
        names = ("netclaim_events_spooled_total", 'netclaim_events_received_total{op="ADD"}',
                 'netclaim_events_acked_total{op="ADD"}', "netclaim_events_failed_total",
                 "netclaim_spool_overflow_events_total")
        gauges = ("netclaim_credential_reloads_total", "netclaim_api_unauthorized_consecutive")
        try:
            import urllib.request

            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=3) as resp:
                text = resp.read().decode()
            self.counters.update(pid, checks.metric_values(text, names))
            cred = checks.metric_values(text, gauges)
            if len(cred) == len(gauges):
                self.creds.append(tokens.CredScrape(time.time(), pid, cred[gauges[0]], cred[gauges[1]]))
            for failed in publisher_status(self.node.nc / "publisher.sock").get("failed_events") or []:
                self.failed.setdefault(str(failed.get("event_id")), failed)
        except Exception:  # noqa: BLE001 - a restarting publisher: the next scrape
            pass

    # ------------------------------------------------------------ the node

    def look(self) -> checks.Look:
        now = time.time()
        try:
            resp = self.core.list_namespaced_pod(NS, _request_timeout=5, _preload_content=False)
            pods = json.loads(resp.data)["items"]
            claims = self.custom.list_namespaced_custom_object("resource.k8s.io", "v1", NS, "resourceclaims",
                                                               _request_timeout=5)["items"]
            listing = json.loads(self.node.cluster.crictl("pods", "-o", "json"))
        except Exception as exc:  # noqa: BLE001 - API or runtime down: this look is incomplete
            return checks.Look(now, error=f"{type(exc).__name__}: {str(exc)[:200]}")
        look = checks.Look(now, pods, claims)
        kinds = {p["metadata"]["uid"]: checks.pod_kind(p["metadata"].get("labels")) for p in pods}
        for item in listing.get("items") or []:
            meta = item.get("metadata") or {}
            sb = checks.Sandbox(item["id"], meta.get("uid", ""), f"{meta.get('namespace')}/{meta.get('name')}",
                                kinds.get(meta.get("uid", ""), checks.pod_kind(item.get("labels"))),
                                item.get("state") == "SANDBOX_READY", int(item.get("createdAt", 0)) / 1e9)
            look.sandboxes[sb.id] = sb
            self.sandboxes[sb.id] = sb
        return look

    def views(self, look: checks.Look) -> dict[str, checks.NetnsView]:
        return checks.claimed_views(look, self.node.cluster.crictl, self.pids)

    def check(self, tick: int) -> None:
        look = self.look()
        if look.error:
            self.incomplete += 1
            self.last_errors = (self.last_errors + [look.error])[-5:]
            return
        self.looks += 1
        self.workload.seen(look.pods)
        views = self.views(look)
        own = checks.own_sandbox_problems(look, self.driver, views, list(self.node.unchained))
        self.note_shown(look, views)
        self.own.observe(look.at, own, self.window)
        self.stale.observe(look.at, checks.stale_entries(look, self.driver), self.window)
        self.schema.observe(look, self.driver)
        if tick % 5 == 0:
            self.events()

    def note_shown(self, look: checks.Look, views: dict[str, checks.NetnsView]) -> None:
        """When each claimed sandbox was first shown by a claim as it is (Ready, eth0's IPs and MAC)."""
        for claim in look.claims:
            for entry in checks.entries_of(claim, self.driver):
                sid = checks.entry_sandbox(entry)
                sb, view = look.sandboxes.get(sid), views.get(sid)
                if sb is None or view is None or sid in self.shown or checks.ready_of(entry) != "True":
                    continue
                data = entry.get("networkData") or {}
                if (data.get("interfaceName"), sorted(data.get("ips") or []), data.get("hardwareAddress")) == (
                        "eth0", view.cidrs, view.mac):
                    self.shown[sid] = (sb.created, look.at)

    def events(self) -> None:
        for ns in (NS, "default"):
            try:
                items = self.custom.list_namespaced_custom_object("events.k8s.io", "v1", ns, "events",
                                                                  _request_timeout=5)["items"]
            except Exception:  # noqa: BLE001
                continue
            for ev in items:
                if ev.get("reportingController") == checks.REPORTING_CONTROLLER and ev.get("type") == "Warning":
                    self.warnings[ev["metadata"]["uid"]] = {
                        k: ev.get(k) for k in ("reason", "note", "regarding", "related", "eventTime")}

    def run(self) -> None:
        tick = 0
        while not self.stop.is_set():
            started = time.monotonic()
            for step in (self.sample, self.check):
                try:
                    step(tick)
                except Exception as exc:  # noqa: BLE001 - the observer must outlive anything the node does
                    self.last_errors = (self.last_errors + [f"{step.__name__}: {exc!r}"[:300]])[-5:]
            tick += 1
            self.stop.wait(max(0.0, self.interval - (time.monotonic() - started)))


def publisher_status(sock_path: Path) -> dict[str, Any]:
    """The publisher's `status` answer over its socket (what `netclaim-publisher status -o json` prints)."""
    from cni_plugin.wire.frame import encode_frame, read_frame

    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(5)
        sock.connect(str(sock_path))
        sock.sendall(encode_frame({"kind": "status"}))
        reply = read_frame(sock)
    return reply.get("status") or {}


# ---------------------------------------------------------------- the run


class Soak:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.env = {**os.environ, "NETCLAIM_CLUSTER_DIR": args.dir}
        self.cluster: RealCluster | None = None
        self.node: faults.Node | None = None
        self.observer: Observer | None = None
        self.records: list[faults.FaultRecord] = []
        self.t0 = time.time()
        self.teardown_notes: list[str] = []
        self.threads: list[threading.Thread] = []
        self.keeper_log: list[tokens.KeeperLine] = []

    def setup(self) -> None:
        progress(f"taking down whatever ran in {self.args.dir}, then bringing up the soak's cluster")
        cluster_sh("down", env=self.env)
        self.cluster = RealCluster.up(self.args.dir, self.env)
        nc = Path(self.args.dir) / "nc"
        for name, size in TMPFS.items():
            path = nc / name
            path.mkdir(parents=True, exist_ok=True)
            subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", f"nc-soak-{name}", str(path)],
                           check=True, capture_output=True, text=True)
        os.chmod(nc, 0o700)
        self.cluster.sh("install-netclaim")
        soak_dir = nc / "soak"
        soak_dir.mkdir(mode=0o700, exist_ok=True)
        self.node = faults.Node(self.cluster, soak_dir)
        # The agents' credentials become rotating token files; the publisher is started again to read its
        # kubeconfig's tokenFile user, the keeper starts with its own (soak_tokens.py).
        self.node.tokens = tokens.Tokens(self.cluster, nc)
        self.node.keeper_env = self.node.tokens.setup()
        self.node.signal("publisher", signal.SIGTERM)
        self.node.start("publisher")
        self.node.start("chain-keeper")
        self.workload = Workload(self.cluster, self.args.seed)
        self.node.claimed_start = self.workload.claimed_start
        self.workload.create()
        self.observer = Observer(self.node, self.workload, self.args.interval)

    def background(self) -> list[threading.Thread]:
        assert self.observer is not None
        stop = self.observer.stop

        def scaler() -> None:
            while not stop.wait(self.args.step):
                self.workload.step()

        def supervisor() -> None:  # its own thread: starting a kubelet again takes a while
            assert self.node is not None
            while not stop.wait(self.args.interval):
                self.node.supervise()

        threads = [threading.Thread(target=f, daemon=True) for f in (self.observer.run, scaler, supervisor)]
        for t in threads:
            t.start()
        return threads

    def inject(self, fault: faults.Fault) -> None:
        assert self.node is not None and self.observer is not None
        window = self.observer.window
        progress(f"fault {len(self.records) + 1}: {fault.name}")
        window.active = True
        try:
            record = fault.inject(self.node, self.workload.nudge)
        finally:
            window.active = False
            window.last_end = time.time()
        self.records.append(record)
        extra = f"; ERRORS {record.errors}" if record.errors else ""
        progress(f"  {fault.name} over after {record.end - record.start:.1f}s: {'; '.join(record.notes)}{extra}")
        time.sleep(self.args.recovery)

    def loop(self) -> None:
        total = self.args.minutes * 60
        self.t0 = time.time()
        self.threads = self.background()
        progress(f"warming up; the run lasts {self.args.minutes:g} min and at least one full fault cycle")
        time.sleep(max(20.0, self.args.recovery))
        first = True
        while first or time.time() - self.t0 < total:
            with_restarts = first or time.time() - self.t0 < total / 2
            cycle = (faults.restart_phase() if with_restarts else []) + faults.live_phase(
                rotations=2 if self.args.minutes >= 10 else 1)
            for fault in cycle:
                if not first and time.time() - self.t0 >= total:
                    break
                self.inject(fault)
            first = False
        progress(f"settling for {checks.GRACE + 3 * self.args.interval:.0f}s")
        time.sleep(checks.GRACE + 3 * self.args.interval)

    def teardown(self) -> None:
        if self.node is not None:
            self.node.stopping.set()
        if self.observer is not None:
            self.observer.stop.set()
        for thread in self.threads:
            thread.join(timeout=120)  # a supervisor restart in progress finishes before `down`
        nc = Path(self.args.dir) / "nc"
        subprocess.run(["mount", "-o", "remount,rw", str(nc / "spool")], capture_output=True)
        self.keep_logs(Path(self.args.out) / "soak-logs")
        self.keeper_log = tokens.keeper_lines(Path(self.args.out) / "soak-logs" / "chain-keeper.log")
        (nc / "state" / "soak-filler").unlink(missing_ok=True)
        if self.args.keep:
            self.teardown_notes.append(f"cluster kept in {self.args.dir} (--keep)")
            return
        try:
            cluster_sh("down", env=self.env)
        except Exception as exc:  # noqa: BLE001
            self.teardown_notes.append(f"cluster.sh down failed: {exc}")
        with open("/proc/self/mounts", encoding="utf-8") as fh:
            left = [line.split()[1] for line in fh if line.split()[1].startswith(str(Path(self.args.dir)) + "/")]
        for mount in sorted(left, key=len, reverse=True):
            subprocess.run(["umount", "-l", mount], capture_output=True)
        self.teardown_notes.append(f"mounts left under the cluster dir after down: {left}" if left
                                   else "host clean: no mount left under the cluster dir")


    def keep_logs(self, dest: Path, cap: int = 4 << 20) -> None:
        """The node's logs (the last `cap` bytes of each) outlive `down`: violations are read from them."""
        dest.mkdir(parents=True, exist_ok=True)
        cluster = Path(self.args.dir)
        for log in [*cluster.glob("*.log"), cluster / "nc" / "plugin.log", cluster / "cp" / "kube-apiserver.log"]:
            try:
                with open(log, "rb") as src:
                    src.seek(max(0, log.stat().st_size - cap))
                    (dest / log.name).write_bytes(src.read())
            except OSError:
                continue


def run(args: argparse.Namespace) -> dict[str, Any]:
    soak = Soak(args)
    previous = signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    failure = ""
    try:
        soak.setup()
        soak.loop()
    except KeyboardInterrupt:
        failure = "interrupted"
    except Exception as exc:  # noqa: BLE001 - reported, and the host is still cleaned up
        failure = f"{type(exc).__name__}: {exc}"
        progress(f"soak aborted: {failure}")
    finally:
        soak.teardown()
        signal.signal(signal.SIGTERM, previous)
    figures = report.build(soak, failure)
    print(report.summary(figures))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.plot:
        report.plot(figures, Path(args.plot))
        progress(f"plot: {args.plot}")
    if args.doc:
        report.write_doc(figures, Path(args.doc), Path(args.plot) if args.plot else None)
        progress(f"doc: {args.doc}")
    return figures
