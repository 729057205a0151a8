"""The live watch may take truth away from an entry, never add it, and one netns cannot stall it.

A pod's workload with NET_ADMIN in its own netns (the network functions netclaim serves usually
have it) can put any address and any MAC on its interface. The claim's status is what the network
gave the pod, written with the driver's authority, so what the workload adds must never appear in
`networkData`: a MAC changed since the ADD is `Ready=False MacChanged`, an address gained is not
shown (unless the operator names the network, for SLAAC/DHCP networks). And a netns holding tens of
thousands of addresses costs the watch's one thread a bounded read, so every other netns is still
let go when the runtime removes it.

Real parts, as in test_live_watch_survives_faults_and_crashes.py: the publisher's `Service` with
its journal on disk running the live-watch thread, real netns with a veth `eth0` changed with
`ip -n`. The published entry is what the reconciler applies: `shown_entry` of the journal's row.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator

import pytest
from livewatch_kit import (
    PodNetns,
    ip,
    journal_attachment,
    live_state,
    made_pod_netns,
    pod_netns,
    published,
    ready,
    service,
    start_watch,
)
from publisher_testkit import wait_until

from publisher import limits
from publisher.live.sandbox import Sandbox
from publisher.live.watcher import LiveSettings
from publisher.service import Service

pytestmark = pytest.mark.netns

__all__ = ["pod_netns", "service"]  # fixtures, used by name

ADD_IP = "10.77.0.5/24"  # what the ADD configured (pod_netns's address)
PLANTED_IP = "192.0.2.66/32"
PLANTED_MAC = "02:00:5e:00:53:66"






def test_an_address_and_a_mac_the_workload_sets_are_never_published(service: Service, pod_netns: PodNetns) -> None:
    add_mac = pod_netns.mac()
    journal_attachment(service, pod_netns.path, add_mac)
    start_watch(service)

    # The workload plants an address and a MAC on its interface; then the link goes down, which any
    # working watch records: once it has, the watch has read the interface with both in place.
    ip("-n", pod_netns.name, "addr", "add", PLANTED_IP, "dev", "eth0")
    ip("-n", pod_netns.name, "link", "set", "eth0", "address", PLANTED_MAC)
    pod_netns.link("down")
    wait_until("LinkDown recorded", lambda: live_state(service) == "LinkDown", timeout=30)
    entry = published(service)
    assert ready(entry)["status"] == "False" and ready(entry)["reason"] == "LinkDown", entry
    assert entry["networkData"] == {"interfaceName": "eth0", "ips": [ADD_IP], "hardwareAddress": add_mac}, entry

    # Up again: the interface no longer carries the ADD's MAC, and the status says so.
    pod_netns.link("up")
    wait_until("the link's recovery read", lambda: live_state(service) != "LinkDown", timeout=30)
    entry = published(service)
    assert ready(entry)["status"] == "False" and ready(entry)["reason"] == "MacChanged", entry
    assert add_mac in ready(entry)["message"] and PLANTED_MAC in ready(entry)["message"], entry
    assert PLANTED_MAC not in json.dumps(entry["networkData"]) and PLANTED_IP not in json.dumps(entry["networkData"])

    # The MAC given back: Ready again, and still only the ADD's address.
    ip("-n", pod_netns.name, "link", "set", "eth0", "address", add_mac)
    wait_until("Ready recorded", lambda: live_state(service) == "Ready", timeout=30)
    entry = published(service)
    assert ready(entry)["status"] == "True", entry
    assert entry["networkData"] == {"interfaceName": "eth0", "ips": [ADD_IP], "hardwareAddress": add_mac}, entry


def test_a_network_the_operator_names_shows_addresses_gained_after_the_add(service: Service,
                                                                           pod_netns: PodNetns) -> None:
    service.live_watch.settings = LiveSettings(hold=0.2, journal_interval=0.5, retry_unopenable=0.5,
                                               report_added=frozenset({"podnet"}))  # the attachment's network
    add_mac = pod_netns.mac()
    journal_attachment(service, pod_netns.path, add_mac)
    start_watch(service)

    ip("-n", pod_netns.name, "addr", "add", PLANTED_IP, "dev", "eth0")  # SLAAC or DHCP, on such a network
    wait_until("the gained address published", lambda: PLANTED_IP in published(service)["networkData"].get("ips", []),
               timeout=30)
    entry = published(service)
    assert entry["networkData"]["ips"] == [ADD_IP, PLANTED_IP], entry
    assert ready(entry)["status"] == "True" and entry["networkData"]["hardwareAddress"] == add_mac, entry


def test_a_value_stored_by_an_older_publisher_shows_nothing_the_interface_gained(service: Service,
                                                                                 pod_netns: PodNetns) -> None:
    """An older publisher stored every address seen, and the MAC seen, in the row's `live`."""
    add_mac = pod_netns.mac()
    cid = journal_attachment(service, pod_netns.path, add_mac)
    older = {"state": "Ready", "message": "", "since": "", "ifname": "eth0", "ips": [ADD_IP, PLANTED_IP],
             "mac": PLANTED_MAC}
    with service.journal._tx() as db:
        db.execute("UPDATE attachments SET live=? WHERE container_id=?", (json.dumps(older), cid))
    entry = published(service)
    assert entry["networkData"] == {"interfaceName": "eth0", "ips": [ADD_IP], "hardwareAddress": add_mac}, entry

    # The upgraded watch reads the interface again and replaces the stored value with its own.
    start_watch(service)
    wait_until("the stored value replaced", lambda: service.journal.attachment(cid, "eth0").live.get("mac") == add_mac,
               timeout=30)
    entry = published(service)
    assert ready(entry)["status"] == "True" and entry["networkData"]["ips"] == [ADD_IP], entry


