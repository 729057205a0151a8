"""Pods started while netclaim is not in the chain, in the real single-node cluster (scripts/cluster.sh).

netclaim is installed the operator way (`scripts/cluster.sh install-netclaim`:
scripts/install.sh chains it and records its driver in the drivers file, the
publisher runs as a node service reading that file, as the systemd unit does;
no driver name is passed to it by hand, so a node whose install path does not
tell the publisher its drivers fails here), then taken out of the primary
conflist by hand, as a primary CNI's installer does when it rewrites its file. A pod with a claim
started now never runs netclaim, so its claim gets no status: the publisher
must say so (a NetclaimNotChained Warning Event on the pod and the
netclaim_pods_unchained metrics), and must say nothing about a pod without a
claim started at the same time, nor about a claimed pod started while
netclaim was chained.

NETCLAIM_UNCHAINED_CLUSTER_DIR picks the cluster dir (default: nc-cl-unch in the temp dir);
NETCLAIM_CLUSTER_KEEP=1 leaves it up.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from deploylib import REPO, own_cluster

sys.path.insert(0, str(REPO / "scripts" / "harness"))
from runtime.realcluster import (RealCluster, cluster_sh, entries_of, ready_status,  # noqa: E402
                                 wait_until)

pytestmark = pytest.mark.containerd

REASON = "NetclaimNotChained"


@pytest.fixture(scope="module")
def cluster() -> Iterator[RealCluster]:
    yield from own_cluster("NETCLAIM_UNCHAINED_CLUSTER_DIR", os.path.join(tempfile.gettempdir(), "nc-cl-unch"))


def without_netclaim(raw: bytes) -> bytes:
    """The conflist as a primary CNI's installer writes it back: its own plugins only."""
    doc = json.loads(raw)
    doc["plugins"] = [p for p in doc["plugins"] if p.get("type") != "netclaim"]
    return json.dumps(doc, indent=2).encode()


def write_atomically(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.test")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def runtime_chain(cluster: RealCluster) -> list[str]:
    """The plugin types of the chain containerd has loaded now (it reloads the conf dir on inotify)."""
    info = json.loads(cluster.crictl("info", "-o", "json"))
    config = info.get("cniconfig") or (info.get("config") or {}).get("cniconfig") or {}
    types = []
    for network in config.get("Networks") or []:
        for plugin in (network.get("Config") or {}).get("Plugins") or []:
            types.append((plugin.get("Network") or {}).get("type", ""))
    return types


def warnings_about(cluster: RealCluster, ns: str, pod: str) -> list[dict[str, Any]]:
    events = json.loads(cluster.kubectl("get", "events.events.k8s.io", "-n", ns, "-o", "json"))["items"]
    return [e for e in events if e.get("reason") == REASON and (e.get("regarding") or {}).get("name") == pod]


def metrics_text(cluster: RealCluster) -> str:
    port = (Path(cluster.dir) / "nc" / "metrics.port").read_text().strip()
    return urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()


def metric(cluster: RealCluster, name: str) -> float:
    text = metrics_text(cluster)
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} not exposed:\n{text[-2000:]}")


def gets(cluster: RealCluster) -> float:
    """GET requests the publisher made so far (any answer)."""
    return sum(float(line.split()[-1]) for line in metrics_text(cluster).splitlines()
               if line.startswith("netclaim_api_requests_total{") and 'verb="get"' in line)


def unchained_check(cluster: RealCluster) -> dict[str, Any]:
    """The publisher's `status` of its unchained check: the drivers it looks for, or why it is off."""
    from publisher.cli import request_status

    return request_status(str(Path(cluster.dir) / "nc" / "publisher.sock"))["unchained_check"]


def test_pod_started_while_unchained_gets_a_warning_event_and_a_metric(cluster: RealCluster) -> None:
    env = {k: v for k, v in cluster.env.items() if k not in ("NETCLAIM_DRIVER_NAMES", "NETCLAIM_DRIVERS_FILE")}
    cluster_sh("install-netclaim", env={**env, "NETCLAIM_UNCHAINED_GRACE": "3"})
    conflist = Path(cluster.values["NETCLAIM_CONFLIST"])
    chained = conflist.read_bytes()
    ns = cluster.namespace(f"unch-{uuid.uuid4().hex[:6]}")
    try:
        # While chained: a claimed pod gets its status and no warning.
        wait_until(lambda: "netclaim" in runtime_chain(cluster), "containerd to load the chain with netclaim")
        cluster.claim(ns, "early-net")
        cluster.pod(ns, "early", claim="early-net")
        cluster.wait_running(ns, "early", timeout=180)
        wait_until(lambda: [e for e in entries_of(cluster.claim_yaml(ns, "early-net"), cluster.driver)
                            if ready_status(e) == "True"], "the status of the pod started while chained", timeout=90)

        # The primary's installer rewrites its conflist without netclaim; the runtime follows.
        write_atomically(conflist, without_netclaim(chained))
        wait_until(lambda: "netclaim" not in runtime_chain(cluster), "containerd to reload the chain without netclaim")
        gets_before = gets(cluster)
        cluster.pod(ns, "plain")  # no claim: must cost nothing
        cluster.wait_running(ns, "plain", timeout=180)
        cluster.claim(ns, "late-net")
        cluster.pod(ns, "late", claim="late-net")
        cluster.wait_running(ns, "late", timeout=180)

        [event] = wait_until(lambda: warnings_about(cluster, ns, "late"), "the NetclaimNotChained Event", timeout=90)
        assert event["type"] == "Warning"
        assert event["regarding"]["kind"] == "Pod" and event["regarding"]["uid"]
        assert event["related"]["name"] == "late-net"
        assert "late-net" in event["note"] and cluster.driver in event["note"]
        assert entries_of(cluster.claim_yaml(ns, "late-net"), cluster.driver) == []  # what the Event explains
        # The driver reached the publisher by the install path alone: the drivers file install.sh wrote,
        # read when it changed (the publisher was started before install.sh ran).
        assert unchained_check(cluster)["driver_names"] == [cluster.driver]
        assert metric(cluster, "netclaim_pods_unchained") == 1
        assert metric(cluster, "netclaim_pods_unchained_reported_total") == 1
        # The pods judged before it: started while chained, or without a claim, cost no warning, and the
        # pod without a claim no request: the one GET is the unchained pod's claim, read once.
        assert warnings_about(cluster, ns, "early") == []
        assert warnings_about(cluster, ns, "plain") == []
        assert gets(cluster) - gets_before == 1

        # The pod goes away: the gauge follows; the total keeps the count.
        cluster.delete_pod(ns, "late")
        wait_until(lambda: metric(cluster, "netclaim_pods_unchained") == 0, "the gauge to drop the deleted pod")
        assert metric(cluster, "netclaim_pods_unchained_reported_total") == 1
        assert len(warnings_about(cluster, ns, "late")) == 1
    finally:
        for pod in ("early", "plain", "late"):
            cluster.kubectl("delete", "pod", pod, "-n", ns, "--wait=true", "--timeout=120s", check=False, timeout=180)
        cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)
        if b'"netclaim"' not in conflist.read_bytes():
            write_atomically(conflist, chained)  # uninstall-netclaim removes it the installer's way
        cluster.sh("uninstall-netclaim")
