"""The chain keeper keeps the node chained while another account holds its probe port, and says who.

A local account (here a real process under uid 65534) binds the keeper's probe port first and
answers `200 chained conflist=x`. The real keeper process must still chain netclaim, re-chain it
when the primary CNI rewrites its conflist, name the uid in its log, count the tries, and serve
its readiness on its unix socket, where the publisher's heartbeat and the chart's exec probes ask.
"""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

import pytest
from peers import squatting
from test_chain_keeper import PRIMARY, Node, get, keeper_log, metrics_port, running_keeper, wait

from publisher.observe.nodelease import ask_keeper


def exec_probe(socket_path: Path, path: str) -> subprocess.CompletedProcess[str]:
    """The chart's exec probe command (conf/helm/netclaim/templates/_helpers.tpl), with this interpreter."""
    return subprocess.run([sys.executable, "-I", "-m", "publisher.observe.localprobe", str(socket_path), path],
                          check=False, capture_output=True, text=True, timeout=60)


@pytest.fixture()
def node(tmp_root: Path) -> Node:
    return Node(tmp_root)


def taken(metrics: int) -> float:
    """netclaim_listen_address_taken_total{listener="probe"} on the keeper's /metrics."""
    found = re.search(r'^netclaim_listen_address_taken_total{listener="probe"} ([0-9.e+]+)$',
                      get(metrics, "/metrics")[1], re.MULTILINE)
    return float(found.group(1)) if found else 0.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_keeper_whose_probe_port_another_account_holds_keeps_chaining_and_names_the_holder(
        node: Node, plugin_binary: Path, tmp_root: Path) -> None:
    port = free_port()
    probe_socket = Path(tempfile.mkdtemp(prefix="nc-run-", dir=tmp_root)) / "keeper-probe.sock"
    node.write("10-calico.conflist", PRIMARY)
    with squatting(port):
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as resp:  # the squatter answers
            assert resp.read() == b"chained conflist=x\n"
        with running_keeper(node, plugin_binary, tmp_root, f"--probe-address=127.0.0.1:{port}",
                            f"--probe-socket={probe_socket}", "--metrics-address=127.0.0.1:0") as proc:
            wait(lambda: node.chained("10-calico.conflist"), "the first chaining", proc, tmp_root)
            node.write("10-calico.conflist", PRIMARY)  # the primary CNI rewrites its conflist without netclaim
            wait(lambda: node.chained("10-calico.conflist"), "netclaim chained again", proc, tmp_root)

            said = f"probe port 127.0.0.1:{port} is held by uid 65534"
            wait(lambda: said in keeper_log(tmp_root), "the log to name the squatter's uid", proc, tmp_root)
            assert keeper_log(tmp_root).count(said) == 1, "once per streak, not once per try"
            metrics = metrics_port(proc, tmp_root)
            wait(lambda: taken(metrics) >= 2, "the tries counted", proc, tmp_root)

            view = ask_keeper(str(probe_socket))  # what the publisher's heartbeat reads
            assert (view.chained, view.conflist) == ("yes", "10-calico.conflist"), view
            for path in ("/healthz", "/readyz"):
                assert exec_probe(probe_socket, path).returncode == 0, exec_probe(probe_socket, path)
            assert proc.poll() is None
