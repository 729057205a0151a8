"""In a real node: other CNI installers side by side with the chain keeper, for minutes.

Each test runs one real installer behaviour (tests/chain_writers.py) against
`netclaim-publisher chain-keeper` in the conf dir that this node's containerd
reads, for RUN seconds, while the node keeps running pods. The keeper runs as
the DaemonSet runs it (no pinned conflist: the first network file by name,
Multus' own file skipped; `--node-name` for the Node Event, `--metrics-address`
for /readyz and /metrics; the publisher's Node-bound credentials). Near the end
of each run, while the other writer still runs, a new pod with a netclaim
claim is created, and what a user would look at is checked:

- no loop: the keeper's own count of its writes (`netclaim_chain_rewrites_total`)
  and the other writer's writes stay within a small bound, stated per test. A
  loop is one write per keeper poll (every second): 60 a minute on each side,
  each one a config reload in containerd;
- netclaim chained (`netclaim_chained` 1, /readyz 200 "chained ...") or, for
  Cilium's exclusive mode, the contest reported (the `ChainContested` Warning
  Event on the Node, `netclaim_chain_contested` 1, /readyz saying so);
- the new pod's claim status shows the pod's interface, IPs and MAC as read
  in its own netns when netclaim is chained; when the contest is reported
  instead, new pods still start and run with their address (netclaim never
  blocks a pod).

Behaviours that name CNI binaries a test node does not have are made to work:
the Cilium- and flannel-style files carry this node's bridge network (its name
and IPAM kept, so addresses stay unique and every pod's DEL works whatever
file is primary at teardown); istio-cni's entry runs a pass-through chained
plugin, which is what istio-cni does for a pod it does not redirect; Multus'
`00-multus.conf` is a real primary (see that test). The conf dir is put back
byte for byte after every behaviour, and the keeper restarted, so each starts
from the node as `install-netclaim` left it.

Budget: five behaviours of RUN (80) seconds each, the pod started within the
run, in the shared cluster: about 7 minutes (6 min 52 s measured).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from chain_writers import (
    MULTUS,
    PASSTHROUGH,
    Watcher,
    appends_itself_last,
    cilium_exclusive,
    copy_in_place,
    install_plugin,
    load,
    multus_auto_config,
    render,
    without_plugin,
    write_atomic,
    write_in_place,
)
from publisher import limits
from runtime.realcluster import RealCluster, entries_of, ready_status, wait_until

REPO = Path(__file__).resolve().parents[2]
RUN = 80.0  # seconds each behaviour runs side by side with the keeper
POD_AT = RUN - 25  # the new pod is created about here (once netclaim is chained, where it should be)
STAND_INS = ("istio-cni", "multus")  # stand-in plugins this file installs; removed after each behaviour


# ---------------------------------------------------------------- the node's conf dir and the keeper


class NodeConf:
    """This node's CNI conf and bin dirs, and how install-netclaim left them (restored after every run)."""

    def __init__(self, cluster: RealCluster, work: Path) -> None:
        self.cluster = cluster
        self.conf_dir = Path(cluster.values["NETCLAIM_CNI_CONF"])
        self.bin_dir = Path(cluster.values["NETCLAIM_CNI_BIN"])
        self.conflist = Path(cluster.values["NETCLAIM_CONFLIST"]).name
        self.work = work
        self.baseline = {p.name: p.read_bytes() for p in self.conf_dir.iterdir() if p.is_file()}
        doc = json.loads(self.baseline[self.conflist])
        assert [p["type"] for p in doc["plugins"]][-1] == "netclaim", doc
        self.chained_doc = doc
        # The node's own network, as its primary CNI renders it: netclaim's entry not in it.
        self.network = dict(doc, plugins=[p for p in doc["plugins"] if p["type"] != "netclaim"])

    def reset(self) -> None:
        """The conf dir exactly as install-netclaim left it; stand-in plugins gone."""
        for path in self.conf_dir.iterdir():
            if path.name not in self.baseline:
                path.unlink()
        for name, data in self.baseline.items():
            path = self.conf_dir / name
            if not path.exists() or path.read_bytes() != data:
                write_atomic(path, data)
        for name in STAND_INS:
            (self.bin_dir / name).unlink(missing_ok=True)

    def doc(self, name: str) -> dict[str, Any]:
        return load(self.conf_dir / name)

    def types(self, name: str) -> list[str]:
        return [p["type"] for p in self.doc(name)["plugins"]]

    def chained(self, name: str) -> bool:
        """netclaim once in the chain, after the primary plugin."""
        try:
            types = self.types(name)
        except (FileNotFoundError, ValueError, KeyError):
            return False
        return types.count("netclaim") == 1 and types.index("netclaim") >= 1


