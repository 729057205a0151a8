"""The Helm chart's DaemonSet in the real single-node cluster (scripts/cluster.sh), end to end.

The cluster starts with its primary CNI only (bridge + host-local conflist),
netclaim NOT installed. The image is built here without any registry
(scripts/build-image.sh) and imported into the cluster's containerd. Then,
as an operator would: helm install; a pod with a claim gets its status; the
primary conflist is rewritten the way Calico does (in place, without
netclaim) and the way Cilium does (its own conflist first, the others moved
away), and the next pod still gets its status; helm upgrade to a new image
tag keeps every status and the journal; helm uninstall leaves the node as it
was before the install, byte for byte. A spool cap set through the chart is
the one the plugin on the node keeps while the publisher is unreachable.

NETCLAIM_DEPLOY_CLUSTER_DIR picks the cluster dir (default /tmp/nc-cl-deploy);
NETCLAIM_CLUSTER_KEEP=1 leaves it up.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import cni_plugin
from cni_plugin.wire import spool as wire_spool
from publisher.keeper.nodefiles import cached_users
from chartlib import CHART, helm
from deploylib import REPO, Looker, own_cluster

sys.path.insert(0, str(REPO / "scripts" / "harness"))
from runtime.realcluster import RealCluster, entries_of, free_port, ready_status, wait_until  # noqa: E402

pytestmark = pytest.mark.containerd

VERSION = cni_plugin.__version__
NEXT = f"{VERSION}-next"
RELEASE = "netclaim"
CNI_CACHE = "/var/lib/cni"  # libcni's cache (containerd writes it there whatever its config says)
NAMESPACE = "netclaim-system"


@pytest.fixture(scope="module")
def cluster() -> Iterator[RealCluster]:
    yield from own_cluster("NETCLAIM_DEPLOY_CLUSTER_DIR", os.path.join(tempfile.gettempdir(), "nc-cl-deploy"))


def uninstall_release(cluster: RealCluster, kubeconfig: str, tail: int) -> str:
    """`helm uninstall`, waiting for the DaemonSet's pod to be gone; the end of the keeper's log.

    The log file is opened before: the kubelet deletes it with the pod."""
    logs = sorted(Path(cluster.dir).glob(f"pod-logs/{NAMESPACE}_*/chain-keeper/*.log"),
                  key=lambda p: p.stat().st_mtime)
    keeper_log = logs[-1].open("rb") if logs else None
    try:
        helm("uninstall", RELEASE, "-n", NAMESPACE, "--wait", "--timeout", "180s", kubeconfig=kubeconfig,
             check=False, timeout=240)
        wait_until(lambda: not daemonset_pod(cluster), "the DaemonSet's pod to be gone", timeout=180)
        said = keeper_log.read().decode(errors="replace")[-tail:] if keeper_log else "(no log)"
    finally:
        if keeper_log:
            keeper_log.close()
    print(said)
    return said


def build_image(tag: str) -> str:
    proc = subprocess.run([str(REPO / "scripts" / "build-image.sh"), "--tag", tag], capture_output=True, text=True,
                          timeout=3600)
    assert proc.returncode == 0, f"scripts/build-image.sh --tag {tag} failed:\n{proc.stderr[-3000:]}"
    return proc.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="module")
def images(cluster: RealCluster) -> dict[str, str]:
    out = {}
    for tag in (VERSION, NEXT):
        out[tag] = build_image(tag)
        cluster.sh("import-image", out[tag])
    return out


class NodeFiles:
    """What netclaim may touch on the node, to compare before and after."""

    def __init__(self, cluster: RealCluster) -> None:
        self.conf = Path(cluster.values["NETCLAIM_CNI_CONF"])
        self.bin = Path(cluster.values["NETCLAIM_CNI_BIN"])
        self.conflist = Path(cluster.values["NETCLAIM_CONFLIST"])
        self.run = Path(cluster.dir) / "netclaim-run"
        self.state = Path(cluster.dir) / "netclaim-state"

    def snapshot(self) -> dict[str, Any]:
        return {
            "conf": {p.name: p.read_bytes() for p in sorted(self.conf.iterdir()) if p.is_file()},
            "bin": sorted(p.name for p in self.bin.iterdir()),
        }

    def chained(self, path: Path) -> bool:
        try:
            plugins = json.loads(path.read_bytes())["plugins"]
        except (FileNotFoundError, ValueError, KeyError):
            return False
        return plugins[-1]["type"] == "netclaim"


def helm_values(files: NodeFiles, cluster: RealCluster, tag: str, port: int) -> list[str]:
    sets = {
        "driverName": cluster.driver, "image.tag": tag, "image.pullPolicy": "Never",
        "cni.confDir": str(files.conf), "cni.binDir": str(files.bin), "cni.pollInterval": "0.5",
        "hostPaths.run": str(files.run), "hostPaths.state": str(files.state), "metrics.port": str(port),
        "priorityClassName": "",
        # Non-default values of the chart's parity set, checked on the installed pod.
        "commonLabels.netclaim-test": "cluster", "podLabels.tier": "node", "updateStrategy.maxUnavailable": "50%",
        "serviceAccount.annotations.owner": "net",
        # No kube-proxy here: the API server as the node sees it.
        "apiServer.host": "127.0.0.1", "apiServer.port": cluster.values["NETCLAIM_APISERVER"].rsplit(":", 1)[1],
        # This kernel has no AppArmor: the kubelet refuses a pod that asks for a profile.
        "liveWatch.openerAppArmorProfile": "",
    }
    out = []
    for key, value in sets.items():
        out += ["--set-string" if key in ("image.tag", "cni.pollInterval", "apiServer.port") else "--set", f"{key}={value}"]
    return out


def start_claimed_pod(cluster: RealCluster, ns: str, name: str) -> None:
    """Pod NAME with claim NAME-net, Running."""
    cluster.claim(ns, f"{name}-net")
    cluster.pod(ns, name, claim=f"{name}-net")
    cluster.wait_running(ns, name, timeout=180)


def pod_gets_status(cluster: RealCluster, ns: str, name: str) -> dict[str, Any]:
    start_claimed_pod(cluster, ns, name)
    return claim_gets_status(cluster, ns, name)


def claim_gets_status(cluster: RealCluster, ns: str, name: str) -> dict[str, Any]:
    """The driver's Ready entry with IPs on NAME-net, once the publisher has written it."""
    def entry() -> dict[str, Any] | None:
        mine = entries_of(cluster.claim_yaml(ns, f"{name}-net"), cluster.driver)
        ok = [e for e in mine if ready_status(e) == "True" and (e.get("networkData") or {}).get("ips")]
        return ok[0] if ok else None

    return wait_until(entry, f"the status of {ns}/{name}-net", timeout=90)


