"""Multus's DRA path on the real node: two networks of one NAD, two devices of one request.

One cluster per Multus mode (`scripts/cluster.sh up --with-multus [--multus-thick] --with-vf-driver`):
the real Multus, thin plugin or thick (shim and daemon), as the node's primary CNI and, beside the e2e test
driver, the harness's own DRA driver `vf.netclaim.test` (scripts/harness/netdriver),
whose devices carry the attributes Multus resolves a NAD's
`k8s.v1.cni.cncf.io/resourceName` with: `k8s.cni.cncf.io/resourceName`
(netclaim.test/vf) and `k8s.cni.cncf.io/deviceID` (a PCI address). The names sort
opposite to the addresses: vf-0 has the highest, vf-3 the lowest.

The pod has three networks: eth0 from the node's primary network, whose netclaim
reports under request `nic` of one claim (a device of the e2e test driver), and
dra-driver-sriov's "multiple VFs behind Multus" shape: a second claim whose
request `vf` has `count: 2`, and the NAD `vf` twice in its networks (net1, net2). The NAD's chain is macvlan, vf-capture (records the device ID
Multus hands the chain), netclaim (driverName vf.netclaim.test, request vf,
the `deviceID` capability). Multus gives the delegates the allocated devices'
IDs sorted, in the order of the pod's networks: net1 gets the lowest address,
which is the allocated device whose NAME sorts last, so neither the
allocation's order nor the names' order gives the right pairing; only the
device ID does.

NETCLAIM_MULTUS_DRA_CLUSTER_DIR picks the thin cluster's directory (default
nc-vftest under the temp dir; thick adds `-k`); NETCLAIM_CLUSTER_KEEP=1 keeps them.
Measured here (2 shared cores): about 30 s per mode, 20 s of it bringing the
cluster up and the pod to Ready, 9 s taking it down.
"""

from __future__ import annotations

import json
import os
import uuid
from dataclasses import dataclass
from typing import Any, Iterator

import pytest

from runtime import multinet  # noqa: E402  (conftest puts scripts/harness on sys.path)
from runtime.multinet import Attachment
from runtime.realcluster import RealCluster, entries_of, ready_status, wait_until

from multus_kit import MODES, mode_dir, multus_cluster

DEVICE_ID_ATTR = "k8s.cni.cncf.io/deviceID"
NETS = [Attachment("vf", "net1"), Attachment("vf", "net2")]


@pytest.fixture(scope="module", params=MODES)
def vcluster(request: pytest.FixtureRequest) -> Iterator[RealCluster]:
    """The vf driver's cluster, once with Multus thin and once thick (tests/cluster/multus_kit.py)."""
    yield from multus_cluster(request.param, mode_dir("NETCLAIM_MULTUS_DRA_CLUSTER_DIR", "nc-vftest", request.param),
                              "--with-vf-driver", what=" and the vf driver",
                              env={"NETCLAIM_DRIVER_NAMES": "net.example.com vf.netclaim.test",
                                   "NETCLAIM_UNCHAINED_GRACE": "3"})


@dataclass
class VfPod:
    """The running pod and what the API and the node say about it."""

    ns: str
    name: str
    claim: str  # the vf claim
    primary_claim: str  # eth0's
    sandbox: str
    allocated: dict[str, str]  # allocated device name -> its k8s.cni.cncf.io/deviceID
    handed: dict[str, dict[str, Any]]  # ifname -> what the chain was handed at ADD (vf-capture's record)


def slice_device_ids(cluster: RealCluster, driver: str) -> dict[tuple[str, str], str]:
    """(pool, device) -> deviceID attribute, from the node's ResourceSlices of `driver`."""
    slices = json.loads(cluster.kubectl("get", "resourceslices", "-o", "json"))["items"]
    return {(s["spec"]["pool"]["name"], d["name"]): d["attributes"][DEVICE_ID_ATTR]["string"]
            for s in slices if s["spec"]["driver"] == driver and s["spec"].get("nodeName") == cluster.node
            for d in s["spec"].get("devices") or [] if DEVICE_ID_ATTR in (d.get("attributes") or {})}


