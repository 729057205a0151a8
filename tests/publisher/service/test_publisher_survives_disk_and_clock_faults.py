"""publisher side: the journal never wedges the publisher, a broken spool never stops
housekeeping, scheduling survives wall-clock steps, the metrics port is bounded, files are
private, and the probes tell the truth.

Everything is real: the publisher subprocess, the API server, a second process holding
SQLite's write lock, a tmpfs remounted read-only, TCP connections, a wall clock stepped
inside the publisher process (a sitecustomize that shifts time.time on SIGUSR1).
"""

from __future__ import annotations

import os
import signal
import socket
import stat
import subprocess
import sys
import textwrap
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from cni_plugin.wire.event import PodRef
from cni_plugin.wire.frame import event_request
from cni_plugin.wire.spool import list_spool
from publisher import limits
from publisher_testkit import Plugin, add, cni_result, request, resynced, wait_until, wire_event

pytestmark = pytest.mark.controlplane


def wait_for(predicate, timeout: float = 60.0, what: str = "condition"):
    return wait_until(what, predicate, timeout)


def probe(publisher, path: str, timeout: float = 10.0) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{publisher.port}{path}", timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def hold_write_lock(db: str, seconds: float) -> subprocess.Popen:
    """Another process (a backup tool, a second publisher by mistake) takes SQLite's write lock."""
    code = textwrap.dedent(f"""
        import sqlite3, sys, time
        c = sqlite3.connect({db!r}, isolation_level=None)
        c.execute("BEGIN IMMEDIATE")
        print("held", flush=True)
        time.sleep({seconds})
        c.execute("ROLLBACK")
    """)
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def pod_ready(cluster, name: str) -> tuple[str, PodRef]:
    claim, uid = cluster.pod_with_claim(name, [("nic", "nic0")])
    return claim, PodRef(cluster.namespace, name, uid)


def published(cluster, claim: str, timeout: float = 60.0) -> None:
    cluster.wait_devices(claim, lambda d: len(d) == 1 and d[0]["networkData"]["interfaceName"] == "eth0", timeout)


# ---------------------------------------------------------------- item 1


def test_a_held_write_lock_does_not_wedge_the_publisher(cluster, publisher_factory, workdir):
    pub = publisher_factory(extra=["--spool-interval", "0.5"])
    plugin = Plugin(pub.socket, pub.spool, workdir)
    claim1, pod1 = pod_ready(cluster, "held-1")
    holder = hold_write_lock(os.path.join(pub.state, "journal.db"), 10)
    try:
        add(plugin, "c-held-1", pod1)  # acked late or spooled: the plugin returns 0 either way
        code, body = wait_for(lambda: (lambda r: r if r[0] == 503 and "journal:" in r[1] else None)(
            probe(pub, "/readyz")), 30, "readyz naming the journal")
        assert body.startswith("journal: ") and "locked" in body
        # Everything that only reads answers while the lock is held.
        assert probe(pub, "/healthz")[0] == 200  # not wedged for long: no restart yet
        assert pub.metric("netclaim_ready") == 0
        assert pub.status()["node"] == pub.node
        assert holder.poll() is None, "the lock was released before the reads were checked"
    finally:
        holder.wait(30)
    # Released: the publisher recovers by itself.
    wait_for(lambda: probe(pub, "/readyz")[0] == 200, 60, "ready again")
    published(cluster, claim1)
    claim2, pod2 = pod_ready(cluster, "held-2")
    add(plugin, "c-held-2", pod2)
    published(cluster, claim2)
    assert pub.status()["ready"] is True and pub.metric("netclaim_ready") == 1
    assert pub.proc.poll() is None


# ---------------------------------------------------------------- item 4


@pytest.fixture()
def tmpfs_spool(publisher_factory):
    """A publisher (not started) whose spool dir is a small tmpfs of its own."""
    pub = publisher_factory(start=False)
    os.makedirs(pub.spool)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,mode=0700", "tmpfs", pub.spool], check=True)
    yield pub
    pub.kill()
    subprocess.run(["umount", "-l", pub.spool], check=False)


