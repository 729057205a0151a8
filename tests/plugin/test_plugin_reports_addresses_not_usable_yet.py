"""At ADD the plugin tells the publisher which of the result's addresses the interface cannot use.

An IPv6 address is tentative while duplicate address detection (DAD) runs, DAD-failed for good when
another host on the link holds it, and deprecated once its preferred lifetime ended. The claim's
entry is read by consumers that send traffic to its addresses, so the publisher must know, from the
ADD on, which addresses are not usable: the event carries them (`unusable_ips`).

Real parts: two network namespaces joined by a veth pair (the pod's `eth0` and a neighbour's), IPv6
DAD done by the kernel, the real plugin executable, and pyroute2 as an oracle independent of the
plugin's own netlink code. The publisher is the test double that records the events it acks.
"""

from __future__ import annotations

import secrets
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from .conftest import Dirs, Netns, PublisherDouble, run_plugin

pytestmark = pytest.mark.netns

DUPLICATE = "fd00:dad::5/64"  # the neighbour holds it already
UNIQUE = "fd00:dad::6/64"
IPV4 = "10.201.0.6/24"


def sysctl(ns: str, *pairs: str) -> None:
    subprocess.run(["ip", "netns", "exec", ns, "sysctl", "-qw", *pairs], check=True, capture_output=True)


@dataclass
class Link:
    """The pod's netns (`eth0`) and a neighbour's netns (`eth0` too), a veth between them."""

    pod: Netns
    neighbour: str

    def ip(self, *args: str) -> str:
        return self.pod.ip(*args)

    def flags(self, cidr: str) -> set[str]:
        """The address's state words as `ip -6 addr` prints them ({'missing'} when absent)."""
        for line in self.ip("-6", "addr", "show", "dev", "eth0").splitlines():
            words = line.split()
            if words[:2] == ["inet6", cidr]:
                return {w for w in words if w in ("tentative", "dadfailed", "deprecated")}
        return {"missing"}

    def pyroute2_flags(self, cidr: str) -> int:
        """The address's IFA_FLAGS as pyroute2 reads them: the oracle for the plugin's reading."""
        from pyroute2 import NetNS

        address, _, prefix = cidr.partition("/")
        with NetNS(self.pod.name) as ns:
            for msg in ns.get_addr(family=10, index=ns.link_lookup(ifname="eth0")[0]):
                if msg.get_attr("IFA_ADDRESS") == address and msg["prefixlen"] == int(prefix):
                    return msg.get_attr("IFA_FLAGS") or msg["flags"]
        raise AssertionError(f"{cidr} not on eth0")


@pytest.fixture
def link(netns: Netns) -> Iterator[Link]:
    neighbour = f"ncnb-{secrets.token_hex(4)}"
    subprocess.run(["ip", "netns", "add", neighbour], check=True)
    try:
        netns.ip("link", "add", "eth0", "type", "veth", "peer", "name", "eth0", "netns", neighbour)
        for ns in (netns.name, neighbour):
            # DAD as the kernel's defaults do it, one probe, but without the random start delay.
            sysctl(ns, "net.ipv6.conf.eth0.disable_ipv6=0", "net.ipv6.conf.eth0.accept_dad=1",
                   "net.ipv6.conf.eth0.dad_transmits=1", "net.ipv6.conf.eth0.router_solicitation_delay=0")
        yield Link(netns, neighbour)
    finally:
        subprocess.run(["ip", "netns", "del", neighbour], check=False)