def captured_adds(cluster: RealCluster, ns: str, pod: str, sandbox: str) -> dict[str, list[dict[str, Any]]]:
    """ifname -> vf-capture's ADD records of this sandbox."""
    found: dict[str, list[dict[str, Any]]] = {}
    path = cluster.values["NETCLAIM_VF_CAPTURE"]
    if not os.path.exists(path):
        return found
    with open(path) as f:
        for line in f:
            r = json.loads(line)
            if (r["command"], r["podNamespace"], r["podName"], r["containerID"]) == ("ADD", ns, pod, sandbox):
                found.setdefault(r["ifname"], []).append(r)
    return found


def last_error(cluster: RealCluster) -> str:
    """The publisher's last error log line, shortened (what a failure message should point at)."""
    try:
        with open(cluster.values["NETCLAIM_PUBLISHER_LOG"], errors="replace") as f:
            errors = [line for line in f if '"level":"error"' in line]
    except OSError:
        return ""
    if not errors:
        return ""
    e = json.loads(errors[-1])
    return f"{e.get('msg')} ({e.get('ifname', '')}): {(e.get('exception') or e.get('error') or '').strip()[-300:]}"


@pytest.fixture(scope="module")
def vf_pod(vcluster: RealCluster) -> Iterator[VfPod]:
    ns = vcluster.namespace(f"v-{uuid.uuid4().hex[:6]}")
    driver, cls = vcluster.values["NETCLAIM_VF_DRIVER"], vcluster.values["NETCLAIM_VF_DEVICE_CLASS"]
    template = multinet.claim_template(ns, "vfs", [vcluster.values["NETCLAIM_VF_REQUEST"]], cls)
    template["spec"]["spec"]["devices"]["requests"][0]["exactly"]["count"] = 2
    primary = multinet.claim_template(ns, "eth0", [multinet.PRIMARY_REQUEST], vcluster.values["NETCLAIM_DEVICE_CLASS"])
    vcluster.apply(template, primary, multinet.pod(ns, "p", NETS, {"net": {"resourceClaimTemplateName": "eth0"},
                                                                  "vf": {"resourceClaimTemplateName": "vfs"}}))
    vcluster.wait_running(ns, "p")
    names = wait_until(lambda: len(multinet.claim_names(vcluster.get("pod", "p", ns))) == 2
                       and multinet.claim_names(vcluster.get("pod", "p", ns)), "the pod's two generated claims")
    by_driver = {r["driver"]: name for name in names for r in
                 vcluster.get("resourceclaim", name, ns)["status"]["allocation"]["devices"]["results"]}
    claim, primary_claim = by_driver[driver], by_driver[vcluster.driver]
    results = vcluster.get("resourceclaim", claim, ns)["status"]["allocation"]["devices"]["results"]
    ids = slice_device_ids(vcluster, driver)
    allocated = {r["device"]: ids[(r["pool"], r["device"])] for r in results if r["driver"] == driver}
    sandbox = vcluster.sandbox(ns, "p")["id"]
    adds = captured_adds(vcluster, ns, "p", sandbox)
    assert sorted(adds) == ["net1", "net2"] and all(len(v) == 1 for v in adds.values()), \
        f"one ADD of the vf chain per interface, vf-capture saw {adds}"
    yield VfPod(ns, "p", claim, primary_claim, sandbox, allocated, {ifname: recs[0] for ifname, recs in adds.items()})
    vcluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)


def test_multus_hands_each_vf_network_the_device_id_of_its_own_allocated_device(vf_pod: VfPod) -> None:
    """net1 and net2 were each handed a different allocated device's ID, as runtimeConfig.deviceID (the
    capability) and as top-level deviceID/pciBusID; net1 the lowest ID, i.e. the device whose name sorts last."""
    assert len(vf_pod.allocated) == 2, f"two devices of the vf driver allocated: {vf_pod.allocated}"
    for ifname, rec in vf_pod.handed.items():
        assert rec["runtimeDeviceID"] == rec["deviceID"] == rec["pciBusID"], f"{ifname}: {rec}"
    given = {ifname: rec["runtimeDeviceID"] for ifname, rec in vf_pod.handed.items()}
    assert given["net1"] != given["net2"], f"both networks got the same device: {given}"
    assert sorted(given.values()) == sorted(vf_pod.allocated.values()), \
        f"Multus handed {given}, the allocated devices' IDs are {vf_pod.allocated}"
    assert given["net1"] == min(vf_pod.allocated.values())
    by_id = {v: k for k, v in vf_pod.allocated.items()}
    assert by_id[given["net1"]] == max(vf_pod.allocated), \
        f"net1 got {by_id[given['net1']]}, the allocated device whose name sorts last is {max(vf_pod.allocated)}"