def test_undeletable_spool_keeps_housekeeping_going(cluster, tmpfs_spool, workdir):
    pub = tmpfs_spool
    pub.extra += ["--spool-interval", "0.2", "--resync-interval", "1"]
    plugin = Plugin(pub.socket, pub.spool, workdir)
    claim1, pod1 = pod_ready(cluster, "ro-1")
    add(plugin, "c-ro-1", pod1)  # publisher down: spooled
    assert len(list_spool(pub.spool)) == 1
    subprocess.run(["mount", "-o", "remount,ro", pub.spool], check=True)
    pub.start(wait=False)
    published(cluster, claim1)  # the spooled event was ingested although its file cannot go
    code, body = wait_for(lambda: (lambda r: r if r[0] == 503 else None)(probe(pub, "/readyz")), 30,
                          "readyz naming the spool")
    assert body.startswith("spool: ") and "cannot be deleted" in body and "Read-only" in body
    # Housekeeping goes on: resyncs complete, a new event is published.
    st = resynced(pub, 60)
    assert st["spool_stuck_files"] == 1 and st["spool_files"] == 0
    first = st["last_resync"]
    wait_for(lambda: (pub.status(brief=True)["last_resync"] or 0) > first, 30, "another resync")
    claim2, pod2 = pod_ready(cluster, "ro-2")
    add(plugin, "c-ro-2", pod2)
    published(cluster, claim2)
    assert probe(pub, "/healthz")[0] == 200
    # ... and the log is not flooded: the fault is told once, not at every look at the spool.
    events = pub.log_events()
    assert sum(1 for e in events if e.get("msg") == "spool fault") == 1
    assert not [e for e in events if "crashed" in str(e.get("msg"))]
    assert len(events) < 100, events[-20:]


def test_soak_a_stuck_spool_file_goes_and_readiness_returns_once_the_spool_is_writable(
        cluster, tmpfs_spool, workdir):
    """Found by the 60-minute soak: after a read-only spool was made writable again, the file
    that could not be deleted stayed remembered as stuck, and /readyz stayed false for good."""
    pub = tmpfs_spool
    pub.extra += ["--spool-interval", "0.5"]
    plugin = Plugin(pub.socket, pub.spool, workdir)
    claim, pod = pod_ready(cluster, "ro-back")
    add(plugin, "c-ro-back", pod)  # publisher down: spooled
    subprocess.run(["mount", "-o", "remount,ro", pub.spool], check=True)
    pub.start(wait=False)
    published(cluster, claim)
    wait_for(lambda: (lambda r: r if r[0] == 503 and r[1].startswith("spool: ") else None)(probe(pub, "/readyz")),
             30, "readyz naming the spool")
    subprocess.run(["mount", "-o", "remount,rw", pub.spool], check=True)
    wait_for(lambda: probe(pub, "/readyz")[0] == 200, 30, "ready again once the spool is writable")
    st = pub.status()
    assert st["spool_stuck_files"] == 0 and list_spool(pub.spool) == [], st


def test_soak_a_held_write_lock_shows_in_readiness_while_nothing_is_written(publisher_factory):
    """Found by the 60-minute soak: with no event to write, another process holding the journal's
    write lock went unseen (/readyz stayed true), though any ADD would have had to spool."""
    pub = publisher_factory(extra=["--spool-interval", "1"])
    assert probe(pub, "/readyz")[0] == 200
    holder = hold_write_lock(str(Path(pub.state) / "journal.db"), 12)
    try:
        code, body = wait_for(lambda: (lambda r: r if r[0] == 503 else None)(probe(pub, "/readyz")), 10,
                              "readyz naming the journal while the lock is held")
        assert body.startswith("journal: ") and "locked" in body, body
    finally:
        holder.wait(30)
    wait_for(lambda: probe(pub, "/readyz")[0] == 200, 15, "ready again after the lock is released")


# ---------------------------------------------------------------- item 8

SITECUSTOMIZE = """
import signal
import time

_real, _real_ns = time.time, time.time_ns
_offset = [0.0]


def _step(_signum, _frame):
    with open({path!r}) as fh:
        _offset[0] += float(fh.read())


time.time = lambda: _real() + _offset[0]
time.time_ns = lambda: _real_ns() + int(_offset[0] * 1e9)
signal.signal(signal.SIGUSR1, _step)
"""


