"""an apply whose answer is lost must not leave a stale entry behind.

The real publisher talks to the real API server through an HTTPS proxy
(tests/publisher/lossy_proxy.py) that can forward a status apply, let the API
server apply it, and reset the publisher's connection instead of answering.
"""

from __future__ import annotations

import dataclasses
import json
import time

import pytest

from cni_plugin.wire.event import PodRef
from cni_plugin.wire.frame import event_request
from publisher.reconcile.reconciler import server_devices
from publisher.reconcile.writer import holds, owned_keys
from publisher_testkit import DRIVER, Cluster, apply_as, cni_result, drained, request, suffix, wire_event

pytestmark = pytest.mark.controlplane

MANAGER = "netclaim/node-a"


def entries(devices: list[dict]) -> set[str]:
    return {d["device"] for d in devices if d["driver"] == DRIVER}


def send(socket_path: str, event) -> None:
    assert request(socket_path, event_request(event))["ok"] is True


def wait(predicate, what: str, timeout: float = 30.0) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    raise AssertionError(f"never happened: {what}")


def test_lost_apply_then_desired_body_goes_back(cluster: Cluster, publisher_factory, proxy,
                                                               control_plane, workdir):
    via_proxy = dataclasses.replace(control_plane, server=proxy.url, ca_file=proxy.cert)
    kubeconfig = via_proxy.kubeconfig_for_token(control_plane.token("admin"), workdir / "proxy.kubeconfig")
    publisher = publisher_factory(start=False, extra=["--retry-max-delay", "1"])
    publisher.kubeconfig = kubeconfig
    publisher.start()
    claim, uid = cluster.pod_with_claim("lossy", [("nic", "nic0"), ("nic2", "nic1")])
    pod = PodRef(cluster.namespace, "lossy", uid)
    cid = "c" + suffix()
    send(publisher.socket, wire_event("ADD", cid, pod, cni_result()))
    cluster.wait_devices(claim, lambda d: entries(d) == {"nic0"})
    drained(publisher)  # body {nic0} applied and acknowledged
    proxy.lose.set()
    send(publisher.socket, wire_event("ADD", cid, pod, cni_result(ifname="net1", ipv4="10.78.0.5/24", ipv6=None),
                                      ifname="net1", request_name="nic2"))
    # The API server applied {nic0, nic1}; the publisher saw its connection reset.
    cluster.wait_devices(claim, lambda d: entries(d) == {"nic0", "nic1"})
    wait(lambda: proxy.lost >= 1, "a status apply lost in flight")
    # The desired body goes back to the acknowledged one: net1's sandbox is deleted.
    send(publisher.socket, wire_event("DEL", cid, pod, ifname="net1", request_name="nic2"))
    wait(lambda: publisher.status()["journal_depth"] == 0, "the DEL handled")
    proxy.lose.clear()
    drained(publisher)
    assert entries(cluster.devices(claim)) == {"nic0"}, "the removed entry stays after a lost apply"


def test_holds_sees_an_entry_we_own_beyond_the_desired_ones(cluster: Cluster):
    """`holds` on the live claim: our manager owns nic0 and nic1 there; a desired body of
    nic0 alone does not hold (another manager's entry does not count)."""
    claim, _ = cluster.pod_with_claim("owned", [("nic", "nic0"), ("nic", "nic1"), ("nic", "nic2")])
    ours = [{"driver": DRIVER, "pool": "node-a", "device": d, "data": {"containerID": "c"}} for d in ("nic0", "nic1")]
    apply_as(cluster, claim, MANAGER, ours)
    apply_as(cluster, claim, "someone-else", [{"driver": DRIVER, "pool": "node-a", "device": "nic2"}])
    raw = cluster.resource.read_namespaced_resource_claim(claim, cluster.namespace, _preload_content=False)
    live = json.loads(raw.data)
    owned = owned_keys(live, MANAGER)
    assert owned == {(DRIVER, "node-a", "nic0", ""), (DRIVER, "node-a", "nic1", "")}
    assert holds(server_devices(live), ours, owned)
    assert not holds(server_devices(live), ours[:1], owned), "an entry we own and no longer want still holds"