def test_each_vf_interface_is_reported_on_the_device_multus_gave_it(vcluster: RealCluster, vf_pod: VfPod) -> None:
    """The claim shows one entry per allocated device, each with its own interface, IPs and MAC, equal to the
    pod's netns and Multus's network-status, and paired with its device as Multus paired them (by device ID)."""
    driver = vcluster.values["NETCLAIM_VF_DRIVER"]
    device_of = {ifname: next(d for d, i in vf_pod.allocated.items() if i == rec["runtimeDeviceID"])
                 for ifname, rec in vf_pod.handed.items()}
    last: list[str] = []

    def right() -> bool:
        nonlocal last
        last = []
        entries = entries_of(vcluster.get("resourceclaim", vf_pod.claim, vf_pod.ns), driver)
        pod = vcluster.get("pod", vf_pod.name, vf_pod.ns)
        status = {s.get("interface"): s for s in
                  json.loads((pod["metadata"].get("annotations") or {}).get(multinet.STATUS_ANNOTATION) or "[]")}
        netns = multinet.netns_interfaces(vcluster, vf_pod.ns, vf_pod.name)
        by_device = {e["device"]: e for e in entries}
        if sorted(by_device) != sorted(vf_pod.allocated) or len(entries) != len(vf_pod.allocated):
            last.append(f"entries on devices {[e['device'] for e in entries]}, allocated {sorted(vf_pod.allocated)}")
        for ifname, device in device_of.items():
            e = by_device.get(device)
            if e is None:
                continue
            nd = e.get("networkData") or {}
            ns_if, st = netns[ifname], status.get(ifname) or {}
            if nd.get("interfaceName") != ifname:
                last.append(f"{device} (Multus gave it to {ifname}) shows interface {nd.get('interfaceName')!r}")
            if (nd.get("hardwareAddress") or "").lower() != ns_if.mac:
                last.append(f"{device}: mac {nd.get('hardwareAddress')} != {ifname}'s {ns_if.mac} in the netns")
            if sorted(nd.get("ips") or []) != sorted(ns_if.cidrs):
                last.append(f"{device}: ips {nd.get('ips')} != {ifname}'s {ns_if.cidrs} in the netns")
            if (st.get("mac") or "").lower() != ns_if.mac or \
                    sorted(st.get("ips") or []) != sorted(c.split("/")[0] for c in ns_if.cidrs):
                last.append(f"{ifname}: network-status {st.get('mac')} {st.get('ips')} != netns {ns_if}")
            if ready_status(e) != "True":
                last.append(f"{device}: Ready={ready_status(e)!r}")
        return not last

    try:
        wait_until(right, f"claim {vf_pod.ns}/{vf_pod.claim}'s entries on the devices Multus gave net1 and net2",
                   timeout=30)
    except AssertionError:
        warnings = json.loads(vcluster.kubectl("get", "events", "-n", vf_pod.ns, "--field-selector",
                                               f"type=Warning,involvedObject.name={vf_pod.claim}", "-o", "json"))
        seen = [f"{w['reason']}: {w['message']}" for w in warnings["items"]]
        raise AssertionError(f"Multus gave {device_of}; after 30 s: {'; '.join(last)}; "
                             f"Warning Events on the claim: {seen or 'none'}; "
                             f"the publisher's last error: {last_error(vcluster) or 'none'}") from None
    entries = entries_of(vcluster.get("resourceclaim", vf_pod.claim, vf_pod.ns), driver)
    macs = {(e["networkData"]["interfaceName"], e["networkData"]["hardwareAddress"]) for e in entries}
    assert len(macs) == 2 and len({m for _, m in macs}) == 2, f"two interfaces, two MACs: {macs}"


