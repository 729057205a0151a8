"""Rollout order: the previous release's publisher must read every event this plugin sends.

Publishers roll out first; plugins follow (the chain keeper installs the new plugin, or a
systemd publisher runs next to a keeper-installed plugin, or a DaemonSet surges). So for a
while, and again after a downgrade, the publisher on the node is the previous release's.
This test loads the previous release's `cni_plugin` package from git history (no network)
and has its `wire` read what the real plugin of this tree spools for ADD, CHECK (clean and
drifted), DEL and GC, with pod identity.

PREVIOUS_RELEASE is the oldest publisher this plugin must still talk to. Move it forward to
a release's commit once that release has shipped and the one before it is no longer
supported; a new field or version the pinned publisher cannot read then fails here, which
is the point: it may only be sent once every supported publisher reads it.

The one exception is the device ID (`device_id`), sent only by chains that carry one (a meta
plugin's `deviceID`): 0.1.0's publisher refuses every field it does not know, so such chains
need the publisher upgraded first, the documented order (docs/publisher.md "Versions, rollout
and downgrades"). What this plugin sends for them is held to TOLERANT_SINCE, the first
publisher that ignores a field it does not know.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
import re
import shutil
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import pytest

from cni_plugin.wire import event as wire_event
from cni_plugin.wire import spool as wire_spool
from cni_plugin.launcher import install

from .conftest import REPO, Chain, Dirs, run_plugin

sys.path.append(str(Path(__file__).resolve().parents[1] / "publisher"))
from publisher_testkit import Publisher, unreachable_kubeconfig, wait_until

# The last commit before publishers tolerated unknown fields and kept newer versions (0.1.0).
PREVIOUS_RELEASE = "9cdf7f85d28f3af5e9a2499690ae2d730cd5552a"
PREVIOUS_PACKAGE = "cni_plugin_previous"
# The first publisher that ignores (and counts) event fields it does not know.
TOLERANT_SINCE = "e18489429f648f43aec4bca4013513a60475cade"


def _git(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, timeout=60)


def _package_of(commit: str, package_name: str, root: Path) -> Path:
    """The cni_plugin package of `commit`, from git history, written to root/package_name."""
    if _git("cat-file", "-e", f"{commit}^{{commit}}").returncode != 0:
        pytest.fail(f"commit {commit} is not in this checkout's history: this test needs a full clone "
                    "(git fetch --unshallow)")
    listing = _git("ls-tree", "--name-only", commit, "cni_plugin/")
    assert listing.returncode == 0, listing.stderr
    package = root / package_name
    package.mkdir()
    for name in listing.stdout.decode().split():
        if name.endswith(".py"):
            shown = _git("show", f"{commit}:{name}")
            assert shown.returncode == 0, shown.stderr
            (package / Path(name).name).write_bytes(shown.stdout)
    return package


def _wire_of(commit: str, package_name: str, tmp_path_factory: pytest.TempPathFactory) -> ModuleType:
    """The `wire` module of `commit`'s cni_plugin package, imported under another name."""
    root = tmp_path_factory.mktemp(package_name)
    package = _package_of(commit, package_name, root)
    sys.path.insert(0, str(root))
    try:
        module = importlib.import_module(f"{package_name}.wire")
    finally:
        sys.path.remove(str(root))
    assert module.__file__.startswith(str(package))
    return module


@pytest.fixture(scope="module")
def previous_wire(tmp_path_factory: pytest.TempPathFactory) -> ModuleType:
    return _wire_of(PREVIOUS_RELEASE, PREVIOUS_PACKAGE, tmp_path_factory)


@pytest.fixture(scope="module")
def tolerant_wire(tmp_path_factory: pytest.TempPathFactory) -> ModuleType:
    return _wire_of(TOLERANT_SINCE, "cni_plugin_tolerant", tmp_path_factory)


def _spool_every_verb(chain: Chain, **extra: object) -> list[Path]:
    """What the real plugin spools (no publisher listens) for each verb, with pod identity."""
    prev = chain.bridge_add()
    rc, out, err = chain.netclaim("ADD", prev, interface={"mtu": 1400}, **extra)
    assert rc == 0, out + err
    result = json.loads(out)
    assert chain.netclaim("CHECK", result, interface={"mtu": 1400})[:2] == (0, "")
    assert chain.netclaim("CHECK", result, interface={"mtu": 1450})[0] == 1  # drift: check_error set
    assert chain.netclaim("DEL", result, interface={"mtu": 1400})[:2] == (0, "")
    conf = chain.netclaim_conf(None)
    conf["cniVersion"] = "1.1.0"
    conf["cni.dev/valid-attachments"] = [{"containerID": chain.container_id, "ifname": "eth0"}]
    rc, out, err = run_plugin(chain.exe, "GC", conf, container_id="", ifname="")
    assert (rc, out) == (0, ""), out + err
    return [Path(p) for p in wire_spool.list_spool(chain.dirs.spool)]


