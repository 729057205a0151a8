"""The chain keeper among files it does not own: a conflist another installer keeps as a symlink, a FIFO
or an oversized file in the conf dir, a name planted in the CNI bin dir.

The conf dir and the bin dir are shared with the primary CNI's installer, config management and
whatever else runs as root on the node. The keeper must never write through a link, never replace
someone else's link with a copy, never block on a file that is not a regular one, and never read a
file whole however large it is: each of these stops the keeper (the init container never finishes)
or silently leaves the node with a stale network config. The real keeper runs on a scratch conf dir
and bin dir, as the CLI (`chain-keeper --once`, `--uninstall`) or as its own code in this process
where the process id matters.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
from pathlib import Path

import pytest
from deploylib import DRIVER, python_env
from test_chain_keeper import PRIMARY, Node, keeper_argv

from publisher import limits

LINK = "../managed/calico.conflist"  # where config management keeps the primary's conflist
ONCE_WITHIN = 60.0  # seconds: `--once` takes about one; a keeper that blocks on a file never ends


@pytest.fixture()
def node(tmp_root: Path) -> Node:
    return Node(tmp_root)


def run_keeper(node: Node, plugin: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(keeper_argv(node, plugin, *extra), check=False, capture_output=True, text=True,
                          env=python_env(), timeout=ONCE_WITHIN)


def managed_primary(node: Node, doc: dict) -> tuple[Path, Path]:
    """The primary conflist as some installs keep it: a link in the conf dir to a file maintained elsewhere."""
    managed = node.net_d.parent / "managed"
    managed.mkdir()
    real = managed / "calico.conflist"
    real.write_text(json.dumps(doc, indent=1))
    link = node.net_d / "10-calico.conflist"
    link.symlink_to(LINK)
    return link, real


def keeper_entry() -> dict:
    from publisher.keeper.conflist import build_entry

    return build_entry([f"driverName={DRIVER}", "request=nic"], empty_is_default=True)


# ---------------------------------------------------------------- a symlinked primary conflist


def test_a_symlinked_primary_stays_a_link_and_the_keeper_says_why_it_is_not_chained(node: Node, plugin_binary: Path
                                                                                    ) -> None:
    link, real = managed_primary(node, PRIMARY)
    kept = real.read_bytes()
    once = run_keeper(node, plugin_binary, "--once")
    assert once.returncode == 0, once.stderr
    # The link is still the link: the other installer's next version of its file reaches the runtime.
    assert link.is_symlink() and os.readlink(link) == LINK, "the keeper replaced the link with a copy"
    assert real.read_bytes() == kept, "the keeper wrote through the link"
    assert sorted(os.listdir(node.net_d)) == ["10-calico.conflist"]  # no copy, no backup beside it
    assert "not chained conflist=10-calico.conflist" in once.stderr, once.stderr
    assert f"10-calico.conflist is a symlink to {LINK}, maintained elsewhere" in once.stderr, once.stderr
    real.write_text(json.dumps(dict(PRIMARY, mtu=1400), indent=1))  # the other installer's update
    assert json.loads(link.read_text())["mtu"] == 1400
    # Control: the same primary as a regular file is chained.
    link.unlink()
    node.write("10-calico.conflist", PRIMARY)
    assert run_keeper(node, plugin_binary, "--once").returncode == 0
    assert node.chained("10-calico.conflist")


def test_a_symlinked_primary_the_keeper_cannot_resolve_is_still_the_primary(node: Node, plugin_binary: Path) -> None:
    """In the DaemonSet the keeper sees only the conf dir: a link to a file elsewhere on the node dangles there,
    yet the runtime (on the node) resolves it and uses it. The keeper must not chain the next file instead."""
    target = "/etc/cni/managed-by-config-management/calico.conflist"  # not there for this process
    (node.net_d / "10-calico.conflist").symlink_to(target)
    other = node.write("20-other.conflist", PRIMARY)
    once = run_keeper(node, plugin_binary, "--once")
    assert once.returncode == 0, once.stderr
    assert (node.net_d / "20-other.conflist").read_bytes() == other, "the keeper chained a file the runtime skips"
    assert os.readlink(node.net_d / "10-calico.conflist") == target
    assert f"10-calico.conflist is a symlink to {target}, maintained elsewhere" in once.stderr, once.stderr


def test_a_symlinked_primary_chained_where_it_is_maintained_counts_and_uninstall_leaves_it(
        node: Node, plugin_binary: Path) -> None:
    """The operator put netclaim's entry into the file config management maintains: the keeper reports the
    node chained and writes nothing; the hand uninstall leaves the link a link and the operator's file as is."""
    chained = dict(PRIMARY, plugins=[*PRIMARY["plugins"], {"type": "netclaim", "driverName": DRIVER,
                                                           "request": "nic"}])
    link, real = managed_primary(node, chained)
    kept = real.read_bytes()
    once = run_keeper(node, plugin_binary, "--once")
    assert once.returncode == 0, once.stderr
    assert "chain status status=chained conflist=10-calico.conflist" in once.stderr, once.stderr
    assert link.is_symlink() and os.readlink(link) == LINK, "the keeper replaced the link with a copy"
    assert real.read_bytes() == kept
    assert (node.bin_d / "netclaim").read_bytes() == plugin_binary.read_bytes()
    gone = run_keeper(node, plugin_binary, "--uninstall")
    assert gone.returncode == 0, gone.stderr
    assert link.is_symlink() and os.readlink(link) == LINK, "uninstall replaced the link with a stripped copy"
    assert real.read_bytes() == kept
    assert "conflist left as it is" in gone.stderr and "maintained elsewhere" in gone.stderr, gone.stderr
    assert sorted(os.listdir(node.net_d)) == ["10-calico.conflist"]


