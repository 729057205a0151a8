"""A claim's dirty mark: cleared only by a reconcile that saw the change, left alone while its owner works,
and never made due sooner by a change than a sibling hold or the API server's Retry-After allows.

The publisher's own parts in this process (the Service's journal file, rules,
reconciler and writer, on the real API server), not started: the test is the
worker, housekeeping and the live watch's journal write. Interleavings two
threads can produce are forced by running the other thread's step from inside
an apply.
"""

from __future__ import annotations

import dataclasses
import threading
from pathlib import Path
from typing import Any

import pytest

from cni_plugin.wire.event import PodRef
from publisher import limits
from publisher.clock import node_seconds
from publisher.journal.livestate import entry_and_live, record_live, watched_rows
from publisher.kube.calls import Credentials, Kube
from publisher.live.status import Observed, next_live
from publisher.observe.metrics import Metrics
from publisher.clock import now_rfc3339
from publisher.service import Service, Settings
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


NETNS = "/var/run/netns/held-sandbox"  # where the ADD says the sandbox is (the live watch's write needs one)


def link_down(svc: Service, container_id: str) -> None:
    """What the live watch writes when it sees the attachment's interface go down: the observation,
    and a dirty mark on its claim (publisher/journal/livestate.py, the watch's only journal write)."""
    row = next(w for w in watched_rows(svc.journal) if w.container_id == container_id)
    found = entry_and_live(svc.journal, row)
    assert found is not None
    entry, stored = found
    net = entry.get("networkData") or {}
    seen = Observed(ifname=row.ifname, present=True, up=False, mac=net.get("hardwareAddress", ""),
                    ips=list(net.get("ips") or []))
    assert record_live(svc.journal, row, next_live(entry, stored, seen, now_rfc3339()))


def count_applies(svc: Service, monkeypatch: Any) -> list[int]:
    """Status applies that reached the API server (or the proxy in front of it)."""
    real = svc.kube.apply_claim_status
    applies = [0]

    def apply(*args: Any, **kwargs: Any) -> Any:
        applies[0] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(svc.kube, "apply_claim_status", apply)
    return applies


def ready(devices: list[dict[str, Any]], device: str) -> str:
    entry = next(d for d in devices if d["driver"] == DRIVER and d["device"] == device)
    return next(c["status"] for c in entry["conditions"] if c["type"] == "Ready")


def test_a_link_change_while_the_claim_is_held_waits_for_the_sandboxs_last_add(
        cluster: Cluster, service: Service, monkeypatch):
    """One apply per sandbox: the live watch's first look at a new sandbox finding its link down
    does not apply the claim its first ADD holds; the last ADD applies both entries, link state
    included."""
    service.rules.settings.sibling_hold = 60.0  # no scheduling delay ends the hold during the test
    claim, uid = cluster.pod_with_claim("held", [("nic", "nic0"), ("nic2", "nic1")])
    pod, cid = PodRef(cluster.namespace, "held", uid), "c" + suffix()
    service.rules.process(pending(service, wire_event("ADD", cid, pod, cni_result(), netns=NETNS)))
    applies = count_applies(service, monkeypatch)
    link_down(service, cid)
    service.housekeeping.retry_dirty()  # a housekeeping pass right after the live watch's write
    assert (applies[0], ours(cluster, claim)) == (0, []), "applied while the sandbox's other ADD was held for"
    net1 = cni_result(ifname="net1", ipv4="10.78.0.5/24", ipv6=None, mac="0a:58:0a:4e:00:05")
    service.rules.process(pending(service, wire_event("ADD", cid, pod, net1, ifname="net1", request_name="nic2",
                                                      netns=NETNS)))
    devices = cluster.devices(claim)
    assert ours(cluster, claim) == [cid, cid]
    assert (ready(devices, "nic0"), ready(devices, "nic1")) == ("False", "True")
    assert applies[0] == 1
    assert service.journal.dirty_claims() == []


@pytest.fixture()
def throttled_service(control_plane, proxy, workdir: Path):
    """The publisher's Service whose API requests go through a proxy that can answer 429 (lossy_proxy.py)."""
    via_proxy = dataclasses.replace(control_plane, server=proxy.url, ca_file=proxy.cert)
    kubeconfig = str(via_proxy.kubeconfig_for_token(control_plane.token("admin"), workdir / "proxy.kubeconfig"))
    kube = Kube(Credentials(kubeconfig).loader(kubeconfig, 4), credentials=Credentials(kubeconfig))
    svc = Service(Settings(node_name="node-a", state_dir=str(workdir / "state"), spool_dir=str(workdir / "spool"),
                           workers=1, emit_events=False), kube, Metrics())
    yield svc
    svc.stop()


def test_a_claim_told_to_retry_after_a_minute_is_not_retried_sooner_for_a_link_change(
        cluster: Cluster, throttled_service: Service, proxy, monkeypatch):
    """The API server throttles the claim's apply (429, Retry-After: 60): a link change of its
    sandbox meanwhile is applied by the retry after the minute, not by one sent at once."""
    svc = throttled_service
    claim, uid = cluster.pod_with_claim("throttled", [("nic", "nic0")])
    cid = "c" + suffix()
    proxy.throttle = 60
    svc.rules.process(pending(svc, wire_event("ADD", cid, PodRef(cluster.namespace, "throttled", uid), cni_result(),
                                              netns=NETNS)))
    assert proxy.throttled == 1
    link_down(svc, cid)
    svc.housekeeping.drifted(cluster.namespace, claim, "a claim window saw a change")
    svc.housekeeping.retry_dirty()  # a housekeeping pass right after both marks
    assert proxy.throttled == 1, "the claim was retried before the server's Retry-After"
    assert svc.journal.dirty_claims(node_seconds()) == []
    proxy.throttle = 0
    monkeypatch.setattr("publisher.repair.resync.node_seconds", lambda: EVERYTHING_DUE)  # the minute has passed
    svc.housekeeping.retry_dirty()
    assert ours(cluster, claim) == [cid]
    assert ready(cluster.devices(claim), "nic0") == "False"
    assert svc.journal.dirty_claims() == []


def test_a_link_change_while_the_worker_applies_is_applied_once_that_apply_ends(
        cluster: Cluster, service: Service, monkeypatch):
    """A change recorded after the worker planned its apply keeps the worker's lease on the mark
    (it may be the hold of a sandbox); the worker's end of the apply makes it due at once, not
    DIRTY_LEASE later."""
    claim, uid = cluster.pod_with_claim("lease", [("nic", "nic0")])
    cid = "c" + suffix()
    p_add = pending(service, wire_event("ADD", cid, PodRef(cluster.namespace, "lease", uid), cni_result(),
                                        netns=NETNS))
    during_apply(service, monkeypatch, lambda: link_down(service, cid))
    service.rules.process(p_add)
    assert ours(cluster, claim) == [cid]
    assert ready(cluster.devices(claim), "nic0") == "True", "the change came after the apply was planned"
    assert [c[:2] for c in service.journal.dirty_claims(node_seconds())] == [(cluster.namespace, claim)]
    service.housekeeping.retry_dirty()
    assert ready(cluster.devices(claim), "nic0") == "False"
    assert service.journal.dirty_claims() == []