def heartbeat_owners(cluster: RealCluster) -> list[list[str]]:
    """The owner uids of each of the release namespace's heartbeat Leases."""
    leases = json.loads(cluster.kubectl("get", "leases", "-n", NAMESPACE, "-l",
                                        "app.kubernetes.io/component=node-heartbeat", "-o", "json"))["items"]
    return [[r["uid"] for r in lease["metadata"].get("ownerReferences") or []] for lease in leases]


def daemonset_pod(cluster: RealCluster) -> dict[str, Any]:
    pods = json.loads(cluster.kubectl("get", "pods", "-n", NAMESPACE, "-l", "app.kubernetes.io/name=netclaim",
                                      "-o", "json"))["items"]
    return pods[0] if len(pods) == 1 else {}


def test_daemonset_install_rechain_upgrade_uninstall(cluster: RealCluster, images: dict[str, str]) -> None:
    files = NodeFiles(cluster)
    before = files.snapshot()
    assert not files.chained(files.conflist), "netclaim must not be installed before the chart"
    port = free_port()
    kubeconfig = cluster.kubeconfig
    ns = cluster.namespace(f"ds-{uuid.uuid4().hex[:6]}")
    try:
        # Install.
        helm("install", RELEASE, str(CHART), "-n", NAMESPACE, "--create-namespace",
             *helm_values(files, cluster, VERSION, port), "--wait", "--timeout", "300s",
             kubeconfig=kubeconfig, timeout=400)
        wait_until(lambda: files.chained(files.conflist), "netclaim chained into the primary conflist")
        assert (files.bin / "netclaim").is_file()
        first_pod = daemonset_pod(cluster)
        first_uid = first_pod["metadata"]["uid"]
        assert first_pod["metadata"]["labels"]["tier"] == "node"
        assert first_pod["metadata"]["labels"]["netclaim-test"] == "cluster"
        a = pod_gets_status(cluster, ns, "a")
        # The node's heartbeat Lease is owned by the publisher's pod: it goes with the pod.
        wait_until(lambda: heartbeat_owners(cluster) == [[first_uid]], "the heartbeat Lease owned by the pod")

        # Calico-style: the primary's installer rewrites its file in place, without netclaim.
        files.conflist.write_bytes(before["conf"][files.conflist.name])
        wait_until(lambda: files.chained(files.conflist), "re-chaining after the Calico-style rewrite")
        pod_gets_status(cluster, ns, "b")

        # Cilium-style: its own conflist first by name, every other one moved away.
        primary = json.loads(before["conf"][files.conflist.name])
        cilium = files.conf / "05-cilium-like.conflist"
        tmp = files.conf / ".05-cilium-like.tmp"
        tmp.write_text(json.dumps(dict(primary, name=primary["name"]), indent=2))
        os.replace(tmp, cilium)
        moved = files.conf / (files.conflist.name + ".cilium_bak")
        os.rename(files.conflist, moved)
        wait_until(lambda: files.chained(cilium), "chaining into the Cilium-style conflist")
        pod_gets_status(cluster, ns, "c")
        # "Cilium" goes away again: the original comes back, the keeper follows it.
        os.rename(moved, files.conflist)
        cilium.unlink()
        wait_until(lambda: files.chained(files.conflist), "chaining back into the original conflist")

        # Upgrade to a new image tag: statuses and the journal survive.
        journal = files.state / "publisher" / "journal.db"
        inode = journal.stat().st_ino  # the publisher's journal on the node
        helm("upgrade", RELEASE, str(CHART), "-n", NAMESPACE, *helm_values(files, cluster, NEXT, port),
             "--wait", "--timeout", "300s", kubeconfig=kubeconfig, timeout=400)
        new = wait_until(lambda: (lambda p: p if p and p["metadata"]["uid"] != first_uid
                                  and p["status"].get("phase") == "Running" else None)(daemonset_pod(cluster)),
                         "the upgraded pod", timeout=180)
        assert {c["image"].rsplit(":", 1)[1] for c in new["spec"]["containers"]} == {NEXT}
        assert files.chained(files.conflist) and (files.bin / "netclaim").is_file()
        assert journal.stat().st_ino == inode  # the same journal, replayed by the new publisher
        for name in ("a", "b", "c"):
            assert entries_of(cluster.claim_yaml(ns, f"{name}-net"), cluster.driver), name
        assert pod_gets_status(cluster, ns, "d")["networkData"]["ips"]
        wait_until(lambda: heartbeat_owners(cluster) == [[new["metadata"]["uid"]]],
                   "the upgraded pod to own the heartbeat Lease", timeout=120)
        assert a["networkData"]["ips"] == entries_of(cluster.claim_yaml(ns, "a-net"), cluster.driver)[0][
            "networkData"]["ips"]
    finally:
        for name in ("a", "b", "c", "d"):
            cluster.kubectl("delete", "pod", name, "-n", ns, "--wait=true", "--timeout=120s", check=False,
                            timeout=180)
        keeper_said = uninstall_release(cluster, kubeconfig, 3000)
        cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)

    # Uninstall left nothing of the release in the API (the Lease went with its pod) and the node as
    # it was before the install.
    wait_until(lambda: heartbeat_owners(cluster) == [], "the heartbeat Lease to go with the pod", timeout=120)
    after = files.snapshot()
    assert after["bin"] == before["bin"], keeper_said
    assert after["conf"].keys() == before["conf"].keys()
    assert after == before
    for d in (files.run, files.state):
        assert not d.exists() or list(d.iterdir()) == [], sorted(d.iterdir())


