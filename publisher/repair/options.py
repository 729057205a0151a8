"""The repair side's options (`run`): the safety net, claim windows and the unchained-pod check.

publisher/repair/safetynet.py verifies claims again, publisher/repair/claimwatch.py watches them
after an apply and publisher/repair/unchained.py reports pods started without netclaim; this
module turns the command line into their settings.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import click

from publisher.clioptions import stacked

OPTIONS = [
    click.option("--verify-after", envvar="NETCLAIM_VERIFY_AFTER", show_envvar=True, default=86400.0,
                 show_default=True, type=click.FloatRange(0.05, None),
                 help="Safety net: each tracked claim is read again and repaired if needed this many seconds "
                      "(plus --verify-spread jitter) after it was last verified. Drift is repaired by events "
                      "first; this covers what no event shows."),
    click.option("--verify-spread", envvar="NETCLAIM_VERIFY_SPREAD", show_envvar=True, default=43200.0,
                 show_default=True, type=click.FloatRange(0, None),
                 help="Random extra seconds (uniform) added to each claim's --verify-after, so the reads are "
                      "spread evenly over time and nodes."),
    click.option("--resync-interval", envvar="NETCLAIM_RESYNC_INTERVAL", show_envvar=True, default=None,
                 type=click.FloatRange(0.05, None),
                 help="Deprecated: the same as --verify-after S --verify-spread 0 (each claim verified every S "
                      "seconds). Kept for existing installs; will be removed."),
    click.option("--claim-window", envvar="NETCLAIM_CLAIM_WINDOW", show_envvar=True, default=0.0,
                 show_default=True, type=click.FloatRange(0, 3600),
                 help="Seconds a claim stays watched after netclaim's apply: a change that drops or alters its "
                      "entries is repaired at once. Off by default (0: claims are read with GET and not watched): "
                      "a windowed watch costs the API server about 3x the CPU of a GET per ADD (docs/scale.md)."),
    click.option("--max-claim-windows", envvar="NETCLAIM_MAX_CLAIM_WINDOWS", show_envvar=True, default=32,
                 show_default=True, type=click.IntRange(0, 1024),
                 help="Claim watches open at once at most (a thread and a connection each); beyond, a claim is "
                      "read with GET and not watched."),
    click.option("--driver-name", "driver_names", envvar="NETCLAIM_DRIVER_NAMES", show_envvar=True, multiple=True,
                 help="A DRA driver netclaim reports for (repeatable; the variable: space-separated). A Running "
                      "pod with a claim of one of them whose sandbox never ran netclaim gets a NetclaimNotChained "
                      "Warning Event (none here nor in --drivers-file: not looked for, and the start says so)."),
    click.option("--drivers-file", envvar="NETCLAIM_DRIVERS_FILE", show_envvar=True, default="",
                 help="A file of more driver names, as scripts/install.sh records them: one `DRIVER CONFLIST` "
                      "line per conflist it chained netclaim into (the systemd unit: /etc/netclaim/drivers). Read "
                      "again whenever it changes; missing: it names none."),
    click.option("--unchained-grace", envvar="NETCLAIM_UNCHAINED_GRACE", show_envvar=True, default=30.0,
                 show_default=True, type=click.FloatRange(1, 3600),
                 help="Seconds after a claimed pod is seen Running before a missing ADD counts as not chained."),
]


options = stacked(OPTIONS)
"""The repair side's `run` options, in the order --help shows them."""


@dataclass(frozen=True)
class RepairSettings:
    """When claims are verified again, how long they stay watched, and which drivers' pods must be chained."""

    verify_after: float
    verify_spread: float
    claim_window: float
    max_claim_windows: int
    driver_names: tuple[str, ...]
    drivers_file: str
    unchained_grace: float

    @property
    def open_windows(self) -> int:
        """Claim watches that may be open at once (each holds a connection of the API client's pool)."""
        return self.max_claim_windows if self.claim_window > 0 else 0


def settings_from(values: dict[str, Any]) -> RepairSettings:
    """The repair side's settings; the deprecated --resync-interval, when given, is said in the log and wins."""
    verify_after, verify_spread = values["verify_after"], values["verify_spread"]
    resync_interval = values["resync_interval"]
    if resync_interval is not None:
        from publisher import logs

        logs.get().warning("--resync-interval (NETCLAIM_RESYNC_INTERVAL) is deprecated: use --verify-after and "
                           "--verify-spread", extra={"resync_interval": resync_interval})
        verify_after, verify_spread = resync_interval, 0.0
    return RepairSettings(verify_after=verify_after, verify_spread=verify_spread,
                          claim_window=values["claim_window"], max_claim_windows=values["max_claim_windows"],
                          driver_names=values["driver_names"], drivers_file=values["drivers_file"],
                          unchained_grace=values["unchained_grace"])