def step_wall_clock(pub, workdir: Path, seconds: float) -> None:
    """Step the publisher's wall clock (time.time) as NTP or a bad RTC would."""
    (workdir / "step").write_text(str(seconds))
    pub.proc.send_signal(signal.SIGUSR1)


@pytest.fixture()
def stepped_publisher(publisher_factory, workdir, monkeypatch):
    site = workdir / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE.format(path=str(workdir / "step")))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")])))
    return publisher_factory(extra=["--spool-interval", "0.2", "--resync-interval", "1"])


def test_a_wall_clock_step_back_does_not_stall_retries(cluster, stepped_publisher, workdir):
    pub = stepped_publisher
    plugin = Plugin(pub.socket, pub.spool, workdir)
    claim = "step-back-net"
    cluster.claim(claim)
    uid = cluster.pod("step-back", [claim])
    add(plugin, "c-step-back", PodRef(cluster.namespace, "step-back", uid))
    # Not allocated yet: the ADD is retried with backoff.
    wait_for(lambda: (pub.status()["oldest_pending"] or {}).get("attempts", 0) >= 2, 60, "retries")
    step_wall_clock(pub, workdir, -3600)
    cluster.allocate(claim, [("nic", "nic0")], "step-back", uid)
    published(cluster, claim, 60)  # the retry came on schedule, not an hour later


def test_a_wall_clock_step_forward_does_not_prune_tombstones_early(cluster, stepped_publisher,
                                                                                  workdir):
    pub = stepped_publisher
    claim, pod = pod_ready(cluster, "step-fwd")
    late_add = wire_event("ADD", "c-step-fwd", pod, cni_result())  # stamped before the DEL
    dele = wire_event("DEL", "c-step-fwd", pod)
    assert request(pub.socket, event_request(dele))["ok"] is True
    wait_for(lambda: pub.status()["tombstones"] == 1, 30, "tombstone recorded")
    step_wall_clock(pub, workdir, 2 * limits.ORDER_HORIZON)
    before = resynced(pub, 60)["last_resync"]
    wait_for(lambda: (pub.status(brief=True)["last_resync"] or 0) > before, 30, "a resync after the step")
    assert pub.status()["tombstones"] == 1  # still guards against an older ADD arriving late
    assert request(pub.socket, event_request(late_add))["ok"] is True
    resynced(pub, 60)
    assert cluster.devices(claim) == []


# ---------------------------------------------------------------- item 12


