"""A publisher started on a journal another release wrote (a rollback, and an upgrade again).

The real publisher process, the real API server, real netns for the sandboxes' liveness, and
for the older release the journal code of 0.1.0 itself, taken from git history. The publisher
never refuses to start: a newer journal it may write is used, any other is set aside and the
node's attachments rebuilt from the live cluster; rows an older release wrote are checked
again. Each time `status` says what happened and one `RolledBack` Warning on the Node does.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from kubernetes import client
from publisher_testkit import (
    BIN,
    DRIVER,
    Cluster,
    Plugin,
    add,
    apply_as,
    cni_result,
    drained,
    request,
    suffix,
    wait_until,
    wire_event,
)

from cni_plugin.wire.event import PodRef
from cni_plugin.wire.frame import event_request
from publisher.journal import schema as journal_schema

pytestmark = pytest.mark.controlplane

REPO = Path(__file__).resolve().parents[3]
RELEASE_0_1_0 = "9cdf7f85d28f3af5e9a2499690ae2d730cd5552a"


@pytest.fixture()
def cluster(api_client):
    """A namespace and a node of this test's own: the rebuild reads every claim of the node's pods,
    and the shared node of the other tests carries their entries."""
    c = Cluster(api_client, f"pub-{suffix()}", node=f"node-rb-{suffix()}").setup()
    yield c
    c.teardown()
    try:
        c.core.delete_node(c.node)
    except client.ApiException:
        pass


@pytest.fixture()
def node_publisher(publisher_factory, cluster):
    """Publishers of the test's node, on one state directory (a node's publisher across releases)."""
    def make(extra: list[str] | None = None):
        pub = publisher_factory(start=False, sub="node", extra=extra)
        pub.node = cluster.node
        return pub.start()
    return make


def journal_db(publisher) -> str:
    return os.path.join(publisher.state, "journal.db")


def entries(cluster: Cluster, claim: str) -> list[dict]:
    return [d for d in cluster.devices(claim) if d["driver"] == DRIVER]


def rolled_back_warnings(cluster: Cluster, node: str, journal: str) -> list[dict]:
    """RolledBack Warnings on the Node (a Node's Events live in "default") about this journal."""
    resp = client.EventsV1Api(cluster.api).list_namespaced_event("default", _preload_content=False)
    return [e for e in json.loads(resp.data)["items"]
            if e.get("reason") == "RolledBack" and e.get("type") == "Warning"
            and (e.get("regarding") or {}).get("kind") == "Node" and e["regarding"].get("name") == node
            and journal in (e.get("note") or "")]


def send_add(publisher, cid: str, pod: PodRef, ipv4: str, netns: str) -> None:
    ev = wire_event("ADD", cid, pod, cni_result(ipv4=ipv4, ipv6=None), netns=netns)
    assert request(publisher.socket, event_request(ev)).get("ok")


def test_a_newer_journal_it_may_write_is_used_and_what_it_does_not_know_survives(
        cluster: Cluster, node_publisher, workdir):
    claim, uid = cluster.pod_with_claim("a", [("nic", "nic0")])
    first = node_publisher()
    first.stop()
    # A newer release's journal: a column with a default and a table this release does not know,
    # a higher version, and compatible_since still this release's (all it added were columns).
    db = sqlite3.connect(journal_db(first))
    db.execute("ALTER TABLE attachments ADD COLUMN from_the_future TEXT NOT NULL DEFAULT 'later'")
    db.execute("CREATE TABLE future_things (k TEXT)")
    db.execute("INSERT INTO future_things VALUES ('kept')")
    db.execute(f"PRAGMA user_version={journal_schema.SCHEMA_VERSION + 3}")
    db.commit()
    db.close()

    pub = node_publisher()
    add(Plugin(pub.socket, pub.spool, workdir), "c" + suffix(), PodRef(cluster.namespace, "a", uid))
    wait_until("the ADD published", lambda: [e["networkData"]["ips"] for e in entries(cluster, claim)])
    st = drained(pub)
    schema = st["journal_schema"]
    assert schema["event"] == "kept_newer" and schema["found_version"] == journal_schema.SCHEMA_VERSION + 3, schema
    assert "kept and used" in schema["note"] and not schema["set_aside_to"], schema
    notes = wait_until("one RolledBack Warning on the Node",
                       lambda: rolled_back_warnings(cluster, pub.node, journal_db(pub)))
    assert len(notes) == 1 and f"schema version {journal_schema.SCHEMA_VERSION + 3}" in notes[0]["note"], notes
    pub.stop()
    db = sqlite3.connect(journal_db(pub))
    try:
        assert db.execute("PRAGMA user_version").fetchone()[0] == journal_schema.SCHEMA_VERSION + 3
        assert db.execute("SELECT k FROM future_things").fetchall() == [("kept",)]
        assert db.execute("SELECT from_the_future FROM attachments").fetchall() == [("later",)]
    finally:
        db.close()


def test_a_newer_journal_it_may_not_write_is_set_aside_and_only_live_sandboxes_stay_shown(
        cluster: Cluster, node_publisher, workdir):
    claim_a, uid_a = cluster.pod_with_claim("a", [("nic", "nic0")])
    claim_b, uid_b = cluster.pod_with_claim("b", [("nic", "nic1")])
    live, dead = f"rb-live-{suffix()}", f"rb-dead-{suffix()}"
    for name in (live, dead):
        subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        first = node_publisher(["--no-live-watch"])
        send_add(first, "ca" + suffix(), PodRef(cluster.namespace, "a", uid_a), "10.77.0.5/24", f"/run/netns/{live}")
        send_add(first, "cb" + suffix(), PodRef(cluster.namespace, "b", uid_b), "10.77.0.6/24", f"/run/netns/{dead}")
        wait_until("both sandboxes published", lambda: entries(cluster, claim_a) and entries(cluster, claim_b))
        drained(first)
        shown_a = entries(cluster, claim_a)
        first.stop()
        # The newer release migrated the journal in a way this one must not write past; b's
        # sandbox died while no publisher ran (its netns is gone, no DEL came).
        newer = journal_schema.SCHEMA_VERSION + 5
        db = sqlite3.connect(journal_db(first))
        db.execute("INSERT OR REPLACE INTO meta(key, value) VALUES ('compatible_since', ?)", (str(newer),))
        db.execute(f"PRAGMA user_version={newer}")
        db.commit()
        db.close()
        subprocess.run(["ip", "netns", "del", dead], check=True)

        pub = node_publisher(["--no-live-watch"])  # starts: no exit, no crash loop
        wait_until("the dead sandbox's entry removed", lambda: not entries(cluster, claim_b))
        st = drained(pub)
        assert entries(cluster, claim_a) == shown_a  # the live sandbox's entry, as it was
        assert st["attachments"] == 1, st
        schema = st["journal_schema"]
        assert schema["event"] == "set_aside" and schema["found_version"] == newer, schema
        aside = schema["set_aside_to"]
        assert os.path.basename(aside).startswith(f"journal-schema{newer}-") and os.path.exists(aside), schema
        assert "rebuilt 1 attachment(s)" in schema["note"] and "1 entry of dead sandboxes" in schema["note"], schema
        text = subprocess.run([str(BIN / "netclaim-publisher"), "status", "--socket", pub.socket],
                              capture_output=True, text=True, check=False).stdout
        assert f"journal:         journal {journal_db(pub)} has schema version {newer}" in text, text
        notes = wait_until("one RolledBack Warning on the Node",
                           lambda: rolled_back_warnings(cluster, pub.node, journal_db(pub)))
        assert len(notes) == 1 and aside in notes[0]["note"] and "rebuilt" in notes[0]["note"], notes
    finally:
        for name in (live, dead):
            subprocess.run(["ip", "netns", "del", name], check=False, capture_output=True)


OLD_WRITER = textwrap.dedent("""
    import json, sys
    from publisher.journal import Journal
    from publisher.journal_schema import Attachment
    state, fields = sys.argv[1], json.loads(sys.argv[2])
    journal = Journal(state)
    journal.finish(None, upsert=[Attachment(**fields)])
    journal.close()
""")


def write_as_0_1_0(workdir: Path, state: str, att: dict) -> None:
    """0.1.0's own journal code (from git history) writes one attachment, as its ADD does."""
    tree = workdir / "release-0.1.0"
    tree.mkdir()
    archive = subprocess.run(["git", "-C", str(REPO), "archive", RELEASE_0_1_0, "publisher", "cni_plugin"],
                             check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    out = subprocess.run([sys.executable, "-c", OLD_WRITER, state, json.dumps(att)], cwd=tree,
                         env={**os.environ, "PYTHONPATH": str(tree)}, capture_output=True, text=True, timeout=60,
                         check=False)
    assert out.returncode == 0, out.stderr[-2000:]


def test_rows_an_older_release_wrote_are_noticed_and_checked_again(cluster: Cluster, node_publisher, workdir):
    claim_a, uid_a = cluster.pod_with_claim("a", [("nic", "nic0")])
    claim_b, uid_b = cluster.pod_with_claim("b", [("nic", "nic1")])
    first = node_publisher()
    add(Plugin(first.socket, first.spool, workdir), "ca" + suffix(), PodRef(cluster.namespace, "a", uid_a))
    wait_until("a published", lambda: entries(cluster, claim_a))
    drained(first)
    first.stop()
    # Rolled back to 0.1.0: it publishes b's sandbox (its row and its entry, as this node's manager).
    cid_b = "cb" + suffix()
    entry = {"driver": DRIVER, "pool": cluster.node, "device": "nic1",
             "conditions": [{"type": "Ready", "status": "True", "reason": "Configured", "message": "configured",
                             "lastTransitionTime": "2026-12-01T00:00:00Z"}],
             "data": {"network": "testnet", "containerID": cid_b},
             "networkData": {"interfaceName": "eth0", "ips": ["10.77.0.8/24"]}}
    write_as_0_1_0(workdir, first.state, {
        "container_id": cid_b, "ifname": "eth0", "driver": DRIVER, "network": "testnet",
        "pod_namespace": cluster.namespace, "pod_name": "b", "pod_uid": uid_b, "claim_namespace": cluster.namespace,
        "claim_name": claim_b, "claim_uid": "", "pool": cluster.node, "device": "nic1",
        "share_id": "", "entry": entry, "result_hash": "h", "event_ts": 1.0, "request": "nic"})
    apply_as(cluster, claim_b, f"netclaim/{cluster.node}", [entry])
    # b is deleted while no publisher runs: no watch sees it, no DEL comes.
    cluster.core.delete_namespaced_pod("b", cluster.namespace, grace_period_seconds=0)
    wait_until("pod b gone", lambda: "b" not in {p.metadata.name for p in
                                                 cluster.core.list_namespaced_pod(cluster.namespace).items})

    pub = node_publisher()  # upgraded again
    wait_until("the older release's row checked again: b's entry removed", lambda: not entries(cluster, claim_b))
    st = drained(pub)
    assert [e["device"] for e in entries(cluster, claim_a)] == ["nic0"]
    schema = st["journal_schema"]
    assert schema["event"] == "older_writer" and schema["older_rows"] == 1, schema
    assert "an older release wrote this journal" in schema["note"], schema
    notes = wait_until("one RolledBack Warning on the Node",
                       lambda: rolled_back_warnings(cluster, pub.node, journal_db(pub)))
    assert len(notes) == 1 and "an older release wrote this journal" in notes[0]["note"], notes