class Keeper:
    """`netclaim-publisher chain-keeper` as the DaemonSet runs it, as a node process; its log in the work dir."""

    def __init__(self, node: NodeConf, plugin: Path, name: str) -> None:
        cluster, nc = node.cluster, Path(node.cluster.dir) / "nc"
        self.log_path = node.work / f"keeper-{name}.log"
        self.log_path.unlink(missing_ok=True)
        argv = [str(REPO / ".venv" / "bin" / "netclaim-publisher"), "chain-keeper",
                f"--cni-conf-dir={node.conf_dir}", f"--cni-bin-dir={node.bin_dir}", f"--plugin-binary={plugin}",
                f"--driver-name={cluster.driver}", f"--plugin-socket={nc / 'publisher.sock'}",
                f"--plugin-spool-dir={nc / 'spool'}", f"--plugin-log-file={nc / 'plugin.log'}",
                f"--node-name={cluster.node}", f"--kubeconfig={nc / 'publisher.kubeconfig'}",
                "--metrics-address=127.0.0.1:0", "--log-format=json"]
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=True)
        self.port = wait_until(self._port, "the keeper's metrics server", timeout=60)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def _port(self) -> int | None:
        self.alive()
        for line in self.log().splitlines():
            with contextlib.suppress(ValueError):
                rec = json.loads(line)
                if rec.get("msg") == "chain keeper metrics" and rec.get("port"):
                    return int(rec["port"])
        return None

    def get(self, path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=10) as resp:
                return resp.status, resp.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()

    def series(self, name: str) -> dict[str, float]:
        """One metric of the keeper's /metrics, by its conflist label."""
        _code, text = self.get("/metrics")
        return {m.group(1): float(m.group(2))
                for m in re.finditer(rf'^{name}{{conflist="([^"]*)"}} ([0-9.e+]+)$', text, re.M)}

    def writes(self) -> int:
        return int(sum(self.series("netclaim_chain_rewrites_total").values()))

    def alive(self) -> None:
        assert self.proc.poll() is None, f"the keeper exited:\n{self.log()[-3000:]}"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)  # no --daemonset: a stop keeps the node chained
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class Run:
    """One behaviour side by side with the keeper; `at(t)` waits until t seconds into it."""

    def __init__(self, keeper: Keeper, watchers: list[Watcher]) -> None:
        self.keeper, self.watchers = keeper, watchers
        self.start = time.monotonic()
        self.wall_start = time.time()

    def at(self, seconds: float) -> None:
        while time.monotonic() - self.start < seconds:
            self.keeper.alive()
            time.sleep(0.5)
        self.keeper.alive()

    def context(self) -> str:
        writers = "\n".join(line for w in self.watchers for line in w.log[-20:] + w.errors[-5:])
        return f"\nother writers:\n{writers}\nkeeper log:\n{self.keeper.log()[-4000:]}"


@pytest.fixture(scope="module")
def node(real_cluster: RealCluster) -> Iterator[NodeConf]:
    real_cluster.sh("chain-keeper-stop")  # the keepers here are started per behaviour
    work = Path(real_cluster.dir) / "coexist"
    work.mkdir(exist_ok=True)
    conf = NodeConf(real_cluster, work)
    try:
        yield conf
    finally:
        conf.reset()


