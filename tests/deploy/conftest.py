"""Fixtures for the deployment tests (helpers live in deploylib.py)."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture()
def tmp_root() -> Iterator[Path]:
    """A private temp dir removed even when the test fails."""
    path = Path(tempfile.mkdtemp(prefix="nc-deploy-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