# ---------------------------------------------------------------- the plugin's settings from the chart


def keeper_observed_its_daemonset(cluster: RealCluster) -> bool:
    """The one DaemonSet pod's chain keeper has logged its first look at its own DaemonSet."""
    name = (daemonset_pod(cluster).get("metadata") or {}).get("name")
    return bool(name) and "own DaemonSet observed" in cluster.kubectl("logs", "-n", NAMESPACE, name, "-c",
                                                                      "chain-keeper", check=False)


def spooled_pods(spool: Path) -> list[str]:
    """The pods whose events wait in the plugin's spool on the node, oldest first."""
    events = [wire_spool.read_spool(path) for path in wire_spool.list_spool(str(spool))]
    return [e.pod.name for e in sorted(events, key=lambda e: e.timestamp) if e.pod]


def test_the_spool_cap_set_through_the_chart_holds_on_the_node(cluster: RealCluster, images: dict[str, str]) -> None:
    """`cni.pluginSpoolMaxFiles=2` (and `cni.pluginHandoffWaitMs=0`: a full spool costs a pod start nothing) with
    the publisher unreachable: it listens elsewhere and reads another spool (`publisher.extraArgs`), so it neither
    takes the plugin's events nor drains its spool. The keeper writes the chart's values into the node's entry as
    integers; three claimed pods start, the spool holds the first two events (pod a's first: a loaded node may
    start a pod's sandbox twice, each start its own ADD) and the overflow marker counts the rest. With the
    publisher back on its socket, the spooled events give their pods' claims status."""
    files = NodeFiles(cluster)
    before = files.snapshot()
    assert not files.chained(files.conflist), "netclaim must not be installed before the chart"
    kubeconfig = cluster.kubeconfig
    ns = cluster.namespace(f"cap-{uuid.uuid4().hex[:6]}")
    spool = files.state / "spool"
    ports = {"metrics.keeperPort": free_port(), "metrics.probePort": free_port(),
             "metrics.keeperProbePort": free_port()}
    chart = [*helm_values(files, cluster, VERSION, free_port()), "--set", "cni.pluginSpoolMaxFiles=2",
             "--set", "cni.pluginHandoffWaitMs=0", "--set", "cni.pluginAckTimeoutMs=500",
             *(a for key, port in ports.items() for a in ("--set", f"{key}={port}"))]
    away = ["--set", f"publisher.extraArgs[0]=--socket={files.run}/away.sock",
            "--set", f"publisher.extraArgs[1]=--spool-dir={files.state}/away-spool"]
    try:
        helm("install", RELEASE, str(CHART), "-n", NAMESPACE, "--create-namespace", *chart, *away,
             "--wait", "--timeout", "300s", kubeconfig=kubeconfig, timeout=400)
        wait_until(lambda: files.chained(files.conflist), "netclaim chained into the primary conflist")
        [entry] = [p for p in json.loads(files.conflist.read_bytes())["plugins"] if p["type"] == "netclaim"]
        assert {k: entry.get(k) for k in ("spoolMaxFiles", "handoffWaitMs", "ackTimeoutMs")} == {
            "spoolMaxFiles": 2, "handoffWaitMs": 0, "ackTimeoutMs": 500}, entry  # JSON integers, not strings

        for name in ("a", "b", "c"):  # one after the other: concurrent ADDs may overshoot a cap by their number
            start_claimed_pod(cluster, ns, name)
        spooled = spooled_pods(spool)
        assert len(spooled) == 2 and spooled[0] == "a" and set(spooled) <= {"a", "b"}, spooled
        overflow = wire_spool.read_overflow(str(spool))
        assert overflow and overflow["dropped"] >= 1 and overflow["lastCommand"] == "ADD", overflow

        helm("upgrade", RELEASE, str(CHART), "-n", NAMESPACE, *chart, "--wait", "--timeout", "300s",
             kubeconfig=kubeconfig, timeout=400)
        for name in sorted(set(spooled)):
            assert claim_gets_status(cluster, ns, name)["networkData"]["ips"], name
        wait_until(lambda: not spooled_pods(spool), "the publisher to take the spooled events")
        # The upgraded pod's keeper has looked at its DaemonSet before the uninstall below: an uninstall in the
        # seconds before that first look leaves the node chained (the keeper cannot tell it from an upgrade).
        wait_until(lambda: keeper_observed_its_daemonset(cluster), "the upgraded keeper to observe its DaemonSet",
                   timeout=180)
    finally:
        for name in ("a", "b", "c"):
            cluster.kubectl("delete", "pod", name, "-n", ns, "--wait=true", "--timeout=120s", check=False,
                            timeout=180)
        keeper_said = uninstall_release(cluster, kubeconfig, 3000)
        cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)
    assert files.snapshot() == before, keeper_said


