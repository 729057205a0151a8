"""dranet beside netclaim on the real node: two writers of one claim's `status.devices`.

dranet (kubernetes-sigs/dranet, built from its source snapshot) runs on the node
as a kubelet plugin (driver `dra.net`) and as an NRI plugin of the node's
containerd 2.x: at RunPodSandbox it moves a host interface (one end of a veth
pair that `cluster.sh up --with-dranet` creates; this kernel has no dummy
driver) into the pod and server-side applies its own entry with field manager
`dra.net` and `force: true`. netclaim reports the primary interface (eth0,
from the CNI chain) on a device of the DRA test driver with its own manager.

What a user sees, read back from the pod's own network namespace:
- both entries (one in each of two claims, or both in one claim with both
  requests), each equal to its interface in the pod;
- managedFields: each manager owns exactly its own entry;
- in EVERY version of the claim the API server sent while the sandbox was
  restarted (crictl stopp, or the pause process killed), dranet's entry is
  present and unchanged, and netclaim's entry, when present, is the old or the
  new sandbox's eth0: neither writer removed or rewrote the other's;
- after the pod is deleted the claims carry no entry and the interface is back
  in the host's namespace, still paired with its peer;
- containerd restarted under the pod: both entries stay byte for byte, but
  containerd's NRI no longer sends that sandbox's StopPodSandbox, so dranet
  cannot move the interface back (asserted as seen, see that test).

The cluster is this module's own (containerd with NRI enabled is not the
default node): NETCLAIM_DRANET_CLUSTER_DIR, default `nc-drn` under the temp
dir. If dranet cannot be built or started, every test here FAILS with the
reason. Measured on 2 shared cores (load 8-10): 60 s for the module (cluster up
with dranet and netclaim 21 s, the tests 4-13 s each, down 11 s), plus dranet's
build once (1.5-3 min, then cached; scripts/build/dranet.sh needs the snapshot in
NETCLAIM_PEERS_DIR).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Iterator

import pytest

from runtime.realcluster import ClusterError, RealCluster, cluster_sh, entries_of, ready_status, wait_until

DRANET = "dra.net"


@pytest.fixture(scope="module")
def cluster() -> Iterator[RealCluster]:
    """This module's own node, up with dranet and netclaim installed; a cluster already up there is reused and
    left up (NETCLAIM_CLUSTER_KEEP=1 keeps the one started here)."""
    if os.geteuid() != 0:
        pytest.fail("the real cluster needs root (kubelet, containerd, cgroups)", pytrace=False)
    directory = os.environ.get("NETCLAIM_DRANET_CLUSTER_DIR", os.path.join(tempfile.gettempdir(), "nc-drn"))
    env = {**os.environ, "NETCLAIM_CLUSTER_DIR": directory}
    try:
        reused = "kubelet: running" in cluster_sh("status", env=env)
    except ClusterError:
        reused = False
    try:
        c = RealCluster.up(directory, env, with_dranet=True)
        c.sh("install-netclaim")
    except ClusterError as exc:
        if not reused:
            cluster_sh("down", env=env)
        pytest.fail(f"the cluster with dranet could not start: {exc}", pytrace=False)
    try:
        yield c
    finally:
        if not reused and not os.environ.get("NETCLAIM_CLUSTER_KEEP"):
            c.down()


@pytest.fixture
def ns(cluster: RealCluster) -> Iterator[str]:
    cluster.sh("dranet-start")  # idempotent: interfaces present with their host addresses, dranet running
    name = cluster.namespace(f"d-{uuid.uuid4().hex[:6]}")
    yield name
    cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


# ---------------------------------------------------------------- what the pod and the host show


@dataclass(frozen=True)
class Link:
    name: str
    mac: str
    cidrs: list[str]
    index: int


def links(netns: str | None) -> dict[str, Link]:
    """Every interface of a network namespace (None: the host's), as `ip -j addr` shows it."""
    cmd = ["ip", "-j", "addr", "show"]
    if netns:
        cmd = ["nsenter", f"--net={netns}", *cmd]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=30).stdout
    found = {}
    for link in json.loads(out):
        cidrs = [f"{a['local']}/{a['prefixlen']}" for a in link.get("addr_info", []) if a.get("scope") == "global"]
        found[link["ifname"]] = Link(link["ifname"], link.get("address", "").lower(), cidrs, link["ifindex"])
    return found


def network_data(link: Link) -> dict[str, Any]:
    data: dict[str, Any] = {"interfaceName": link.name, "hardwareAddress": link.mac}
    if link.cidrs:
        data["ips"] = link.cidrs
    return data