def test_the_previous_publisher_reads_every_event_this_plugin_spools(chain: Chain, previous_wire) -> None:
    files = _spool_every_verb(chain)
    ours = [wire_spool.read_spool(str(p)) for p in files]
    assert [e.op for e in ours] == ["ADD", "CHECK", "CHECK", "DEL", "GC"]
    assert ours[2].check_error and all(e.has_pod_identity for e in ours[:4])
    _read_by(previous_wire, files)


def test_the_first_tolerant_publisher_reads_the_events_of_a_chain_with_a_device_id(chain: Chain,
                                                                                  tolerant_wire) -> None:
    files = _spool_every_verb(chain, runtimeConfig={"deviceID": "05:00.1"})
    ours = [wire_spool.read_spool(str(p)) for p in files]
    assert ours[0].op == "ADD" and ours[0].device_id == "0000:05:00.1"
    assert "device_id" not in tolerant_wire.Event.FIELDS
    _read_by(tolerant_wire, files)


def _read_by(previous_wire: ModuleType, files: list[Path]) -> None:
    """Each spooled event is read by that publisher's wire as sent, on the spool and the socket."""
    for path in files:
        sent = json.loads(path.read_bytes())
        theirs = previous_wire.read_spool(str(path))  # raises if the previous publisher would refuse it
        seen = theirs.to_dict()
        for name in previous_wire.Event.FIELDS:  # and it reads every field it knows as sent
            if name in sent:
                assert seen[name] == sent[name], (sent["op"], name, seen[name], sent[name])
        # The socket carries the same object in a request frame.
        frame = previous_wire.decode_body(json.dumps({"kind": "event", "event": sent}).encode())
        assert previous_wire.Event.from_dict(frame["event"]).event_id == sent["event_id"]


# ---------------------------------------------------------------- the real plugins of other releases, this publisher
#
# A publisher of this release meets the plugin of release N-1 (after `helm rollback` of the plugin only, a
# systemd publisher upgraded before its plugin) and of release N+1 (a maxSurge rollout, a downgraded
# publisher). Each plugin runs for real (its own process, on a real netns behind bridge + host-local) and
# hands its events to a real publisher (a subprocess whose API server is unreachable: intake, journal and
# spool work without it, which is all these tests look at), through the socket (the publisher runs) and
# through the spool (the publisher starts after the plugin ran).

CHANNELS = ["socket", "spool"]
VERBS = ["ADD", "CHECK", "DEL", "GC"]
# What the N+1 plugin adds that this publisher does not know.
NEWER_FIELD = "numa_node"


