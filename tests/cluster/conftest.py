"""One real single-node Kubernetes per test session (scripts/cluster.sh), netclaim installed the operator way.

The cluster is etcd + kube-apiserver + kube-controller-manager + kube-scheduler
+ kubelet + containerd 2.x + the Kubernetes DRA test driver, with netclaim
chained into containerd's CNI conflist by scripts/install.sh and the publisher
running as a node service with the shipped RBAC and a Node-bound token. If any
of it cannot start, every test here FAILS with the reason (never skipped).

NETCLAIM_CLUSTER_DIR picks the cluster's directory (default /tmp/nc-cltest);
a cluster already up there is reused and left up. NETCLAIM_CLUSTER_KEEP=1 keeps
the one started here.
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

from runtime.realcluster import ClusterError, RealCluster, cluster_sh  # noqa: E402


@pytest.fixture(scope="session")
def real_cluster() -> Iterator[RealCluster]:
    if os.geteuid() != 0:
        pytest.fail("the real cluster needs root (kubelet, containerd, cgroups)", pytrace=False)
    directory = os.environ.get("NETCLAIM_CLUSTER_DIR", "/tmp/nc-cltest")
    env = {**os.environ, "NETCLAIM_CLUSTER_DIR": directory}
    try:
        reused = "kubelet: running" in cluster_sh("status", env=env)
    except ClusterError:
        reused = False
    try:
        cluster = RealCluster.up(directory, env)
    except ClusterError as exc:
        try:
            cluster_sh("down", env=env)
        finally:
            pytest.fail(f"the real cluster could not start: {exc}", pytrace=False)
    try:
        cluster.sh("install-netclaim")
    except ClusterError as exc:
        if not reused:
            cluster.down()
        pytest.fail(f"netclaim could not be installed in the real cluster: {exc}", pytrace=False)
    yield cluster
    if not reused and not os.environ.get("NETCLAIM_CLUSTER_KEEP"):
        cluster.down()


@pytest.fixture
def ns(real_cluster: RealCluster) -> Iterator[str]:
    """A fresh namespace per test (with its default ServiceAccount), deleted afterwards."""
    name = real_cluster.namespace(f"t-{uuid.uuid4().hex[:6]}")
    yield name
    real_cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)
