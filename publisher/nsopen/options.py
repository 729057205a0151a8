"""The netns access options (`run`): the runtime's netns dirs and the opener that opens them, if any.

publisher/nsopen/access.py opens a pod's netns for the live watch, itself or through a
`netclaim-publisher netns-opener`; this module turns the command line into its NetnsAccess.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

from publisher.clioptions import stacked

if TYPE_CHECKING:  # imported where it is made: `run --help` stays light
    from publisher.nsopen.access import NetnsAccess

DEFAULT_NETNS_DIRS = ("/var/run/netns",)  # publisher/nsopen/netnsfile.py; containerd's and CRI-O's default

OPTIONS = [
    click.option("--netns-dir", "netns_dirs", envvar="NETCLAIM_NETNS_DIRS", show_envvar=True, multiple=True,
                 default=DEFAULT_NETNS_DIRS, show_default=True,
                 help="The runtime's directory of pod netns (repeatable; the variable: space-separated). The live "
                      "watch opens only a netns named directly in one of them, never a symlink, a FIFO or a "
                      "/proc/<pid>/ns/net path: such an attachment keeps what the ADD said."),
    click.option("--netns-opener", envvar="NETCLAIM_NETNS_OPENER", show_envvar=True, default="",
                 help="Socket of a `netclaim-publisher netns-opener` that opens each netns for the live watch: "
                      "this process then needs no capability (the chart's layout). Empty: it enters them itself "
                      "(needs CAP_SYS_ADMIN)."),
]


options = stacked(OPTIONS)
"""The netns access `run` options, in the order --help shows them."""


def settings_from(values: dict[str, Any]) -> NetnsAccess:
    """The netns access of the live watch: the dirs it may open, and the opener's socket (empty: none)."""
    from publisher.nsopen.access import NetnsAccess

    return NetnsAccess(dirs=tuple(values["netns_dirs"]), opener=values["netns_opener"])
