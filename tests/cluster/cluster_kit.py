"""What the real-cluster fixtures of tests/cluster share: bringing a cluster up with netclaim installed,
a fresh namespace per test, and how a test reads netclaim's publisher from outside.

A cluster already up in the fixture's directory is reused and left up; one started here goes down at the
end unless NETCLAIM_CLUSTER_KEEP is set. Anything that cannot start FAILS the tests with the reason, never
skips them.
"""

from __future__ import annotations

import json
import os
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from runtime.realcluster import ClusterError, RealCluster, cluster_sh  # conftest puts scripts/harness on sys.path

REPORTING_CONTROLLER = "netclaim.dev/publisher"  # publisher/observe/events.py


def need_root(parts: str = "kubelet, containerd, cgroups") -> None:
    """Fail (never skip) unless root: a real node's parts need it."""
    if os.geteuid() != 0:
        pytest.fail(f"the real cluster needs root ({parts})", pytrace=False)


def already_up(env: dict[str, str]) -> bool:
    """Whether a cluster runs in env's NETCLAIM_CLUSTER_DIR (it is then reused and left up)."""
    try:
        return "kubelet: running" in cluster_sh("status", env=env)
    except ClusterError:
        return False


def cluster_with_netclaim(env: dict[str, str], up: Callable[[], RealCluster], name: str, *,
                          check: Callable[[RealCluster], None] | None = None,
                          after_down: Callable[[RealCluster], None] | None = None) -> Iterator[RealCluster]:
    """`up()` a cluster in env's NETCLAIM_CLUSTER_DIR and `install-netclaim` into it; in a fixture:
    `yield from cluster_with_netclaim(...)`.

    `name` names it in a failure ("the real cluster with CRI-O"); `check` may refuse the cluster it got
    (ClusterError) before netclaim is installed; `after_down` runs once a cluster started here went down.
    """
    reused = already_up(env)
    try:
        cluster = up()
    except ClusterError as exc:
        try:
            if not reused:
                cluster_sh("down", env=env)
        finally:
            pytest.fail(f"{name} could not start: {exc}", pytrace=False)
    try:
        if check is not None:
            check(cluster)
        cluster.sh("install-netclaim")
    except ClusterError as exc:
        if not reused:
            cluster.down()
        pytest.fail(f"netclaim could not be installed in {name}: {exc}", pytrace=False)
    try:
        yield cluster
    finally:
        if not reused and not os.environ.get("NETCLAIM_CLUSTER_KEEP"):
            cluster.down()
            if after_down is not None:
                after_down(cluster)


def fresh_namespace(cluster: RealCluster, prefix: str) -> Iterator[str]:
    """A new namespace (with its default ServiceAccount) for one test, deleted afterwards without waiting;
    in a fixture: `yield from fresh_namespace(cluster, "t")`."""
    name = cluster.namespace(f"{prefix}-{uuid.uuid4().hex[:6]}")
    yield name
    cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


def netclaim_warnings(cluster: RealCluster, ns: str) -> list[str]:
    """The Warning Events netclaim's publisher posted in the namespace (on pods or claims): reason and note."""
    items = json.loads(cluster.kubectl("get", "events.events.k8s.io", "-n", ns, "-o", "json"))["items"]
    return [f"{e.get('reason')}: {e.get('note')}" for e in items
            if e.get("type") == "Warning" and e.get("reportingController") == REPORTING_CONTROLLER]


def publisher_metric(cluster: RealCluster, name: str) -> float:
    """A counter of the publisher's /metrics (summed over its labels when `name` has none)."""
    port = (Path(cluster.dir) / "nc" / "metrics.port").read_text().strip()
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    total = 0.0
    for line in text.splitlines():
        key, _, value = line.rpartition(" ")
        if key == name or ("{" not in name and key.startswith(name + "{")):
            total += float(value)
    return total
