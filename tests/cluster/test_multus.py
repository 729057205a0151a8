"""Pods with several networks on the real node, Multus as its primary CNI.

One cluster per Multus deployment (`scripts/cluster.sh up --with-multus`, and
`--multus-thick`; tests/cluster/multus_kit.py): the real Multus (built from its
source snapshot), either the thin plugin or the thick one (multus-shim
forwarding to multus-daemon, which runs the delegates chrooted into the host's
root), delegates eth0 to the node's bridge conflist and each secondary network to a
NetworkAttachmentDefinition whose chain ends in netclaim with its own claim
request: macvlan (net1), a second bridge, host-device moving a host interface
into the pod. (ipvlan is not tested: this kernel has no ipvlan links.) The DRA test driver allocates one device per network.
For every pod, every interface is compared three ways (scripts/harness/
runtime/multinet.py): the claim's status entry, the pod's network namespace
(`ip` inside it) and Multus's `k8s.v1.cni.cncf.io/network-status`.

NETCLAIM_MULTUS_CLUSTER_DIR picks the thin cluster's directory (default nc-mutest
under the temp dir; the thick one's gets `-k` added); NETCLAIM_CLUSTER_KEEP=1 keeps them. Measured here (2 cores
shared with other work): the thin half takes 60-76 s, cluster up with Multus
included (~15 s); the thick half adds ~63 s (the whole module ~140 s). Every
test runs on both: the thick half costs far less than the 3 minutes that would
justify a subset.
"""

from __future__ import annotations

import calendar
import json
import os
import sqlite3
import subprocess
import time
import uuid
from typing import Any, Iterator

import pytest

from runtime import multinet  # noqa: E402  (conftest puts scripts/harness on sys.path)
from multus_kit import MODES, mode_dir, multus_cluster
from runtime.multinet import Attachment
from runtime.realcluster import RealCluster, wait_until

MACVLAN, BRIDGE2 = Attachment("macvlan", "net1"), Attachment("bridge2", "net2")


@pytest.fixture(scope="module", params=MODES)
def mcluster(request: pytest.FixtureRequest) -> Iterator[RealCluster]:
    """One cluster per Multus mode; the tests of one mode run together, then its cluster goes down."""
    mode = request.param
    yield from multus_cluster(mode, mode_dir("NETCLAIM_MULTUS_CLUSTER_DIR", "nc-mutest", mode),
                              env={"NETCLAIM_DRA_DEVICES": "48"})  # ten pods with three networks, and the others'


@pytest.fixture
def mns(mcluster: RealCluster) -> Iterator[str]:
    name = mcluster.namespace(f"m-{uuid.uuid4().hex[:6]}")
    yield name
    mcluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


def settled(cluster: RealCluster, ns: str, pod: str, expected: dict[str, str], timeout: float = 30) -> None:
    """Every interface's three views agree within `timeout` of the pod being Ready, else the last disagreements."""
    last: list[str] = []

    def ok() -> bool:
        nonlocal last
        last = multinet.problems(multinet.view(cluster, ns, pod), expected)
        return not last

    try:
        wait_until(ok, f"pod {ns}/{pod}'s entries, netns and network-status to agree", timeout=timeout)
    except AssertionError:
        raise AssertionError(f"pod {ns}/{pod}: " + "; ".join(last)) from None


def nad_plugin(cluster: RealCluster, nad: str) -> dict[str, Any]:
    """The first plugin of a NetworkAttachmentDefinition's chain, as the cluster created it."""
    return json.loads(cluster.get("network-attachment-definition", nad, "default")["spec"]["config"])["plugins"][0]


def expected_of(attachments: list[Attachment]) -> dict[str, str]:
    return {"eth0": multinet.PRIMARY_REQUEST, **{a.ifname: a.request for a in attachments}}


