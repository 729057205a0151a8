"""The endpoints controller's /healthz and /readyz on the real API server: a watch that died fails liveness
(and the log names it), the leader is ready only once its first lists are done, a standby is live and ready.

The probes are asked over the controller's own probe listener (--probe-address), as the kubelet's httpGet
asks. A list is refused for real (the API server's RBAC), and a watch thread is ended through the cache's
stop(), the seam that ends one watch while the rest of the controller runs.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from typing import Any, Iterator

import pytest
from endpoints_kit import Controller
from kubernetes import client
from publisher_testkit import free_port, wait_until

from publisher import logs
from publisher.endpoints import options
from publisher.endpoints.command import Program


def ask(port: int, path: str) -> tuple[int, str]:
    """GET /healthz or /readyz on the probe listener: (status, body); (0, why) when nothing answers."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except OSError as exc:
        return 0, str(exc)


def exec_probe(sock: str, path: str) -> int:
    """The chart's exec probe command (probes.mode=exec): its exit code."""
    return subprocess.run([sys.executable, "-I", "-m", "publisher.observe.localprobe", sock, path],
                          capture_output=True, timeout=30).returncode


def grant(cluster: Any, name: str, account: str, rules: list[dict[str, Any]]) -> None:
    rbac = client.RbacAuthorizationV1Api(cluster.api)
    rbac.create_namespaced_role(cluster.namespace, {"metadata": {"name": name}, "rules": rules})
    rbac.create_namespaced_role_binding(cluster.namespace, {
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": cluster.namespace}]})


def test_the_leader_is_ready_once_its_first_lists_are_done_and_live_meanwhile(
        control_plane, cluster, workdir):
    """The API server refuses the claims' list (no grant yet): live, not ready, the reason names the claims;
    once granted, the next list completes and it is ready."""
    core = client.CoreV1Api(cluster.api)
    core.create_namespaced_service_account(cluster.namespace, {"metadata": {"name": "endpoints"}})
    grant(cluster, "endpoints-base", "endpoints", [
        {"apiGroups": [""], "resources": ["services", "pods"], "verbs": ["list", "watch"]},
        {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"],
         "verbs": ["list", "watch", "create", "patch", "delete"]},
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["get", "create", "update"]}])
    token = core.create_namespaced_service_account_token(
        "endpoints", cluster.namespace,
        {"spec": {"audiences": ["https://kubernetes.default.svc"], "expirationSeconds": 3600}}).status.token
    kubeconfig = control_plane.kubeconfig_for_token(token, workdir / "endpoints.kubeconfig")
    port, sock = free_port(), str(workdir / "probe.sock")
    controller = Controller(kubeconfig, cluster.namespace, workdir, "a",
                            [f"--probe-address=127.0.0.1:{port}", f"--probe-socket={sock}"])
    try:
        controller.start()
        status, body = wait_until("the leader says its claims are not listed yet",
                                  lambda: (lambda a: a if a[0] == 503 and "resourceclaims" in a[1] else None)(
                                      ask(port, "/readyz")), timeout=90)
        assert "first list not done" in body
        assert ask(port, "/healthz")[0] == 200  # refused lists are not a stall (yet): live
        # the chart's exec probes ask the socket the same (exit 0 only on 200)
        assert (exec_probe(sock, "/healthz"), exec_probe(sock, "/readyz")) == (0, 1)
        grant(cluster, "endpoints-claims", "endpoints", [
            {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims"], "verbs": ["list", "watch"]}])
        wait_until("ready once the claims' list completes", lambda: ask(port, "/readyz") == (200, "leading\n"),
                   timeout=120)
        assert ask(port, "/healthz")[0] == 200
        assert (exec_probe(sock, "/healthz"), exec_probe(sock, "/readyz")) == (0, 0)
    finally:
        controller.kill()


class Captured(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture()
def captured() -> Iterator[Captured]:
    handler = Captured()
    logs.get().addHandler(handler)
    logs.get().setLevel(logging.INFO)
    yield handler
    logs.get().removeHandler(handler)


def program(control_plane: Any, namespace: str, identity: str, port: int) -> Program:
    cfg = options.EndpointsSettings(
        kubeconfig=control_plane.kubeconfig, namespace=namespace, lease_namespace=namespace,
        lease_name="netclaim-endpoints", identity=identity, lease_duration=15.0, renew_deadline=10.0, retry=1.0,
        log_format="json", log_level="info", probe_address=f"127.0.0.1:{port}")
    return Program(cfg, threading.Event())


def test_a_watch_whose_thread_ended_fails_liveness_and_the_log_names_it_a_standby_stays_live_and_ready(
        control_plane, cluster, captured):
    leader_port, standby_port = free_port(), free_port()
    leader = program(control_plane, cluster.namespace, "leader", leader_port)
    runs = [threading.Thread(target=leader.run, daemon=True)]
    runs[0].start()
    standby: Program | None = None
    try:
        wait_until("the leader is ready", lambda: ask(leader_port, "/readyz") == (200, "leading\n"))
        standby = program(control_plane, cluster.namespace, "standby", standby_port)
        runs.append(threading.Thread(target=standby.run, daemon=True))
        runs[1].start()
        wait_until("the standby is ready", lambda: ask(standby_port, "/readyz") == (200, "standby\n"))
        assert ask(standby_port, "/healthz")[0] == 200
        assert ask(leader_port, "/healthz") == (200, "ok\n")  # the positive control

        leader.controller.claims.stop()  # the claims' watch thread ends; the other watches go on

        status, body = wait_until("liveness fails", lambda: (lambda a: a if a[0] == 503 else None)(
            ask(leader_port, "/healthz")))
        assert "watch resourceclaims: its thread ended" in body
        assert ask(leader_port, "/readyz")[0] == 503
        said = [r for r in captured.records if r.getMessage().startswith("liveness check failed")]
        assert [(getattr(r, "part", ""), getattr(r, "reason", "")) for r in said] == [
            ("watch resourceclaims", "watch resourceclaims: its thread ended")]
        assert ask(standby_port, "/healthz")[0] == 200  # the standby's own checks are unaffected
    finally:
        leader.stopping.set()
        if standby is not None:
            standby.stopping.set()
        for run in runs:
            run.join(30)
    assert not any(run.is_alive() for run in runs)
    assert ask(leader_port, "/healthz")[0] == 0  # the listener is closed when the program ends


def test_the_probe_options_are_checked_before_anything_starts() -> None:
    from click.testing import CliRunner

    from publisher.endpoints.command import endpoints

    out = CliRunner().invoke(endpoints, ["--probe-address", "no-port"])
    assert out.exit_code == 2 and "HOST:PORT" in out.output


def test_a_standby_the_api_server_does_not_answer_is_not_ready(control_plane, cluster, workdir):
    """A standby cut off from the API server could never take over: two Ready replicas would hide that none can
    lead. It talks to the API server through a proxy (tests/publisher/lossy_proxy.py): ready while answered,
    503 naming the silence once the proxy is gone for longer than the Lease lasts; still live (a restart would
    not reconnect it)."""
    from lossy_proxy import LossyApiProxy
    from test_endpoints_leader_fence import proxied_kubeconfig

    leader_port, standby_port = free_port(), free_port()
    leader = program(control_plane, cluster.namespace, "leader", leader_port)
    runs = [threading.Thread(target=leader.run, daemon=True)]
    runs[0].start()
    proxy = LossyApiProxy(control_plane.server, control_plane.ca_file, workdir).start()
    standby: Program | None = None
    try:
        wait_until("the leader is ready", lambda: ask(leader_port, "/readyz") == (200, "leading\n"))
        cfg = options.EndpointsSettings(
            kubeconfig=proxied_kubeconfig(control_plane, proxy, workdir / "proxied.kubeconfig"),
            namespace=cluster.namespace, lease_namespace=cluster.namespace, lease_name="netclaim-endpoints",
            identity="standby", lease_duration=6.0, renew_deadline=4.0, retry=1.0, log_format="json",
            log_level="info", probe_address=f"127.0.0.1:{standby_port}")
        standby = Program(cfg, threading.Event())
        runs.append(threading.Thread(target=standby.run, daemon=True))
        runs[1].start()
        wait_until("the standby is ready", lambda: ask(standby_port, "/readyz") == (200, "standby\n"))
        proxy.stop()
        status, body = wait_until("the cut-off standby not ready", lambda: (lambda a: a if a[0] == 503 else None)(
            ask(standby_port, "/readyz")), timeout=60)
        assert "has not answered the election for" in body, body
        assert ask(standby_port, "/healthz")[0] == 200  # a restart would not reconnect it: live, not ready
    finally:
        leader.stopping.set()
        if standby is not None:
            standby.stopping.set()
        for run in runs:
            run.join(40)


def test_a_replica_the_api_server_never_answered_is_not_ready(control_plane, cluster, workdir):
    """The chart's pods on a network that cannot reach the API server: the election never gets an answer, so
    neither replica is ready (before, both were: a standby counted as ready once its loop ran)."""
    from publisher_testkit import unreachable_kubeconfig

    port = free_port()
    cfg = options.EndpointsSettings(
        kubeconfig=str(unreachable_kubeconfig(workdir)), namespace=cluster.namespace,
        lease_namespace=cluster.namespace, lease_name="netclaim-endpoints", identity="cut-off", lease_duration=6.0,
        renew_deadline=4.0, retry=1.0, log_format="json", log_level="info", probe_address=f"127.0.0.1:{port}")
    cut_off = Program(cfg, threading.Event())
    run = threading.Thread(target=cut_off.run, daemon=True)
    run.start()
    try:
        wait_until("an election round", lambda: ask(port, "/healthz")[0] == 200, timeout=60)
        wait_until("a second election round", lambda: cut_off.election.answered_at is None
                   and "election" in cut_off.probes.health.beats, timeout=60)
        assert ask(port, "/readyz") == (503, "standby: the API server has not answered the election yet\n")
    finally:
        cut_off.stopping.set()
        run.join(40)
