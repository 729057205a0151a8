"""After ADD the entry keeps following the pod's interface in its real netns.

The chain is the reference bridge + host-local, then the real netclaim plugin,
as a runtime runs it; the publisher is the real process against the real API
server. The interface is then changed the way a node or an operator changes
it (`ip -n <netns> ...`), and the claim's status must follow: Ready=False with
the reason and back, the ADD's address removed (one added is not the network's
and is not shown). A netns deleted with no DEL
must be freed (the publisher's sockets would keep it, and its veth, alive)
and its entry removed.
"""

from __future__ import annotations

import json
import subprocess
from typing import Any

import pytest

from cni_plugin.wire.event import PodRef
from publisher_testkit import Cluster, request, suffix, wait_until
from livewatch_kit import CNI_BIN, netns_addresses, plugin_binary, run_plugin

pytestmark = [pytest.mark.controlplane, pytest.mark.netns]


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)


def host_link_exists(name: str) -> bool:
    return subprocess.run(["ip", "link", "show", name], capture_output=True).returncode == 0


def ready(device: dict[str, Any]) -> dict[str, Any]:
    return next(c for c in device["conditions"] if c["type"] == "Ready")


class Chain:
    """bridge + host-local + netclaim in one netns, undone at the end whatever happened."""

    def __init__(self, cluster: Cluster, plugin, workdir, netns: str) -> None:
        self.claim, uid = cluster.pod_with_claim("livepod", [("nic", "nic0")])
        self.pod = PodRef(cluster.namespace, "livepod", uid)
        self.cid, self.bridge = "live" + suffix(), "lbr" + suffix()
        self.octet = int(suffix()[:2], 16) % 200 + 20
        self.netns, self.nspath = netns, f"/var/run/netns/{netns}"
        self.bridge_conf = {
            "cniVersion": "1.0.0", "name": "testnet", "type": "bridge", "bridge": self.bridge, "isGateway": True,
            "ipam": {"type": "host-local", "dataDir": str(workdir / "ipam"),
                     "ranges": [[{"subnet": f"10.{self.octet}.0.0/24"}]]},
        }
        self.plugin = plugin

    def add(self) -> dict[str, Any]:
        prev = run_plugin(f"{CNI_BIN}/bridge", "ADD", self.bridge_conf, self.cid, self.nspath, self.pod)
        conf = {**self.plugin.conf(prev), "name": "testnet", "cniVersion": "1.0.0"}
        run_plugin(str(plugin_binary()), "ADD", conf, self.cid, self.nspath, self.pod)
        return prev

    def cleanup(self) -> None:
        try:
            run_plugin(f"{CNI_BIN}/bridge", "DEL", self.bridge_conf, self.cid, self.nspath, self.pod)
        except AssertionError:
            pass  # cleanup only
        subprocess.run(["ip", "link", "del", self.bridge], capture_output=True)


@pytest.fixture()
def netns():
    name = f"live-{suffix()}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    yield name
    subprocess.run(["ip", "netns", "del", name], capture_output=True)


@pytest.fixture()
def chain(cluster, plugin, workdir, netns):
    c = Chain(cluster, plugin, workdir, netns)
    yield c
    c.cleanup()


