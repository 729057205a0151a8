"""A node's months in minutes, on the real cluster with the Helm chart installed.

What a node meets over months, in the order a bad month could bring it: the
projected token rotated twice with the old one revoked at once, an API-server
restart that breaks every watch, the publisher SIGKILLed while a burst of
ADDs is being applied, a reboot (every pod process killed, the runtime's
/run state wiped, a new boot id) with pods that come back and pods deleted
meanwhile, a `helm upgrade` to a new image with a surge (the new pod beside the
old one), then `helm uninstall` and the
pods' deletion. A watcher looks at the node every 2 s for the whole run:
every Running claimed pod shows its live sandbox (IPs, MAC, containerID,
Ready) and no entry names a sandbox that is gone, each within 10 s of the end
of the last fault; at the end the journal holds no row of a gone sandbox and
the node's CNI dirs are byte for byte what they were before the install.

Real parts: the single-node cluster of scripts/cluster.sh (kube-apiserver,
etcd, scheduler, controllers, kubelet, containerd, the DRA test driver), the
chart's DaemonSet with the image built here. Two things are simulated because
they cannot happen to a test host, each named where it is done:
- the rotation writes the token into the pod's projected volume the way the
  kubelet's atomic writer does; the tokens are bound to holder pods on the
  node (so they carry the node's name, as the kubelet's do) and a holder's
  deletion revokes its token;
- the reboot gives every netclaim process a new boot id through
  NETCLAIM_BOOT_ID_FILE (the runtime passes its environment to the plugin;
  the chart's `extraEnv` reaches the publisher), since a container's fresh
  procfs cannot be bind-mounted over.

NETCLAIM_LIFE_CLUSTER_DIR picks the cluster dir (default /tmp/nc-cl-life).
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from chartlib import CHART, helm
from deploylib import REPO, Looker, own_cluster
from test_daemonset_cluster import (NAMESPACE, NEXT, RELEASE, VERSION, NodeFiles, daemonset_pod, free_port,
                                    helm_values, uninstall_release)
from test_daemonset_cluster import images  # noqa: F401 - the fixture: both tags built, imported into this cluster

sys.path.insert(0, str(REPO / "scripts" / "harness"))
from benchlib import soak_boot  # noqa: E402
from benchlib import soak_checks as checks  # noqa: E402
from runtime import identity  # noqa: E402
from runtime.controlplane import api_client  # noqa: E402
from runtime.realcluster import PAUSE_IMAGE, RealCluster, cluster_sh, pod_manifest, wait_until  # noqa: E402

pytestmark = pytest.mark.containerd

NS = "life"
BOOT_FILE = "simulated-boot-id"  # in hostPaths.run: the publisher mounts it at the node's path


@pytest.fixture(scope="module")
def cluster() -> Iterator[RealCluster]:
    yield from own_cluster("NETCLAIM_LIFE_CLUSTER_DIR", os.path.join(tempfile.gettempdir(), "nc-cl-life"))


# ---------------------------------------------------------------- the watcher


class Watcher:
    """Looks at pods, claims and sandboxes every 2 s; the soak's persistence rules judge what it sees."""

    def __init__(self, cluster: RealCluster) -> None:
        api = api_client(cluster.kubeconfig)
        self.cluster = cluster
        self.core, self.custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
        self.window = checks.FaultWindow()
        self.own = checks.Persistence("claim shows its pod's own sandbox")
        self.stale = checks.Persistence("no entry names a gone sandbox")
        self.pids: dict[str, int] = {}
        self.looks = 0
        self.last_look: checks.Look | None = None
        self.bad_now: dict[str, dict[Any, str]] = {"own": {}, "stale": {}}
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def fault(self, name: str) -> "FaultSpan":
        return FaultSpan(self, name)

    def look(self) -> checks.Look:
        now = time.time()
        try:
            pods = json.loads(self.core.list_namespaced_pod(NS, _request_timeout=5, _preload_content=False).data)
            claims = self.custom.list_namespaced_custom_object("resource.k8s.io", "v1", NS, "resourceclaims",
                                                               _request_timeout=5)["items"]
            listing = json.loads(self.cluster.crictl("pods", "-o", "json"))
        except Exception as exc:  # noqa: BLE001 - API or runtime down: this look is incomplete
            return checks.Look(now, error=f"{type(exc).__name__}: {str(exc)[:200]}")
        look = checks.Look(now, pods["items"], claims)
        kinds = {p["metadata"]["uid"]: checks.pod_kind(p["metadata"].get("labels")) for p in look.pods}
        for item in listing.get("items") or []:
            meta = item.get("metadata") or {}
            sb = checks.Sandbox(item["id"], meta.get("uid", ""), f"{meta.get('namespace')}/{meta.get('name')}",
                                kinds.get(meta.get("uid", ""), ""), item.get("state") == "SANDBOX_READY",
                                int(item.get("createdAt", 0)) / 1e9)
            look.sandboxes[sb.id] = sb
        return look

    def check(self) -> None:
        look = self.look()
        if look.error:
            return
        views = checks.claimed_views(look, self.cluster.crictl, self.pids)
        own = checks.own_sandbox_problems(look, self.cluster.driver, views)
        stale = checks.stale_entries(look, self.cluster.driver)
        with self.lock:
            self.own.observe(look.at, own, self.window)
            self.stale.observe(look.at, stale, self.window)
            self.bad_now = {"own": own, "stale": stale}
            self.last_look = look
            self.looks += 1

    def run(self) -> None:
        while not self.stop.is_set():
            started = time.monotonic()
            try:
                self.check()
            except Exception:  # noqa: BLE001 - the watcher must outlive anything the node does
                pass
            self.stop.wait(max(0.0, 2.0 - (time.monotonic() - started)))

    def settled(self, what: str, timeout: float = 180) -> checks.Look:
        """Waits for two complete looks in a row with nothing bad (the rules judge the time it took)."""
        seen = [0]

        def calm() -> bool:
            with self.lock:
                bad = any(self.bad_now.values())
                looks = self.looks
            if bad:
                seen[0] = looks + 1
                return False
            return looks >= seen[0] + 2

        seen[0] = self.looks + 1
        try:
            wait_until(calm, f"the node to settle after {what}", timeout=timeout, interval=0.5)
        except AssertionError as exc:
            raise AssertionError(f"{exc}; still wrong: {self.bad_now}") from None
        assert self.last_look is not None
        return self.last_look

    def violations(self) -> list[checks.Violation]:
        with self.lock:
            return self.own.violations + self.stale.violations


