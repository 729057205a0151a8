"""The endpoints controller's options (`netclaim-publisher endpoints`) and the settings they make.

Checked before anything starts: a lease the controller could never keep (renewed no more often
than it expires) is a configuration error, not a flapping leader.
"""

from __future__ import annotations

import os
import socket
import uuid
from dataclasses import dataclass
from typing import Any

import click

from publisher.clioptions import stacked
from publisher.observe.options import address_value

DEFAULT_LEASE = "netclaim-endpoints"

OPTIONS = [
    click.option("--kubeconfig", envvar=["NETCLAIM_KUBECONFIG", "KUBECONFIG"], show_envvar=True, default=None,
                 help="Kubeconfig file (KUBECONFIG may list several, colon-separated); without it the in-cluster "
                      "service account is used."),
    click.option("--namespace", envvar="NETCLAIM_ENDPOINTS_NAMESPACE", show_envvar=True, default="",
                 help="Serve the Services of this namespace only (empty: every namespace; the RBAC must allow it)."),
    click.option("--lease-namespace", envvar=["NETCLAIM_LEASE_NAMESPACE", "POD_NAMESPACE"], show_envvar=True,
                 default="default", show_default=True, help="Namespace of the leader-election Lease."),
    click.option("--lease-name", envvar="NETCLAIM_LEASE_NAME", show_envvar=True, default=DEFAULT_LEASE,
                 show_default=True, help="Name of the leader-election Lease: one active controller per Lease."),
    click.option("--identity", envvar=["NETCLAIM_IDENTITY", "POD_NAME"], show_envvar=True, default="",
                 help="This candidate's holderIdentity in the Lease (empty: host name, process id and a random "
                      "suffix)."),
    click.option("--lease-duration", envvar="NETCLAIM_LEASE_DURATION", show_envvar=True, default=15.0,
                 show_default=True, type=click.FloatRange(min=1.0),
                 help="Seconds a standby waits after the leader's last renewal before it takes over."),
    click.option("--lease-renew-deadline", envvar="NETCLAIM_LEASE_RENEW_DEADLINE", show_envvar=True, default=10.0,
                 show_default=True, type=click.FloatRange(min=0.5),
                 help="Seconds the leader goes on without a renewal before it stops (less than --lease-duration)."),
    click.option("--lease-retry", envvar="NETCLAIM_LEASE_RETRY", show_envvar=True, default=2.0, show_default=True,
                 type=click.FloatRange(min=0.1),
                 help="Seconds between renewals, and between a standby's tries (less than --lease-renew-deadline)."),
    click.option("--probe-address", envvar="NETCLAIM_PROBE_ADDRESS", show_envvar=True, default="",
                 callback=address_value,
                 help="HOST:PORT serving only /healthz and /readyz, for the kubelet's httpGet probes (the chart with "
                      "probes.mode=tcp: the pod's IP). Empty: off."),
    click.option("--probe-socket", envvar="NETCLAIM_PROBE_SOCKET", show_envvar=True, default="",
                 type=click.Path(dir_okay=False),
                 help="Unix socket serving only /healthz and /readyz (created 0600), for exec probes "
                      "(`python -m publisher.observe.localprobe SOCKET /healthz`): only the pod's own containers "
                      "can ask. Empty: off."),
    click.option("--log-format", envvar="NETCLAIM_LOG_FORMAT", show_envvar=True, default="json", show_default=True,
                 type=click.Choice(["json", "text"]), help="Log lines on stderr: JSON (one event a line) or text."),
    click.option("--log-level", envvar="NETCLAIM_LOG_LEVEL", show_envvar=True, default="info", show_default=True,
                 type=click.Choice(["debug", "info", "warning", "error"]), help="Least severe level logged."),
]


options = stacked(OPTIONS)
"""The controller's options, in the order --help shows them."""


@dataclass(frozen=True)
class EndpointsSettings:
    """Where the controller reads and who it is in the election."""

    kubeconfig: str | None
    namespace: str
    lease_namespace: str
    lease_name: str
    identity: str
    lease_duration: float
    renew_deadline: float
    retry: float
    log_format: str
    log_level: str
    probe_address: str = ""
    probe_socket: str = ""


def settings_from(values: dict[str, Any]) -> EndpointsSettings:
    """The settings from the options' values, or a usage error naming the option at fault."""
    duration, deadline, retry = values["lease_duration"], values["lease_renew_deadline"], values["lease_retry"]
    if not deadline < duration:
        raise click.BadParameter(f"{deadline} is not less than --lease-duration {duration}",
                                 param_hint="--lease-renew-deadline")
    if not retry < deadline:
        raise click.BadParameter(f"{retry} is not less than --lease-renew-deadline {deadline}",
                                 param_hint="--lease-retry")
    identity = values["identity"] or f"{socket.gethostname()}_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    return EndpointsSettings(kubeconfig=values["kubeconfig"], namespace=values["namespace"],
                             lease_namespace=values["lease_namespace"], lease_name=values["lease_name"],
                             identity=identity, lease_duration=duration, renew_deadline=deadline, retry=retry,
                             log_format=values["log_format"], log_level=values["log_level"],
                             probe_address=values["probe_address"], probe_socket=values["probe_socket"])
