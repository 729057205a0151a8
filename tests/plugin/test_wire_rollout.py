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

import importlib
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from cni_plugin import wire

from .conftest import REPO, Chain, run_plugin

# The last commit before publishers tolerated unknown fields and kept newer versions (0.1.0).
PREVIOUS_RELEASE = "9cdf7f85d28f3af5e9a2499690ae2d730cd5552a"
PREVIOUS_PACKAGE = "cni_plugin_previous"
# The first publisher that ignores (and counts) event fields it does not know.
TOLERANT_SINCE = "e18489429f648f43aec4bca4013513a60475cade"


def _git(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, timeout=60)


def _wire_of(commit: str, package_name: str, tmp_path_factory: pytest.TempPathFactory) -> ModuleType:
    """The cni_plugin package of `commit`, under another name, from git history."""
    if _git("cat-file", "-e", f"{commit}^{{commit}}").returncode != 0:
        pytest.fail(f"commit {commit} is not in this checkout's history: this test needs a full clone "
                    "(git fetch --unshallow)")
    listing = _git("ls-tree", "--name-only", commit, "cni_plugin/")
    assert listing.returncode == 0, listing.stderr
    root = tmp_path_factory.mktemp(package_name)
    package = root / package_name
    package.mkdir()
    for name in listing.stdout.decode().split():
        if name.endswith(".py"):
            shown = _git("show", f"{commit}:{name}")
            assert shown.returncode == 0, shown.stderr
            (package / Path(name).name).write_bytes(shown.stdout)
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
    return [Path(p) for p in wire.list_spool(chain.dirs.spool)]


def test_the_previous_publisher_reads_every_event_this_plugin_spools(chain: Chain, previous_wire) -> None:
    files = _spool_every_verb(chain)
    ours = [wire.read_spool(str(p)) for p in files]
    assert [e.op for e in ours] == ["ADD", "CHECK", "CHECK", "DEL", "GC"]
    assert ours[2].check_error and all(e.has_pod_identity for e in ours[:4])
    _read_by(previous_wire, files)


def test_the_first_tolerant_publisher_reads_the_events_of_a_chain_with_a_device_id(chain: Chain,
                                                                                  tolerant_wire) -> None:
    files = _spool_every_verb(chain, runtimeConfig={"deviceID": "05:00.1"})
    ours = [wire.read_spool(str(p)) for p in files]
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