class FaultSpan:
    """A fault's window: the rules do not judge during it; their 10 s grace counts from its end."""

    def __init__(self, watcher: Watcher, name: str) -> None:
        self.watcher, self.name = watcher, name

    def __enter__(self) -> "FaultSpan":
        self.watcher.window.active = True
        print(f"[life {time.strftime('%H:%M:%S')}] fault: {self.name}", flush=True)
        return self

    def __exit__(self, *exc: Any) -> None:
        self.watcher.window.last_end = time.time()
        self.watcher.window.active = False


# ---------------------------------------------------------------- the workload


def claimed_pod(name: str, *, template: str = "", claim: str = "") -> dict[str, Any]:
    pod = pod_manifest(NS, name, template=template, claim=claim)
    pod["metadata"]["labels"] = {"soak": checks.CLAIMED, "app": name}
    return pod


def deployment(cluster: RealCluster, replicas: int) -> None:
    pod = claimed_pod("net", template="net")
    cluster.apply({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "net", "namespace": NS},
                   "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": "net"}},
                            "template": {"metadata": {"labels": pod["metadata"]["labels"]}, "spec": pod["spec"]}}})


def running_claimed(cluster: RealCluster) -> list[dict[str, Any]]:
    pods = json.loads(cluster.kubectl("get", "pods", "-n", NS, "-o", "json"))["items"]
    return [p for p in pods if checks.pod_kind(p["metadata"].get("labels")) == checks.CLAIMED
            and checks.pod_running(p)]


def wait_replicas(cluster: RealCluster, count: int, what: str, timeout: float = 240) -> None:
    wait_until(lambda: len([p for p in running_claimed(cluster) if p["metadata"]["name"].startswith("net-")]) == count
               and len(running_claimed(cluster)) == count + solo_count(cluster), what, timeout=timeout, interval=1)


