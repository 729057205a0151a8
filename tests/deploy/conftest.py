"""Fixtures for the deployment tests (helpers live in deploylib.py)."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

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