def test_the_three_network_pod_shows_eth0_on_its_request_beside_the_two_vfs(vcluster: RealCluster,
                                                                             vf_pod: VfPod) -> None:
    """Three interfaces, three entries: eth0's on the primary claim's device of request nic, equal to the
    netns and network-status like the two VFs' (checked above), and nothing of eth0 on the vf claim."""
    last: list[str] = []

    def right() -> bool:
        nonlocal last
        v = multinet.view(vcluster, vf_pod.ns, vf_pod.name)
        last = [p for p in multinet.problems(v, {"eth0": multinet.PRIMARY_REQUEST})
                if not p.startswith("network-status names")]  # it also names net1 and net2, as it should
        names = {s.get("interface") for s in v.network_status}
        if names != {"eth0", "net1", "net2"}:
            last.append(f"network-status names {sorted(map(str, names))}")
        vf_entries = entries_of(vcluster.get("resourceclaim", vf_pod.claim, vf_pod.ns),
                                vcluster.values["NETCLAIM_VF_DRIVER"])
        if sorted(e["networkData"]["interfaceName"] for e in vf_entries) != ["net1", "net2"]:
            last.append(f"vf claim entries name {[e['networkData']['interfaceName'] for e in vf_entries]}")
        return not last

    try:
        wait_until(right, f"eth0's entry on claim {vf_pod.ns}/{vf_pod.primary_claim}", timeout=30)
    except AssertionError:
        raise AssertionError("; ".join(last)) from None


def test_a_vf_network_whose_chain_lacks_netclaim_is_named_in_a_warning(vcluster: RealCluster) -> None:
    """net1 through the NAD that ends in netclaim, net2 through a NAD of the same resource name whose chain
    does not: net1's entry is published (equal to the netns), and the device Multus gave net2 is named in
    a NetclaimDeviceNotChained Warning on the pod instead of being silently left without status."""
    driver = vcluster.values["NETCLAIM_VF_DRIVER"]
    ns = vcluster.namespace(f"u-{uuid.uuid4().hex[:6]}")
    try:
        nad = vcluster.get("network-attachment-definitions", "vf", "default")
        config = json.loads(nad["spec"]["config"])
        config["name"] = "vf-plain"
        config["plugins"] = [p for p in config["plugins"] if p["type"] not in ("netclaim", "vf-capture")]
        config["plugins"][0]["ipam"]["ranges"] = [[{"subnet": "172.31.21.0/24"}]]
        plain = {"apiVersion": "k8s.cni.cncf.io/v1", "kind": "NetworkAttachmentDefinition",
                 "metadata": {"name": "vf-plain", "namespace": ns, "annotations": nad["metadata"]["annotations"]},
                 "spec": {"config": json.dumps(config)}}
        template = multinet.claim_template(ns, "vfs", [vcluster.values["NETCLAIM_VF_REQUEST"]],
                                           vcluster.values["NETCLAIM_VF_DEVICE_CLASS"])
        template["spec"]["spec"]["devices"]["requests"][0]["exactly"]["count"] = 2
        pod = multinet.pod(ns, "p", [Attachment("vf", "net1")], {"vf": {"resourceClaimTemplateName": "vfs"}})
        pod["metadata"]["annotations"][multinet.NETWORKS_ANNOTATION] = f"default/vf@net1,{ns}/vf-plain@net2"
        vcluster.apply(plain, template, pod)
        vcluster.wait_running(ns, "p")
        claim = vcluster.pod_claim(ns, "p")
        results = vcluster.get("resourceclaim", claim, ns)["status"]["allocation"]["devices"]["results"]
        ids = slice_device_ids(vcluster, driver)
        allocated = {r["device"]: ids[(r["pool"], r["device"])] for r in results if r["driver"] == driver}
        # Multus hands the sorted IDs out in network order: net2, the unchained one, gets the higher.
        unchained = max(allocated, key=lambda d: allocated[d])

        def warned() -> list[dict[str, Any]]:
            events = json.loads(vcluster.kubectl("get", "events.events.k8s.io", "-n", ns, "-o", "json"))["items"]
            return [e for e in events if e.get("reason") == "NetclaimDeviceNotChained"]

        [event] = wait_until(warned, "the NetclaimDeviceNotChained Event", timeout=90)
        assert event["regarding"]["name"] == "p" and event["related"]["name"] == claim, event
        assert f"/{unchained} (request vf)" in event["note"], (unchained, event["note"])
        assert f"/{min(allocated, key=lambda d: allocated[d])} " not in event["note"], event["note"]
        netns = multinet.netns_interfaces(vcluster, ns, "p")
        [entry] = entries_of(vcluster.get("resourceclaim", claim, ns), driver)
        nd = entry["networkData"]
        assert entry["device"] != unchained and nd["interfaceName"] == "net1", entry
        assert nd["hardwareAddress"].lower() == netns["net1"].mac and sorted(nd["ips"]) == sorted(netns["net1"].cidrs)
    finally:
        vcluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)