@pytest.fixture(scope="module")
def keeper_plugin(node: NodeConf) -> Path:
    """The plugin the keeper installs: a copy of the installed one (so it never rewrites it)."""
    path = node.work / "netclaim"
    shutil.copy2(node.bin_dir / "netclaim", path)
    return path


@contextlib.contextmanager
def side_by_side(node: NodeConf, plugin: Path, name: str, *watchers: Watcher,
                 stand_in: tuple[str, str] | None = None) -> Iterator[Run]:
    """Start the keeper and the other writers on the node as install-netclaim left it; put it back after.

    `stand_in` (name, source): a plugin the other writer's config names, installed first.
    """
    node.reset()
    wait_until(lambda: node_schedulable(node.cluster), f"node {node.cluster.node} Ready, no not-ready taint",
               timeout=120)
    if stand_in:
        install_plugin(node.bin_dir, stand_in[0], stand_in[1], sys.executable)
    keeper = Keeper(node, plugin, name)
    started: list[Watcher] = []
    try:
        # The keeper has had its first look (netclaim's DaemonSet runs on the node already) when the other
        # installer starts: their first writes do not land on the same instant.
        wait_until(lambda: keeper.alive() or '"chain status"' in keeper.log(), "the keeper's first look")
        for w in watchers:
            w.start()
            started.append(w)
        yield Run(keeper, started)
    finally:
        for w in started:
            w.halt.set()
        for w in started:
            w.join(timeout=30)
        keeper.stop()
        node.reset()


# ---------------------------------------------------------------- what a user looks at


def node_schedulable(cluster: RealCluster) -> bool:
    """The node is Ready (its runtime's network too) and carries no not-ready taint."""
    obj = cluster.get("node", cluster.node)
    ready = next(c for c in obj["status"]["conditions"] if c["type"] == "Ready")["status"] == "True"
    return ready and not any(t["key"] == "node.kubernetes.io/not-ready" for t in obj["spec"].get("taints") or [])


def link(cluster: RealCluster, ns: str, pod: str) -> dict[str, Any]:
    """eth0 as the pod sees it, in its own netns: name, MAC, MTU and global addresses."""
    out = subprocess.run(["nsenter", f"--net={cluster.netns(ns, pod)}", "ip", "-j", "addr", "show", "dev", "eth0"],
                         capture_output=True, text=True, check=True).stdout
    (dev,) = json.loads(out)
    return {"name": dev["ifname"], "mac": dev["address"].lower(), "mtu": dev["mtu"],
            "cidrs": [f"{a['local']}/{a['prefixlen']}" for a in dev.get("addr_info", []) if a.get("scope") == "global"]}


def runtime_networks(cluster: RealCluster) -> list[str]:
    """The networks containerd has loaded for pods (`crictl info`), loopback aside."""
    info = json.loads(cluster.crictl("info", "-o", "json"))
    return [n["Config"]["Name"] for n in info["cniconfig"]["Networks"] if n["Config"]["Name"] != "cni-loopback"]


def new_pod(cluster: RealCluster, ns: str, name: str) -> tuple[str, dict[str, Any]]:
    """A new pod with a netclaim claim (from a template), Running; its claim's name and its eth0."""
    cluster.claim_template(ns)
    cluster.pod(ns, name, template="net")
    cluster.wait_running(ns, name)
    eth0 = link(cluster, ns, name)
    assert eth0["cidrs"] and cluster.pod_ip(ns, name) in [c.split("/")[0] for c in eth0["cidrs"]], eth0
    return cluster.pod_claim(ns, name), eth0


def assert_status_is_the_pods(cluster: RealCluster, ns: str, claim: str, eth0: dict[str, Any]) -> None:
    """The claim shows netclaim's Ready entry for exactly the pod's interface, IPs and MAC."""
    def entry() -> dict[str, Any] | None:
        mine = entries_of(cluster.claim_yaml(ns, claim), cluster.driver)
        return mine[0] if len(mine) == 1 and ready_status(mine[0]) == "True" else None

    got = wait_until(entry, f"netclaim's Ready entry on {ns}/{claim}", timeout=60)
    assert got["networkData"] == {"interfaceName": "eth0", "ips": eth0["cidrs"], "hardwareAddress": eth0["mac"]}