def test_one_claim_a_request_per_network(mcluster: RealCluster, mns: str) -> None:
    """eth0 + macvlan + bridge2 + host-device from one template claim: four entries, each its own interface."""
    cls = mcluster.values["NETCLAIM_DEVICE_CLASS"]
    nets = [MACVLAN, BRIDGE2, Attachment("hostdev0", "net3")]
    mcluster.apply(multinet.claim_template(mns, "four", ["nic", "macvlan", "bridge2", "hostdev"], cls),
                   multinet.pod(mns, "p", nets, {"net": {"resourceClaimTemplateName": "four"}}))
    mcluster.wait_running(mns, "p")
    settled(mcluster, mns, "p", expected_of(nets))
    v = multinet.view(mcluster, mns, "p")
    # The host interface really moved: its host-side name is gone from the host while the pod holds it.
    host = subprocess.run(["ip", "link", "show", nad_plugin(mcluster, "hostdev0")["device"]],
                          capture_output=True, text=True)
    assert host.returncode != 0, "the host-device interface is still in the host"
    macs = {e[0]["networkData"]["hardwareAddress"] for e in v.entries.values()}
    assert len(macs) == 4, f"four interfaces, four MACs: {macs}"
    assert next(s for s in v.network_status if s["interface"] == "eth0").get("default") is True
    # Multus's least-privilege identity (pods get, pods/status update, NAD get, DRA reads, Events) sufficed.
    refused = [line for line in open(os.path.join(mcluster.dir, "multus.log"), errors="replace")
               if "forbidden" in line.lower()]
    assert not refused, f"Multus was refused by the API: {refused[:3]}"


def test_a_secondary_interface_set_down_shows_on_its_own_entry_only(mcluster: RealCluster, mns: str) -> None:
    """net1 (macvlan behind Multus) set down in the pod's netns: its entry says Ready=False LinkDown,
    eth0's stays Ready; up again, both agree with the netns once more."""
    cls = mcluster.values["NETCLAIM_DEVICE_CLASS"]
    nets = [MACVLAN]
    mcluster.apply(multinet.claim_template(mns, "two", ["nic", "macvlan"], cls),
                   multinet.pod(mns, "p", nets, {"net": {"resourceClaimTemplateName": "two"}}))
    mcluster.wait_running(mns, "p")
    settled(mcluster, mns, "p", expected_of(nets))
    netns = mcluster.netns(mns, "p")

    def in_pod(*ip_args: str) -> None:
        subprocess.run(["nsenter", f"--net={netns}", "ip", *ip_args], check=True, capture_output=True)

    def ready_of(v: multinet.PodView, ifname: str) -> tuple[str, str]:
        (entry,) = v.entries[ifname]
        cond = next(c for c in entry["conditions"] if c["type"] == "Ready")
        return cond["status"], cond.get("reason", "")

    def net1_unready() -> multinet.PodView | None:
        v = multinet.view(mcluster, mns, "p")
        return v if ready_of(v, "net1")[0] == "False" else None

    in_pod("link", "set", "net1", "down")
    v = wait_until(net1_unready, "net1's entry to show Ready=False", timeout=60)
    assert ready_of(v, "net1") == ("False", "LinkDown")
    assert ready_of(v, "eth0")[0] == "True"
    in_pod("link", "set", "net1", "up")
    wait_until(lambda: ready_of(multinet.view(mcluster, mns, "p"), "net1")[0] == "True",
               "net1's entry to show Ready=True again", timeout=60)
    settled(mcluster, mns, "p", expected_of(nets))


def test_a_claim_per_network_template_and_precreated(mcluster: RealCluster, mns: str) -> None:
    """eth0 from a template, net1 from a pre-created claim, net2 from a second template: each claim its own entry."""
    cls = mcluster.values["NETCLAIM_DEVICE_CLASS"]
    nets = [MACVLAN, BRIDGE2]
    mcluster.apply(multinet.claim_template(mns, "primary", ["nic"], cls),
                   multinet.claim(mns, "mv", ["macvlan"], cls),
                   multinet.claim_template(mns, "second", ["bridge2"], cls),
                   multinet.pod(mns, "p", nets, {"eth": {"resourceClaimTemplateName": "primary"},
                                                 "mv": {"resourceClaimName": "mv"},
                                                 "br": {"resourceClaimTemplateName": "second"}}))
    mcluster.wait_running(mns, "p")
    settled(mcluster, mns, "p", expected_of(nets))
    pre = mcluster.get("resourceclaim", "mv", mns)
    (entry,) = pre["status"]["devices"]
    assert entry["networkData"]["interfaceName"] == "net1"