def solo_count(cluster: RealCluster) -> int:
    return int(cluster.kubectl("get", "pod", "solo", "-n", NS, "--ignore-not-found", "-o", "name").strip() != "")


# ---------------------------------------------------------------- the projected token


class TokenRotation:
    """The chart pod's projected token replaced the kubelet's way, each new one bound to a holder pod on the node
    (so it carries the node's name, as the kubelet's pod-bound token does); deleting a holder revokes its token.

    The kubelet may later write its own (valid) token back; a component that kept a revoked token is caught
    either way, because its next request is refused."""

    def __init__(self, cluster: RealCluster) -> None:
        self.cluster = cluster
        self.api = api_client(cluster.kubeconfig)
        self.core = client.CoreV1Api(self.api)
        self.holders: list[dict[str, str]] = []
        self.tokens: list[str] = []

    def volume(self) -> Path:
        uid = daemonset_pod(self.cluster)["metadata"]["uid"]
        return Path(self.cluster.dir) / "k" / "pods" / uid / "volumes" / "kubernetes.io~projected" / "api-token"

    def rotate(self) -> str:
        """A new token in the volume (atomic, as the kubelet writes it); the previous holder's token revoked."""
        account = daemonset_pod(self.cluster)["spec"]["serviceAccountName"]
        holder = identity.token_holder(self.api, NAMESPACE, f"token-holder-{uuid.uuid4().hex[:6]}", account,
                                       self.cluster.node, PAUSE_IMAGE)
        token = identity.bound_token(self.api, "Pod", holder, namespace=NAMESPACE, service_account=account)
        write_projected(self.volume(), "token", token)
        self.holders.append(holder)
        self.tokens.append(token)
        note = f"token {len(self.tokens)} bound to pod {holder['name']}"
        if len(self.holders) > 1:
            old, old_token = self.holders[-2], self.tokens[-2]
            self.core.delete_namespaced_pod(old["name"], NAMESPACE, grace_period_seconds=0)
            wait_until(lambda: not identity.authenticated(self.api, old_token), "the previous token to be refused",
                       timeout=90, interval=1)
            note += f"; token {len(self.tokens) - 1} revoked"
        assert identity.authenticated(self.api, token)
        return note

    def cleanup(self) -> None:
        for holder in self.holders:
            try:
                self.core.delete_namespaced_pod(holder["name"], NAMESPACE, grace_period_seconds=0)
            except ApiException as exc:
                if exc.status != 404:
                    raise


def write_projected(volume: Path, key: str, value: str) -> None:
    """What the kubelet's atomic writer does: a new timestamped dir with every file, then `..data` swapped."""
    current = volume / "..data"
    fresh = volume / f"..life-{uuid.uuid4().hex[:8]}"
    fresh.mkdir(mode=0o755)
    for item in os.listdir(current):
        data = value.encode() if item == key else (current / item).read_bytes()
        fd = os.open(fresh / item, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o400)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
    link = volume / "..data_tmp"
    link.unlink(missing_ok=True)
    os.symlink(fresh.name, link)
    os.rename(link, current)


# ---------------------------------------------------------------- faults on the node


class PodCount(Looker):
    """The most netclaim pods the node ran at once while the block ran (a surge runs two)."""

    every = 0.2

    def __init__(self, cluster: RealCluster) -> None:
        super().__init__()
        self.core = client.CoreV1Api(api_client(cluster.kubeconfig))
        self.most = 0

    def look(self) -> None:
        try:
            pods = self.core.list_namespaced_pod(NAMESPACE, label_selector="app.kubernetes.io/name=netclaim",
                                                 _request_timeout=5).items
        except Exception:  # noqa: BLE001 - the next look
            return
        self.most = max(self.most, len([p for p in pods if p.status.phase in ("Pending", "Running")]))


def publisher_pid(cluster: RealCluster) -> int:
    ids = cluster.crictl("ps", "--name", "^publisher$", "--state", "running", "-q").split()
    if len(ids) != 1:
        return 0
    return int(json.loads(cluster.crictl("inspect", "-o", "json", ids[0]))["info"]["pid"])


def publisher_ready(cluster: RealCluster) -> bool:
    pod = daemonset_pod(cluster)
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    return any(s["name"] == "publisher" and s.get("ready") for s in statuses)


