"""Clusters with Multus as the node's primary CNI, in either of Multus 4's deployments, for module fixtures.

thin: the Multus plugin itself is the node's plugin and runs the delegates.
thick (Multus 4's default): multus-shim is the node's plugin and forwards every
call to multus-daemon, which runs the delegates chrooted into the host's root
(`chrootDir: /hostroot`, as Multus's quick start sets it); the harness runs the
daemon as its DaemonSet's container would, in a mount namespace of its own
(scripts/harness/cluster/multus.sh).
"""

from __future__ import annotations

import os
import tempfile
from typing import Iterator

import pytest

from runtime import multinet  # noqa: E402  (conftest puts scripts/harness on sys.path)
from runtime.realcluster import ClusterError, RealCluster, cluster_sh, parse_env

MODES = ("thin", "thick")


def mode_dir(env_name: str, default: str, mode: str) -> str:
    """One mode's cluster directory: $env_name (else `default` under the temp dir), `-k` added for thick."""
    base = os.environ.get(env_name, os.path.join(tempfile.gettempdir(), default))
    return base if mode == "thin" else f"{base}-k"


def multus_cluster(mode: str, directory: str, *up_args: str, env: dict[str, str] | None = None,
                   what: str = "") -> Iterator[RealCluster]:
    """`up --with-multus` in `mode` ("thin", "thick", "thick-no-chroot"), netclaim installed the operator way with
    eth0 reporting under the primary request; `up_args` go to `up` (e.g. --with-vf-driver), `env` to every
    cluster.sh call. Down afterwards unless NETCLAIM_CLUSTER_KEEP. Fails, never skips, when anything cannot
    start. In a module fixture: `yield from multus_cluster(...)`."""
    if os.geteuid() != 0:
        pytest.fail("the real cluster needs root (kubelet, containerd, cgroups)", pytrace=False)
    flags = {"thin": (), "thick": ("--multus-thick",),
             "thick-no-chroot": ("--multus-thick", "--multus-no-chroot")}[mode]
    env = {**os.environ, "NETCLAIM_CLUSTER_DIR": directory, "NETCLAIM_REQUEST": multinet.PRIMARY_REQUEST,
           **(env or {})}
    try:
        cluster = RealCluster(directory, parse_env(cluster_sh("up", "--with-multus", *flags, *up_args, env=env)), env)
        cluster.sh("install-netclaim")
    except ClusterError as exc:
        try:
            cluster_sh("down", env=env)
        finally:
            pytest.fail(f"the real cluster with Multus {mode}{what} could not start: {exc}", pytrace=False)
    yield cluster
    if not os.environ.get("NETCLAIM_CLUSTER_KEEP"):
        cluster.down()
