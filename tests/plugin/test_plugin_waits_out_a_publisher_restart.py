"""A publisher restart on a node whose spool cannot take events loses no event.

The real plugin executable, a real read-only tmpfs as the spool, and the
publisher's socket appearing only while the ADD runs (its restart).
"""

from __future__ import annotations

import threading

from .conftest import Dirs, PublisherDouble, Tmpfs
from .test_plugin_input_and_handoff_limits import add, error_of, prev_result


def read_only_spool(tmpfs_factory) -> str:
    fs: Tmpfs = tmpfs_factory("1m")
    spool = fs.path / "spool"
    spool.mkdir(mode=0o700)
    fs.remount_read_only()
    return str(spool)


def test_an_add_during_a_publisher_restart_is_acked_when_the_spool_is_read_only(
        plugin_exe: str, dirs: Dirs, tmpfs_factory) -> None:
    spool = read_only_spool(tmpfs_factory)
    came_back: list[PublisherDouble] = []
    restart = threading.Timer(0.5, lambda: came_back.append(PublisherDouble(dirs.socket)))
    restart.start()
    try:
        # A wait far longer than the restart, so a loaded machine's scheduling cannot end it first.
        rc, out, err = add(plugin_exe, dirs, prev_result(), spoolDir=spool, failurePolicy="Fail",
                           handoffWaitMs=20000)
    finally:
        restart.join()
    try:
        assert rc == 0, out + err
        assert [(e.op, e.pod.name) for e in came_back[0].events] == [("ADD", "web-0")], "the event reached the publisher"
        waited = [r for r in dirs.log_records() if r.get("msg") == "event handed off after waiting for the publisher"]
        assert waited and "Read-only" in waited[0]["spoolError"], dirs.log_records()
    finally:
        for pub in came_back:
            pub.close()


def test_an_add_is_refused_once_the_wait_ends_without_a_publisher(plugin_exe: str, dirs: Dirs,
                                                                   tmpfs_factory) -> None:
    spool = read_only_spool(tmpfs_factory)
    rc, out, err = add(plugin_exe, dirs, prev_result(), spoolDir=spool, failurePolicy="Fail", handoffWaitMs=300)
    assert rc == 1 and error_of(out)["code"] == 11, out + err
    lost = [r for r in dirs.log_records() if r.get("msg") == "event not handed off"]
    assert lost and lost[0]["waitedMs"] == 300, dirs.log_records()


def test_a_wait_out_of_range_is_a_config_error(plugin_exe: str, dirs: Dirs) -> None:
    rc, out, err = add(plugin_exe, dirs, prev_result(), handoffWaitMs=60001)
    assert rc == 1 and error_of(out)["code"] == 7 and "handoffWaitMs" in error_of(out)["msg"], out + err