def test_ready_and_addresses_follow_the_interface_in_the_pod_netns(cluster: Cluster, publisher, chain) -> None:
    prev = chain.add()
    [device] = cluster.wait_devices(chain.claim, lambda d: len(d) == 1)
    assert ready(device)["status"] == "True"
    added_at = ready(device)["lastTransitionTime"]
    add_ip = prev["ips"][0]["address"]
    assert device["networkData"]["ips"] == [add_ip]

    # An address added later (an operator, a sidecar, the pod's own workload) is not the network's:
    # not shown (only a network named in --live-added-addresses shows what it gained).
    extra = f"10.{chain.octet}.0.250/24"
    ip("-n", chain.netns, "addr", "add", extra, "dev", "eth0")

    # Set down inside the pod: Ready=False, LinkDown.
    ip("-n", chain.netns, "link", "set", "eth0", "down")
    [device] = cluster.wait_devices(chain.claim, lambda d: d and ready(d[0])["status"] == "False")
    assert ready(device)["reason"] == "LinkDown", device
    assert "eth0" in ready(device)["message"]
    assert device["data"]["ips"][0]["address"] == add_ip  # data keeps the ADD's CNI result
    assert device["networkData"]["ips"] == [add_ip], device
    ip("-n", chain.netns, "addr", "del", extra, "dev", "eth0")

    # Up again: Ready=True, and its transition time is the recovery's, not the ADD's.
    ip("-n", chain.netns, "link", "set", "eth0", "up")
    [device] = cluster.wait_devices(chain.claim, lambda d: d and ready(d[0])["status"] == "True")
    assert ready(device)["lastTransitionTime"] >= added_at

    # The ADD's own address removed: Ready=False, AddressLost; given back: True.
    ip("-n", chain.netns, "addr", "del", add_ip, "dev", "eth0")
    [device] = cluster.wait_devices(chain.claim, lambda d: d and ready(d[0])["status"] == "False")
    assert ready(device)["reason"] == "AddressLost", device
    assert add_ip in ready(device)["message"]
    assert add_ip not in device["networkData"].get("ips", [])
    ip("-n", chain.netns, "addr", "add", add_ip, "dev", "eth0")
    cluster.wait_devices(chain.claim, lambda d: d and ready(d[0])["status"] == "True"
                         and d[0]["networkData"].get("ips") == [add_ip])

    # The host side of the veth down: the pod's interface loses its carrier.
    host_veth = prev["interfaces"][1]["name"]
    ip("link", "set", host_veth, "down")
    [device] = cluster.wait_devices(chain.claim, lambda d: d and ready(d[0])["status"] == "False")
    assert ready(device)["reason"] == "NoCarrier", device
    ip("link", "set", host_veth, "up")
    cluster.wait_devices(chain.claim, lambda d: d and ready(d[0])["status"] == "True")

    # The MAC the netns shows is the one published throughout.
    mac, _ips = netns_addresses(chain.netns)
    assert cluster.devices(chain.claim)[0]["networkData"]["hardwareAddress"] == mac.lower()
    metrics = publisher.metrics()
    for reason in ("LinkDown", "Recovered", "AddressLost", "NoCarrier"):
        assert metrics.get(f'netclaim_interface_changes_total{{reason="{reason}"}}', 0) >= 1, (reason, metrics)
    assert metrics["netclaim_interface_watched_attachments"] == 1


def test_interface_gone_from_the_netns_is_shown_and_a_deleted_netns_is_freed(cluster: Cluster, publisher,
                                                                             chain) -> None:
    prev = chain.add()
    cluster.wait_devices(chain.claim, lambda d: len(d) == 1 and ready(d[0])["status"] == "True")
    host_veth = prev["interfaces"][1]["name"]

    # Renamed away from CNI_IFNAME: the attachment's interface is gone.
    ip("-n", chain.netns, "link", "set", "eth0", "down")
    ip("-n", chain.netns, "link", "set", "eth0", "name", "moved0")
    [device] = cluster.wait_devices(chain.claim, lambda d: d and ready(d[0])["reason"] == "InterfaceGone")
    assert ready(device)["status"] == "False"
    assert "ips" not in device["networkData"] and "hardwareAddress" not in device["networkData"]
    ip("-n", chain.netns, "link", "set", "moved0", "name", "eth0")
    ip("-n", chain.netns, "link", "set", "eth0", "up")
    cluster.wait_devices(chain.claim, lambda d: d and ready(d[0])["status"] == "True")

    # The runtime removes the sandbox's netns and no DEL ever comes: the publisher lets go
    # of it (the namespace is destroyed, so its veth goes with it) and the entry is removed.
    assert host_link_exists(host_veth)
    subprocess.run(["ip", "netns", "del", chain.netns], check=True)
    wait_until("the deleted netns to be freed (its veth peer gone from the host)",
               lambda: not host_link_exists(host_veth), timeout=30)
    cluster.wait_devices(chain.claim, lambda d: d == [])
    assert publisher.metric("netclaim_interface_netns_vanished_total") == 1
    assert publisher.metrics()["netclaim_interface_watched_namespaces"] == 0


def test_without_the_right_to_enter_netns_the_watch_is_off_and_says_so(cluster: Cluster, publisher_factory,
                                                                       workdir, netns) -> None:
    """CAP_SYS_ADMIN taken away: ADDs publish as before, /readyz is 200 and names why."""
    import urllib.request

    from publisher_testkit import Plugin

    pub = publisher_factory(start=False)
    pub.prefix = ["setpriv", "--bounding-set=-sys_admin", "--inh-caps=-sys_admin", "--"]
    pub.start()
    chain = Chain(cluster, Plugin(pub.socket, pub.spool, workdir), workdir, netns)
    try:
        chain.add()
        cluster.wait_devices(chain.claim, lambda d: len(d) == 1 and ready(d[0])["status"] == "True")
        with urllib.request.urlopen(f"http://127.0.0.1:{pub.port}/readyz", timeout=5) as r:
            body = r.read().decode()
            assert r.status == 200
        assert "live interface watch off" in body and "CAP_SYS_ADMIN" in body, body
        answer = request(pub.socket, {"kind": "status"})
        assert answer.get("ok"), answer
        assert answer["status"]["live_watch"]["enabled"] is False, answer["status"]["live_watch"]
        lines = [e for e in pub.log_events() if e.get("component") == "live-watch"]
        assert any("is off" in e.get("msg", "") for e in lines), json.dumps(lines)
    finally:
        chain.cleanup()
