"""A local account that binds the publisher's probe port and the keeper's first cannot stop it or speak for the keeper.

Ports above 1024 on the node's loopback are any uid's to bind. A squatter (here a real process
under uid 65534, started before the publisher) answers `200 chained conflist=x` on both the
publisher's probe port and the chain keeper's. The publisher must still start and publish,
say which uid holds its port, count it, take the port once it is free, and its heartbeat Lease
must never say `chained: yes` on the squatter's word. The Lease's chained is what the keeper
says on its unix socket (root's), which the squatter cannot serve.

Real parts: the publisher process, the real plugin, kube-apiserver and etcd, a real unprivileged uid.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from peers import squatting
from publisher_testkit import DRIVER, Plugin, add, free_port, suffix, wait_until

from cni_plugin.wire.event import PodRef
from publisher.keeper.keeper import KeeperStatus
from publisher.observe.metrics import HealthServer
from publisher.observe.nodelease import ANNOTATION, ask_keeper

pytestmark = pytest.mark.controlplane

def get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except OSError as exc:
        return 0, type(exc).__name__


def exec_probe(socket_path: str, path: str) -> subprocess.CompletedProcess[str]:
    """The chart's exec probe command (conf/helm/netclaim/templates/_helpers.tpl), with this interpreter."""
    return subprocess.run([sys.executable, "-I", "-m", "publisher.observe.localprobe", socket_path, path],
                          check=False, capture_output=True, text=True, timeout=60)


def lease_state(api_client: Any, namespace: str, node: str) -> dict[str, Any] | None:
    try:
        lease = client.CoordinationV1Api(api_client).read_namespaced_lease(f"netclaim-node-{node}", namespace)
    except client.ApiException:
        return None
    return json.loads((lease.metadata.annotations or {}).get(ANNOTATION) or "null")


@pytest.mark.controlplane
def test_a_publisher_whose_probe_port_another_account_holds_publishes_names_the_holder_and_takes_the_port_later(
        cluster, publisher_factory, api_client, workdir) -> None:
    probe, keeper = free_port(), free_port()
    with squatting(probe, keeper):
        # Positive control: the squatter answers as a chained keeper would (what --keeper-address used to believe).
        assert get(keeper, "/readyz") == (200, "chained conflist=x\n")
        pub = publisher_factory(extra=["--probe-address", f"127.0.0.1:{probe}", "--keeper-address",
                                       f"127.0.0.1:{keeper}", "--node-lease-namespace", cluster.namespace,
                                       "--node-lease-period", "2", "--probe-socket", str(workdir / "probe.sock")])
        claim, uid = cluster.pod_with_claim("squat", [("nic", "nic0")])
        add(Plugin(pub.socket, pub.spool, workdir), "c" + suffix(), PodRef(cluster.namespace, "squat", uid))
        cluster.wait_devices(claim, lambda d: {e["device"] for e in d if e["driver"] == DRIVER} == {"nic0"})

        said = f"probe port 127.0.0.1:{probe} is held by uid 65534"
        wait_until("the log to name the squatter's uid", lambda: said in pub.logs())
        assert pub.logs().count(said) == 1, "once per streak, not once per try"
        taken = 'netclaim_listen_address_taken_total{listener="probe"}'
        wait_until("the tries counted", lambda: pub.metric(taken) >= 2)

        state = wait_until("the heartbeat Lease", lambda: lease_state(api_client, cluster.namespace, pub.node))
        assert state["chained"] != "yes", state
        assert "not believed" in state["chain"], state
        assert get(probe, "/readyz") == (200, "chained conflist=x\n"), "the squatter still holds the probe port"
        # The chart's exec probe asks the publisher itself, over its socket: the squatter is not in the way.
        for path in ("/healthz", "/readyz"):
            said = exec_probe(str(workdir / "probe.sock"), path)
            assert (said.returncode, said.stdout) == (0, "ok\n"), said

    # The squatter gone: the publisher's own probe listener opens there (within the backoff's cap).
    wait_until("the publisher's probe listener", lambda: get(probe, "/readyz") == (200, "ok\n"), timeout=60)
    assert pub.proc is not None and pub.proc.poll() is None


def test_the_heartbeat_believes_the_keepers_socket_from_root_only_and_never_a_tcp_port() -> None:
    """What --keeper-socket and --keeper-address make of the keeper's answer, without an API server."""
    status = KeeperStatus("10-calico.conflist", True)
    shared = Path(tempfile.mkdtemp(prefix="nc-keeper-sock-"))  # a dir every account may write: not the chart's
    try:
        shared.chmod(0o1777)
        port = free_port()
        fake = shared / "impostor.sock"
        with squatting(port, str(fake)):
            over_tcp = ask_keeper(f"127.0.0.1:{port}")  # what the chart's --keeper-address asked, and believed
            assert over_tcp.chained != "yes" and "not believed" in over_tcp.detail, over_tcp
            on_socket = ask_keeper(str(fake))
            assert (on_socket.chained, on_socket.keeper) == ("unknown", "unreachable"), on_socket
            assert "served by uid 65534" in on_socket.detail, on_socket
            refused = exec_probe(str(fake), "/healthz")
            assert refused.returncode == 1 and "uid 65534" in refused.stdout, refused

        real = shared / "keeper-probe.sock"
        server = HealthServer(str(real), None, lambda: (True, status.line()), probes_only=True)
        server.start()
        try:  # Positive control: the keeper's own answer on its socket is believed.
            view = ask_keeper(str(real))
            assert (view.chained, view.conflist, view.keeper) == ("yes", "10-calico.conflist", "answered"), view
            assert exec_probe(str(real), "/readyz").returncode == 0
        finally:
            server.stop()
        assert not real.exists(), "a stopped listener leaves no socket behind"
    finally:
        shutil.rmtree(shared, ignore_errors=True)