# ------------------------------------------------------------------ a netns with many addresses

FLOOD = 10_000  # the kernel adds them in O(n) each: 10,000 take about a second, 20,000 over ten


@pytest.fixture()
def second_netns() -> Iterator[PodNetns]:
    with made_pod_netns("lw", "10.78.0.5/24") as ns:
        yield ns


def flood(ns: PodNetns, count: int) -> None:
    """`count` /32s on the watched interface, added the fast way a workload would."""
    lines = "".join(f"addr add 10.{200 + (i >> 16)}.{(i >> 8) & 255}.{i & 255}/32 dev eth0\n" for i in range(count))
    subprocess.run(["ip", "-n", ns.name, "-batch", "-"], input=lines.encode(), check=True, capture_output=True)


@pytest.mark.parametrize("flooded", [True, False], ids=["beside-a-flooded-netns", "beside-a-quiet-netns"])
def test_a_netns_removed_without_del_is_let_go_while_another_holds_many_addresses(
        service: Service, pod_netns: PodNetns, second_netns: PodNetns, flooded: bool) -> None:
    big, other = pod_netns, second_netns
    big_cid = journal_attachment(service, big.path, big.mac(), cid="a" * 64, claim=("ns", "big"))
    other_cid = journal_attachment(service, other.path, other.mac(), cid="b" * 64, claim=("ns", "other"))
    service._spawn("live-watch", service.live_watch.run)
    wait_until("both netns watched", lambda: service.live_watch.state()["namespaces"] == 2
               and service.live_watch.busy() == 0, timeout=30)

    flapper = None
    if flooded:
        flood(big, FLOOD)
        # ... and keeps changing one of them, so the watch keeps reading that netns.
        flap = (f"while :; do ip -n {big.name} addr add 192.0.2.1/32 dev eth0;"
                f" ip -n {big.name} addr del 192.0.2.1/32 dev eth0; done")
        flapper = subprocess.Popen(["sh", "-c", flap], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        if flooded:
            wait_until("the flood read and recorded", lambda: service.journal.attachment(big_cid, "eth0").live,
                       timeout=60)
        other.remove()
        wait_until("the removed netns let go and its attachment retired",
                   lambda: live_state(service, other_cid) is None, timeout=60)
        assert flapper is None or flapper.poll() is None, "the flood was still going on"
    finally:
        if flapper is not None:
            flapper.kill()
            flapper.wait()
    assert service.metrics.live_vanished._value.get() == 1
    assert service.live_watch.state()["namespaces"] == 1

    # What the flooded attachment shows, and what one read of its netns costs: a bounded answer.
    entry = published(service, big_cid)
    if flooded:
        assert ready(entry)["reason"] == "TooManyAddresses", entry
        assert f"more than {limits.LIVE_MAX_ADDRESSES} addresses" in ready(entry)["message"], entry
    else:
        assert ready(entry)["status"] == "True", entry
    sandbox = Sandbox(big.path)
    try:
        seen = sandbox.observe("eth0")
        if flooded:
            assert len(seen.ips) <= limits.LIVE_MAX_ADDRESSES and seen.more, len(seen.ips)
        else:
            assert seen.ips == ["10.77.0.5/24"], seen
        again = sandbox.observe("eth0")  # the reading socket is usable after a read cut short
        assert again.present and again.ips == seen.ips
    finally:
        sandbox.close()
