"""what another worker commits while an ADD is being resolved.

The publisher's own parts in this process (the Service's journal file, resolver,
rules, reconciler and writer, on the real API server), not started: the test is
the worker. The interleaving two workers can produce is made deterministic by
running the other worker's event from inside the ADD's resolve, right after the
resolver has read the claim (the window between the ADD's checks and its commit).
"""

from __future__ import annotations

from typing import Any

import pytest

from cni_plugin.wire.event import Event, PodRef
from publisher.journal.store import Pending
from publisher.service import Service
from publisher_testkit import DRIVER, MERGE, Cluster, cni_result, suffix, wire_event

pytestmark = pytest.mark.controlplane

EVERYTHING_DUE = 1e18


def journaled(svc: Service, *events: Event) -> list[Pending]:
    """Append the events as intake does; their Pending rows, in the given order."""
    for ev in events:
        assert svc.journal.append(ev)
    ready = {p.event.event_id: p for p in svc.journal.ready(0, 1, EVERYTHING_DUE)}
    return [ready[ev.event_id] for ev in events]


def meanwhile(svc: Service, monkeypatch: Any, add: Event, other_worker: Any) -> None:
    """Run `other_worker()` after the resolver read the claim for `add`, before `add` commits."""
    real = svc.resolver.resolve

    def resolve(event: Event, bound: Any, known: Any = None) -> Any:
        target = real(event, bound, known)
        if event.event_id == add.event_id:
            other_worker()
        return target

    monkeypatch.setattr(svc.resolver, "resolve", resolve)


def shown(devices: list[dict]) -> set[str]:
    return {d["data"]["containerID"] for d in devices if d["driver"] == DRIVER}


def test_add_resolved_before_a_gc_committed_is_not_recorded_after_it(
        cluster: Cluster, service: Service, monkeypatch):
    claim, uid = cluster.pod_with_claim("gc-race", [("nic", "nic0")])
    pod = PodRef(cluster.namespace, "gc-race", uid)
    add = wire_event("ADD", "c" + suffix(), pod, cni_result())
    gc = wire_event("GC", "*", None, ifname="*", valid_attachments=[])  # after the ADD, does not list it
    p_add, p_gc = journaled(service, add, gc)
    meanwhile(service, monkeypatch, add, lambda: service.rules.process(p_gc))  # another worker's GC
    service.rules.process(p_add)
    assert service.journal.attachment(add.container_id, add.ifname) is None, "the GC'd ADD was recorded"
    assert service.journal.depth() == 0 and service.journal.failed() == []
    assert shown(cluster.devices(claim)) == set()


def test_racing_adds_of_a_shared_claim_show_the_newest_sandbox(
        cluster: Cluster, service: Service, monkeypatch):
    claim = "shared"
    cluster.claim(claim)
    uid1, uid2 = cluster.pod("p1", [claim]), cluster.pod("p2", [claim])
    cluster.allocate(claim, [("nic", "nic0")], "p1", uid1)  # reserved for p1 only, for now
    first = wire_event("ADD", "p1" + suffix(), PodRef(cluster.namespace, "p1", uid1), cni_result(ipv4="10.77.0.5/24"))
    newest = wire_event("ADD", "p2" + suffix(), PodRef(cluster.namespace, "p2", uid2), cni_result(ipv4="10.77.0.6/24"))
    p_first, p_newest = journaled(service, first, newest)

    def second_pod_starts() -> None:
        """The claim is reserved for p2 too; p2's ADD is handled to the end by another worker."""
        cluster.resource.patch_namespaced_resource_claim_status(claim, cluster.namespace, {"status": {"reservedFor": [
            {"resource": "pods", "name": "p1", "uid": uid1}, {"resource": "pods", "name": "p2", "uid": uid2}]}},
            _content_type=MERGE)
        service.rules.process(p_newest)
        assert shown(cluster.devices(claim)) == {newest.container_id}

    meanwhile(service, monkeypatch, first, second_pod_starts)
    service.rules.process(p_first)  # reconciles with the claim copy read before p2 was reserved
    assert service.journal.depth() == 0 and service.journal.dirty_count() == 0
    assert shown(cluster.devices(claim)) == {newest.container_id}, "the older sandbox shows until a resync"
