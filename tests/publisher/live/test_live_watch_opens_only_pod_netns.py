"""The live watch follows only a pod's netns: a path that names anything else keeps the ADD's entry.

The runtime names the netns (CNI_NETNS). A `/proc/<pid>/ns/net` path (some runtimes name netns
so) resolves in the publisher's own PID namespace, where pid 1 is not the pod's, and a link in
the netns directory may point anywhere: followed, the watch would publish the host's `lo` as the
pod's interface. A FIFO at a netns path would block the watch's one thread, so no pod's link
change would be seen again. Real parts: the publisher process against the real API server, ADD
events sent on its socket as the plugin sends them, a real netns with a veth for the control.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from functools import partial
from typing import Any

import pytest
from publisher_testkit import Cluster, Publisher, cni_result, request, suffix, wait_until, wire_event

from cni_plugin.wire.event import PodRef
from cni_plugin.wire.frame import event_request

pytestmark = [pytest.mark.controlplane, pytest.mark.netns]

NOT_WATCHABLE = "netns not watchable"


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)


def ready(device: dict[str, Any]) -> dict[str, Any]:
    return next(c for c in device["conditions"] if c["type"] == "Ready")


def add(cluster: Cluster, publisher: Publisher, pod: str, netns: str, ifname: str = "eth0",
        **result: Any) -> tuple[str, dict[str, Any]]:
    """A claimed pod's ADD, as the plugin sends it; (claim, the entry it published)."""
    claim, uid = cluster.pod_with_claim(pod, [("nic", "nic0")])
    event = wire_event("ADD", f"c-{pod}", PodRef(cluster.namespace, pod, uid), cni_result(ifname=ifname, **result),
                       ifname=ifname, netns=netns)
    assert request(publisher.socket, event_request(event))["ok"] is True
    [device] = cluster.wait_devices(claim, lambda d: len(d) == 1)
    return claim, device


def judged(publisher: Publisher, cluster: Cluster, claim: str, netns: str, published: dict[str, Any]) -> bool:
    """The watch said it will not watch `netns`, or the entry moved away from what the ADD published."""
    if any(e.get("msg", "").startswith(NOT_WATCHABLE) and e.get("netns") == netns for e in publisher.log_events()):
        return True
    return cluster.devices(claim) != [published]


@pytest.fixture()
def planted() -> Iterator[list[str]]:
    """Files the test plants in the netns directory, removed at the end."""
    paths: list[str] = []
    yield paths
    for path in paths:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


def test_a_proc_path_or_a_link_to_it_is_never_watched(cluster: Cluster, publisher: Publisher,
                                                       planted: list[str]) -> None:
    """The host's `lo` never shows as a pod's interface: each entry keeps the ADD's data.

    The /proc path is the publisher's own: in the chart's container the publisher is pid 1, so
    that is what `/proc/1/ns/net` names there (the host's netns, through hostNetwork)."""
    own = f"/proc/{publisher.proc.pid if publisher.proc else 1}/ns/net"
    link = f"/var/run/netns/lo-link-{suffix()}"
    os.makedirs("/var/run/netns", exist_ok=True)
    os.symlink(own, link)
    planted.append(link)
    for pod, netns in (("by-proc", own), ("by-link", link)):
        claim, published = add(cluster, publisher, pod, netns, ifname="lo")
        assert ready(published)["status"] == "True", f"{netns}: the watch read the host's lo: {published}"
        wait_until(f"the watch to judge {netns}", partial(judged, publisher, cluster, claim, netns, published),
                   timeout=60)
        assert cluster.devices(claim) == [published], f"{netns}: the host's lo was published as the pod's"
        said = [e for e in publisher.log_events() if e.get("msg", "").startswith(NOT_WATCHABLE)
                and e.get("netns") == netns]
        assert said and said[0].get("claim"), json.dumps(said)
    assert publisher.metrics()["netclaim_interface_watched_namespaces"] == 0


def test_a_fifo_at_a_netns_path_never_stalls_the_watch(cluster: Cluster, publisher: Publisher,
                                                       planted: list[str]) -> None:
    fifo = f"/var/run/netns/fifo-{suffix()}"
    os.makedirs("/var/run/netns", exist_ok=True)
    os.mkfifo(fifo)
    planted.append(fifo)
    fifo_claim, fifo_entry = add(cluster, publisher, "by-fifo", fifo)
    wait_until("the watch to judge the FIFO", lambda: judged(publisher, cluster, fifo_claim, fifo, fifo_entry),
               timeout=60)

    # The control: a real pod netns in the same directory, added after the FIFO, is watched.
    name = f"fifo-ctl-{suffix()}"
    ip("netns", "add", name)
    try:
        ip("-n", name, "link", "add", "eth0", "type", "veth", "peer", "name", "peer0")
        ip("-n", name, "addr", "add", "10.77.0.5/24", "dev", "eth0")
        ip("-n", name, "link", "set", "peer0", "up")
        ip("-n", name, "link", "set", "eth0", "up")
        mac = json.loads(subprocess.run(["ip", "-n", name, "-j", "link", "show", "dev", "eth0"], check=True,
                                        capture_output=True, text=True).stdout)[0]["address"]
        claim, _published = add(cluster, publisher, "real", f"/var/run/netns/{name}", ipv6=None, mac=mac)
        wait_until("the real netns to be watched",
                   lambda: publisher.metrics().get("netclaim_interface_watched_namespaces") == 1, timeout=60)
        ip("-n", name, "link", "set", "eth0", "down")
        [device] = cluster.wait_devices(claim, lambda d: d and ready(d[0])["status"] == "False", timeout=60)
        assert ready(device)["reason"] == "LinkDown", device
    finally:
        subprocess.run(["ip", "netns", "del", name], check=False, capture_output=True)
    assert cluster.devices(fifo_claim) == [fifo_entry]
