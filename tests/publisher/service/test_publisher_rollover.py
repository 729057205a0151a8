"""Two publishers of one node overlap in a surge rollout: the new one waits untouched, then takes over.

With `maxSurge` the DaemonSet starts the new pod beside the old one and deletes
the old one only once the new one is ready. Real parts: two `netclaim-publisher
run` processes on the same state dir, spool and socket, the real API server.
"""

from __future__ import annotations

import pytest

from cni_plugin.wire.event import PodRef
from cni_plugin.wire.frame import event_request
from publisher_testkit import cni_result, request, wait_until, wire_event

pytestmark = pytest.mark.controlplane


def add(cluster, pub, name: str) -> str:
    claim, uid = cluster.pod_with_claim(name, [("nic", "nic0")])
    answer = request(pub.socket, event_request(wire_event("ADD", f"c-{name}", PodRef(cluster.namespace, name, uid),
                                                          cni_result())))
    assert answer.get("ok"), answer
    cluster.wait_devices(claim, lambda d: [e for e in d if (e.get("data") or {}).get("containerID") == f"c-{name}"])
    return uid


def test_a_second_publisher_of_the_node_waits_untouched_and_takes_over_once_the_first_stops(
        cluster, publisher_factory):
    old = publisher_factory(sub="node")
    add(cluster, old, "roll-a")

    new = publisher_factory(sub="node", start=False)  # same socket, state dir and spool: the same node
    new.start(wait=False)
    wait_until("the new publisher to wait for the old one",
               lambda: "waiting for the publisher already running on this node" in new.logs(), 30)
    add(cluster, old, "roll-b")  # the old one still serves and publishes
    assert new.proc.poll() is None, new.logs()[-2000:]
    assert new.logs().count('"publisher started"') == 1, "the waiting publisher must not open journal or socket"

    old.stop()
    assert old.proc.returncode == 0, old.logs()[-2000:]
    new.wait_ready()
    assert new.logs().count('"publisher started"') == 2
    add(cluster, new, "roll-c")
    # The old one's attachments are the new one's: a DEL through the new publisher takes its entry away.
    answer = request(new.socket, event_request(wire_event("DEL", "c-roll-a", PodRef(cluster.namespace, "roll-a", ""))))
    assert answer.get("ok"), answer
    cluster.wait_devices("roll-a-net", lambda d: not d)
    assert [e["data"]["containerID"] for e in cluster.devices("roll-b-net")] == ["c-roll-b"]


def test_a_publisher_stopped_while_it_waits_leaves_the_running_one_alone(cluster, publisher_factory):
    old = publisher_factory(sub="node")
    new = publisher_factory(sub="node", start=False)
    new.start(wait=False)
    wait_until("the new publisher to wait", lambda: "waiting for the publisher already running" in new.logs(), 30)
    new.stop()
    assert new.proc.returncode == 0
    assert "stopped while waiting for the previous one" in new.logs()
    add(cluster, old, "stay-a")  # the socket is still the old one's
