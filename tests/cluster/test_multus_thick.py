"""Multus thick without `chrootDir`: netclaim runs where the publisher cannot hear it, and that is reported.

Multus 4's thick plugin runs the delegates inside multus-daemon. Its quick start
mounts the host's root at /hostroot and sets `chrootDir: /hostroot`, so the
delegates run in the host's mount namespace. Without it they run in the
daemon's container: netclaim finds no publisher socket there, spools into a
directory of the container the publisher never reads, and (failurePolicy
Ignore) the pod starts with no status for its claim. The harness runs that
misconfiguration for real (`up --with-multus --multus-thick --multus-no-chroot`:
the daemon in a mount namespace of its own, tests/cluster/multus_kit.py), with the
publisher told its driver, so that its unchained check is on.

NETCLAIM_MULTUS_NOCHROOT_CLUSTER_DIR picks the cluster's directory (default
nc-munc under the temp dir); NETCLAIM_CLUSTER_KEEP=1 keeps it.
"""

from __future__ import annotations

import json
import os
import tempfile
import urllib.request
import uuid
from pathlib import Path
from typing import Any, Iterator

import pytest

from multus_kit import multus_cluster
from runtime import multinet  # noqa: E402  (conftest puts scripts/harness on sys.path)
from runtime.multinet import Attachment
from runtime.realcluster import RealCluster, entries_of, wait_until

REASON = "NetclaimNotChained"


@pytest.fixture(scope="module")
def ncluster() -> Iterator[RealCluster]:
    directory = os.environ.get("NETCLAIM_MULTUS_NOCHROOT_CLUSTER_DIR", os.path.join(tempfile.gettempdir(), "nc-munc"))
    yield from multus_cluster("thick-no-chroot", directory, what=" without chrootDir",
                              env={"NETCLAIM_DRIVER_NAMES": "net.example.com", "NETCLAIM_UNCHAINED_GRACE": "3"})


def metric(cluster: RealCluster, name: str) -> float:
    port = (Path(cluster.dir) / "nc" / "metrics.port").read_text().strip()
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} not exposed:\n{text[-2000:]}")


def warnings_about(cluster: RealCluster, ns: str, pod: str) -> list[dict[str, Any]]:
    events = json.loads(cluster.kubectl("get", "events.events.k8s.io", "-n", ns, "-o", "json"))["items"]
    return [e for e in events if e.get("reason") == REASON and (e.get("regarding") or {}).get("name") == pod]


def spooled(spool: Path, sandbox: str) -> list[dict[str, Any]]:
    """The events of one sandbox in a spool directory (the plugin's hand-off files the publisher ingests)."""
    events = [json.loads(f.read_text()) for f in sorted(spool.glob("*.event.json"))] if spool.is_dir() else []
    return [e for e in events if e.get("container_id") == sandbox]


def test_thick_multus_without_chroot_dir_is_reported_not_silently_lost(ncluster: RealCluster) -> None:
    """A pod with eth0 and a macvlan network, both netclaim's: every ADD runs netclaim inside multus-daemon's
    mount namespace, which spools it where the publisher never looks. The publisher reports the pod
    (NetclaimNotChained Warning on it, netclaim_pods_unchained 1); the claim has no entry."""
    ns = ncluster.namespace(f"nc-{uuid.uuid4().hex[:6]}")
    try:
        cls = ncluster.values["NETCLAIM_DEVICE_CLASS"]
        ncluster.apply(multinet.claim_template(ns, "two", ["nic", "macvlan"], cls),
                       multinet.pod(ns, "p", [Attachment("macvlan", "net1")],
                                    {"net": {"resourceClaimTemplateName": "two"}}))
        ncluster.wait_running(ns, "p")
        sandbox = ncluster.sandbox(ns, "p")["id"]

        # Where the ADDs went: netclaim ran in the daemon's mount namespace (its root, seen through /proc),
        # found no publisher socket there and spooled both ADDs into that namespace's spool directory.
        # (A Running pod's sandbox network is set up: every ADD has returned.)
        nc = Path(ncluster.dir) / "nc"
        daemon_root = Path(f"/proc/{(Path(ncluster.dir) / 'multus.pid').read_text().strip()}/root")
        inside = daemon_root / nc.relative_to("/")
        adds = [e for e in spooled(inside / "spool", sandbox) if e.get("op") == "ADD"]
        assert sorted(e["ifname"] for e in adds) == ["eth0", "net1"], adds
        # ... and nothing of it on the host: no spool file, no plugin log line, and the publisher never heard of it.
        assert spooled(nc / "spool", sandbox) == []
        for log in (nc / "plugin.log", Path(ncluster.dir) / "publisher.log"):
            assert not log.exists() or sandbox not in log.read_text(), f"{log} names sandbox {sandbox}"

        [event] = wait_until(lambda: warnings_about(ncluster, ns, "p"), "the NetclaimNotChained Event", timeout=90)
        claim = ncluster.pod_claim(ns, "p")
        assert event["type"] == "Warning"
        assert event["related"]["name"] == claim
        assert "Multus thick without chrootDir" in event["note"], event["note"]
        assert metric(ncluster, "netclaim_pods_unchained") == 1
        assert metric(ncluster, "netclaim_pods_unchained_reported_total") == 1
        assert entries_of(ncluster.claim_yaml(ns, claim), ncluster.driver) == []
    finally:
        ncluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)
