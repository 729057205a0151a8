"""The intake's options (`run`): the socket the plugin sends to, who may send, and the spool dir.

publisher/intake/server.py serves the socket and publisher/intake/spool.py ingests the spool; this
module only turns the command line into their settings, so the event path never imports click.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import click

from cni_plugin.wire.frame import DEFAULT_SOCKET
from cni_plugin.wire.spool import DEFAULT_SPOOL_DIR
from publisher.clioptions import stacked

# Also `status` and `resync`: they ask the running publisher over the same socket.
socket_option = click.option(
    "--socket", "socket_path", envvar="NETCLAIM_SOCKET", show_envvar=True, default=DEFAULT_SOCKET,
    show_default=True, help="Unix socket the plugin sends events to (created 0600, parent dir 0700).")

OPTIONS = [
    socket_option,
    click.option("--spool-dir", envvar="NETCLAIM_SPOOL_DIR", show_envvar=True, default=DEFAULT_SPOOL_DIR,
                 show_default=True, help="Where the plugin spools events while the publisher is down; "
                                         "ingested at start and every few seconds."),
    click.option("--allowed-uid", envvar="NETCLAIM_ALLOWED_UIDS", show_envvar=True, type=int, multiple=True,
                 help="Also accept socket peers with this uid (repeatable; root is always accepted). "
                      "The peer also needs filesystem access to the socket."),
    click.option("--allowed-gid", envvar="NETCLAIM_ALLOWED_GIDS", show_envvar=True, type=int, multiple=True,
                 help="Also accept peers with this primary gid (repeatable); the socket becomes 0660 "
                      "owned by the lowest of these groups."),
    click.option("--spool-interval", envvar="NETCLAIM_SPOOL_INTERVAL", show_envvar=True, default=5.0,
                 show_default=True, type=click.FloatRange(0.05, 3600),
                 help="Seconds between looks at the spool dir (and retries of claims whose apply failed)."),
]


options = stacked(OPTIONS)
"""The intake's `run` options, in the order --help shows them."""


@dataclass(frozen=True)
class IntakeSettings:
    """Where events come in: the socket and its allowed peers, the spool dir and how often it is read."""

    socket_path: str
    spool_dir: str
    allowed_uids: tuple[int, ...]
    allowed_gids: tuple[int, ...]
    spool_interval: float


def settings_from(values: dict[str, Any]) -> IntakeSettings:
    """The intake's settings from the values of its options."""
    return IntakeSettings(socket_path=values["socket_path"], spool_dir=values["spool_dir"],
                          allowed_uids=tuple(values["allowed_uid"]), allowed_gids=tuple(values["allowed_gid"]),
                          spool_interval=values["spool_interval"])
