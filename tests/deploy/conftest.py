"""Fixtures for the deployment tests (helpers live in deploylib.py)."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture()
def tmp_root() -> Iterator[Path]:
    """A private temp dir removed even when the test fails."""
    path = Path(tempfile.mkdtemp(prefix="nc-deploy-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="session")
def plugin_binary() -> Path:
    """The real self-contained plugin (scripts/build-plugin.sh, cached)."""
    proc = subprocess.run([str(REPO / "scripts" / "build-plugin.sh")], capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, f"scripts/build-plugin.sh failed: {proc.stderr[-2000:]}"
    return Path(proc.stdout.strip().splitlines()[-1])


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Iterator[None]:
    """Keep each test's call report on its item: a fixture's teardown can then tell whether the test passed
    (tests/deploy/test_kubernetes_versions.py records the cases that passed on each Kubernetes minor)."""
    outcome = yield
    if call.when == "call":
        item.rep_call = outcome.get_result()  # type: ignore[attr-defined]


# ---------------------------------------------------------------- the release tests' cluster

RELEASE_CLUSTER = "release_cluster"
# The last collected test that uses it, and how to bring it down (set while it is up).
_release_cluster_last: list[pytest.Item] = []
_release_cluster_down: list[Callable[[], None]] = []


@pytest.fixture(scope="session")
def release_cluster() -> Iterator[Any]:
    """One real cluster for the release tests of both modules: test_release.py installs the release's archive
    and upgrades on it, test_release_registry.py installs the pushed release from its registry. Starting it
    once saves a cluster start; it is brought down (unless NETCLAIM_CLUSTER_KEEP) right after the last test
    that uses it, not at the end of the session, so the tests after those do not share the machine with it.
    NETCLAIM_RELEASE_CLUSTER_DIR picks its dir (default: nc-cl-release in the temp dir)."""
    from deploylib import own_cluster

    lifetime = own_cluster("NETCLAIM_RELEASE_CLUSTER_DIR", os.path.join(tempfile.gettempdir(), "nc-cl-release"))
    cluster = next(lifetime)
    _release_cluster_down.append(lambda: next(lifetime, None))
    yield cluster
    while _release_cluster_down:
        _release_cluster_down.pop()()


def pytest_collection_finish(session: pytest.Session) -> None:
    users = [item for item in session.items if RELEASE_CLUSTER in getattr(item, "fixturenames", ())]
    _release_cluster_last[:] = users[-1:]


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """After the last test that uses the release cluster, bring it down."""
    if _release_cluster_last and item is _release_cluster_last[0]:
        while _release_cluster_down:
            _release_cluster_down.pop()()