def assert_chained_and_ready(keeper: Keeper, conflist: str, run: Run) -> None:
    assert keeper.series("netclaim_chained").get(conflist) == 1, run.context()
    assert keeper.series("netclaim_chain_contested").get(conflist, 0) == 0, run.context()
    code, body = keeper.get("/readyz")
    assert code == 200 and body.startswith(f"chained conflist={conflist}"), body


def wait_chained(node: NodeConf, conflist: str, run: Run, also: Callable[[], bool] = lambda: True) -> None:
    wait_until(lambda: node.chained(conflist) and also(), f"netclaim chained in {conflist}", timeout=30)
    run.keeper.alive()


# ---------------------------------------------------------------- the behaviours


def test_real_cluster_cilium_exclusive_contest_is_reported_and_pods_still_run(
        real_cluster: RealCluster, node: NodeConf, keeper_plugin: Path, ns: str) -> None:
    """Cilium's exclusive mode: its conflist (this node's bridge network under Cilium's file name, 05- so it is
    the runtime's network) re-rendered on every directory event, every other network file moved away.

    Bound: the keeper writes CHAIN_WRITES_MAX + 1 times (the last one makes the conflist contested), then only
    once per backoff (10 s, doubling): at most 9 writes of Cilium's file in the whole run (one more of the
    node's own file on its first look), and Cilium at most one re-render per keeper write plus its own first
    render and move. The loop this replaces wrote 60 times a minute on each side.
    """
    own = "05-cilium.conflist"
    cilium = Watcher(node.conf_dir, cilium_exclusive(own, render(node.network)), "cilium")
    with side_by_side(node, keeper_plugin, "cilium", cilium) as run:
        run.at(POD_AT)
        _claim, eth0 = new_pod(real_cluster, ns, "late")  # netclaim never blocks a pod
        run.at(RUN)
        real_cluster.wait_running(ns, "late")  # and still runs, the contest going on
        keeper_writes, cilium_writes = run.keeper.series("netclaim_chain_rewrites_total"), cilium.writes
        contested = run.keeper.series("netclaim_chain_contested")
        code, body = run.keeper.get("/readyz")
        files = sorted(os.listdir(node.conf_dir))
        context = run.context()
    backoffs, retries, t = limits.CHAIN_BACKOFF_FIRST, 0, limits.CHAIN_BACKOFF_FIRST
    while t < RUN:  # retries after the contest starts: at 10 s, 10+20 s, 10+20+40 s, ...
        retries, backoffs = retries + 1, min(backoffs * 2, limits.CHAIN_BACKOFF_CAP)
        t += backoffs
    bound = limits.CHAIN_WRITES_MAX + 1 + retries  # 9 for an 80 s run
    assert limits.CHAIN_WRITES_MAX + 1 <= keeper_writes.get(own, 0) <= bound, f"{keeper_writes}{context}"
    # Besides: at most one write of the node's own conflist, on the keeper's first look (before Cilium moved it).
    assert set(keeper_writes) <= {own, node.conflist} and keeper_writes.get(node.conflist, 0) <= 1, keeper_writes
    assert cilium_writes <= keeper_writes[own] + 2, f"{cilium_writes} Cilium writes, keeper's {keeper_writes}{context}"
    # The contest is reported where an operator looks: metric, readiness, Node Event.
    assert contested.get(own) == 1, contested
    assert code == 200 and f"contested={own}" in body, body
    assert [f for f in files if f.endswith((".conf", ".conflist", ".json"))] == [own], files
    event = wait_until(lambda: contest_event(real_cluster, own, run.wall_start), "the ChainContested Event")
    assert event["type"] == "Warning" and event["regarding"]["kind"] == "Node"
    # The pod created meanwhile started and runs, with its address on eth0 from the node's network.
    assert eth0["name"] == "eth0" and eth0["cidrs"]


