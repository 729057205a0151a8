"""Rules of the Warning Events that need no API server: note limit, dedup window, bounded queue."""

from __future__ import annotations

from publisher.observe.events import QUEUE_SIZE, EventRecorder, claim_ref, event_body, pod_ref, trim_note


def test_note_is_cut_to_1_kib_of_utf8_without_splitting_a_character():
    note = trim_note("é" * 1000)  # 2000 bytes
    assert len(note.encode()) <= 1024 and note.endswith("...")
    assert trim_note("short") == "short"


def test_body_names_claim_and_pod():
    body = event_body(claim_ref("ns", "c", "u1"), "ApplyRejected", "x", "node-a", pod_ref("ns", "p", "u2"), 0.0)
    assert body["eventTime"] == "1970-01-01T00:00:00.000000Z"
    assert body["regarding"] == {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "namespace": "ns",
                                 "name": "c", "uid": "u1"}
    assert body["related"]["kind"] == "Pod" and body["reportingInstance"] == "netclaim/node-a"
    assert body["metadata"]["name"].startswith("c.") and body["metadata"]["namespace"] == "ns"


def test_same_object_and_reason_once_per_window_and_queue_bounded():
    now = [1000.0]
    counts: list[str] = []
    rec = EventRecorder(kube=None, node_name="n", count=counts.append, window=600, clock=lambda: now[0])  # not started
    claim = claim_ref("ns", "c")
    assert rec.warn(claim, "ApplyRejected", "a") is True
    assert rec.warn(claim, "ApplyRejected", "b") is False
    assert rec.warn(claim, "InvalidEntry", "c") is True  # another reason is another Event
    now[0] += 601
    assert rec.warn(claim, "ApplyRejected", "d") is True
    assert counts == ["deduplicated"]
    for i in range(QUEUE_SIZE):
        rec.warn(pod_ref("ns", f"p{i}"), "Unresolvable", "x")
    assert counts.count("dropped") == 3  # 3 were queued before: the queue holds QUEUE_SIZE
