"""`netclaim-publisher endpoints`: EndpointSlices for Services on secondary networks, one leader per cluster.

A program of its own (the chart's opt-in Deployment, `endpoints.enabled`); publisher/cli.py only
registers it. Every replica is a candidate for the Lease (publisher/endpoints/election.py); only the
leader watches and writes (publisher/endpoints/controller.py), so a standby costs the API server one
Lease read every few seconds and nothing else. SIGTERM stops the writes, then gives the Lease up.
"""

from __future__ import annotations

import signal
import sys
import threading
from typing import Any

import click

from publisher.endpoints import options
from publisher.kube.options import api_client_for

WORKER_STOP_WAIT = 5.0  # seconds a write in flight may take to finish before the Lease is given up


@click.command("endpoints")
@options.options
def endpoints(**values: Any) -> None:
    """Write EndpointSlices of pods' secondary-network addresses (ResourceClaim status) for annotated Services."""
    stopping = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda _signo, _frame: stopping.set())
    cfg = options.settings_from(values)
    from publisher import logs
    from publisher.endpoints.api import EndpointsKube
    from publisher.endpoints.controller import Controller
    from publisher.endpoints.election import Election
    from publisher.kube.calls import Credentials

    logs.setup(cfg.log_format, cfg.log_level)
    kube = EndpointsKube(api_client_for(cfg.kubeconfig, 8), credentials=Credentials(cfg.kubeconfig, 8))
    election = Election(kube, cfg.lease_namespace, cfg.lease_name, cfg.identity, duration=cfg.lease_duration,
                        renew_deadline=cfg.renew_deadline, retry=cfg.retry)
    logs.get().info("candidate for the lease", extra={"lease": f"{cfg.lease_namespace}/{cfg.lease_name}",
                                                      "identity": cfg.identity, "namespace": cfg.namespace or "*"})
    if not election.acquire(stopping):
        sys.exit(0)
    worker = Controller(kube, cfg.namespace).start(stopping)
    kept = election.keep(stopping)
    stopping.set()
    worker.join(WORKER_STOP_WAIT)
    if not kept:
        sys.exit(1)  # lost the Lease: another replica may lead now; restart as a standby
    election.release()
