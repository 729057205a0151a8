"""A claim's dirty mark: cleared only by a reconcile that saw the change, left alone while its owner works.

The publisher's own parts in this process (the Service's journal file, rules,
reconciler and writer, on the real API server), not started: the test is the
worker and housekeeping. Interleavings two threads can produce are forced by
running the other thread's step from inside an apply.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest

from cni_plugin.wire import PodRef
from publisher import limits
from publisher.service import Service
from publisher_testkit import DRIVER, MERGE, Cluster, cni_result, suffix, wire_event

pytestmark = pytest.mark.controlplane

EVERYTHING_DUE = 1e18


def pending(svc: Service, ev: Any) -> Any:
    assert svc.journal.append(ev)
    return next(p for p in svc.journal.ready(0, 1, EVERYTHING_DUE) if p.event.event_id == ev.event_id)


def during_apply(svc: Service, monkeypatch: Any, step: Any, writer: bool = False) -> list[int]:
    """Run `step()` once, inside the next apply (after it reached the API server; with `writer`,
    inside the writer's apply, which also runs when an identical body is skipped); returns a
    call counter."""
    target = svc.writer if writer else svc.kube
    name = "apply" if writer else "apply_claim_status"
    real = getattr(target, name)
    calls = [0]

    def apply(*args: Any, **kwargs: Any) -> Any:
        out = real(*args, **kwargs)
        calls[0] += 1
        if calls[0] == 1:
            step()
        return out

    monkeypatch.setattr(target, name, apply)
    return calls


def count_claim_gets(svc: Service, monkeypatch: Any) -> list[int]:
    real = svc.kube.get_claim
    gets = [0]

    def get(*args: Any, **kwargs: Any) -> Any:
        gets[0] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(svc.kube, "get_claim", get)
    return gets


def ours(cluster: Cluster, claim: str) -> list[str]:
    return [d["data"]["containerID"] for d in cluster.devices(claim) if d["driver"] == DRIVER]


def test_a_del_committed_while_another_reconcile_applies_keeps_the_claim_dirty_until_it_is_applied(
        cluster: Cluster, service: Service, monkeypatch):
    claim, uid = cluster.pod_with_claim("shared", [("nic", "nic0")])
    pod = PodRef(cluster.namespace, "shared", uid)
    add = wire_event("ADD", "c" + suffix(), pod, cni_result())
    service.rules.process(pending(service, add))
    assert ours(cluster, claim) == [add.container_id]
    dele = wire_event("DEL", add.container_id, pod)
    p_del = pending(service, dele)
    key = (cluster.namespace, claim)
    service.journal.finish(None, dirty=[key])  # a retry (or a verification) of the claim is under way ...

    def del_commits() -> None:  # ... when another worker commits the DEL and waits for the claim's lock
        service.journal.finish(p_del.seq, "done", "", delete=[add.attachment], dirty=[key],
                               lease=limits.DIRTY_LEASE)

    during_apply(service, monkeypatch, del_commits, writer=True)
    service.reconciler.reconcile(*key)  # the retry applied what it planned: the ADD's entry
    assert ours(cluster, claim) == [add.container_id]
    # The DEL's worker dies here (SIGKILL, OOM, node crash) before its own reconcile. Its change
    # must still be marked, so the start-up retry removes the torn-down sandbox's entry.
    assert [c[:2] for c in service.journal.dirty_claims()] == [key], "the DEL's dirty mark was lost"
    service.housekeeping.retry_dirty(everything=True)
    assert ours(cluster, claim) == []
    assert service.journal.dirty_claims() == []


def test_housekeeping_leaves_a_claim_alone_while_the_worker_that_committed_it_applies(
        cluster: Cluster, service: Service, monkeypatch):
    claim, uid = cluster.pod_with_claim("burst", [("nic", "nic0")])
    add = wire_event("ADD", "c" + suffix(), PodRef(cluster.namespace, "burst", uid), cni_result())
    p_add = pending(service, add)
    gets = count_claim_gets(service, monkeypatch)
    housekeeping = threading.Thread(target=service.housekeeping.retry_dirty)  # a pass while the worker applies
    applies = during_apply(service, monkeypatch, housekeeping.start)
    service.rules.process(p_add)
    housekeeping.join(60)
    assert not housekeeping.is_alive()
    assert ours(cluster, claim) == [add.container_id]
    # 2 requests per ADD: the resolver's read of the claim and the worker's apply. Housekeeping
    # reconciling the same claim meanwhile would cost one more GET (and possibly an apply).
    assert (gets[0], applies[0]) == (1, 1)
    assert service.journal.dirty_claims() == []


def test_a_mark_whose_worker_died_is_retried_once_the_lease_ends(cluster: Cluster, service: Service, monkeypatch):
    claim, uid = cluster.pod_with_claim("lease", [("nic", "nic0")])
    key = (cluster.namespace, claim)
    service.journal.finish(None, dirty=[key], lease=limits.DIRTY_LEASE)  # committed; its worker never reconciled
    service.housekeeping.retry_dirty()
    assert [c[:2] for c in service.journal.dirty_claims()] == [key], "retried while its worker still held it"
    later = service.journal.dirty_claims(EVERYTHING_DUE)
    assert [c[:2] for c in later] == [key]
    monkeypatch.setattr("publisher.repair.resync.node_seconds", lambda: EVERYTHING_DUE)  # the lease has ended
    service.housekeeping.retry_dirty()
    assert service.journal.dirty_claims() == []


def test_a_later_repair_is_not_credited_to_a_window_whose_claim_a_worker_reconciled_first(
        cluster: Cluster, service: Service):
    claim, uid = cluster.pod_with_claim("cause", [("nic", "nic0")])
    add = wire_event("ADD", "c" + suffix(), PodRef(cluster.namespace, "cause", uid), cni_result())
    service.rules.process(pending(service, add))
    hk = service.housekeeping
    hk.drifted(cluster.namespace, claim, "window saw a change")  # a claim window marks the claim ...
    service.reconciler.reconcile(cluster.namespace, claim)  # ... and a worker's reconcile cleans it first
    hk._prune()  # housekeeping's minute
    # Much later the entry is wiped by someone else and an apply outcome brings it back.
    cluster.resource.patch_namespaced_resource_claim_status(claim, cluster.namespace, {"status": {"devices": []}},
                                                            _content_type=MERGE)
    service.writer.invalidate(f"{cluster.namespace}/{claim}")
    service.journal.finish(None, dirty=[(cluster.namespace, claim)])
    hk.retry_dirty()
    assert ours(cluster, claim) == [add.container_id]
    repaired = service.metrics.drift_repaired
    assert repaired.labels("window")._value.get() == 0, "credited to a window that repaired nothing"
    assert repaired.labels("outcome")._value.get() == 1