# ---------------------------------------------------------------- uninstall only on proof


class ChainWatch(Looker):
    """Looks at the node every 50 ms while the test hurts the keeper: was netclaim ever out of the chain,
    was the plugin ever missing? (What a pod started at that moment would have suffered.)"""

    every = 0.05

    def __init__(self, files: NodeFiles) -> None:
        super().__init__()
        self.files = files
        self.lapses: list[str] = []

    def look(self) -> None:
        if not self.files.chained(self.files.conflist):
            self.lapses.append("netclaim out of the primary conflist")
        if not (self.files.bin / "netclaim").is_file():
            self.lapses.append("plugin executable missing")


def keeper_container(cluster: RealCluster) -> str:
    ids = cluster.crictl("ps", "--name", "^chain-keeper$", "--state", "running", "-q").split()
    return ids[0] if len(ids) == 1 else ""


def sigterm_keeper(cluster: RealCluster) -> str:
    """SIGTERM to the chain keeper (the kubelet restarts it in the same pod); its decision, once it runs again."""
    old = wait_until(lambda: keeper_container(cluster), "the chain keeper to run", timeout=120)
    cluster.crictl("stop", "--timeout", "40", old)
    wait_until(lambda: (lambda c: c and c != old)(keeper_container(cluster)), "the chain keeper to be restarted",
               timeout=180)
    env = {**os.environ, "CONTAINER_RUNTIME_ENDPOINT": cluster.values["CONTAINER_RUNTIME_ENDPOINT"]}
    logs = subprocess.run([cluster.values["NETCLAIM_CRICTL"], "logs", old], env=env, capture_output=True, text=True,
                          timeout=60)  # the keeper logs on stderr, which crictl gives back on stderr
    said = [line for line in (logs.stdout + logs.stderr).splitlines() if '"uninstall or not"' in line]
    return said[-1] if said else "(no decision logged)"


