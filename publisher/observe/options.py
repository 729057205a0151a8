"""The listeners' and Events' options (`run`): /metrics and the probes, and the Warning Events.

publisher/observe/metrics.py serves the listeners (publisher/observe/listeners.py keeps them open)
and publisher/observe/events.py posts the Events; this module turns the command line into their
settings. The chain keeper's --probe-address is checked by address_value too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import click

from publisher.clioptions import stacked

DEFAULT_METRICS = "127.0.0.1:9464"


def address_value(_ctx: Any, _param: Any, value: str) -> str:
    """HOST:PORT (or empty: off), checked before anything starts."""
    if not value:
        return value
    _host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise click.BadParameter(f"{value!r} is not HOST:PORT")
    return value


OPTIONS = [
    click.option("--metrics-address", envvar="NETCLAIM_METRICS_ADDRESS", show_envvar=True, default=DEFAULT_METRICS,
                 show_default=True, callback=address_value,
                 help="HOST:PORT serving /metrics, /healthz and /readyz (empty: off)."),
    click.option("--probe-address", envvar="NETCLAIM_PROBE_ADDRESS", show_envvar=True, default="",
                 callback=address_value,
                 help="HOST:PORT serving only /healthz and /readyz, on threads of their own, for the kubelet's "
                      "probes: connections held open on --metrics-address cannot make them fail. Use a loopback "
                      "address (the chart: 127.0.0.1, which pods cannot reach). Empty: off."),
    click.option("--probe-socket", envvar="NETCLAIM_PROBE_SOCKET", show_envvar=True, default="",
                 type=click.Path(dir_okay=False),
                 help="Unix socket serving only /healthz and /readyz (created 0600; put it in a root-owned "
                      "directory), for exec probes (`python -m publisher.observe.localprobe SOCKET /healthz`): no "
                      "local account can take it or answer in its place, as it can a TCP port. Empty: off."),
    click.option("--emit-events/--no-emit-events", envvar="NETCLAIM_EMIT_EVENTS", show_envvar=True, default=True,
                 show_default=True,
                 help="Post a Warning Event (events.k8s.io/v1) on the claim, or the pod, when an attachment "
                      "cannot be published (apply refused, unresolvable); at most one per object and reason per "
                      "10 min."),
]


options = stacked(OPTIONS)
"""The listeners' and Events' `run` options, in the order --help shows them."""


@dataclass(frozen=True)
class ObserveSettings:
    """Where /metrics and the probes are served (empty: off) and whether Warning Events are posted."""

    metrics_address: str
    probe_address: str
    probe_socket: str
    emit_events: bool


def settings_from(values: dict[str, Any]) -> ObserveSettings:
    """The listeners' and Events' settings from the values of their options."""
    return ObserveSettings(metrics_address=values["metrics_address"], probe_address=values["probe_address"],
                           probe_socket=values["probe_socket"], emit_events=values["emit_events"])
