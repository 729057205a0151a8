"""An error in a rule is an internal error: reported, the event rescheduled and never lost,
and failed for good only after its retries (publisher/reconcile/workers.py Workers)."""

from __future__ import annotations

from typing import Iterator

import pytest

from cni_plugin.wire.event import PodRef
from publisher import limits
from publisher.clock import node_seconds
from publisher.journal.store import Pending
from publisher.kube.calls import TransientError
from publisher_testkit import cni_result, wait_until, wire_event
from workers_kit import Rig, rig

POD = PodRef("ns", "web", "uid-web")


@pytest.fixture()
def one_shard(workdir) -> Iterator[Rig]:
    yield from rig(workdir / "state", shards=1)


def failing(exc: Exception):
    def rule(p: Pending) -> None:
        raise exc
    return rule


def test_an_exception_in_a_rule_is_reported_and_the_event_rescheduled(one_shard: Rig):
    one_shard.rules.rule = failing(KeyError("interfaces"))
    event = wire_event("ADD", "c1", POD, cni_result())
    one_shard.journal.append(event)
    one_shard.start()
    one_shard.workers.wake.notify(event)

    wait_until("the error reported", lambda: one_shard.report.errors, timeout=30)
    error, event_id = one_shard.report.errors[0]
    assert event_id == event.event_id and error.startswith("internal error: KeyError")
    assert one_shard.journal.depth() == 1 and one_shard.journal.failed() == []  # kept, not lost
    assert one_shard.journal.next_due(0, 1) > node_seconds() + 1  # tried again later, not in a loop
    assert one_shard.workers.stopping.is_set() is False and one_shard.threads[0].is_alive()  # the worker goes on


def test_an_event_a_rule_keeps_failing_on_is_failed_after_its_retries(one_shard: Rig):
    one_shard.rules.rule = failing(ValueError("no rule takes this"))
    event = wire_event("ADD", "c1", POD, cni_result())
    one_shard.journal.append(event)
    pending = one_shard.journal.ready(0, 1, node_seconds())[0]
    last = Pending(pending.seq, pending.event, limits.INTERNAL_ERROR_RETRIES - 1, pending.received)

    one_shard.workers._handle(last)

    assert [f["event_id"] for f in one_shard.journal.failed()] == [event.event_id]
    assert one_shard.journal.depth() == 0
    assert one_shard.metrics.events_failed.labels("internal_error")._value.get() == 1
    assert one_shard.report.errors and "ValueError" in one_shard.report.errors[0][0]


def test_an_api_that_does_not_answer_reschedules_the_event_without_an_error(one_shard: Rig):
    one_shard.rules.rule = failing(TransientError(0, "connection refused"))
    event = wire_event("ADD", "c1", POD, cni_result())
    one_shard.journal.append(event)
    pending = one_shard.journal.ready(0, 1, node_seconds())[0]

    one_shard.workers._handle(pending)

    assert one_shard.report.errors == []
    assert one_shard.journal.depth() == 1 and one_shard.journal.failed() == []
    assert one_shard.journal.next_due(0, 1) > node_seconds()
