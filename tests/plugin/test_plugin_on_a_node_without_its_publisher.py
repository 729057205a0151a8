"""A node left chained without its publisher: its spool at the cap, pods pay the hand-off wait once.

The real plugin executable, no publisher socket, a spool already at a small
`spoolMaxFiles` (what a node left chained after an uninstall the keeper missed
reaches after a few hundred pod starts). The first hand-off that finds neither
channel waits `handoffWaitMs`; the ADDs, DELs and CHECKs after it do not wait,
and every dropped event is still counted in the spool's overflow marker. A
publisher that serves the socket again gets the events at once, and one that
bound or removed the socket after the failed wait is waited for again.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest

from cni_plugin.wire import event as wire_event
from cni_plugin.wire import spool as wire_spool

from .conftest import POD_ARGS, Dirs, Netns, PublisherDouble, run_plugin
from .test_plugin_input_and_handoff_limits import error_of, prev_result

WAIT_MS = 300
CAP = 2


@pytest.fixture
def node(dirs: Dirs) -> Dirs:
    """The test dirs with the socket in a directory of its own, as the publisher's /run/netclaim."""
    run = Path(dirs.root) / "run"
    run.mkdir(mode=0o700)
    dirs.socket = str(run / "pub.sock")
    return dirs


def full_spool(dirs: Dirs) -> None:
    for i in range(CAP):
        wire_spool.write_spool(dirs.spool, wire_event.Event(op="ADD", container_id=f"old{i}", ifname="eth0",
                                                driver="net.example.com"))


def verb(exe: str, dirs: Dirs, command: str, container_id: str, netns: str = "/run/netns/ncpl-none",
         **extra: object) -> tuple[int, str, str]:
    conf = dirs.conf(cniVersion="1.0.0", name="orphan-net", spoolMaxFiles=CAP, **{"handoffWaitMs": WAIT_MS, **extra})
    if command in ("ADD", "CHECK"):
        conf["prevResult"] = prev_result()
    return run_plugin(exe, command, conf, netns=netns, container_id=container_id, args=POD_ARGS)


def not_handed_off(dirs: Dirs, command: str, container_id: str) -> dict:
    """The plugin's own record of the hand-off that found neither channel, for one verb of one sandbox."""
    records = [r for r in dirs.log_records() if r.get("msg") == "event not handed off"
               and r.get("command") == command and r.get("containerID") == container_id]
    assert len(records) == 1, dirs.log_records()
    return records[0]


def test_after_one_failed_wait_later_adds_and_dels_do_not_wait(plugin_exe: str, node: Dirs, netns: Netns) -> None:
    dirs = node
    full_spool(dirs)
    rc, out, err = verb(plugin_exe, dirs, "ADD", "first")
    assert rc == 0, out + err
    first = not_handed_off(dirs, "ADD", "first")
    assert first["waitedMs"] == WAIT_MS and first["outcome"] == "dropped" and "waitSkipped" not in first, first

    rc, out, err = verb(plugin_exe, dirs, "ADD", "second")
    assert rc == 0 and json.loads(out)["interfaces"][0]["mac"] == "02:00:00:00:00:01", out + err
    rc, out, err = verb(plugin_exe, dirs, "DEL", "first")
    assert (rc, out) == (0, ""), out + err
    rc, out, err = verb(plugin_exe, dirs, "CHECK", "check", netns=netns.path)
    assert rc == 1 and error_of(out)["code"] == 100, "the drift is still reported: " + out + err
    rc, out, err = verb(plugin_exe, dirs, "ADD", "strict", failurePolicy="Fail")
    assert rc == 1 and error_of(out)["code"] == 11, "Fail still refuses the pod, without the wait: " + out + err
    for command, container_id in (("ADD", "second"), ("DEL", "first"), ("CHECK", "check"), ("ADD", "strict")):
        record = not_handed_off(dirs, command, container_id)
        assert record["waitedMs"] == 0 and record["waitSkipped"] is True, record
        assert record["outcome"] == "dropped" and "SpoolFull" in record["spoolError"], record

    marker = wire_spool.read_overflow(dirs.spool)
    assert marker is not None and marker["dropped"] == 5, "every dropped event is still counted"
    assert len(wire_spool.list_spool(dirs.spool)) == CAP

    publisher = PublisherDouble(dirs.socket)
    try:
        rc, out, err = verb(plugin_exe, dirs, "ADD", "back")
        rc_del, out_del, err_del = verb(plugin_exe, dirs, "DEL", "second")
        assert rc == 0 and rc_del == 0, out + err + out_del + err_del
        assert [(e.op, e.container_id) for e in publisher.events] == [("ADD", "back"), ("DEL", "second")]
    finally:
        publisher.close()  # gone without removing its socket, as a crashed publisher leaves it

    rc, out, err = verb(plugin_exe, dirs, "ADD", "after-crash")
    assert rc == 0, out + err
    again = not_handed_off(dirs, "ADD", "after-crash")
    assert again["waitedMs"] == WAIT_MS and "waitSkipped" not in again, "a publisher bound the socket since: wait once"
    rc, out, err = verb(plugin_exe, dirs, "DEL", "after-crash")
    assert rc == 0 and not_handed_off(dirs, "DEL", "after-crash")["waitSkipped"] is True, out + err
    assert (wire_spool.read_overflow(dirs.spool) or {}).get("dropped") == 7


def test_a_publisher_that_came_back_and_restarts_is_waited_for_again(plugin_exe: str, node: Dirs) -> None:
    """A failed wait does not cost the events of a later publisher restart: a publisher that came
    back since (and stopped cleanly, taking its socket with it) is waited for, and acks."""
    dirs = node
    full_spool(dirs)
    rc, out, err = verb(plugin_exe, dirs, "ADD", "first")
    assert rc == 0 and not_handed_off(dirs, "ADD", "first")["waitedMs"] == WAIT_MS, out + err
    rc, out, err = verb(plugin_exe, dirs, "DEL", "first")
    assert rc == 0 and not_handed_off(dirs, "DEL", "first")["waitSkipped"] is True, out + err

    back = PublisherDouble(dirs.socket)
    back.close()
    os.unlink(dirs.socket)  # a clean stop: the restart's first half
    restart = threading.Timer(0.5, lambda: came_back.append(PublisherDouble(dirs.socket)))
    came_back: list[PublisherDouble] = []
    restart.start()
    try:
        # A wait far longer than the restart, so a loaded machine's scheduling cannot end it first.
        rc, out, err = verb(plugin_exe, dirs, "ADD", "during-restart", handoffWaitMs=20000)
    finally:
        restart.join()
    try:
        assert rc == 0, out + err
        assert [(e.op, e.container_id) for e in came_back[0].events] == [("ADD", "during-restart")]
        waited = [r for r in dirs.log_records() if r.get("msg") == "event handed off after waiting for the publisher"]
        assert [r["containerID"] for r in waited] == ["during-restart"], dirs.log_records()
    finally:
        for pub in came_back:
            pub.close()
