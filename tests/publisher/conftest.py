"""Fixtures for the publisher tests: a test namespace on the real API server and a
publisher subprocess that is always stopped at teardown (even when a test fails)."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest

from publisher.kube.calls import Credentials, Kube
from publisher.observe.metrics import Metrics
from publisher.service import Service, Settings
from lossy_proxy import LossyApiProxy
from publisher_testkit import Cluster, Plugin, Publisher, suffix


@pytest.fixture()
def workdir():
    path = Path(tempfile.mkdtemp(prefix="pubtest-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture()
def cluster(api_client):
    c = Cluster(api_client, f"pub-{suffix()}").setup()
    yield c
    c.teardown()


@pytest.fixture()
def publisher_factory(control_plane, workdir):
    """Start publishers on demand; every one started here is killed at teardown."""
    started: list[Publisher] = []

    def make(start: bool = True, extra: list[str] | None = None, sub: str = "p",
             kubeconfig: str | None = None) -> Publisher:
        d = workdir / sub
        d.mkdir(exist_ok=True)
        p = Publisher(kubeconfig or control_plane.kubeconfig, d, extra=list(extra or []))
        started.append(p)
        return p.start() if start else p

    yield make
    for p in started:
        p.kill()


@pytest.fixture()
def publisher(publisher_factory):
    return publisher_factory()


@pytest.fixture()
def plugin(publisher, workdir):
    return Plugin(publisher.socket, publisher.spool, workdir)


@pytest.fixture()
def service(control_plane, workdir):
    """A publisher Service in this process (real journal, real API server), not started:
    tests drive its rules, reconciler and health directly."""
    kube = Kube(Credentials(control_plane.kubeconfig).loader(control_plane.kubeconfig, 4),
                credentials=Credentials(control_plane.kubeconfig))
    svc = Service(Settings(node_name="node-a", state_dir=str(workdir / "state"), spool_dir=str(workdir / "spool"),
                           workers=1, emit_events=False), kube, Metrics())
    yield svc
    svc.stop()


@pytest.fixture()
def proxy(control_plane, workdir):
    """A TLS proxy in front of the real API server that can lose answers (tests/publisher/lossy_proxy.py)."""
    p = LossyApiProxy(control_plane.server, control_plane.ca_file, workdir).start()
    yield p
    p.stop()