def device_of(claim: dict[str, Any], driver: str, request: str) -> str:
    (result,) = [r for r in claim["status"]["allocation"]["devices"]["results"]
                 if r["driver"] == driver and r["request"] == request]
    return result["device"]


def published_devices(cluster: RealCluster) -> dict[str, dict[str, str]]:
    """dranet's ResourceSlice for this node: device -> its string attributes (dra.net/ifName, dra.net/ipv4, ...).

    Read before the pod starts: once an interface is in a pod, dranet's next scan leaves it out."""
    found = {}
    for s in json.loads(cluster.kubectl("get", "resourceslices", "-o", "json"))["items"]:
        if s["spec"]["driver"] == DRANET and s["spec"].get("nodeName") == cluster.node:
            for d in s["spec"].get("devices") or []:
                found[d["name"]] = {k: v["string"] for k, v in d["attributes"].items() if "string" in v}
    assert found, "dranet publishes nothing"
    return found


def status_owners(claim: dict[str, Any]) -> dict[str, list[dict[str, str]]]:
    """manager -> the status.devices keys it owns (from managedFields)."""
    owners: dict[str, list[dict[str, str]]] = {}
    for mf in claim["metadata"].get("managedFields") or []:
        devices = ((mf.get("fieldsV1") or {}).get("f:status") or {}).get("f:devices") or {}
        keys = [json.loads(k[2:]) for k in devices if k.startswith("k:")]
        if keys:
            owners.setdefault(mf["manager"], []).extend(keys)
    return owners


def key(entry: dict[str, Any]) -> dict[str, str]:
    return {"driver": entry["driver"], "pool": entry["pool"], "device": entry["device"]}


def claim_obj(cluster: RealCluster, ns: str, name: str) -> dict[str, Any]:
    return json.loads(cluster.kubectl("get", "resourceclaim", name, "-n", ns, "-o", "json", "--show-managed-fields"))


# ---------------------------------------------------------------- every version of a claim, while things happen


