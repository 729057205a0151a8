"""A re-install that starts while the old release's keeper is still cleaning up keeps its node working.

`helm uninstall` and at once `helm install` again: the old pod's chain keeper
(A) has proof that its DaemonSet is gone and cleans the node, while the new
pod's init container (B, `chain-keeper --once`) installs the plugin and
chains it, and its publisher makes its socket and journal. Real parts: the
real kube-apiserver (tests/conftest.py) with a real DaemonSet that is deleted,
so A's own owner watch sees it go and A decides "uninstall" as in a cluster;
the real keeper processes A, B's init and B's long-running keeper, with the
node lock in the state dir as the chart passes it; a real unix socket and a
journal file for B's publisher, made when the kubelet would start it (after
B's init container exited). A is held (`--test-hold`, a file the test
removes) at the two points where B can land: before A's cleanup starts, and
after A unchained but before it removes plugin and dirs.
"""

from __future__ import annotations

import contextlib
import json
import re
import signal
import socket
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from deploylib import DRIVER, netclaim_publisher_bin, python_env, terminate
from test_chain_keeper import PRIMARY, wait

pytestmark = pytest.mark.controlplane

NAMESPACE = "netclaim-reinstall"
CONFLIST = "10-calico.conflist"


@dataclass
class NodeDirs:
    """A scratch node: CNI dirs and the chart's two hostPaths."""

    root: Path

    def __post_init__(self) -> None:
        for d in (self.net_d, self.bin_d, self.run, self.state):
            d.mkdir(parents=True)

    @property
    def net_d(self) -> Path:
        return self.root / "etc" / "cni" / "net.d"

    @property
    def bin_d(self) -> Path:
        return self.root / "opt" / "cni" / "bin"

    @property
    def run(self) -> Path:
        return self.root / "run" / "netclaim"

    @property
    def state(self) -> Path:
        return self.root / "var" / "lib" / "netclaim"

    @property
    def journal(self) -> Path:
        return self.state / "publisher" / "journal.sqlite"

    @property
    def socket(self) -> Path:
        return self.run / "publisher.sock"

    def chained(self) -> bool:
        try:
            plugins = json.loads((self.net_d / CONFLIST).read_text())["plugins"]
        except (FileNotFoundError, ValueError):
            return False
        return [p["type"] for p in plugins].count("netclaim") == 1


class Publisher:
    """B's publisher as the node sees it: a listening unix socket and a journal."""

    def __init__(self, node: NodeDirs) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(str(node.socket))
        self.sock.listen(1)
        node.journal.parent.mkdir(parents=True, exist_ok=True)
        node.journal.write_bytes(b"SQLite format 3\x00 (B's journal)")

    def close(self) -> None:
        self.sock.close()


def keeper_argv(node: NodeDirs, plugin: Path, *extra: str) -> list[str]:
    """The chart's keeper arguments, on the scratch node."""
    return [str(netclaim_publisher_bin()), "chain-keeper", f"--cni-conf-dir={node.net_d}",
            f"--cni-bin-dir={node.bin_d}", f"--plugin-binary={plugin}", f"--driver-name={DRIVER}",
            "--request=nic", f"--plugin-socket={node.socket}", f"--plugin-spool-dir={node.state}/spool",
            "--cni-cache-dir=", f"--lock-dir={node.state}", "--poll-interval=0.2", "--log-format=text", *extra]