def contest_event(cluster: RealCluster, conflist: str, since: float) -> dict[str, Any] | None:
    """The ChainContested Warning Event on this Node that names `conflist`, observed since `since`."""
    items = json.loads(cluster.kubectl("get", "events.events.k8s.io", "-n", "default", "-o", "json"))["items"]
    for e in items:
        if e.get("reason") != "ChainContested" or e.get("regarding", {}).get("name") != cluster.node:
            continue
        seen = (e.get("series") or {}).get("lastObservedTime") or e.get("eventTime") or ""
        if conflist in e.get("note", "") and seen and rfc3339(seen) >= since - 5:
            return e
    return None


def rfc3339(text: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def test_real_cluster_istio_style_chainer_converges_and_pods_get_status(
        real_cluster: RealCluster, node: NodeConf, keeper_plugin: Path, ns: str) -> None:
    """istio-cni (linkerd-cni alike, with another type): its entry put last in the runtime's conflist on every
    directory event; once mid-run its pod restarts (its entry taken out, put back a few seconds later).

    Bound: the keeper leaves netclaim where it is once it is after the primary plugin, so it writes at most
    once (its entry's own settings on the first look) and the chainer three times (its first insert, the
    removal and the insert of its restart). Any more is a fight.
    """
    name = node.conflist
    entry = {"type": "istio-cni", "log_level": "info", "ambient_enabled": False,
             "kubernetes": {"exclude_namespaces": ["kube-system"]}}
    istio = Watcher(node.conf_dir, appends_itself_last(entry), "istio-cni")
    with side_by_side(node, keeper_plugin, "istio", istio, stand_in=("istio-cni", PASSTHROUGH)) as run:
        run.at(25)
        with istio.lock:  # istio-cni's pod stops: its entry goes, nothing puts it back meanwhile
            without_plugin(node.conf_dir / name, "istio-cni")
            istio.writes += 1
            run.at(32)
        run.at(POD_AT)
        wait_chained(node, name, run, lambda: node.types(name)[-1] == "istio-cni")
        claim, eth0 = new_pod(real_cluster, ns, "late")
        run.at(RUN)
        keeper_writes, istio_writes, types = run.keeper.writes(), istio.writes, node.types(name)
        assert_chained_and_ready(run.keeper, name, run)
        context = run.context()
    assert types == ["bridge", "netclaim", "istio-cni"], types
    assert keeper_writes <= 1, f"{keeper_writes} keeper writes{context}"
    assert istio_writes <= 3, f"{istio_writes} istio-cni writes{context}"
    assert_status_is_the_pods(real_cluster, ns, claim, eth0)


def test_real_cluster_calico_in_place_rewrites_are_rechained_and_pods_get_status(
        real_cluster: RealCluster, node: NodeConf, keeper_plugin: Path, ns: str) -> None:
    """Calico's install-cni: when calico-node restarts it renders its conflist and writes it over the old one in
    place (same inode), without foreign entries; here three restarts, 20 s apart, each with another MTU.

    Bound: one keeper write per restart plus at most one on its first look (4), no contest (fewer than
    CHAIN_WRITES_MAX + 1 writes in any window), and the primary's own change (the MTU) never reverted: the
    new pod's eth0 has the last MTU Calico rendered.
    """
    name = node.conflist
    mtus = (1480, 1460, 1440)
    with side_by_side(node, keeper_plugin, "calico") as run:
        for i, mtu in enumerate(mtus):
            run.at(15 + 20 * i)
            network = dict(node.network, plugins=[dict(node.network["plugins"][0], mtu=mtu)])
            write_in_place(node.conf_dir / name, render(network))
            wait_chained(node, name, run, lambda: node.doc(name)["plugins"][0].get("mtu") == mtu)
        run.at(POD_AT)
        claim, eth0 = new_pod(real_cluster, ns, "late")
        run.at(RUN)
        keeper_writes = run.keeper.writes()
        assert_chained_and_ready(run.keeper, name, run)
        context = run.context()
    assert len(mtus) <= keeper_writes <= len(mtus) + 1, f"{keeper_writes} keeper writes{context}"
    assert eth0["mtu"] == mtus[-1], eth0
    assert_status_is_the_pods(real_cluster, ns, claim, eth0)


def test_real_cluster_flannel_copy_is_rechained_and_pods_get_status(
        real_cluster: RealCluster, node: NodeConf, keeper_plugin: Path, ns: str) -> None:
    """flannel's install-cni: `cp -f` of its template to 10-flannel.conflist each time its pod starts. The node
    is handed to it at the start (its template is this node's bridge network; the node's own file goes), then
    its pod restarts twice, 20 s apart, copying the same template again.

    Bound: one keeper write per copy (3), no contest; the keeper follows the new primary file.
    """
    name = "10-flannel.conflist"
    template = node.work / "cni-conf.json"
    template.write_bytes(render(node.network))
    with side_by_side(node, keeper_plugin, "flannel") as run:
        for i in range(3):
            run.at(5 + 20 * i)
            copy_in_place(template, node.conf_dir / name)
            if i == 0:
                (node.conf_dir / node.conflist).unlink()
            wait_chained(node, name, run)
        run.at(POD_AT)
        claim, eth0 = new_pod(real_cluster, ns, "late")
        run.at(RUN)
        keeper_writes = run.keeper.writes()
        assert_chained_and_ready(run.keeper, name, run)
        context = run.context()
    assert 3 <= keeper_writes <= 3 + 1, f"{keeper_writes} keeper writes{context}"  # + its first look
    assert_status_is_the_pods(real_cluster, ns, claim, eth0)


def test_real_cluster_multus_conf_primary_delegates_to_the_chained_network(
        real_cluster: RealCluster, node: NodeConf, keeper_plugin: Path, ns: str) -> None:
    """Multus (thin plugin, auto-generated `00-multus.conf`): its file is really containerd's network, as on a
    Multus node. It inlines its master (this node's conflist) as the cluster-network delegate and is rendered
    again whenever the master changes. The real Multus is not installed here, so `multus` is a stand-in that
    runs the delegate's chain the way libcni does; a pod therefore gets netclaim's status only through the
    delegate, i.e. only if the keeper chains the master and leaves 00-multus.conf to Multus. Once mid-run the
    primary CNI rewrites the master in place without netclaim (as Calico does).

    Bound: the keeper writes the master at most twice (its first look, the re-chain after the primary's
    rewrite) and never 00-multus.conf; Multus renders at most four times (its first render, twice per master
    rewrite, one spare for the keeper's first look).
    """
    master = node.conflist
    multus = Watcher(node.conf_dir, multus_auto_config(master), "multus")

    def delegate_chained() -> bool:
        delegate = node.doc("00-multus.conf")["delegates"][0]
        return [p["type"] for p in delegate["plugins"]].count("netclaim") == 1

    with side_by_side(node, keeper_plugin, "multus", multus, stand_in=("multus", MULTUS)) as run:
        run.at(25)
        write_in_place(node.conf_dir / master, render(node.network))
        wait_chained(node, master, run, delegate_chained)
        run.at(POD_AT)
        wait_chained(node, master, run, delegate_chained)
        # containerd's network is Multus' file, as on a Multus node.
        wait_until(lambda: runtime_networks(real_cluster) == ["multus-cni-network"], "containerd on 00-multus.conf")
        claim, eth0 = new_pod(real_cluster, ns, "late")
        run.at(RUN)
        keeper_writes = run.keeper.series("netclaim_chain_rewrites_total")
        multus_writes = multus.writes
        multus_doc = node.doc("00-multus.conf")
        assert_chained_and_ready(run.keeper, master, run)
        context = run.context()
    assert set(keeper_writes) <= {master} and keeper_writes.get(master, 0) <= 2, f"{keeper_writes}{context}"
    assert multus_writes <= 4, f"{multus_writes} Multus renders{context}"
    assert multus_doc["type"] == "multus" and "plugins" not in multus_doc, multus_doc
    assert_status_is_the_pods(real_cluster, ns, claim, eth0)
