"""the publisher's half: an error that repeats is never retried forever.

The plugin and intake now refuse too-deep and oversized events, but a journal
written by an earlier release can still hold one (it was acked and journaled
before the checks existed). After the upgrade the real publisher must fail that
event once, say so, and go on: the attachment's later events must not wait
behind it, and nothing is logged again for it.
"""

from __future__ import annotations

import json
import sqlite3
import time

import pytest

from cni_plugin.wire.event import Event, PodRef
from publisher_testkit import DRIVER, Cluster, Plugin, add, suffix
from publisher.journal.store import shard_key

pytestmark = pytest.mark.controlplane


def deep(levels: int) -> object:
    value: object = "x"
    for _ in range(levels):
        value = [value]
    return value


def journal_an_old_event(state_dir: str, container_id: str, pod: PodRef) -> None:
    """What an earlier release left in its journal: a pending ADD whose result nests 700 levels."""
    body = Event(op="ADD", container_id=container_id, ifname="eth0", driver=DRIVER, network="testnet",
                 request="nic", pod=pod, result={}, cni_version="1.1.0").to_dict()
    body["result"] = {"cniVersion": "1.1.0", "interfaces": [], "ips": [], "dns": {"options": deep(700)}}
    db = sqlite3.connect(f"{state_dir}/journal.db")
    try:
        db.execute("INSERT INTO events(event_id, container_id, ifname, op, shard_key, received, body)"
                   " VALUES (?,?,?,?,?,?,?)", (body["event_id"], container_id, "eth0", "ADD",
                                               shard_key(container_id), 0.0, json.dumps(body)))
        db.commit()
    finally:
        db.close()


def test_unreadable_journaled_event_fails_once_and_blocks_nothing(
        cluster: Cluster, publisher_factory, workdir):
    claim, uid = cluster.pod_with_claim("p0", [("nic", "nic0")])
    pod = PodRef(cluster.namespace, "p0", uid)
    cid = f"cid-{suffix()}"
    pub = publisher_factory()  # creates the journal's schema
    pub.stop()
    journal_an_old_event(pub.state, cid, pod)
    pub.start()
    plugin = Plugin(pub.socket, pub.spool, workdir)
    add(plugin, cid, pod, res={"ipv4": "10.80.0.9/24"})  # the same attachment: it queues behind the old event
    devices = cluster.wait_devices(claim, lambda ds: any(d.get("networkData") for d in ds), timeout=30)
    assert devices[0]["networkData"]["ips"][0] == "10.80.0.9/24"
    failed = pub.status()["failed_events"]
    assert any("unreadable" in f["error"] for f in failed), failed
    time.sleep(6.0)  # longer than the old retry delay: the failed event must not come back
    lines = [e for e in pub.log_events() if "unreadable" in json.dumps(e)]
    assert len(lines) == 1, lines
