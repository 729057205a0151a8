"""The live watch's options (`run`): whether each attachment's interface is followed after ADD.

publisher/live/ follows the interfaces; which netns it may open, and through what, is
publisher/nsopen/options.py. This module turns the command line into the watch's settings.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import click

from publisher.clioptions import stacked

OPTIONS = [
    click.option("--live-watch/--no-live-watch", envvar="NETCLAIM_LIVE_WATCH", show_envvar=True, default=True,
                 show_default=True,
                 help="Follow each attachment's interface in its pod's netns after ADD: Ready and networkData show "
                      "link down, lost carrier, addresses added or removed (needs CAP_SYS_ADMIN and the netns "
                      "directory; without them the watch is off and says so in /readyz)."),
    click.option("--live-added-addresses", "live_added_addresses", envvar="NETCLAIM_LIVE_ADDED_ADDRESSES",
                 show_envvar=True, multiple=True, metavar="NETWORK",
                 help="A CNI network (its conflist's name) whose interfaces show addresses gained after the ADD "
                      "(SLAAC, DHCP) in networkData.ips (repeatable; the variable: space-separated). Elsewhere the "
                      "watch only takes away: the pod's own workload can add any address to its interface."),
]


options = stacked(OPTIONS)
"""The live watch's `run` options, in the order --help shows them."""


@dataclass(frozen=True)
class LiveSettings:
    """Whether the watch runs, and the CNI networks whose gained addresses it publishes."""

    live_watch: bool
    live_added_addresses: tuple[str, ...]


def settings_from(values: dict[str, Any]) -> LiveSettings:
    """The live watch's settings from the values of its options."""
    return LiveSettings(live_watch=values["live_watch"], live_added_addresses=tuple(values["live_added_addresses"]))
