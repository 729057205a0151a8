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
from pathlib import Path
from typing import Iterator

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts" / "harness"))

from cluster_kit import cluster_with_netclaim, fresh_namespace, need_root  # noqa: E402
from runtime.realcluster import RealCluster  # noqa: E402


@pytest.fixture(scope="session")
def real_cluster() -> Iterator[RealCluster]:
    need_root()
    directory = os.environ.get("NETCLAIM_CLUSTER_DIR", "/tmp/nc-cltest")
    env = {**os.environ, "NETCLAIM_CLUSTER_DIR": directory}
    yield from cluster_with_netclaim(env, lambda: RealCluster.up(directory, env), "the real cluster")


@pytest.fixture
def ns(real_cluster: RealCluster) -> Iterator[str]:
    """A fresh namespace per test (with its default ServiceAccount), deleted afterwards."""
    yield from fresh_namespace(real_cluster, "t")
