"""Fixtures for the end-to-end tests: a real containerd, the real publisher, the real API server.

The containerd harness (scripts/harness/runtime/) is started once per session; each
test gets its own netclaim conflist (installed with scripts/install.sh and
pointing at its own publisher socket and spool), its own publisher process,
namespace and Node, so tests cannot see each other's state. Anything that
cannot start makes the test fail with the reason; nothing is skipped.
"""

from __future__ import annotations

import os
import sys
import uuid
from pathlib import Path
from typing import Iterator

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts" / "harness"))

from runtime.cni_conf import NetclaimInstall  # noqa: E402
from runtime.harness import Harness, ensure_packages  # noqa: E402
from runtime.identity import publisher_kubeconfig  # noqa: E402
from runtime.publisher import PublisherProcess  # noqa: E402

from runtime.cluster import Cluster  # noqa: E402

DRIVER = "e2e.netclaim.example.com"


@pytest.fixture(scope="session")
def harness() -> Iterator[Harness]:
    try:
        ensure_packages()
        h = Harness(prefix="nce2e")
    except Exception as exc:  # the reason is the test result
        pytest.fail(f"containerd harness could not be prepared: {exc}", pytrace=False)
    try:
        h.start()
    except Exception as exc:
        tail = h.containerd.log_tail()
        h.close()
        pytest.fail(f"containerd harness could not start: {exc}\n{tail}", pytrace=False)
    yield h
    h.close()


@pytest.fixture
def plain_chain(harness: Harness) -> Path:
    """bridge + host-local only: the chain without netclaim."""
    conflist = harness.stage_conflist("plain")
    harness.activate(conflist)
    return conflist


@pytest.fixture
def node_dirs(tmp_path: Path) -> Iterator[NetclaimInstall]:
    """Per-test socket, spool, state and plugin log for one netclaim installation."""
    short = Path(f"/run/nce2e-{os.urandom(3).hex()}")  # unix socket paths must stay short
    short.mkdir(mode=0o700)
    yield NetclaimInstall(
        driver_name=DRIVER,
        socket=short / "publisher.sock",
        spool_dir=tmp_path / "spool",
        state_dir=tmp_path / "state",
        log_file=tmp_path / "plugin.log",
        python=str(REPO / ".venv" / "bin" / "python"),
    )
    for child in sorted(short.rglob("*"), reverse=True):
        child.unlink() if not child.is_dir() else child.rmdir()
    short.rmdir()


@pytest.fixture
def netclaim_chain(harness: Harness, node_dirs: NetclaimInstall) -> Path:
    """bridge + host-local + netclaim (installed by scripts/install.sh), active in containerd."""
    try:
        conflist = harness.stage_conflist(f"netclaim-{os.urandom(3).hex()}", node_dirs)
    except RuntimeError as exc:
        pytest.fail(str(exc), pytrace=False)
    harness.activate(conflist)
    return conflist


@pytest.fixture
def cluster(control_plane, api_client) -> Iterator[Cluster]:
    """A namespace and a Node of our own on the real API server, deleted afterwards."""
    c = Cluster(api_client, DRIVER, suffix=uuid.uuid4().hex[:6])
    c.setup()
    yield c
    c.teardown()


@pytest.fixture
def publisher(control_plane, cluster: Cluster, node_dirs: NetclaimInstall, tmp_path: Path) -> Iterator[PublisherProcess]:
    """The real netclaim-publisher for this test's node, socket and spool.

    It runs with the least-privilege identity the project ships, not admin: the
    shipped RBAC (conf/kubernetes) applied, and a token of serviceaccount
    netclaim-system/netclaim-publisher bound to this test's Node.
    """
    try:
        kubeconfig = publisher_kubeconfig(
            cluster.api, server=control_plane.server, ca_file=control_plane.ca_file, node=cluster.node,
            driver=DRIVER, path=tmp_path / "publisher.kubeconfig",
        )
    except Exception as exc:
        pytest.fail(f"the publisher's node identity could not be made: {exc}", pytrace=False)
    proc = PublisherProcess(
        node_name=cluster.node,
        kubeconfig=kubeconfig,
        socket=node_dirs.socket,
        state_dir=node_dirs.state_dir,
        spool_dir=node_dirs.spool_dir,
        log_file=tmp_path / "publisher.log",
    )
    try:
        proc.start()
    except RuntimeError as exc:
        proc.stop()
        pytest.fail(f"netclaim-publisher could not start: {exc}", pytrace=False)
    yield proc
    proc.stop()