@dataclass
class ClaimWatch:
    """`kubectl get resourceclaim -w -o json`: every version the API server sends, in order."""

    cluster: RealCluster
    ns: str
    names: list[str]
    versions: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    procs: list[subprocess.Popen] = field(default_factory=list)
    threads: list[threading.Thread] = field(default_factory=list)

    def __enter__(self) -> "ClaimWatch":
        for name in self.names:
            self.versions[name] = []
            proc = subprocess.Popen(
                [self.cluster.values["NETCLAIM_KUBECTL"], "--kubeconfig", self.cluster.kubeconfig, "get",
                 "resourceclaim", name, "-n", self.ns, "-w", "-o", "json"],
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            thread = threading.Thread(target=self._read, args=(proc, self.versions[name]), daemon=True)
            thread.start()
            self.procs.append(proc)
            self.threads.append(thread)
        return self

    @staticmethod
    def _read(proc: subprocess.Popen, into: list[dict[str, Any]]) -> None:
        decoder = json.JSONDecoder()
        buf = ""
        for line in proc.stdout:  # type: ignore[union-attr]
            buf += line
            try:
                obj, end = decoder.raw_decode(buf.lstrip())
            except json.JSONDecodeError:
                continue
            into.append(obj)
            buf = buf.lstrip()[end:]

    def __exit__(self, *exc: object) -> None:
        time.sleep(1)  # the last versions reach us
        for proc in self.procs:
            proc.terminate()
            proc.wait(timeout=10)
        for thread in self.threads:
            thread.join(timeout=10)


# ---------------------------------------------------------------- steps


def both_entries(cluster: RealCluster, ns: str, pod: str, claims: dict[str, str], dranet_if: str,
                 sandbox: str = "") -> dict[str, dict[str, Any]]:
    """Wait until netclaim's entry (eth0) and dranet's entry (`dranet_if`) are Ready and equal to the pod's
    interfaces (and netclaim's names `sandbox` when given); return them by driver."""
    def entries() -> dict[str, dict[str, Any]] | None:
        netns = cluster.netns(ns, pod)
        pod_links = links(netns)
        found = {}
        for driver, claim in claims.items():
            mine = entries_of(cluster.claim_yaml(ns, claim), driver)
            if len(mine) != 1 or ready_status(mine[0]) != "True":
                return None
            found[driver] = mine[0]
        want_if = {cluster.driver: "eth0", DRANET: dranet_if}
        for driver, entry in found.items():
            link = pod_links.get(want_if[driver])
            if link is None or entry.get("networkData") != network_data(link):
                return None
        if sandbox and sandbox not in json.dumps(found[cluster.driver].get("data") or {}):
            return None
        return found
    return wait_until(entries, f"both entries Ready and equal to {ns}/{pod}'s interfaces", timeout=90)


def assert_each_owns_its_own(cluster: RealCluster, ns: str, claims: dict[str, str],
                             entries: dict[str, dict[str, Any]]) -> None:
    for driver, claim in claims.items():
        owners = status_owners(claim_obj(cluster, ns, claim))
        mine = f"netclaim/{cluster.node}" if driver == cluster.driver else DRANET
        assert key(entries[driver]) in owners.get(mine, []), owners
        for manager, keys in owners.items():
            for k in keys:
                writer = f"netclaim/{cluster.node}" if k["driver"] == cluster.driver else DRANET
                assert manager == writer, f"{manager} owns {k} on {claim}: {owners}"


def assert_no_writer_touched_the_other(watch: ClaimWatch, cluster: RealCluster, claims: dict[str, str],
                                       before: dict[str, dict[str, Any]], after: dict[str, dict[str, Any]]) -> int:
    """Every version the watch saw while the sandbox was replaced: dranet's entry present with the same
    networkData; netclaim's absent (between its DEL and its ADD) or the old or the new sandbox's eth0.
    The last version seen is the final state (the watch covered the whole restart). Returns how many
    versions showed netclaim's entry absent."""
    eth0s = [before[cluster.driver]["networkData"], after[cluster.driver]["networkData"]]
    gaps = 0
    for driver, claim in claims.items():
        versions = watch.versions[claim]
        assert versions, f"the watch saw no version of {claim}"
        dranet_states: set[str] = set()
        for version in versions:
            rv = version["metadata"]["resourceVersion"]
            if driver == DRANET:
                (d,) = entries_of(version, DRANET)  # never removed, never doubled
                assert d["networkData"] == before[DRANET]["networkData"], (claim, rv)
                dranet_states.add(json.dumps(d, sort_keys=True))
            else:
                mine = entries_of(version, cluster.driver)
                assert len(mine) <= 1, (claim, rv)
                gaps += not mine
                assert all(e["networkData"] in eth0s for e in mine), (claim, rv, mine, eth0s)
        # dranet's whole entry (conditions too) is its old apply or its new one, never a third state that
        # another writer's apply made of it.
        assert len(dranet_states) <= 2, (claim, dranet_states)
        last = entries_of(versions[-1], driver)
        assert [e["networkData"] for e in last] == [after[driver]["networkData"]], (claim, last)
    return gaps


def restart_sandbox(cluster: RealCluster, ns: str, pod: str, how: str) -> str:
    """Make the runtime lose the pod's sandbox; the kubelet creates a new one. Returns the new sandbox's id."""
    old = cluster.sandbox(ns, pod)
    if how == "stopp":
        cluster.crictl("stopp", old["id"])
    else:  # the pause process dies
        os.kill(int(old["info"]["pid"]), signal.SIGKILL)

    def new_id() -> str:
        sb = cluster.sandbox(ns, pod)
        return sb["id"] if sb["id"] != old["id"] else ""
    new = wait_until(new_id, f"a new sandbox for {ns}/{pod}", timeout=120)
    cluster.wait_running(ns, pod)
    return new


def assert_back_on_the_host(ifname: str, mac: str) -> None:
    def back() -> Link | None:
        link = links(None).get(ifname)
        return link if link and link.mac == mac else None
    wait_until(back, f"{ifname} ({mac}) back in the host's namespace", timeout=60)
    peer = json.loads(subprocess.run(["ip", "-j", "-d", "link", "show", "dev", ifname], capture_output=True,
                                     text=True, check=True).stdout)[0]
    assert peer.get("linkinfo", {}).get("info_kind") == "veth"
    assert "link_index" in peer or "link" in peer  # still paired with its peer on the host


def claims_empty(cluster: RealCluster, ns: str, *claims: str) -> None:
    def empty() -> bool:
        return all(not (cluster.claim_yaml(ns, c).get("status") or {}).get("devices") for c in claims)
    wait_until(empty, f"no status.devices left on {claims}", timeout=90)


def pod_with_claims(cluster: RealCluster, ns: str, name: str, claims: list[str]) -> None:
    cluster.apply({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": ns},
        "spec": {"containers": [{"name": "app", "image": "netclaim.local/pause:e2e", "imagePullPolicy": "Never"}],
                 "terminationGracePeriodSeconds": 0,
                 "resourceClaims": [{"name": f"c{i}", "resourceClaimName": c} for i, c in enumerate(claims)]}})


def request(name: str, device_class: str) -> dict[str, Any]:
    return {"name": name, "exactly": {"deviceClassName": device_class}}


def claim_doc(ns: str, name: str, requests: list[dict[str, Any]], config: list[dict[str, Any]] | None = None):
    devices: dict[str, Any] = {"requests": requests}
    if config:
        devices["config"] = config
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": ns}, "spec": {"devices": devices}}


# ---------------------------------------------------------------- the tests


def test_dranet_secondary_claim_and_netclaim_primary_claim_across_restart_and_deletion(
        cluster: RealCluster, ns: str) -> None:
    dranet_class = cluster.values["NETCLAIM_DRANET_DEVICE_CLASS"]
    # dranet renames the interface in the pod as its opaque config asks (the host's address moves along; an
    # address of another subnet here fails the sandbox: dranet also copies the host's connected route).
    net1 = {"opaque": {"driver": DRANET, "parameters": {"interface": {"name": "net1"}}}}
    cluster.apply(claim_doc(ns, "primary", [request("nic", cluster.values["NETCLAIM_DEVICE_CLASS"])]),
                  claim_doc(ns, "secondary", [request("nic", dranet_class)], [{"requests": ["nic"], **net1}]))
    published = published_devices(cluster)
    pod_with_claims(cluster, ns, "web", ["primary", "secondary"])
    cluster.wait_running(ns, "web")
    claims = {cluster.driver: "primary", DRANET: "secondary"}
    first = cluster.sandbox(ns, "web")["id"]
    entries = both_entries(cluster, ns, "web", claims, "net1", first)
    device = published[device_of(cluster.claim_yaml(ns, "secondary"), DRANET, "nic")]
    host_if = device["dra.net/ifName"]
    assert entries[DRANET]["networkData"]["ips"] == [device["dra.net/ipv4"]]  # the host's address, moved
    assert entries[DRANET]["networkData"]["hardwareAddress"] == device["dra.net/mac"]
    assert entries[cluster.driver]["networkData"]["ips"] == links(cluster.netns(ns, "web"))["eth0"].cidrs
    # One writer per claim here: netclaim wrote nothing on dranet's claim and dranet nothing on netclaim's.
    assert [e["driver"] for e in cluster.claim_yaml(ns, "primary")["status"]["devices"]] == [cluster.driver]
    assert [e["driver"] for e in cluster.claim_yaml(ns, "secondary")["status"]["devices"]] == [DRANET]
    assert_each_owns_its_own(cluster, ns, claims, entries)
    assert host_if not in links(None)  # moved, not copied

    with ClaimWatch(cluster, ns, ["primary", "secondary"]) as watch:
        second = restart_sandbox(cluster, ns, "web", "stopp")
        after = both_entries(cluster, ns, "web", claims, "net1", second)
    assert after[DRANET]["networkData"] == entries[DRANET]["networkData"]
    gaps = assert_no_writer_touched_the_other(watch, cluster, claims, entries, after)
    print(f"restart (crictl stopp): {len(watch.versions['primary'])} + {len(watch.versions['secondary'])} "
          f"claim versions seen, netclaim's entry absent in {gaps}")
    assert_each_owns_its_own(cluster, ns, claims, after)

    cluster.delete_pod(ns, "web")
    claims_empty(cluster, ns, "primary", "secondary")
    assert_back_on_the_host(host_if, entries[DRANET]["networkData"]["hardwareAddress"])


def test_one_claim_with_both_requests_across_a_killed_pause_and_deletion(cluster: RealCluster, ns: str) -> None:
    cluster.apply(claim_doc(ns, "both", [request("primary", cluster.values["NETCLAIM_DEVICE_CLASS"]),
                                         request("secondary", cluster.values["NETCLAIM_DRANET_DEVICE_CLASS"])]))
    published = published_devices(cluster)
    pod_with_claims(cluster, ns, "app", ["both"])
    cluster.wait_running(ns, "app")
    claim = cluster.claim_yaml(ns, "both")
    host_if = published[device_of(claim, DRANET, "secondary")]["dra.net/ifName"]
    claims = {cluster.driver: "both", DRANET: "both"}
    # Without opaque config dranet keeps the host's name and moves the host's addresses along.
    entries = both_entries(cluster, ns, "app", claims, host_if, cluster.sandbox(ns, "app")["id"])
    assert entries[DRANET]["networkData"].get("ips"), "the host interface's address moved with it"
    assert device_of(claim, cluster.driver, "primary") == entries[cluster.driver]["device"]
    assert len(cluster.claim_yaml(ns, "both")["status"]["devices"]) == 2
    assert_each_owns_its_own(cluster, ns, claims, entries)

    with ClaimWatch(cluster, ns, ["both"]) as watch:
        new = restart_sandbox(cluster, ns, "app", "kill-pause")
        after = both_entries(cluster, ns, "app", claims, host_if, new)
    assert after[DRANET]["networkData"] == entries[DRANET]["networkData"]
    # One claim, both writers: every version carries both entries' checks.
    gaps = assert_no_writer_touched_the_other(watch, cluster, claims, entries, after)
    print(f"restart (pause killed): {len(watch.versions['both'])} claim versions seen, netclaim's entry absent in "
          f"{gaps}")
    assert_each_owns_its_own(cluster, ns, claims, after)

    since = os.path.getsize(cluster.values["NETCLAIM_DRANET_LOG"])
    cluster.delete_pod(ns, "app")
    claims_empty(cluster, ns, "both")
    assert_back_on_the_host(host_if, entries[DRANET]["networkData"]["hardwareAddress"])
    assert dranet_stop_hook_ran(cluster, ns, "app", since)


def dranet_stop_hook_ran(cluster: RealCluster, ns: str, pod: str, since: int) -> bool:
    """dranet's log, after byte `since`, shows its NRI StopPodSandbox hook for the pod (it logs each at -v=2)."""
    with open(cluster.values["NETCLAIM_DRANET_LOG"], "rb") as fh:
        fh.seek(since)
        return f'"StopPodSandbox" pod="{ns}/{pod}"'.encode() in fh.read()


def test_containerd_restart_leaves_both_entries_but_loses_dranet_stop_hook_and_the_interface(
        cluster: RealCluster, ns: str) -> None:
    """containerd restarts under a running pod. dranet loses its NRI connection and exits; cluster.sh starts it
    again and waits for its registration. Neither writer touches either entry. But containerd 2.4.2 rebuilds
    its NRI state of containers only, not of pod sandboxes (the issue of containerd/containerd#8426), so it
    never sends StopPodSandbox to NRI for a sandbox older than the restart: dranet cannot move the interface
    back, and a veth dies with the pod's netns (a physical NIC would fall back to the host unconfigured)."""
    cluster.apply(claim_doc(ns, "both", [request("primary", cluster.values["NETCLAIM_DEVICE_CLASS"]),
                                         request("secondary", cluster.values["NETCLAIM_DRANET_DEVICE_CLASS"])]))
    published = published_devices(cluster)
    pod_with_claims(cluster, ns, "steady", ["both"])
    cluster.wait_running(ns, "steady")
    host_if = published[device_of(cluster.claim_yaml(ns, "both"), DRANET, "secondary")]["dra.net/ifName"]
    claims = {cluster.driver: "both", DRANET: "both"}
    sandbox = cluster.sandbox(ns, "steady")["id"]
    both_entries(cluster, ns, "steady", claims, host_if, sandbox)
    time.sleep(2)  # dranet's status apply is asynchronous: let it land before taking the reference
    before = cluster.claim_yaml(ns, "both")["status"]["devices"]

    pid_file = os.path.join(cluster.dir, "dranet.pid")
    with open(pid_file) as fh:
        dranet_pid = fh.read().strip()
    cluster.sh("containerd-stop")
    cluster.sh("containerd-start")
    with open(pid_file) as fh:
        assert fh.read().strip() != dranet_pid  # a new dranet, registered with the new containerd
    cluster.wait_running(ns, "steady")
    assert cluster.sandbox(ns, "steady")["id"] == sandbox  # the same sandbox: nothing to re-attach
    both_entries(cluster, ns, "steady", claims, host_if, sandbox)
    assert cluster.claim_yaml(ns, "both")["status"]["devices"] == before  # nobody rewrote either entry

    since = os.path.getsize(cluster.values["NETCLAIM_DRANET_LOG"])
    cluster.delete_pod(ns, "steady")
    claims_empty(cluster, ns, "both")
    peer = "ndp-" + host_if.removeprefix("ndr-")
    wait_until(lambda: not {host_if, peer} & set(links(None)), f"the veth pair {host_if}/{peer} to die", timeout=60)
    assert not dranet_stop_hook_ran(cluster, ns, "steady", since)