class NodeForBoot:
    """What soak_boot's power cut needs of a node: the cluster and its directory."""

    def __init__(self, cluster: RealCluster) -> None:
        self.cluster = cluster
        self.dir = Path(cluster.dir)


def reboot(cluster: RealCluster, boot_file: Path, delete_meanwhile: list[str]) -> str:
    """Power-cycle the node without touching the host: kubelet and containerd stopped, every process of the
    cluster's pods killed (the publisher's with them), the runtime's /run state wiped; while the node is down
    some pods are deleted; then a new boot id and the services start again."""
    cluster.sh("kubelet-stop")
    cluster.sh("containerd-stop")
    node = NodeForBoot(cluster)
    killed = soak_boot.kill_pods(node)  # type: ignore[arg-type]
    released = soak_boot.wipe_run_state(node)  # type: ignore[arg-type]
    for name in delete_meanwhile:
        cluster.kubectl("delete", "pod", name, "-n", NS, "--grace-period=0", "--force", check=False)
    boot_id = str(uuid.uuid4())
    tmp = boot_file.with_name(f".{boot_file.name}.tmp")
    tmp.write_text(boot_id + "\n")
    os.replace(tmp, boot_file)
    cluster_sh("containerd-start", env={**cluster.env, "NETCLAIM_BOOT_ID_FILE": str(boot_file)})
    cluster.sh("kubelet-start")
    return f"killed {killed} processes, released {released} mounts, boot id {boot_id}"


def journal_rows(state: Path) -> list[tuple[str, str, str]]:
    """(container_id, pod namespace/name, claim) of every attachment in the publisher's journal."""
    db = sqlite3.connect(f"file:{state / 'publisher' / 'journal.db'}?mode=ro", uri=True, timeout=30)
    try:
        return [(r[0], f"{r[1]}/{r[2]}", r[3]) for r in
                db.execute("SELECT container_id, pod_namespace, pod_name, claim_name FROM attachments")]
    finally:
        db.close()


# ---------------------------------------------------------------- the life


