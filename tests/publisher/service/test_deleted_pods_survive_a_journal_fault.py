"""A pod the pod watch saw deleted while the journal could not be written still gets its claim reconciled.

Housekeeping looks up the claims of deleted pods in a step of its own; when that step fails (another
process holds the journal's write lock) the step backs off and tries again, and the deletions it
was told about must still be there then: lost, the pod's entry would stay in its claim until a DEL
or the safety net a day later. Real parts: the publisher's Service and its Journal on disk, the
lock held by a second SQLite connection (`BEGIN IMMEDIATE`); SQLite's busy timeout is shortened so
the fault costs a fraction of a second.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from cni_plugin.wire.event import new_order
from publisher import limits
from publisher.journal.schema import Attachment
from publisher.kube.calls import Kube
from publisher.observe.metrics import Metrics
from publisher.service import Service, Settings


@pytest.fixture()
def service(workdir: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Service]:
    """The publisher's Service, not started (no API server: the step under test makes no request)."""
    monkeypatch.setattr(limits, "JOURNAL_BUSY_TIMEOUT", 0.3)  # read when the journal opens its connection
    svc = Service(Settings(node_name="node-a", state_dir=str(workdir / "state"), spool_dir=str(workdir / "spool"),
                           workers=1, emit_events=False), Kube(api_client=None), Metrics())
    yield svc
    svc.stop()


def test_a_deleted_pod_seen_during_a_journal_fault_gets_its_claim_reconciled_after(service: Service) -> None:
    stamp = new_order()
    service.journal.finish(None, upsert=[Attachment(
        container_id="c" * 64, ifname="eth0", driver="net.example.com", network="podnet", pod_namespace="ns",
        pod_name="web", pod_uid="uid-web", claim_namespace="ns", claim_name="claim-web", claim_uid="cu", pool="p",
        device="nic0", share_id="", entry={}, result_hash="h", event_ts=time.time(), stamp=stamp, added=stamp)])
    service.journal.clean("ns", "claim-web")
    hk = service.housekeeping

    hk.pod_seen(None, "ns", "web", "uid-web")  # what the pod watch tells housekeeping of a deleted pod
    holder = sqlite3.connect(service.journal.path, isolation_level=None)
    try:
        holder.execute("BEGIN IMMEDIATE")  # another process holds the journal's write lock
        hk._step("pods", hk.deleted_pods)
    finally:
        holder.rollback()
        holder.close()
    assert hk.steps["pods"].failures == 1, "the step met the fault"
    assert service.journal.dirty_claims() == []

    hk.deleted_pods()  # the step's next try, after its backoff
    assert [(ns, name) for ns, name, _ in service.journal.dirty_claims()] == [("ns", "claim-web")]
