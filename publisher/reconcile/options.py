"""The reconciler's options (`run`): its workers, how long an event may wait, and how devices are matched.

publisher/reconcile/ resolves, maps and applies; this module turns the command line into the
settings it is given (through publisher/service.py Settings).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import click

from publisher import limits
from publisher.clioptions import stacked

OPTIONS = [
    click.option("--workers", envvar="NETCLAIM_WORKERS", show_envvar=True, default=4, show_default=True,
                 type=click.IntRange(1, 64),
                 help="Worker threads (events of one sandbox always go to the same one)."),
    click.option("--resolve-timeout", envvar="NETCLAIM_RESOLVE_TIMEOUT", show_envvar=True, default=120.0,
                 show_default=True, type=float,
                 help="Seconds an event may wait for its pod to be visible or its claim allocated before it "
                      "is reported and dropped."),
    click.option("--sibling-hold", envvar="NETCLAIM_SIBLING_HOLD", show_envvar=True, default=limits.SIBLING_HOLD,
                 show_default=True, type=click.FloatRange(0, 30),
                 help="Seconds a claim's apply may wait, after a sandbox's first ADD on it, for the same sandbox's "
                      "ADDs of the claim's other devices (Multus runs networks one after another): one apply for "
                      "them all. 0: every ADD applies at once."),
    click.option("--device-id-attribute", "device_id_attributes", envvar="NETCLAIM_DEVICE_ID_ATTRIBUTES",
                 show_envvar=True, multiple=True,
                 help="A ResourceSlice attribute that holds a device's ID, qualified with its domain (repeatable, "
                      "first found wins; the variable: space-separated). An interface whose meta plugin handed it "
                      "a device ID (Multus: deviceID) is mapped to the allocated device carrying that ID. Default: "
                      "k8s.cni.cncf.io/deviceID, then resource.kubernetes.io/pciBusID."),
    click.option("--shared-attachments/--no-shared-attachments", envvar="NETCLAIM_SHARED_ATTACHMENTS",
                 show_envvar=True, default=False, show_default=True,
                 help="A device several pods use (a shared claim, a PodGroup's) shows one entry, its newest "
                      "sandbox's; with this on, that entry's data also lists every pod on the device "
                      "(`attachments`: pod, sandbox, interface, IPs, MAC), within the API's 10 KiB."),
    click.option("--retry-max-delay", envvar="NETCLAIM_RETRY_MAX_DELAY", show_envvar=True, default=5.0,
                 show_default=True, type=float,
                 help="Cap of the backoff between retries of a failed apply (429/5xx/no connection)."),
]


options = stacked(OPTIONS)
"""The reconciler's `run` options, in the order --help shows them."""


@dataclass(frozen=True)
class ReconcileSettings:
    """Workers, the resolve deadline, the sibling hold, the slice attributes of device IDs, the retry cap,
    whether a shared device's entry lists its pods."""

    workers: int
    resolve_timeout: float
    sibling_hold: float
    device_id_attributes: tuple[str, ...]
    retry_cap: float
    shared_attachments: bool = False


def settings_from(values: dict[str, Any]) -> ReconcileSettings:
    """The reconciler's settings; a malformed --device-id-attribute is a usage error."""
    from publisher.reconcile.slices import DEFAULT_DEVICE_ID_ATTRIBUTES, check_attribute_names

    try:
        id_attributes = check_attribute_names(values["device_id_attributes"]) or DEFAULT_DEVICE_ID_ATTRIBUTES
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--device-id-attribute") from None
    return ReconcileSettings(workers=values["workers"], resolve_timeout=values["resolve_timeout"],
                             sibling_hold=values["sibling_hold"], device_id_attributes=id_attributes,
                             retry_cap=values["retry_max_delay"], shared_attachments=values["shared_attachments"])