def test_two_networks_on_one_request_are_refused_not_guessed(mcluster: RealCluster, mns: str) -> None:
    """net1 and net2 both name request `macvlan`, which holds two devices: nothing tells which is which
    (Multus's deviceID is not read), so neither gets an entry and the claim carries an AmbiguousDevice
    Warning; eth0 is still reported and the pod runs."""
    cls = mcluster.values["NETCLAIM_DEVICE_CLASS"]
    template = multinet.claim_template(mns, "pair", ["nic", "macvlan"], cls)
    template["spec"]["spec"]["devices"]["requests"][1]["exactly"]["count"] = 2
    mcluster.apply(template, multinet.pod(mns, "p", [MACVLAN, Attachment("macvlan", "net2")],
                                          {"net": {"resourceClaimTemplateName": "pair"}}))
    mcluster.wait_running(mns, "p")
    claim = mcluster.pod_claim(mns, "p")

    def warned() -> bool:
        out = mcluster.kubectl("get", "events", "-n", mns, "--field-selector",
                               f"reason=AmbiguousDevice,involvedObject.name={claim}", "-o", "json")
        return bool(json.loads(out)["items"])

    wait_until(warned, f"an AmbiguousDevice Warning on claim {claim}", timeout=30)
    # eth0's entry waits, at most for the sibling hold, for the ADDs of the claim's other devices,
    # which never map: wait for it, then nothing else may be there.
    wait_until(lambda: "eth0" in multinet.view(mcluster, mns, "p").entries, "eth0's entry", timeout=30)
    v = multinet.view(mcluster, mns, "p")
    assert sorted(v.entries) == ["eth0"], f"entries for {sorted(v.entries)}: a guess"
    (eth0,) = v.entries["eth0"]
    assert eth0["networkData"]["hardwareAddress"] == v.netns["eth0"].mac
    assert eth0["networkData"]["ips"] == v.netns["eth0"].cidrs


# ------------------------------------------------------------------ item 6: churn


def _stamp(text: str) -> float:
    return calendar.timegm(time.strptime(text, "%Y-%m-%dT%H:%M:%SZ"))


def _ready_since(pod: dict[str, Any]) -> float | None:
    for c in (pod.get("status") or {}).get("conditions") or []:
        if c.get("type") == "Ready" and c.get("status") == "True":
            return _stamp(c["lastTransitionTime"])
    return None


def _written(v: multinet.PodView) -> float:
    """When the last of the pod's entries turned Ready (the publisher's own stamp, in the API)."""
    return max(_stamp(c["lastTransitionTime"]) for found in v.entries.values() for e in found
               for c in e.get("conditions") or [] if c.get("type") == "Ready")


def _sweep(cluster: RealCluster, ns: str, expected: dict[str, str], want: int, sandboxes: set[str],
           limit: float = 10, timeout: float = 240) -> dict[str, float]:
    """Until `want` pods run: each Running pod must show every entry right within `limit` s of turning Ready.

    Returns pod -> seconds from the pod's Ready to its last entry's Ready (API
    stamps, whole seconds; negative when the entries came first, as they should:
    netclaim reports during RunPodSandbox). A pod a sweep finds wrong later than
    `limit` after Ready fails at once; so does a right pod whose entries came late.
    """
    lag: dict[str, float] = {}
    late: dict[str, list[str]] = {}
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pods = json.loads(cluster.kubectl("get", "pods", "-n", ns, "-o", "json"))["items"]
        claims = {c["metadata"]["name"]: c for c in
                  json.loads(cluster.kubectl("get", "resourceclaims", "-n", ns, "-o", "json"))["items"]}
        for p in pods:
            name = p["metadata"]["name"]
            since = _ready_since(p)
            if name in lag or since is None or p["metadata"].get("deletionTimestamp"):
                continue
            try:
                v = multinet.view(cluster, ns, name, p, claims)
                found = multinet.problems(v, expected)
            except (subprocess.CalledProcessError, AssertionError) as exc:
                found = [f"cannot read: {exc}"]
            now = time.time()
            if not found:
                lag[name] = _written(v) - since
                if lag[name] > limit:
                    late[name] = [f"entries Ready {lag[name]:.0f}s after the pod"]
                sandboxes.add(cluster.sandbox(ns, name)["id"])
            elif now - since > limit:
                late[name] = found
        assert not late, f"Running pods not right within {limit}s of Ready: {late}"
        if len(lag) >= want and sum(1 for p in pods if _ready_since(p)) >= want:
            return lag
        time.sleep(0.5)
    raise AssertionError(f"only {len(lag)} of {want} pods Running and right after {timeout}s")