def wait_for(what: str, check, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def result_for(link: Link, *cidrs: str) -> dict:
    """The result a primary plugin gives for the pod's eth0 holding `cidrs`."""
    mac = link.pod.link("eth0")["mac"]
    return {"cniVersion": "1.0.0", "interfaces": [{"name": "eth0", "mac": mac, "sandbox": link.pod.path}],
            "ips": [{"interface": 0, "address": c} for c in cidrs]}


def add(exe: str, dirs: Dirs, link: Link, prev: dict, **extra: object) -> dict:
    conf = dirs.conf(cniVersion="1.0.0", name="dadnet", prevResult=prev, **extra)
    rc, out, err = run_plugin(exe, "ADD", conf, netns=link.pod.path)
    assert rc == 0, (out, err)
    return conf


def sent(publisher: PublisherDouble) -> dict[str, str]:
    [event] = publisher.events
    return event.to_dict().get("unusable_ips") or {}


def test_an_address_another_host_holds_is_reported_dad_failed(plugin_exe: str, dirs: Dirs, link: Link,
                                                              publisher: PublisherDouble) -> None:
    link.ip("link", "set", "eth0", "up")
    subprocess.run(["ip", "-n", link.neighbour, "link", "set", "eth0", "up"], check=True)
    subprocess.run(["ip", "-n", link.neighbour, "addr", "add", DUPLICATE, "dev", "eth0", "nodad"], check=True)
    link.ip("addr", "add", IPV4, "dev", "eth0")
    link.ip("addr", "add", DUPLICATE, "dev", "eth0")
    link.ip("addr", "add", UNIQUE, "dev", "eth0")
    wait_for("DAD to end on both addresses", lambda: "tentative" not in link.flags(UNIQUE)
             and "dadfailed" in link.flags(DUPLICATE))
    assert link.pyroute2_flags(DUPLICATE) & 0x08, "pyroute2 sees IFA_F_DADFAILED"
    assert not link.pyroute2_flags(UNIQUE) & (0x08 | 0x40 | 0x20), "the unique address is usable"

    add(plugin_exe, dirs, link, result_for(link, IPV4, DUPLICATE, UNIQUE))
    assert sent(publisher) == {DUPLICATE: "dadfailed"}  # and only it: the unique one and the IPv4 one are usable


def test_a_tentative_address_is_reported_and_a_wait_for_dad_ends_with_it(plugin_exe: str, dirs: Dirs, link: Link,
                                                                        publisher: PublisherDouble) -> None:
    # The neighbour's end stays down: without carrier DAD does not start, so the address stays tentative.
    link.ip("link", "set", "eth0", "up")
    link.ip("addr", "add", UNIQUE, "dev", "eth0")
    assert link.flags(UNIQUE) == {"tentative"} and link.pyroute2_flags(UNIQUE) & 0x40
    prev = result_for(link, UNIQUE)
    add(plugin_exe, dirs, link, prev)  # no wait (the default): the live watch follows the address
    assert sent(publisher) == {UNIQUE: "tentative"}

    # The link comes up and DAD runs: an ADD that may wait for it reports nothing unusable.
    publisher.events.clear()
    subprocess.run(["ip", "-n", link.neighbour, "link", "set", "eth0", "up"], check=True)
    add(plugin_exe, dirs, link, prev, addressWaitMs=3000)
    assert sent(publisher) == {}
    assert link.flags(UNIQUE) == set() and not link.pyroute2_flags(UNIQUE) & 0x40


def test_a_deprecated_address_is_reported(plugin_exe: str, dirs: Dirs, link: Link,
                                          publisher: PublisherDouble) -> None:
    link.ip("link", "set", "eth0", "up")
    subprocess.run(["ip", "-n", link.neighbour, "link", "set", "eth0", "up"], check=True)
    link.ip("addr", "add", UNIQUE, "dev", "eth0", "nodad", "preferred_lft", "0")
    link.ip("addr", "add", IPV4, "dev", "eth0")
    assert link.flags(UNIQUE) == {"deprecated"} and link.pyroute2_flags(UNIQUE) & 0x20
    add(plugin_exe, dirs, link, result_for(link, IPV4, UNIQUE))
    assert sent(publisher) == {UNIQUE: "deprecated"}


def test_an_add_whose_addresses_are_all_usable_sends_the_event_as_before(plugin_exe: str, dirs: Dirs, link: Link,
                                                                         publisher: PublisherDouble) -> None:
    link.ip("link", "set", "eth0", "up")
    link.ip("addr", "add", IPV4, "dev", "eth0")
    link.ip("addr", "add", UNIQUE, "dev", "eth0", "nodad")
    add(plugin_exe, dirs, link, result_for(link, IPV4, UNIQUE))
    assert "unusable_ips" not in publisher.events[0].to_dict()  # a publisher of any release reads it