def test_a_symlinked_primary_is_reported_once_as_a_warning_and_the_keeper_stays_ready(node: Node,
                                                                                    plugin_binary: Path) -> None:
    """The Warning Event (posted by the same recorder as ChainContested, on the Node) is asked for once, not on
    every poll; /readyz stays ready as for a reported contest: only the operator can change this node."""
    from publisher.keeper.keeper import ChainKeeper, KeeperConfig

    managed_primary(node, PRIMARY)
    notes: list[tuple[str, str]] = []
    keeper = ChainKeeper(KeeperConfig(conf_dir=node.net_d, bin_dir=node.bin_d, plugin_binary=plugin_binary,
                                      entry=keeper_entry()), report=lambda name, note: notes.append((name, note)))
    for _ in range(3):
        assert keeper.reconcile() is False
    assert len(notes) == 1, notes
    name, note = notes[0]
    assert name == "10-calico.conflist" and f"is a symlink to {LINK}, maintained elsewhere" in note, note
    ready, line = keeper.status.ready()
    assert ready and line.startswith("not chained conflist=10-calico.conflist problem="), line
    assert keeper.metrics.chained.labels("10-calico.conflist")._value.get() == 0


# ---------------------------------------------------------------- files that are not regular, or too large


def test_a_fifo_named_like_a_network_file_neither_hangs_the_keeper_nor_its_uninstall(node: Node,
                                                                                    plugin_binary: Path) -> None:
    original = node.write("10-calico.conflist", PRIMARY)
    fifo = node.net_d / "05-leftover.conf"  # sorts first: it must not be taken for the primary either
    os.mkfifo(fifo)
    once = run_keeper(node, plugin_binary, "--once")  # the old keeper blocked in open() for good
    assert once.returncode == 0, once.stderr
    assert node.chained("10-calico.conflist"), once.stderr
    gone = run_keeper(node, plugin_binary, "--uninstall")
    assert gone.returncode == 0, gone.stderr
    assert (node.net_d / "10-calico.conflist").read_bytes() == original
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)  # not the keeper's: left as it is


def test_a_network_file_over_the_size_cap_is_refused_without_reading_it_whole(node: Node,
                                                                             plugin_binary: Path) -> None:
    padded = dict(PRIMARY, padding="x" * (2 << 20))  # twice the cap; no conflist comes near it
    data = node.write("10-calico.conflist", padded)
    once = run_keeper(node, plugin_binary, "--once")
    assert once.returncode == 0, once.stderr
    assert (node.net_d / "10-calico.conflist").read_bytes() == data, "an oversized conflist was edited"
    assert "not chained conflist=10-calico.conflist" in once.stderr and "larger than" in once.stderr, once.stderr
    assert len(data) > limits.NETWORK_FILE_MAX
    # Control: the same file within the cap is chained.
    node.write("10-calico.conflist", dict(PRIMARY, padding="x" * 1000))
    assert run_keeper(node, plugin_binary, "--once").returncode == 0
    assert node.chained("10-calico.conflist")


# ---------------------------------------------------------------- names planted in the bin dir


def test_a_link_planted_at_a_temp_name_in_the_bin_dir_is_never_written_through(node: Node, plugin_binary: Path,
                                                                               tmp_root: Path) -> None:
    """The keeper's temp names were `.netclaim.<pid>.tmp` and `.netclaim-retired.<pid>.tmp`, opened without
    O_EXCL or O_NOFOLLOW; in a container the pid is 1. A link planted there made the keeper write the plugin
    (or the marker) into the link's target and then rename the link into place as the plugin."""
    from publisher.keeper.keeper import ChainKeeper, KeeperConfig

    outside = tmp_root / "outside"
    outside.write_bytes(b"not the keeper's\n")
    pid = os.getpid()  # the keeper's own code runs in this process
    for name in (f".netclaim.{pid}.tmp", f".netclaim-retired.{pid}.tmp"):
        (node.bin_d / name).symlink_to(outside)
    keeper = ChainKeeper(KeeperConfig(conf_dir=node.net_d, bin_dir=node.bin_d, plugin_binary=plugin_binary,
                                      entry=keeper_entry()))
    keeper.ensure_plugin()
    keeper.write_marker()
    assert outside.read_bytes() == b"not the keeper's\n", "the keeper wrote through a planted link"
    plugin, marker = node.bin_d / "netclaim", node.bin_d / ".netclaim-retired"
    for path, mode in ((plugin, 0o755), (marker, 0o644)):
        st = os.lstat(path)
        assert stat.S_ISREG(st.st_mode) and st.st_mode & 0o7777 == mode, (path, oct(st.st_mode))
    assert plugin.read_bytes() == plugin_binary.read_bytes()  # control: installed as ever
    assert json.loads(marker.read_bytes())["cacheDir"] == ""
    # Nothing of the keeper's own temp files is left behind.
    assert sorted(p.name for p in node.bin_d.iterdir() if not p.is_symlink()) == [".netclaim-retired", "netclaim"]
