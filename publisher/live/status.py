"""What the live-interface watch saw, and how an entry shows it.

The ADD's entry (publisher/reconcile/mapper.py) is what the CNI result said;
`Attachment.live` is what the sandbox's netns showed later, when that differs
(or once it has differed). The entry published is the ADD's with the live
networkData and, when the interface is not usable, `Ready=False` with the
reason: a consumer reads one truth, the netns's. `data` stays the ADD's CNI
result: it is the record of what the network plugins configured, and the
netns cannot say which plugin set what.

Pure functions: the watcher (publisher/live/watcher.py) computes a `live`
value, the reconciler's plan overlays it. Neither touches the API.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from publisher import limits

READY = "Ready"
OK = "Ready"
# Reasons of Ready=False, worst first: one is shown, the first that holds.
INTERFACE_GONE = "InterfaceGone"
LINK_DOWN = "LinkDown"
NO_CARRIER = "NoCarrier"
ADDRESS_LOST = "AddressLost"
REASONS = (INTERFACE_GONE, LINK_DOWN, NO_CARRIER, ADDRESS_LOST)


@dataclass
class Observed:
    """The attachment's interface as its netns shows it (`present` False: no such interface)."""

    ifname: str
    present: bool
    up: bool = False
    carrier: bool = False
    mac: str = ""
    ips: list[str] = field(default_factory=list)  # canonical CIDRs, global scope only


def add_truth(entry: dict[str, Any]) -> tuple[str, list[str], str]:
    """(interface name, IPs, MAC) the ADD's entry shows."""
    net = entry.get("networkData") or {}
    return net.get("interfaceName", ""), list(net.get("ips") or []), net.get("hardwareAddress", "")


def judge(entry: dict[str, Any], seen: Observed) -> tuple[str, str]:
    """(state, message): OK, or the first reason of REASONS that holds."""
    _name, add_ips, _mac = add_truth(entry)
    if not seen.present:
        return INTERFACE_GONE, f"interface {seen.ifname} is not in the pod's network namespace"
    if not seen.up:
        return LINK_DOWN, f"interface {seen.ifname} is administratively down"
    if not seen.carrier:
        return NO_CARRIER, f"interface {seen.ifname} has no carrier (its peer or lower device is down)"
    lost = [ip for ip in add_ips if ip not in seen.ips]
    if lost:
        return ADDRESS_LOST, f"address {', '.join(lost)} configured at ADD is no longer on {seen.ifname}"[
            : limits.MAX_MESSAGE]
    return OK, ""


def ordered_ips(add_ips: list[str], seen: list[str]) -> list[str]:
    """The ADD's addresses still present in their order, then new ones sorted: a stable list."""
    kept = [ip for ip in add_ips if ip in seen]
    return (kept + sorted(ip for ip in seen if ip not in kept))[: limits.MAX_IPS]


def next_live(entry: dict[str, Any], stored: dict[str, Any], seen: Observed, now: str) -> dict[str, Any]:
    """The `live` value to store after an observation.

    {} while nothing ever differed from the ADD: the ADD's entry is the truth and
    nothing is written. Once something differed the observation is kept, so a
    recovery moves Ready's lastTransitionTime instead of reverting to the ADD's.
    `since` moves only when the state does.
    """
    name, add_ips, mac = add_truth(entry)
    state, message = judge(entry, seen)
    ips = ordered_ips(add_ips, seen.ips) if seen.present else []
    shown_mac = seen.mac if seen.present else ""
    if not stored and state == OK and ips == add_ips and shown_mac == mac and seen.ifname == name:
        return {}
    since = stored.get("since", "") if stored.get("state") == state else now
    if not stored and state == OK:
        since = ""  # addresses changed, never unready: Ready keeps the ADD's transition time
    return {"state": state, "message": message, "since": since, "ifname": seen.ifname, "ips": ips,
            "mac": shown_mac}


def shown_entry(entry: dict[str, Any], live: dict[str, Any]) -> dict[str, Any]:
    """The entry to publish: the ADD's, with what the netns shows over it."""
    if not live:
        return entry
    out = dict(entry)
    net: dict[str, Any] = {"interfaceName": live.get("ifname") or add_truth(entry)[0]}
    if live.get("ips"):
        net["ips"] = list(live["ips"])
    if live.get("mac"):
        net["hardwareAddress"] = live["mac"]
    out["networkData"] = net
    conditions = [dict(c) for c in entry.get("conditions") or []]
    ready = next((c for c in conditions if c.get("type") == READY), None)
    if live.get("state", OK) != OK:
        down = {"type": READY, "status": "False", "reason": live["state"], "message": live.get("message", ""),
                "lastTransitionTime": live.get("since") or (ready or {}).get("lastTransitionTime", "")}
        conditions = [down if c is ready else c for c in conditions] if ready else conditions + [down]
    elif ready is not None and ready.get("status") == "True" and live.get("since", "") > ready.get(
            "lastTransitionTime", ""):
        ready["lastTransitionTime"] = live["since"]  # recovered after the ADD: the transition is the recovery
    out["conditions"] = conditions
    return out