def threads_of(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Threads:"):
            return int(line.split()[1])
    raise AssertionError("no Threads line")


def test_idle_connections_are_bounded_and_closed(publisher):
    pid = publisher.proc.pid
    baseline = threads_of(pid)
    conns = []
    try:
        for _ in range(150):
            conns.append(socket.create_connection(("127.0.0.1", publisher.port), timeout=5))
        time.sleep(1.0)  # let the server accept them all
        assert threads_of(pid) <= baseline + 2, (baseline, threads_of(pid))
        closed = set()

        def all_closed() -> bool:
            for i, c in enumerate(conns):
                if i in closed:
                    continue
                c.settimeout(0.01)
                try:
                    if c.recv(1) == b"":
                        closed.add(i)
                except (socket.timeout, BlockingIOError):
                    pass
                except OSError:  # reset: closed as well
                    closed.add(i)
            return len(closed) == len(conns)

        wait_for(all_closed, 4 * limits.HTTP_TIMEOUT + 30, "every idle connection closed by the server")
        assert threads_of(pid) <= baseline + 2
    finally:
        for c in conns:
            c.close()
    assert probe(publisher, "/healthz")[0] == 200
    assert publisher.metric("netclaim_http_connections_refused_total") > 0


# ---------------------------------------------------------------- item 17


def test_nothing_the_publisher_creates_is_readable_by_others(cluster, publisher_factory, workdir):
    old = os.umask(0o022)  # the DaemonSet's umask
    try:
        pub = publisher_factory()
    finally:
        os.umask(old)
    claim, pod = pod_ready(cluster, "modes")
    add(Plugin(pub.socket, pub.spool, workdir), "c-modes", pod)
    published(cluster, claim)
    paths = [Path(pub.state), Path(pub.socket).parent, Path(pub.socket)]
    paths += list(Path(pub.state).iterdir())
    if os.path.isdir(pub.spool):
        paths += [Path(pub.spool), *Path(pub.spool).iterdir()]
    names = {p.name for p in paths}
    assert {"journal.db", "journal.db-wal", "journal.db-shm"} <= names
    loose = {str(p): oct(stat.S_IMODE(p.lstat().st_mode)) for p in paths if p.lstat().st_mode & 0o077}
    assert loose == {}


# ---------------------------------------------------------------- health


def test_health_liveness_fails_while_the_journal_is_wedged(cluster, publisher_factory, workdir):
    pub = publisher_factory()
    claim, pod = pod_ready(cluster, "wedged")
    holder = hold_write_lock(os.path.join(pub.state, "journal.db"), limits.JOURNAL_WEDGED + 30)
    try:
        assert request(pub.socket, event_request(wire_event("ADD", "c-wedged", pod, cni_result())),
                       timeout=60)["ok"] is False  # the commit failed: a plugin would spool it
        code, body = wait_for(lambda: (lambda r: r if r[0] == 503 else None)(probe(pub, "/healthz")),
                              limits.JOURNAL_WEDGED + 25, "liveness failing")
        assert body.startswith("journal: writes failing") and "locked" in body
        assert probe(pub, "/readyz")[0] == 503
    finally:
        holder.wait(limits.JOURNAL_WEDGED + 60)
    wait_for(lambda: probe(pub, "/healthz")[0] == 200 and probe(pub, "/readyz")[0] == 200, 60, "healthy again")


def test_health_thread_past_its_restart_budget_fails_liveness(control_plane, workdir):
    from publisher.kube.calls import Credentials, Kube
    from publisher.observe.metrics import Metrics
    from publisher.service import Service, Settings

    kube = Kube(Credentials(control_plane.kubeconfig).loader(control_plane.kubeconfig, 2),
                credentials=Credentials(control_plane.kubeconfig))
    svc = Service(Settings(node_name="node-a", state_dir=str(workdir / "state"), spool_dir=str(workdir / "spool"),
                           workers=1, emit_events=False), kube, Metrics())
    try:
        svc.start()
        wait_for(lambda: svc.ready()[0], 30, "ready")

        def crash() -> None:
            raise RuntimeError("boom")

        svc._spawn("probe", crash)
        ok, why = wait_for(lambda: (lambda r: r if not r[0] else None)(svc.live()),
                           limits.THREAD_RESTART_BUDGET * limits.WORKER_RESTART_DELAY + 30, "liveness failing")
        assert why.startswith("thread: probe crashed ") and f"in {limits.THREAD_RESTART_WINDOW:.0f}s" in why
        assert not svc.ready()[0] and svc.ready()[1].startswith("thread: ")
    finally:
        svc.stop()


def test_times_of_another_boot_are_rebased_at_open(workdir):
    """Times stored on another boot's CLOCK_BOOTTIME mean nothing now: due at once; its marks go."""
    import sqlite3

    from publisher.clock import node_seconds
    from publisher.journal.store import Journal

    pod = PodRef("ns", "pod", "uid")
    j = Journal(str(workdir / "state"))
    j.append(wire_event("ADD", "c1", pod, cni_result()))
    [p] = j.ready(0, 1, node_seconds())
    j.reschedule(p.seq, node_seconds() + 10 * 86400, "waiting")  # far away on this boot's clock
    dele = wire_event("DEL", "c2", pod)
    j.finish(None, tombstone=(dele.attachment, dele.order), dirty=[("ns", "claim")])
    j.retry_dirty("ns", "claim", node_seconds() + 10 * 86400)
    j.close()
    db = sqlite3.connect(str(workdir / "state" / "journal.db"), isolation_level=None)
    db.execute("UPDATE meta SET value='another-boot' WHERE key='boot_id'")
    db.execute("UPDATE tombstones SET recorded=?", (node_seconds() + 10 * 86400,))  # "recorded" in its future
    db.close()
    j = Journal(str(workdir / "state"))
    now = node_seconds()
    assert [q.seq for q in j.ready(0, 1, now)] == [p.seq]  # due at once
    assert j.dirty_claims(now) == [("ns", "claim", 1)]
    # Marks of another boot protect nothing once its events change nothing (the boot rule).
    assert j.order_marks() == (0, 0)
    j.close()