def _held_by(cluster: RealCluster, sandboxes: set[str]) -> list[str]:
    """Secondary-network addresses host-local still holds for these sandboxes (its files: IP -> container ID)."""
    ipam = os.path.join(cluster.dir, "cni", "ipam-multus")
    held = []
    for net in os.listdir(ipam) if os.path.isdir(ipam) else []:
        for f in os.listdir(os.path.join(ipam, net)):
            path = os.path.join(ipam, net, f)
            if f[0].isdigit() and open(path).read().split()[0] in sandboxes:
                held.append(f"{net}/{f}")
    return held


def _journaled(cluster: RealCluster, ns: str) -> int:
    """Attachments of the namespace's pods the publisher's journal still holds (read-only look at its database)."""
    path = os.path.join(cluster.dir, "nc", "state", "journal.db")
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=10) as db:
        return db.execute("SELECT count(*) FROM attachments WHERE pod_namespace=?", (ns,)).fetchone()[0]


def _nothing_left(cluster: RealCluster, ns: str, sandboxes: set[str]) -> None:
    """Scaled to zero: no pod, no claim, no attachment in the publisher, no secondary address of theirs left."""
    wait_until(lambda: not json.loads(cluster.kubectl("get", "pods,resourceclaims", "-n", ns, "-o", "json"))["items"],
               "pods and their claims gone", timeout=120)
    assert len(sandboxes) >= 10
    # The API forgets a pod before the kubelet stops its sandbox: DEL (Multus from its cache, then every
    # delegate) follows within seconds.
    wait_until(lambda: not _held_by(cluster, sandboxes), "the deleted pods' secondary addresses released", timeout=60)
    wait_until(lambda: _journaled(cluster, ns) == 0, "the publisher to forget the deleted pods' attachments", timeout=60)


def test_churn_three_networks_with_kubelet_and_containerd_restarts(mcluster: RealCluster, mns: str) -> None:
    """0 -> 10 -> 0 -> 10 pods with eth0, net1 (macvlan) and net2 (bridge2); kubelet and containerd restarted."""
    cls = mcluster.values["NETCLAIM_DEVICE_CLASS"]
    nets = [MACVLAN, BRIDGE2]
    expected = expected_of(nets)
    mcluster.apply(multinet.claim_template(mns, "three", ["nic", "macvlan", "bridge2"], cls),
                   multinet.deployment(mns, "web", nets, "three"))

    def scale(n: int) -> None:
        mcluster.kubectl("scale", "deployment", "web", "-n", mns, f"--replicas={n}")

    scale(10)
    time.sleep(3)  # the kubelet restarts while the first sandboxes are being set up
    mcluster.sh("kubelet-stop")
    mcluster.sh("kubelet-start")
    first: set[str] = set()
    lag1 = _sweep(mcluster, mns, expected, 10, first)
    scale(0)
    _nothing_left(mcluster, mns, first)
    mcluster.sh("containerd-stop")
    mcluster.sh("containerd-start")
    scale(10)
    second: set[str] = set()
    lag2 = _sweep(mcluster, mns, expected, 10, second)
    print(f"ready-to-right lag, s: first ten max {max(lag1.values()):.1f}, second ten max {max(lag2.values()):.1f}")
    scale(0)
    _nothing_left(mcluster, mns, second)


# ------------------------------------------------------------------ Services on a secondary network

# A TCP server that answers every connection with the name it was given: run on the host inside a pod's
# network namespace (the pods run the pause image, which serves nothing), so a connection proves the
# network path between the two pods' netns, not a server of the test's.
ECHO_NAME = ("import socket,sys\n"
             "s=socket.socket(socket.AF_INET6 if ':' in sys.argv[1] else socket.AF_INET)\n"
             "s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1)\n"
             "s.bind((sys.argv[1],int(sys.argv[2])));s.listen(8)\n"
             "while True:\n"
             "    c,_=s.accept();c.sendall(sys.argv[3].encode());c.close()\n")
CONNECT = ("import socket,sys\n"
           "c=socket.create_connection((sys.argv[1],int(sys.argv[2])),timeout=3)\n"
           "print(c.recv(100).decode())\n")