def test_a_chart_installed_node_keeps_every_claim_true_through_a_compressed_life_and_ends_clean(
        cluster: RealCluster, images: dict[str, str]) -> None:
    files = NodeFiles(cluster)
    before = files.snapshot()
    assert not files.chained(files.conflist), "netclaim must not be installed before the chart"
    boot_file = files.run / BOOT_FILE  # absent until the reboot: the kernel's boot id is read meanwhile
    values = [*helm_values(files, cluster, VERSION, free_port()), "--set", "extraEnv[0].name=NETCLAIM_BOOT_ID_FILE",
              "--set", f"extraEnv[0].value={boot_file}"]
    kubeconfig = cluster.kubeconfig
    watcher = Watcher(cluster)
    tokens = TokenRotation(cluster)
    notes: list[str] = []
    helm("install", RELEASE, str(CHART), "-n", NAMESPACE, "--create-namespace", *values, "--wait", "--timeout",
         "300s", kubeconfig=kubeconfig, timeout=400)
    try:
        # The keeper chained netclaim; the runtime must have loaded that chain before pods start.
        wait_until(lambda: "netclaim" in cluster.loaded_cni_types(), "containerd to load the chain with netclaim",
                   timeout=120, interval=0.5)
        cluster.namespace(NS)
        cluster.claim_template(NS, "net")
        cluster.claim(NS, "solo-net")
        cluster.apply(claimed_pod("solo", claim="solo-net"))
        deployment(cluster, 3)
        wait_replicas(cluster, 3, "the first pods to run")
        watcher.thread.start()
        watcher.settled("the install")

        # The projected token: replaced, then rotated twice, each time the previous one revoked at once.
        for rotation in range(3):
            with watcher.fault(f"token rotation {rotation}"):
                notes.append(tokens.rotate())
            deployment(cluster, 4 + rotation)  # a pod start whose status needs the new token
            wait_replicas(cluster, 4 + rotation, f"a pod started after token rotation {rotation}")
            watcher.settled(f"token rotation {rotation}")
        deployment(cluster, 3)

        # The API server restarts: every watch (pods, the keeper's DaemonSet) breaks and lists again.
        with watcher.fault("API-server restart"):
            cluster.sh("apiserver-stop")
            time.sleep(3)  # an outage, not a blip: clients see refused connections
            cluster.sh("apiserver-start")
        wait_replicas(cluster, 3, "the pods after the API-server restart")
        watcher.settled("the API-server restart")

        # The publisher SIGKILLed while a burst of ADDs is being applied; the kubelet starts it again.
        with watcher.fault("publisher SIGKILL during a burst"):
            pid = wait_until(lambda: publisher_pid(cluster), "the publisher to run", timeout=60)
            seen = {s["id"] for s in json.loads(cluster.crictl("pods", "-o", "json"))["items"]}
            deployment(cluster, 6)
            wait_until(lambda: {s["id"] for s in json.loads(cluster.crictl("pods", "-o", "json"))["items"]} - seen,
                       "the burst's first sandbox", timeout=120, interval=0.05)
            os.kill(pid, signal.SIGKILL)
            notes.append(f"publisher pid {pid} SIGKILLed")
            wait_until(lambda: publisher_ready(cluster) and publisher_pid(cluster) not in (0, pid),
                       "the publisher to be restarted and ready", timeout=240, interval=1)
        wait_replicas(cluster, 6, "the burst's pods")
        watcher.settled("the publisher's SIGKILL")

        # A reboot: pods come back in new sandboxes, two are deleted while the node is down.
        gone = [p["metadata"]["name"] for p in running_claimed(cluster) if p["metadata"]["name"].startswith("net-")][:1]
        gone.append("solo")
        with watcher.fault("reboot"):
            notes.append(reboot(cluster, boot_file, gone))
            wait_until(lambda: publisher_ready(cluster), "the publisher of the new boot to be ready", timeout=300,
                       interval=1)
        wait_replicas(cluster, 6, "the pods after the reboot", timeout=300)
        watcher.settled("the reboot", timeout=240)

        # helm upgrade to a new image with a surge (the new pod beside the old one) while pods start.
        with watcher.fault("helm upgrade with maxSurge"):
            old_uid = daemonset_pod(cluster)["metadata"]["uid"]
            deployment(cluster, 7)
            with PodCount(cluster) as overlap:
                helm("upgrade", RELEASE, str(CHART), "-n", NAMESPACE,
                     *[v.replace(f"image.tag={VERSION}", f"image.tag={NEXT}") for v in values],
                     "--set", "updateStrategy.maxSurge=1", "--set", "updateStrategy.maxUnavailable=0", "--wait",
                     "--timeout", "300s", kubeconfig=kubeconfig, timeout=400)
                wait_until(lambda: (lambda p: p and p["metadata"]["uid"] != old_uid and publisher_ready(cluster))(
                    daemonset_pod(cluster)), "the upgraded publisher to be ready", timeout=240, interval=1)
            assert overlap.most == 2, f"the surge never ran two netclaim pods at once ({overlap.most})"
        wait_replicas(cluster, 7, "the pods after the upgrade")
        look = watcher.settled("the upgrade")

        # The journal holds no row of a gone sandbox.
        live = {sb.id for sb in look.sandboxes.values() if sb.ready}
        rows = journal_rows(files.state)
        assert rows and all(row[0] in live for row in rows), (rows, sorted(live))
    finally:
        watcher.stop.set()
        print("\n".join(notes))

    violations = watcher.violations()
    assert not violations, "\n".join(f"{v.invariant}: {v.detail} (for {v.last_seen - v.first_seen:.0f}s)"
                                     for v in violations)

    # Uninstall while pods run, then the pods go: the plugin stays while a sandbox's cached config runs it and
    # leaves with the last one's DEL; the node ends as it was before the install.
    said = uninstall_release(cluster, kubeconfig, 3000)
    tokens.cleanup()  # only now: the keeper's last watch ran on the last holder's token; the holders are pods too
    cluster.kubectl("delete", "namespace", NS, "--wait=true", "--timeout=240s", timeout=300)
    wait_until(lambda: files.snapshot() == before, f"the node's CNI dirs to be as before the install\n{said}",
               timeout=240, interval=1)
    for d in (files.run, files.state):
        assert not d.exists() or list(d.iterdir()) == [], sorted(d.iterdir())
