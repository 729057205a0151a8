"""The journal's options (`run`): where it lives and whether every commit is fsynced before the ack.

publisher/journal/store.py keeps the journal and publisher/journal/durability.py decides the
`auto` mode; this module turns the command line into their settings.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import click

from publisher.clioptions import stacked

DEFAULT_STATE_DIR = "/var/lib/netclaim/publisher"

state_dir_option = click.option(
    "--state-dir", envvar="NETCLAIM_STATE_DIR", show_envvar=True, default=DEFAULT_STATE_DIR, show_default=True,
    help="Directory of the SQLite journal (pending events, desired state).")

durable_commits_option = click.option(
    "--durable-commits", envvar="NETCLAIM_DURABLE_COMMITS", show_envvar=True, default="auto", show_default=True,
    type=click.Choice(["auto", "always", "never"]),
    help="fsync every journal commit before the ack. auto: only when the state dir is on a network or "
         "FUSE filesystem; use always for a publisher in a VM-isolated runtime (docs/publisher.md).")

OPTIONS = [state_dir_option, durable_commits_option]


options = stacked(OPTIONS)
"""The journal's `run` options, in the order --help shows them."""


@dataclass(frozen=True)
class JournalSettings:
    """The journal's directory and whether its commits are fsynced (and why, for the start's log line)."""

    state_dir: str
    durable_commits: bool
    why: str


def settings_from(values: dict[str, Any]) -> JournalSettings:
    """The journal's settings; `auto` is decided now, from the state dir's filesystem."""
    from publisher.journal.durability import durable_commits

    durable, why = durable_commits(values["durable_commits"], values["state_dir"])
    return JournalSettings(state_dir=values["state_dir"], durable_commits=durable, why=why)
