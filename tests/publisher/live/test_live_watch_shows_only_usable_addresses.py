"""An entry lists an address only once the pod can use it, and says why while it cannot.

Consumers (EndpointSlice controllers, service meshes) send traffic to `networkData.ips`. An IPv6
address still in duplicate address detection (tentative), one that failed it (another host on the
link holds it) and a deprecated one are not usable: the entry leaves them out and is Ready=False
(`AddressesPending`, `DuplicateAddress`, `AddressDeprecated`) while an address the ADD configured is
so; once DAD completes the live watch shows the address and Ready=True.

Real parts, as the other live-watch tests (tests/publisher/livewatch_kit.py): the publisher's
`Service` running its live-watch thread over a journal on disk, a real pod netns with a veth
`eth0` whose peer stays in the netns, and the kernel's own DAD. The published entry is what the
reconciler applies: `shown_entry` of the journal's row.
"""

from __future__ import annotations

import subprocess

import pytest
from livewatch_kit import (
    PodNetns,
    address_flags,
    ip,
    journal_attachment,
    live_state,
    pod_netns,
    published,
    ready,
    service,
    start_watch,
)
from publisher_testkit import wait_until

from publisher.service import Service

pytestmark = pytest.mark.netns

__all__ = ["pod_netns", "service"]  # fixtures, used by name

IPV4 = "10.77.0.5/24"  # pod_netns's address, usable from the start
IPV6 = "fd00:77::5/64"






def dad(ns: PodNetns, *, transmits: int, retrans_ms: int = 1000) -> None:
    """Duplicate address detection on `eth0` as the test needs it (the kernel's default is 1 probe, 1 s)."""
    subprocess.run(["ip", "netns", "exec", ns.name, "sysctl", "-qw", "net.ipv6.conf.eth0.disable_ipv6=0",
                    "net.ipv6.conf.eth0.accept_dad=1", f"net.ipv6.conf.eth0.dad_transmits={transmits}",
                    "net.ipv6.conf.eth0.router_solicitation_delay=0",
                    f"net.ipv6.neigh.eth0.retrans_time_ms={retrans_ms}"], check=True, capture_output=True)




def test_a_tentative_address_is_shown_once_dad_completes(service: Service, pod_netns: PodNetns) -> None:
    dad(pod_netns, transmits=100)  # DAD of 100 probes, a second apart: tentative while the test looks
    ip("-n", pod_netns.name, "addr", "add", IPV6, "dev", "eth0")
    journal_attachment(service, pod_netns.path, pod_netns.mac(), ips=(IPV4, IPV6))
    start_watch(service)

    wait_until("AddressesPending recorded", lambda: live_state(service) == "AddressesPending", timeout=30)
    assert address_flags(pod_netns.name, IPV6) == {"tentative"}
    entry = published(service)
    assert entry["networkData"]["ips"] == [IPV4], entry
    assert ready(entry)["status"] == "False" and ready(entry)["reason"] == "AddressesPending", entry
    assert IPV6 in ready(entry)["message"], entry

    # The address added again where DAD takes one probe of 0.1 s: once it completes, Ready with the address.
    dad(pod_netns, transmits=1, retrans_ms=100)
    ip("-n", pod_netns.name, "addr", "del", IPV6, "dev", "eth0")
    ip("-n", pod_netns.name, "addr", "add", IPV6, "dev", "eth0")
    wait_until("Ready with the address", lambda: live_state(service) == "Ready"
               and published(service)["networkData"].get("ips") == [IPV4, IPV6], timeout=30)
    assert address_flags(pod_netns.name, IPV6) == set()
    assert ready(published(service))["status"] == "True"


def test_an_address_that_failed_dad_is_never_shown(service: Service, pod_netns: PodNetns) -> None:
    dad(pod_netns, transmits=1)
    ip("-n", pod_netns.name, "addr", "add", IPV6, "dev", "peer0", "nodad")  # the host on the other end holds it
    ip("-n", pod_netns.name, "addr", "add", IPV6, "dev", "eth0")
    wait_until("DAD to fail", lambda: "dadfailed" in address_flags(pod_netns.name, IPV6), timeout=30)
    journal_attachment(service, pod_netns.path, pod_netns.mac(), ips=(IPV4, IPV6))
    start_watch(service)

    wait_until("DuplicateAddress recorded", lambda: live_state(service) == "DuplicateAddress", timeout=30)
    entry = published(service)
    assert entry["networkData"]["ips"] == [IPV4], entry
    assert ready(entry)["status"] == "False" and IPV6 in ready(entry)["message"], entry


def test_a_deprecated_address_is_not_shown(service: Service, pod_netns: PodNetns) -> None:
    ip("-n", pod_netns.name, "addr", "add", IPV6, "dev", "eth0", "nodad", "preferred_lft", "0")
    assert address_flags(pod_netns.name, IPV6) == {"deprecated"}
    journal_attachment(service, pod_netns.path, pod_netns.mac(), ips=(IPV4, IPV6))
    start_watch(service)

    wait_until("AddressDeprecated recorded", lambda: live_state(service) == "AddressDeprecated", timeout=30)
    entry = published(service)
    assert entry["networkData"]["ips"] == [IPV4], entry
    assert ready(entry)["status"] == "False" and IPV6 in ready(entry)["message"], entry

    # Its lifetime renewed: usable again, and shown.
    ip("-n", pod_netns.name, "addr", "change", IPV6, "dev", "eth0", "preferred_lft", "forever")
    wait_until("Ready with the address", lambda: published(service)["networkData"].get("ips") == [IPV4, IPV6],
               timeout=30)
    assert ready(published(service))["status"] == "True"
