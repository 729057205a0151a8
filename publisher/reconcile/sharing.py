"""Every pod's attachment on a shared device, in the `data` of the device's one entry (opt-in).

KEP-4817 gives a device one entry (driver/pool/device/shareID), so a device that several pods use
(a claim reserved for several pods, or for a PodGroup) shows only its newest sandbox
(publisher/reconcile/reconciler.py newest_sandbox). With `--shared-attachments` on, that entry's
`data` also lists each pod using the device: `attachments`, one item per pod (its newest sandbox),
sorted by pod name, each as that sandbox's own entry shows it (the live watch's view included, so
an interface change of any pod changes the list). One pod only: no list, the entry stays as it is.

The list shares `data`'s 10 KiB (publisher/limits.py MAX_DATA_BYTES) with the CNI result: when it
does not fit, as many items are kept as fit, the shown pod's first, and `trimmed` says
`attachments` (docs/publisher.md "The `data` field").
"""

from __future__ import annotations

from typing import Any, Callable

from publisher import limits
from publisher.journal.store import Attachment
from publisher.live.status import shown_entry

ATTACHMENTS = "attachments"  # the key in `data`, and its name in `trimmed` when the list was cut


def attachment_item(att: Attachment) -> dict[str, Any]:
    """One pod's item: who it is, which sandbox, and the networkData its own entry shows."""
    net = shown_entry(att.entry, att.live).get("networkData") or {}
    item: dict[str, Any] = {"pod": att.pod_name, "podUID": att.pod_uid, "containerID": att.container_id,
                            "interfaceName": net.get("interfaceName") or att.ifname,
                            "ips": list(net.get("ips") or [])}
    if net.get("hardwareAddress"):
        item["hardwareAddress"] = net["hardwareAddress"]
    return item


def per_pod(atts: list[Attachment], newest: Callable[[list[Attachment]], Attachment]) -> list[Attachment]:
    """Each pod's newest sandbox among a device's live attachments, sorted by pod name."""
    pods: dict[tuple[str, str], list[Attachment]] = {}
    for att in atts:
        pods.setdefault((att.pod_name, att.pod_uid), []).append(att)
    return [newest(pods[k]) for k in sorted(pods)]


def without_attachments(data: dict[str, Any]) -> dict[str, Any]:
    """`data` with no list (one an earlier apply wrote may come back adopted from the API by a rebuild)."""
    if ATTACHMENTS not in data and ATTACHMENTS not in (data.get("trimmed") or []):
        return data
    out = {k: v for k, v in data.items() if k != ATTACHMENTS}
    trimmed = [t for t in out.get("trimmed") or [] if t != ATTACHMENTS]
    if trimmed:
        out["trimmed"] = trimmed
    else:
        out.pop("trimmed", None)
    return out


def with_attachments(data: dict[str, Any], items: list[dict[str, Any]], first: int = 0) -> dict[str, Any]:
    """`data` with `items` as its `attachments` (a new dict; `data` is left as it is).

    Fewer than two items: no list. Over the API's limit: the longest run of items that fits is kept,
    `items[first]` (the shown pod's) before the others in their order, the kept ones in their order,
    and `attachments` is added to `trimmed`; when not even one fits, the list is left out.
    """
    data = without_attachments(data)
    if len(items) < 2:
        return data
    items = limits.valid_text(items)
    rank = [first] + [i for i in range(len(items)) if i != first]

    def candidate(count: int) -> dict[str, Any]:
        kept = sorted(rank[:count])
        out = {k: v for k, v in data.items() if k != "trimmed"}
        if kept:
            out[ATTACHMENTS] = [items[i] for i in kept]
        shed = list(data.get("trimmed") or []) + ([ATTACHMENTS] if count < len(items) else [])
        if shed:
            out["trimmed"] = shed
        return out

    if limits.data_size(candidate(len(items))) <= limits.MAX_DATA_BYTES:
        return candidate(len(items))
    low, high = 0, len(items) - 1  # the size grows with each item kept: the most that fit, by halves
    while low < high:
        mid = (low + high + 1) // 2
        if limits.data_size(candidate(mid)) <= limits.MAX_DATA_BYTES:
            low = mid
        else:
            high = mid - 1
    return candidate(low)


def shared_entry(entry: dict[str, Any], shown: Attachment, sharers: list[Attachment],
                 newest: Callable[[list[Attachment]], Attachment]) -> dict[str, Any]:
    """The device's entry (`entry`, built from `shown`) with the list of the pods among `sharers`,
    the device's live attachments; `entry` itself when its data has no list and gets none."""
    data = entry.get("data")
    if not isinstance(data, dict):
        return entry
    pods = per_pod(sharers, newest)
    mine = [i for i, a in enumerate(pods) if (a.pod_name, a.pod_uid) == (shown.pod_name, shown.pod_uid)]
    first = mine[0] if mine else 0  # `sharers` holds `shown` (plan's by_device): always found there
    if mine:
        pods[first] = shown  # the entry's own sandbox, whatever the order's tie-breaks say
    new = with_attachments(data, [attachment_item(a) for a in pods], first)
    return entry if new is data else {**entry, "data": new}