def service_account(cluster: RealCluster) -> str:
    return daemonset_pod(cluster)["spec"]["serviceAccountName"]


def can_i(cluster: RealCluster, verb: str, what: str, account: str) -> bool:
    out = cluster.kubectl("auth", "can-i", verb, what, "-n", NAMESPACE, f"--as=system:serviceaccount:{NAMESPACE}:"
                          f"{account}", check=False)
    return out.strip() == "yes"


def test_refused_credentials_keep_the_node_and_uninstall_cleans_it(cluster: RealCluster,
                                                                                  images: dict[str, str]) -> None:
    """401 (ServiceAccount re-created during an upgrade), 403 (the keeper's RoleBinding gone) and an API
    server that is down on SIGTERM keep netclaim chained, the plugin and the journal; `helm uninstall`
    still puts the conflist back byte for byte although the keeper's credentials die with the release,
    and keeps the plugin while a running pod's cached config still runs it."""
    files = NodeFiles(cluster)
    before = files.snapshot()
    assert not files.chained(files.conflist), "netclaim must not be installed before the chart"
    port = free_port()
    kubeconfig = cluster.kubeconfig
    ns = cluster.namespace(f"i3-{uuid.uuid4().hex[:6]}")
    # As on a CRI-O node, which tears sandboxes down with the config libcni cached at their ADD (this
    # test runs that teardown by hand below); the keeper would learn containerd here and not keep the plugin.
    crio_rule = ["--set", "extraEnv[0].name=NETCLAIM_RUNTIME_TEARDOWN", "--set", "extraEnv[0].value=cached-config"]
    helm("install", RELEASE, str(CHART), "-n", NAMESPACE, "--create-namespace",
         *helm_values(files, cluster, VERSION, port), *crio_rule, "--wait", "--timeout", "300s",
         kubeconfig=kubeconfig, timeout=400)
    wait_until(lambda: files.chained(files.conflist), "netclaim chained into the primary conflist")
    pod_gets_status(cluster, ns, "a")
    journal = files.state / "publisher" / "journal.db"
    inode = journal.stat().st_ino
    keeper_said = ""
    try:
        with ChainWatch(files) as watch:
            # 403: the keeper's Role binding is gone (RBAC being replaced, an authorizer not synced yet).
            binding = json.loads(cluster.kubectl("get", "rolebinding", f"{RELEASE}-chain-keeper", "-n", NAMESPACE,
                                                 "-o", "json"))
            account = service_account(cluster)
            assert can_i(cluster, "get", f"daemonsets/{RELEASE}", account)
            cluster.kubectl("delete", "rolebinding", f"{RELEASE}-chain-keeper", "-n", NAMESPACE)
            wait_until(lambda: not can_i(cluster, "get", f"daemonsets/{RELEASE}", account),
                       "the keeper's grant to be gone")
            decisions = [sigterm_keeper(cluster)]
            for key in ("uid", "resourceVersion", "creationTimestamp", "managedFields"):
                binding["metadata"].pop(key, None)
            cluster.kubectl("create", "-f", "-", stdin=json.dumps(binding))

            # The API server down while the keeper is stopped: no answer proves nothing either.
            cluster.sh("apiserver-stop")
            try:
                decisions.append(sigterm_keeper(cluster))
            finally:
                cluster.sh("apiserver-start")

            # 401: the ServiceAccount is re-created by an upgrade (the old pod's token dies with the old one).
            old_pod = daemonset_pod(cluster)["metadata"]["uid"]
            cluster.kubectl("delete", "serviceaccount", account, "-n", NAMESPACE)
            helm("upgrade", RELEASE, str(CHART), "-n", NAMESPACE, *helm_values(files, cluster, NEXT, port),
                 *crio_rule, "--wait", "--timeout", "300s", kubeconfig=kubeconfig, timeout=400)
            wait_until(lambda: (lambda p: p and p["metadata"]["uid"] != old_pod
                                and p["status"].get("phase") == "Running")(daemonset_pod(cluster)),
                       "the upgraded pod", timeout=180)
        assert watch.lapses == [], sorted(set(watch.lapses))
        # What the keeper said on each SIGTERM: asked, got 403 / no answer, kept the node.
        assert '"owner":"unknown"' in decisions[0] and "get: 403" in decisions[0], decisions[0]
        assert '"owner":"unknown"' in decisions[1], decisions[1]
        assert journal.stat().st_ino == inode  # the journal was never emptied
        assert pod_gets_status(cluster, ns, "b")["networkData"]["ips"]
        cluster.delete_pod(ns, "b")
    finally:
        # Uninstall with pod "a" still running: the keeper's token dies with the release.
        keeper_said = uninstall_release(cluster, kubeconfig, 4000)

    after = files.snapshot()
    assert after["conf"] == before["conf"], keeper_said  # every conflist byte for byte
    for d in (files.run, files.state):
        assert not d.exists() or list(d.iterdir()) == [], sorted(d.iterdir())
    # Pod "a"'s sandbox was created with netclaim in its chain: the runtime's cached config still runs it.
    assert (files.bin / "netclaim").is_file(), keeper_said
    assert (files.bin / ".netclaim-retired").is_file(), keeper_said
    # Its teardown as CRI-O does it, with that cached config: the kept executable's DEL exits 0, prints
    # nothing and leaves nothing on the uninstalled node.
    proc = cached_del(files, cluster.sandbox(ns, "a")["id"], ns, "a")
    assert (proc.returncode, proc.stdout) == (0, b""), proc.stderr
    for d in (files.run, files.state):
        assert not d.exists() or list(d.iterdir()) == [], sorted(d.iterdir())
    cluster.delete_pod(ns, "a")
    cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)
    # The hand path removes the plugin only once no sandbox's cached config runs it: wait for every
    # teardown to finish (this test's pods, and any an earlier test's namespace deletion still runs).
    # The keeper's own reading of libcni's cache is the precondition here, not what is under test.
    def cached() -> list[str]:
        return cached_users(Path(CNI_CACHE), f"{files.run}/publisher.sock")

    try:
        wait_until(lambda: not cached(), "every sandbox that ran netclaim to be torn down", timeout=180)
    except AssertionError as exc:
        raise AssertionError(f"{exc}; containerIDs still cached: {cached()}") from exc
    proc = subprocess.run([str(REPO / ".venv" / "bin" / "netclaim-publisher"), "chain-keeper", "--uninstall",
                           f"--driver-name={cluster.driver}", "--request=nic",
                           f"--cni-conf-dir={files.conf}", f"--cni-bin-dir={files.bin}",
                           f"--plugin-socket={files.run}/publisher.sock", "--log-format=text"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert files.snapshot() == before, proc.stderr  # the hand path removes it once nobody can run it


def cached_del(files: NodeFiles, container_id: str, ns: str, pod: str) -> subprocess.CompletedProcess[bytes]:
    """Run the installed plugin's DEL with the config libcni cached at the sandbox's ADD (CRI-O's teardown)."""
    import base64

    [cache] = Path(CNI_CACHE, "results").glob(f"*-{container_id}-eth0")
    cached = json.loads(cache.read_bytes())
    conflist = json.loads(base64.b64decode(cached["config"]))
    [entry] = [p for p in conflist["plugins"] if p["type"] == "netclaim"]
    stdin = json.dumps({**entry, "name": conflist["name"], "cniVersion": conflist["cniVersion"]}).encode()
    env = {"CNI_COMMAND": "DEL", "CNI_CONTAINERID": container_id, "CNI_NETNS": "", "CNI_IFNAME": "eth0",
           "CNI_PATH": str(files.bin), "CNI_ARGS": f"IgnoreUnknown=1;K8S_POD_NAMESPACE={ns};K8S_POD_NAME={pod}",
           "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
    return subprocess.run([str(files.bin / "netclaim")], input=stdin, env=env, capture_output=True, timeout=60)