@contextlib.contextmanager
def process(argv: list[str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    with log.open("ab") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=python_env())
        try:
            yield proc
        finally:
            terminate(proc)


def text(log: Path) -> str:
    return log.read_text(errors="replace") if log.exists() else ""


@pytest.fixture()
def reaper() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Processes stopped at the end whatever happened."""
    procs: list[subprocess.Popen[bytes]] = []
    yield procs
    for proc in procs:
        terminate(proc)


@pytest.fixture()
def daemonset(api_client: client.ApiClient) -> Iterator[str]:
    """A's own DaemonSet (deleted by the test: the uninstall)."""
    core, apps = client.CoreV1Api(api_client), client.AppsV1Api(api_client)
    try:
        core.create_namespace({"metadata": {"name": NAMESPACE}})
    except ApiException as exc:
        if exc.status != 409:
            raise
    name = f"netclaim-{uuid.uuid4().hex[:6]}"
    apps.create_namespaced_daemon_set(NAMESPACE, {
        "metadata": {"name": name},
        "spec": {"selector": {"matchLabels": {"app": name}},
                 "template": {"metadata": {"labels": {"app": name}},
                              "spec": {"containers": [{"name": "keeper", "image": "local/pause:1"}]}}}})
    yield name
    with contextlib.suppress(ApiException):
        apps.delete_namespaced_daemon_set(name, NAMESPACE)


def uninstall_a(node: NodeDirs, plugin: Path, control_plane: Any, api_client: client.ApiClient, ds: str,
                hold: Path | None, point: str, reaper: list[subprocess.Popen[bytes]]
                ) -> tuple[subprocess.Popen[bytes], Path]:
    """Start keeper A, wait until it chained and watches its DaemonSet, delete the DaemonSet, SIGTERM A."""
    log = node.root / "keeper-a.log"
    extra = [f"--kubeconfig={control_plane.kubeconfig}", f"--daemonset={ds}", f"--namespace={NAMESPACE}",
             f"--cleanup-dir={node.run}", f"--cleanup-dir={node.state}"]
    if hold is not None:
        hold.touch()
        extra.append(f"--test-hold={point}={hold}")
    out = log.open("ab")
    proc = subprocess.Popen(keeper_argv(node, plugin, *extra), stdout=out, stderr=subprocess.STDOUT,
                            env=python_env())
    reaper.append(proc)
    out.close()
    wait(lambda: node.chained() and "state=present" in text(log), "A chained and watching its DaemonSet",
         proc, timeout=60)
    client.AppsV1Api(api_client).delete_namespaced_daemon_set(ds, NAMESPACE)
    wait(lambda: "state=gone" in text(log), "A's watch seeing its DaemonSet deleted", proc, timeout=60)
    proc.send_signal(signal.SIGTERM)
    return proc, log


def test_positive_control_without_a_reinstall_the_uninstall_removes_everything(
        tmp_root: Path, plugin_binary: Path, control_plane: Any, api_client: client.ApiClient,
        daemonset: str, reaper: list[subprocess.Popen[bytes]]) -> None:
    node = NodeDirs(tmp_root)
    original = json.dumps(PRIMARY, indent=1).encode()
    (node.net_d / CONFLIST).write_bytes(original)
    (node.state / "spool").mkdir()
    (node.state / "spool" / "1-x.event.json").write_text("{}")
    proc, log = uninstall_a(node, plugin_binary, control_plane, api_client, daemonset, None, "", reaper)
    assert proc.wait(60) == 0, text(log)
    assert (node.net_d / CONFLIST).read_bytes() == original
    assert not (node.bin_d / "netclaim").exists()
    assert list(node.run.iterdir()) == [] and list(node.state.iterdir()) == [], text(log)  # lock files too


@pytest.mark.parametrize("point", ["before-cleanup", "after-unchain"])
def test_a_reinstall_during_the_uninstall_ends_chained_with_its_plugin_journal_and_socket(
        tmp_root: Path, plugin_binary: Path, control_plane: Any, api_client: client.ApiClient,
        daemonset: str, point: str, reaper: list[subprocess.Popen[bytes]]) -> None:
    node = NodeDirs(tmp_root)
    (node.net_d / CONFLIST).write_text(json.dumps(PRIMARY, indent=1))
    hold = tmp_root / "hold"
    keeper_a, log_a = uninstall_a(node, plugin_binary, control_plane, api_client, daemonset, hold, point,
                                   reaper)
    wait(lambda: hold.with_name("hold.reached").exists(), f"A held at {point}", keeper_a, timeout=60)

    # The re-install's pod: its init container first; the kubelet starts the publisher once it exited.
    log_b = tmp_root / "init-b.log"
    publisher: Publisher | None = None
    with process(keeper_argv(node, plugin_binary, "--once"), log_b) as init_b:
        wait(lambda: init_b.poll() is not None or "waiting for the node lock" in text(log_b),
             "B's init container to install, or to wait for A", timeout=60)
        if init_b.poll() is not None:
            publisher = Publisher(node)
        hold.unlink()  # A goes on with its uninstall
        assert keeper_a.wait(60) == 0, text(log_a)
        assert init_b.wait(60) == 0, text(log_b)
    try:
        publisher = publisher or Publisher(node)
        assert (node.bin_d / "netclaim").exists(), f"A's uninstall removed B's plugin\n{text(log_a)}"
        assert node.chained(), text(log_a)
        assert node.socket.exists(), f"A's uninstall removed B's socket\n{text(log_a)}"
        assert node.journal.exists(), f"A's uninstall removed B's journal\n{text(log_a)}"
        # B's long-running keeper gets the lock (A is gone) and keeps the node chained.
        log_k = tmp_root / "keeper-b.log"
        with process(keeper_argv(node, plugin_binary, f"--cleanup-dir={node.run}", f"--cleanup-dir={node.state}"),
                     log_k) as keeper_b:
            wait(lambda: re.search(r"chain status .*\bchained conflist=", text(log_k)) is not None,
                 "B's keeper chaining", keeper_b, timeout=60)
        assert (node.bin_d / "netclaim").exists() and node.chained()
        assert node.socket.exists() and node.journal.exists()
    finally:
        publisher.close()


def test_a_rollouts_new_pod_takes_the_node_from_the_running_keeper_which_then_removes_nothing(
        tmp_root: Path, plugin_binary: Path, control_plane: Any, api_client: client.ApiClient,
        daemonset: str, reaper: list[subprocess.Popen[bytes]]) -> None:
    """maxSurge: the new pod's init container must not wait for the old keeper (whose pod is deleted only once
    the new one is ready); the old keeper steps down, and on its SIGTERM it removes nothing."""
    node = NodeDirs(tmp_root)
    (node.net_d / CONFLIST).write_text(json.dumps(PRIMARY, indent=1))
    log_a = tmp_root / "keeper-a.log"
    a_argv = keeper_argv(node, plugin_binary, f"--kubeconfig={control_plane.kubeconfig}", f"--daemonset={daemonset}",
                         f"--namespace={NAMESPACE}", f"--cleanup-dir={node.run}", f"--cleanup-dir={node.state}")
    with process(a_argv, log_a) as keeper_a:
        wait(lambda: node.chained() and "state=present" in text(log_a), "A chained and watching its DaemonSet",
             keeper_a, timeout=60)
        log_b = tmp_root / "init-b.log"
        with process(keeper_argv(node, plugin_binary, "--once"), log_b) as init_b:
            wait(lambda: init_b.poll() is not None, "the new pod's init container to finish", timeout=60)
            assert init_b.returncode == 0, text(log_b)
        assert "stepping down" in text(log_a), text(log_a)
        log_k = tmp_root / "keeper-b.log"
        with process(keeper_argv(node, plugin_binary), log_k) as keeper_b:
            wait(lambda: re.search(r"chain status .*\bchained conflist=", text(log_k)) is not None,
                 "B's keeper chaining", keeper_b, timeout=60)
            # Only B keeps the chain now: a rewrite of the primary without netclaim is undone by B.
            (node.net_d / CONFLIST).write_text(json.dumps(PRIMARY, indent=2))
            wait(node.chained, "B re-chaining the rewritten primary", keeper_b, timeout=60)
            keeper_a.send_signal(signal.SIGTERM)  # the DaemonSet deletes the old pod
            assert keeper_a.wait(60) == 0, text(log_a)
            assert "nothing removed" in text(log_a), text(log_a)
            assert node.chained() and (node.bin_d / "netclaim").exists(), text(log_a)
            assert keeper_b.poll() is None, text(log_k)
