"""End to end: a claim's entry lists an IPv6 address only once duplicate address detection let the pod have it.

The chain is the reference `macvlan` plugin with `static` IPAM (it leaves DAD on and does not wait
for it, as a plugin whose IPAM gives no gateway does), then the real netclaim plugin, as a runtime
runs a conflist; the publisher is the real process against the real API server, its live watch on.
Pods share one L2 link (a host veth, the macvlans' master), and the kernel does DAD on it.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest
from livewatch_kit import address_flags
from publisher_testkit import Cluster, suffix, wait_until
from livewatch_kit import CNI_BIN, plugin_binary, run_plugin

from cni_plugin.wire.event import PodRef

pytestmark = [pytest.mark.controlplane, pytest.mark.netns]


def ready(device: dict[str, Any]) -> dict[str, Any]:
    return next(c for c in device["conditions"] if c["type"] == "Ready")




def pyroute2_flags(netns: str, cidr: str) -> int:
    """IFA_FLAGS as pyroute2 reads them: an oracle apart from netclaim's own netlink code."""
    from pyroute2 import NetNS

    address, _, prefix = cidr.partition("/")
    with NetNS(netns) as ns:
        for msg in ns.get_addr(family=10, index=ns.link_lookup(ifname="eth0")[0]):
            if msg.get_attr("IFA_ADDRESS") == address and msg["prefixlen"] == int(prefix):
                return msg.get_attr("IFA_FLAGS") or msg["flags"]
    raise AssertionError(f"{cidr} not on eth0 in {netns}")


class Link:
    """One L2 link (a host veth pair, up) whose macvlans put pods on it; undone at the end."""

    def __init__(self, workdir: Any) -> None:
        tag = suffix()[:6]
        self.master = f"ncmv{tag}"
        self.netns: list[str] = []
        self.workdir = workdir
        self.prefix = f"fd00:{int(tag[:4], 16) or 1:x}"  # as `ip` prints it: no leading zero
        self.octet = int(tag[:2], 16) % 200 + 20
        subprocess.run(["ip", "link", "add", self.master, "type", "veth", "peer", "name", f"ncmw{tag}"], check=True)
        for name in (self.master, f"ncmw{tag}"):
            subprocess.run(["ip", "link", "set", name, "up"], check=True)
        self.added: list[tuple[dict, str, str, PodRef]] = []

    def conf(self, addresses: list[str]) -> dict[str, Any]:
        return {"cniVersion": "1.0.0", "name": "dadnet", "type": "macvlan", "master": self.master, "mode": "bridge",
                "ipam": {"type": "static", "addresses": [{"address": a} for a in addresses]}}

    def pod_netns(self, *sysctls: str) -> str:
        name = f"dad-{suffix()}"
        subprocess.run(["ip", "netns", "add", name], check=True)
        self.netns.append(name)
        if sysctls:  # the defaults every interface made in this netns starts with
            subprocess.run(["ip", "netns", "exec", name, "sysctl", "-qw", *sysctls], check=True, capture_output=True)
        return name

    def primary_add(self, netns: str, addresses: list[str], pod: PodRef) -> dict[str, Any]:
        cid = "dad" + suffix()
        conf = self.conf(addresses)
        prev = run_plugin(f"{CNI_BIN}/macvlan", "ADD", conf, cid, f"/var/run/netns/{netns}", pod)
        self.added.append((conf, cid, f"/var/run/netns/{netns}", pod))
        prev["_cid"] = cid
        return prev

    def netclaim_add(self, plugin: Any, netns: str, prev: dict[str, Any], pod: PodRef) -> None:
        cid = prev.pop("_cid")
        conf = {**plugin.conf(prev), "name": "dadnet", "cniVersion": "1.0.0"}
        run_plugin(str(plugin_binary()), "ADD", conf, cid, f"/var/run/netns/{netns}", pod)

    def cleanup(self) -> None:
        for conf, cid, path, pod in self.added:
            try:
                run_plugin(f"{CNI_BIN}/macvlan", "DEL", conf, cid, path, pod)
            except AssertionError:
                pass  # cleanup only
        for name in self.netns:
            subprocess.run(["ip", "netns", "del", name], check=False, capture_output=True)
        subprocess.run(["ip", "link", "del", self.master], check=False, capture_output=True)


@pytest.fixture()
def link(workdir) -> Iterator[Link]:
    made = Link(workdir)
    yield made
    made.cleanup()


def test_an_address_another_pod_holds_is_not_published(cluster: Cluster, publisher, plugin, link: Link) -> None:
    duplicate, unique, ipv4 = f"{link.prefix}::5/64", f"{link.prefix}::6/64", f"10.{link.octet}.0.6/24"
    holder = link.pod_netns()
    link.primary_add(holder, [duplicate], PodRef(cluster.namespace, "holder", "uid-holder"))
    wait_until("the holder's address usable", lambda: address_flags(holder, duplicate) == set(), timeout=30)

    claim, uid = cluster.pod_with_claim("dadpod", [("nic", "nic0")])
    pod = PodRef(cluster.namespace, "dadpod", uid)
    netns = link.pod_netns()
    prev = link.primary_add(netns, [ipv4, duplicate, unique], pod)
    wait_until("DAD's outcome on both addresses", lambda: "dadfailed" in address_flags(netns, duplicate)
               and address_flags(netns, unique) == set(), timeout=30)
    assert pyroute2_flags(netns, duplicate) & 0x08  # IFA_F_DADFAILED, as pyroute2 reads it
    link.netclaim_add(plugin, netns, prev, pod)

    [device] = cluster.wait_devices(claim, lambda d: len(d) == 1)
    assert device["networkData"]["ips"] == [ipv4, unique], device
    assert ready(device)["status"] == "False" and ready(device)["reason"] == "DuplicateAddress", device
    assert duplicate in ready(device)["message"], device
    assert duplicate in json.dumps(device["data"])  # data keeps the CNI result: what the network configured


def test_a_tentative_address_is_published_once_dad_completes(cluster: Cluster, publisher, plugin, link: Link) -> None:
    ipv6, ipv4 = f"{link.prefix}::7/64", f"10.{link.octet}.0.7/24"
    claim, uid = cluster.pod_with_claim("slowdad", [("nic", "nic0")])
    pod = PodRef(cluster.namespace, "slowdad", uid)
    # DAD of 6 probes, a second apart: the address stays tentative for about 6 s after the primary plugin.
    netns = link.pod_netns("net.ipv6.conf.default.dad_transmits=6", "net.ipv6.conf.default.accept_dad=1")
    prev = link.primary_add(netns, [ipv4, ipv6], pod)
    assert address_flags(netns, ipv6) == {"tentative"} and pyroute2_flags(netns, ipv6) & 0x40
    link.netclaim_add(plugin, netns, prev, pod)

    [device] = cluster.wait_devices(claim, lambda d: len(d) == 1)
    assert ready(device)["status"] == "False" and ready(device)["reason"] == "AddressesPending", device
    assert device["networkData"]["ips"] == [ipv4] and ipv6 in ready(device)["message"], device

    [device] = cluster.wait_devices(claim, lambda d: d and ready(d[0])["status"] == "True", timeout=60)
    assert address_flags(netns, ipv6) == set()
    assert device["networkData"]["ips"] == [ipv4, ipv6], device
