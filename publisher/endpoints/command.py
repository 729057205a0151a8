"""`netclaim-publisher endpoints`: EndpointSlices for Services on secondary networks, one leader per cluster.

A program of its own (the chart's opt-in Deployment, `endpoints.enabled`); publisher/cli.py only
registers it. Every replica is a candidate for the Lease (publisher/endpoints/election.py); only the
leader watches and writes (publisher/endpoints/controller.py), so a standby costs the API server one
Lease read every few seconds and nothing else. SIGTERM stops the writes, then gives the Lease up.
The probe listeners (--probe-address, --probe-socket) open first, so a standby answers too
(publisher/endpoints/probes.py says what they check).
"""

from __future__ import annotations

import functools
import signal
import sys
import threading
from typing import Any

import click

from publisher.endpoints import options
from publisher.kube.options import api_client_for

WORKER_STOP_WAIT = 5.0  # seconds a write in flight may take to finish before the Lease is given up


class Program:
    """One replica: its election, its probes and, while it leads, its controller."""

    def __init__(self, cfg: options.EndpointsSettings, stopping: threading.Event) -> None:
        from publisher.endpoints.api import EndpointsKube
        from publisher.endpoints.election import Election
        from publisher.endpoints.probes import Probes
        from publisher.kube.calls import Credentials

        self.cfg, self.stopping = cfg, stopping
        self.kube = EndpointsKube(api_client_for(cfg.kubeconfig, 8), credentials=Credentials(cfg.kubeconfig, 8))
        self.election = Election(self.kube, cfg.lease_namespace, cfg.lease_name, cfg.identity,
                                 duration=cfg.lease_duration, renew_deadline=cfg.renew_deadline, retry=cfg.retry)
        self.probes = Probes(stopping, self.election.leading, unanswered=self.election.unanswered_for,
                             answer_within=self.election.duration)
        self.election.on_round = self.probes.election_round
        self.controller: Any = None

    def run(self) -> int:
        """Until SIGTERM (0) or the Lease lost (1: another replica may lead now; restart as a standby)."""
        from publisher import logs
        from publisher.observe.listeners import keep_listening

        cfg = self.cfg
        listeners = [keep_listening(name, address, functools.partial(self._serve, address))
                     for name, address in (("probe", cfg.probe_address), ("probe-socket", cfg.probe_socket))]
        logs.get().info("candidate for the lease", extra={
            "lease": f"{cfg.lease_namespace}/{cfg.lease_name}", "identity": cfg.identity,
            "namespace": cfg.namespace or "*", "probes": cfg.probe_address, "probe_socket": cfg.probe_socket})
        try:
            return self._lead()
        finally:
            for listener in listeners:
                if listener is not None:
                    listener.stop()

    def _lead(self) -> int:
        from publisher.endpoints.controller import Controller

        if not self.election.acquire(self.stopping):
            return 0
        self.controller = Controller(self.kube, self.cfg.namespace, beat=self.probes.beat,
                                     may_write=self.election.holds)
        worker = self.controller.start(self.stopping)
        self.probes.lead(self.controller.caches, worker)
        kept = self.election.keep(self.stopping)
        self.stopping.set()
        worker.join(WORKER_STOP_WAIT)
        if not kept:
            return 1
        self.election.release()
        return 0

    def _serve(self, address: str) -> Any:
        """The publisher's bounded probe listener (/healthz, /readyz only) with this replica's checks."""
        from publisher import logs
        from publisher.observe.metrics import HealthServer

        server = HealthServer(address, None, self.probes.ready, self.probes.live, probes_only=True)
        server.start()
        logs.get().info("probes", extra={"address": address, "port": server.port})
        return server


@click.command("endpoints")
@options.options
def endpoints(**values: Any) -> None:
    """Write EndpointSlices of pods' secondary-network addresses (ResourceClaim status) for annotated Services."""
    stopping = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda _signo, _frame: stopping.set())
    cfg = options.settings_from(values)
    from publisher import logs

    logs.setup(cfg.log_format, cfg.log_level)
    sys.exit(Program(cfg, stopping).run())