@pytest.fixture(scope="module")
def previous_plugin_exe(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The previous release's plugin from git history, run as a runtime runs it (launcher: python -IS)."""
    root = tmp_path_factory.mktemp("plugin-previous")
    package = _package_of(PREVIOUS_RELEASE, "cni_plugin", root)
    assert '__version__ = "0.1.0"' in (package / "__init__.py").read_text()
    return install(str(root / "netclaim"), python=sys.executable, root=str(root))


@pytest.fixture(scope="module")
def newer_plugin_exe(tmp_path_factory: pytest.TempPathFactory) -> str:
    """This tree's plugin as the next release may be: its wire version one higher (and read up to it), and
    one optional field more in every event. A copy of the package, patched, run for real."""
    root = tmp_path_factory.mktemp("plugin-newer")
    package = root / "cni_plugin"
    shutil.copytree(REPO / "cni_plugin", package, ignore=shutil.ignore_patterns("__pycache__"))
    source = (package / "wire" / "event.py").read_text()
    for name in ("WIRE_VERSION", "WIRE_VERSION_MAX"):
        source, count = re.subn(rf"^{name} = \d+$", f"{name} = {wire_event.WIRE_VERSION_MAX + 1}", source,
                                flags=re.MULTILINE)
        assert count == 1, f"cni_plugin/wire/event.py no longer sets {name} on one line of its own"
    source += (f"\n\n_to_dict = Event.to_dict\n\n\ndef _newer_to_dict(self):\n"
               f"    return {{**_to_dict(self), {NEWER_FIELD!r}: 0}}\n\n\nEvent.to_dict = _newer_to_dict\n")
    (package / "wire" / "event.py").write_text(source)
    return install(str(root / "netclaim"), python=sys.executable, root=str(root))


@dataclass
class Node:
    """A plugin's chain on a real netns and this release's publisher on the same socket and spool."""

    chain: Chain
    publisher: Publisher

    def start_publisher(self) -> Publisher:
        return self.publisher.start()

    def journaled(self) -> list[tuple[str, str]]:
        """(event id, op) of every event in the publisher's journal, in arrival order."""
        db = sqlite3.connect(f"file:{self.publisher.state}/journal.db?mode=ro", uri=True, timeout=10)
        try:
            return list(db.execute("SELECT event_id, op FROM events ORDER BY seq"))
        finally:
            db.close()

    def spool(self) -> list[str]:
        return sorted(os.listdir(self.publisher.spool))

    def rejected(self, reason: str) -> float:
        return self.publisher.metric(f'netclaim_events_rejected_total{{reason="{reason}"}}')


def _node(exe: str, netns, dirs: Dirs, channel: str) -> Iterator[Node]:
    pub = Publisher(str(unreachable_kubeconfig(dirs.root)), dirs.root / "pub")
    os.makedirs(pub.spool, mode=0o700)
    chain = Chain(exe, netns, dataclasses.replace(dirs, socket=pub.socket, spool=pub.spool))
    node = Node(chain, pub)
    try:
        if channel == "socket":
            node.start_publisher()
        yield node
    finally:
        pub.kill()
        chain.teardown()


@pytest.fixture(params=CHANNELS)
def previous_node(request, previous_plugin_exe: str, netns, dirs: Dirs) -> Iterator[Node]:
    yield from _node(previous_plugin_exe, netns, dirs, request.param)


@pytest.fixture(params=CHANNELS)
def newer_node(request, newer_plugin_exe: str, netns, dirs: Dirs) -> Iterator[Node]:
    yield from _node(newer_plugin_exe, netns, dirs, request.param)


def _said(record: dict) -> str:
    """What a plugin log line says: `msg` now, `event` in 0.1.0's log."""
    return record.get("msg") or record.get("event") or ""


def _run_every_verb(node: Node) -> list[str]:
    """Runs ADD, CHECK, DEL and GC with the node's plugin; how each was handed off, by the plugin's log."""
    chain = node.chain
    prev = chain.bridge_add()
    rc, out, err = chain.netclaim("ADD", prev)
    assert rc == 0, out + err
    result = json.loads(out)
    assert chain.netclaim("CHECK", result)[:2] == (0, "")
    assert chain.netclaim("DEL", result)[:2] == (0, "")
    conf = chain.netclaim_conf(None)
    conf["cniVersion"] = "1.1.0"
    conf["cni.dev/valid-attachments"] = [{"containerID": chain.container_id, "ifname": "eth0"}]
    rc, out, err = run_plugin(chain.exe, "GC", conf, container_id="", ifname="")
    assert (rc, out) == (0, ""), out + err
    done = {_said(r): str(r.get("handoff")) for r in chain.dirs.log_records() if _said(r).endswith(" done")}
    assert list(done) == [f"{op} done" for op in VERBS], chain.dirs.log_records()
    return list(done.values())


def _spooled(node: Node) -> list[tuple[str, str]]:
    """(event id, op) of each spool file, in the order the plugin wrote them (their names)."""
    bodies = [json.loads((Path(node.publisher.spool) / n).read_text()) for n in node.spool()]
    return [(b["event_id"], b["op"]) for b in bodies]


def test_this_publisher_journals_every_event_of_the_previous_plugin(previous_node: Node) -> None:
    """Plugin N-1, publisher N: nothing is lost or set aside, on the socket or through the spool."""
    node = previous_node
    if node.publisher.proc:  # the socket: each event acked, so journaled by the time the plugin exits
        assert _run_every_verb(node) == ["acked"] * len(VERBS)
        assert node.spool() == []
        assert [op for _, op in node.journaled()] == VERBS
    else:  # the spool: each event waits there for the publisher
        assert _run_every_verb(node) == ["spooled"] * len(VERBS)
        events = _spooled(node)
        assert [op for _, op in events] == VERBS
        node.start_publisher()
        wait_until("every spooled event of the previous plugin journaled", lambda: node.journaled() == events)
        wait_until("the spool emptied", lambda: node.spool() == [])
    assert node.rejected("bad_spool_file") == 0 and node.rejected("bad_event") == 0
    assert node.publisher.metric("netclaim_wire_unknown_fields_total") == 0
    assert node.publisher.proc.poll() is None


def test_this_publisher_keeps_every_event_of_a_newer_plugin_and_keeps_running(newer_node: Node) -> None:
    """Plugin N+1 (a newer wire version, a field this publisher does not know), publisher N: the socket
    refuses each event with a reason (the plugin spools it), the spool keeps each for a newer publisher;
    nothing is journaled, nothing set aside as malformed, and the publisher stays up and ready."""
    node = newer_node
    assert _run_every_verb(node) == ["spooled"] * len(VERBS)
    if node.publisher.proc:  # the socket: each refusal is in the plugin's log, with the publisher's reason
        refusals = [r.get("socketError", "") for r in node.chain.dirs.log_records() if _said(r) == "event spooled"]
        assert len(refusals) == len(VERBS) and all(
            "newer" in r and "upgrade the publisher" in r for r in refusals), refusals
    else:
        node.start_publisher()
    events = _spooled(node)
    assert [op for _, op in events] == VERBS
    wait_until("each newer event counted", lambda: node.rejected("newer_version") == len(VERBS))
    node.publisher.wait_ready()
    status = node.publisher.status()
    assert status["spool_files"] == len(VERBS), status
    assert _spooled(node) == events, "a newer event was not kept as the plugin wrote it"
    assert not [n for n in node.spool() if n.endswith(".bad")]
    kept = [json.loads((Path(node.publisher.spool) / n).read_text()) for n in node.spool()]
    assert all(e["version"] == wire_event.WIRE_VERSION_MAX + 1 and NEWER_FIELD in e for e in kept), kept
    assert node.rejected("bad_spool_file") == 0 and node.journaled() == []
    assert node.publisher.proc.poll() is None
