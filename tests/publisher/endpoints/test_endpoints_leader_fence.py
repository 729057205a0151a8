"""A leader whose Lease renewal hangs stops writing slices before a standby can take over (the real API server).

The old leader talks to the API server through a TLS proxy (tests/publisher/lossy_proxy.py) that, on cue,
holds each Lease request a few seconds before it forwards it (within the client's timeout): its renewal
takes longer than the Lease lasts, the way an overloaded API server answers late, while its watches go on.
The standby, talking to the API server directly, sees the Lease unrenewed and takes over; a change of a
pod's entry then comes to both. Only the new leader may write it.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

from endpoints_kit import annotated_service, endpoints_by_pod, entry, server_pod, write_entries
from lossy_proxy import LossyApiProxy
from publisher_testkit import free_port, wait_until

from publisher.endpoints import options
from publisher.endpoints.command import Program


LEASE_DELAY = 4.0  # seconds a Lease request is held: below the client's 5 s read timeout for Lease calls


class LeaseStallingProxy(LossyApiProxy):
    """While `stall` is set a Lease request is forwarded only LEASE_DELAY seconds after it came."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.stall = threading.Event()
        self.stalled = 0

    def _before_forward(self, head: bytes) -> None:
        if self.stall.is_set() and b"/leases" in head.split(b" ", 2)[1]:
            self.stalled += 1
            time.sleep(LEASE_DELAY)


def program(kubeconfig: str, namespace: str, identity: str) -> Program:
    cfg = options.EndpointsSettings(
        kubeconfig=kubeconfig, namespace=namespace, lease_namespace=namespace, lease_name="netclaim-endpoints",
        identity=identity, lease_duration=6.0, renew_deadline=4.0, retry=1.0, log_format="json", log_level="info",
        probe_address=f"127.0.0.1:{free_port()}")
    return Program(cfg, threading.Event())


def proxied_kubeconfig(control_plane: Any, proxy: LossyApiProxy, path: Path) -> str:
    path.write_text(
        "apiVersion: v1\nkind: Config\n"
        f"clusters:\n- name: p\n  cluster:\n    server: {proxy.url}\n    certificate-authority: {proxy.cert}\n"
        f"users:\n- name: u\n  user:\n    token: {control_plane.token('admin')}\n"
        "contexts:\n- name: p\n  context: {cluster: p, user: u}\ncurrent-context: p\n")
    path.chmod(0o600)
    return str(path)


def test_a_leader_whose_renewal_hangs_writes_nothing_once_a_standby_may_lead(control_plane, cluster, workdir):
    proxy = LeaseStallingProxy(control_plane.server, control_plane.ca_file, workdir).start()
    old = program(proxied_kubeconfig(control_plane, proxy, workdir / "proxied.kubeconfig"), cluster.namespace, "old")
    new = program(control_plane.kubeconfig, cluster.namespace, "new")
    runs = [threading.Thread(target=p.run, daemon=True) for p in (old, new)]
    try:
        runs[0].start()
        wait_until("the old leader leads", lambda: old.controller is not None and old.election.leading.is_set())
        server_pod(cluster, "a", ["192.168.50.10/24"])
        annotated_service(cluster, family="IPv4")
        wait_until("a on the slice, ready", lambda: (endpoints_by_pod(cluster).get("a") or {}).get(
            "conditions", {}).get("ready") is True, timeout=60)

        proxy.stall.set()  # the old leader's next renewals are answered late
        runs[1].start()
        wait_until("the standby takes the unrenewed Lease", new.election.leading.is_set, timeout=60)
        assert proxy.stalled >= 1
        applies, failures = old.controller.stats.applies, old.controller.stats.failures

        write_entries(cluster, "a-net", [entry("eth-a", ["10.244.0.9/24"]),
                                         entry("mv-a", ["192.168.50.10/24"], ready=False)])
        wait_until("the new leader writes a's endpoint not ready", lambda: (endpoints_by_pod(cluster).get("a") or {})
                   .get("conditions", {}).get("ready") is False, timeout=60)
        wait_until("the old leader's worker took the change up",
                   lambda: old.controller.stats.applies > applies or old.controller.stats.failures > failures,
                   timeout=60)
        assert old.controller.stats.applies == applies, "the deposed leader wrote a slice beside the new one"
    finally:
        for p in (old, new):
            p.stopping.set()
        proxy.stall.clear()
        for run in runs:
            if run.is_alive() or run.ident is not None:
                run.join(40)
        proxy.stop()
