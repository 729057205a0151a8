"""Fixtures for the endpoints controller's tests on the real API server (tests/publisher/endpoints/endpoints_kit.py)."""

from __future__ import annotations

from typing import Callable, Iterator

import pytest
from endpoints_kit import Controller


@pytest.fixture()
def endpoints_controller(control_plane, cluster, workdir) -> Iterator[Callable[..., Controller]]:
    """Start controllers for the test's namespace; every one is killed at teardown."""
    started: list[Controller] = []

    def make(identity: str = "a", extra: list[str] | None = None) -> Controller:
        c = Controller(control_plane.kubeconfig, cluster.namespace, workdir, identity, list(extra or [])).start()
        started.append(c)
        return c

    yield make
    for c in started:
        c.kill()