def _slice_endpoints(cluster: RealCluster, ns: str, service: str) -> dict[str, dict[str, Any]]:
    """The endpoints of the Service's netclaim slices, by pod name."""
    out = cluster.kubectl("get", "endpointslices", "-n", ns, "-o", "json", "-l",
                          f"kubernetes.io/service-name={service},endpointslice.kubernetes.io/managed-by=netclaim")
    return {ep["targetRef"]["name"]: ep for s in json.loads(out)["items"] for ep in s.get("endpoints") or []}


def test_a_service_on_the_secondary_network_reaches_its_pods_by_the_endpoint_slices(
        mcluster: RealCluster, mns: str, tmp_path: Any) -> None:
    """`netclaim-publisher endpoints` gives a selector-less Service slices of its pods' bridge2 (net2) addresses,
    from their claims' entries: a client pod on bridge2 connects to each address from the slice and is answered
    by that pod; net2 set down in one pod turns its endpoint not ready; a deleted pod leaves the slice."""
    import sys

    cls = mcluster.values["NETCLAIM_DEVICE_CLASS"]
    nets = [BRIDGE2]
    docs: list[dict[str, Any]] = [multinet.claim_template(mns, "two", ["nic", "bridge2"], cls)]
    for name in ("srv-a", "srv-b", "client"):
        doc = multinet.pod(mns, name, nets, {"net": {"resourceClaimTemplateName": "two"}})
        doc["metadata"]["labels"] = {"app": "srv" if name.startswith("srv") else "client"}
        docs.append(doc)
    docs.append({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "srv", "namespace": mns, "annotations": {
        "netclaim.dev/endpoints-selector": "app=srv", "netclaim.dev/endpoints-driver": mcluster.driver,
        "netclaim.dev/endpoints-request": "bridge2"}},
        "spec": {"clusterIP": "None", "ports": [{"name": "echo", "port": 7070, "protocol": "TCP"}]}})
    mcluster.apply(*docs)
    log = open(tmp_path / "endpoints.log", "wb")
    procs = [subprocess.Popen([os.path.join(os.path.dirname(sys.executable), "netclaim-publisher"), "endpoints",
                               "--kubeconfig", mcluster.kubeconfig, "--namespace", mns, "--lease-namespace", mns],
                              stdout=log, stderr=log)]
    try:
        mcluster.wait_running(mns, "srv-a", "srv-b", "client")
        netns = {name: mcluster.netns(mns, name) for name in ("srv-a", "srv-b", "client")}
        for name in ("srv-a", "srv-b"):
            procs.append(subprocess.Popen(["nsenter", f"--net={netns[name]}", sys.executable, "-c", ECHO_NAME,
                                           "0.0.0.0", "7070", name], stdout=log, stderr=log))

        def both_ready() -> dict[str, dict[str, Any]] | None:
            eps = _slice_endpoints(mcluster, mns, "srv")
            return eps if sorted(eps) == ["srv-a", "srv-b"] and all(e["conditions"]["ready"] for e in eps.values()) \
                else None

        eps = wait_until(both_ready, "both server pods ready on the Service's slice", timeout=60)
        for name, ep in eps.items():
            (address,) = ep["addresses"]
            own = [c.split("/")[0] for c in multinet.netns_interfaces(mcluster, mns, name)["net2"].cidrs]
            assert address in own, f"{name}'s endpoint {address} is not its net2 address {own}"

            def answered() -> bool:
                out = subprocess.run(["nsenter", f"--net={netns['client']}", sys.executable, "-c", CONNECT, address,
                                      "7070"], capture_output=True, text=True, timeout=30)
                return out.stdout.strip() == name

            wait_until(answered, f"the client to reach {name} at {address} over net2", timeout=30)

        subprocess.run(["nsenter", f"--net={netns['srv-a']}", "ip", "link", "set", "net2", "down"], check=True)
        wait_until(lambda: _slice_endpoints(mcluster, mns, "srv")["srv-a"]["conditions"]["ready"] is False,
                   "srv-a's endpoint not ready after net2 went down", timeout=60)
        assert _slice_endpoints(mcluster, mns, "srv")["srv-b"]["conditions"]["ready"] is True

        procs[2].kill()  # its server holds the netns: gone before the sandbox is torn down
        mcluster.delete_pod(mns, "srv-b", wait=False)
        wait_until(lambda: "srv-b" not in _slice_endpoints(mcluster, mns, "srv"),
                   "srv-b gone from the slice after its deletion", timeout=60)
    finally:
        for proc in procs:
            proc.kill()
            proc.wait(10)
        log.close()
