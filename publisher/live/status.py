"""What the live-interface watch saw, and how an entry shows it.

The ADD's entry (publisher/reconcile/mapper.py) is what the CNI result said;
`Attachment.live` is what the sandbox's netns showed later, when that differs
(or once it has differed). The status says what the network gave the pod, and
the pod's own workload (NET_ADMIN in its netns) or an RA sender on its L2 can
put anything on the interface, so the netns may take truth away, never add
it: the entry published is the ADD's with `Ready=False` and the reason when
the interface is not usable or no longer the ADD's (another MAC), and the ADD's
addresses that are still there. `interfaceName` and `hardwareAddress` stay the
ADD's; an address the interface gained later is shown only for a network the
operator named (`--live-added-addresses`: SLAAC/DHCP networks), stored apart
(`added`) so that a value stored by an older publisher, whose `ips` held every
address seen, shows nothing it gained either. `data` stays the ADD's CNI
result: it is the record of what the network plugins configured.

Only a usable address is shown: consumers send traffic to what `networkData.ips` lists, and an
IPv6 address still in duplicate address detection (tentative), one that failed it (another host
on the link holds it) or a deprecated one is not. While one of the ADD's addresses is so, the
entry is Ready=False (`DuplicateAddress`, `AddressDeprecated`, `AddressesPending`) without it.
The plugin tells the ADD's state (the event's `unusable_ips`: `at_add`), so the first apply is
already true, and the watch follows the address from there: a DAD that completes is an address
notification, and the entry becomes Ready with the address.

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
MAC_CHANGED = "MacChanged"
TOO_MANY_ADDRESSES = "TooManyAddresses"
DUPLICATE_ADDRESS = "DuplicateAddress"
ADDRESS_LOST = "AddressLost"
ADDRESS_DEPRECATED = "AddressDeprecated"
ADDRESSES_PENDING = "AddressesPending"
REASONS = (INTERFACE_GONE, LINK_DOWN, NO_CARRIER, MAC_CHANGED, TOO_MANY_ADDRESSES, DUPLICATE_ADDRESS, ADDRESS_LOST,
           ADDRESS_DEPRECATED, ADDRESSES_PENDING)

# Why the kernel says an address cannot be used (cni_plugin/lean/netlink.py unusable()).
DADFAILED, TENTATIVE, DEPRECATED = "dadfailed", "tentative", "deprecated"


@dataclass
class Observed:
    """The attachment's interface as its netns shows it (`present` False: no such interface)."""

    ifname: str
    present: bool
    up: bool = False
    carrier: bool = False
    mac: str = ""
    ips: list[str] = field(default_factory=list)  # canonical CIDRs, global scope only, usable ones only
    more: bool = False  # the interface holds more addresses than a read takes (limits.LIVE_MAX_ADDRESSES)
    unusable: dict[str, str] = field(default_factory=dict)  # canonical CIDR -> TENTATIVE, DADFAILED or DEPRECATED


def add_truth(entry: dict[str, Any]) -> tuple[str, list[str], str]:
    """(interface name, IPs, MAC) the ADD's entry shows."""
    net = entry.get("networkData") or {}
    return net.get("interfaceName", ""), list(net.get("ips") or []), net.get("hardwareAddress", "")


def judge(entry: dict[str, Any], seen: Observed) -> tuple[str, str]:
    """(state, message): OK, or the first reason of REASONS that holds."""
    _name, add_ips, add_mac = add_truth(entry)
    if not seen.present:
        return INTERFACE_GONE, f"interface {seen.ifname} is not in the pod's network namespace"
    if not seen.up:
        return LINK_DOWN, f"interface {seen.ifname} is administratively down"
    if not seen.carrier:
        return NO_CARRIER, f"interface {seen.ifname} has no carrier (its peer or lower device is down)"
    if add_mac and seen.mac != add_mac.lower():
        return MAC_CHANGED, f"interface {seen.ifname} has MAC {seen.mac}, not {add_mac.lower()} configured at ADD"
    if seen.more:
        return TOO_MANY_ADDRESSES, (f"interface {seen.ifname} holds more than {limits.LIVE_MAX_ADDRESSES} addresses:"
                                    " its addresses are not checked")
    return judge_addresses(seen.ifname, add_ips, seen.ips, seen.unusable)


def judge_addresses(ifname: str, add_ips: list[str], usable: list[str], unusable: dict[str, str]) -> tuple[str, str]:
    """(state, message) of the ADD's addresses: OK when every one is usable, else the worst reason."""
    def having(state: str) -> list[str]:
        return [ip for ip in add_ips if unusable.get(ip) == state]

    failed = having(DADFAILED)
    lost = [ip for ip in add_ips if ip not in usable and ip not in unusable]
    deprecated = having(DEPRECATED)
    pending = having(TENTATIVE)
    if failed:
        message = (f"address {', '.join(failed)} failed duplicate address detection on {ifname}: another host on"
                   " the link holds it")
        state = DUPLICATE_ADDRESS
    elif lost:
        state, message = ADDRESS_LOST, f"address {', '.join(lost)} configured at ADD is no longer on {ifname}"
    elif deprecated:
        message = (f"address {', '.join(deprecated)} is deprecated on {ifname} (its preferred lifetime ended):"
                   " not for new connections")
        state = ADDRESS_DEPRECATED
    elif pending:
        message = (f"address {', '.join(pending)} is tentative on {ifname}: duplicate address detection has not"
                   " finished")
        state = ADDRESSES_PENDING
    else:
        return OK, ""
    return state, message[: limits.MAX_MESSAGE]


def at_add(entry: dict[str, Any], unusable: dict[str, Any] | None, now: str) -> dict[str, Any]:
    """The `live` value an ADD starts with: what the plugin saw of its addresses (the event's
    `unusable_ips`), {} when each of the entry's addresses was usable, or when the plugin did not say.

    Only the addresses are judged: the plugin looked at nothing else, so the rest of the entry stays
    the ADD's until the live watch reads the interface (its first read follows the commit at once).
    """
    name, add_ips, add_mac = add_truth(entry)
    known: dict[str, str] = {}
    for address, state in (unusable or {}).items():
        try:
            cidr = limits.canonical_cidr(address) if isinstance(address, str) else ""
        except ValueError:
            continue
        if cidr in add_ips and state in (DADFAILED, TENTATIVE, DEPRECATED):
            known[cidr] = state
    if not known:
        return {}
    usable = [ip for ip in add_ips if ip not in known]
    state, message = judge_addresses(name, add_ips, usable, known)
    return {"state": state, "message": message, "since": now, "ifname": name, "ips": usable, "mac": add_mac.lower()}


def kept_ips(add_ips: list[str], seen: list[str] | set[str]) -> list[str]:
    """The ADD's addresses still present, in the ADD's order."""
    return [ip for ip in add_ips if ip in seen]


def added_ips(add_ips: list[str], seen: list[str]) -> list[str]:
    """Addresses the interface gained since the ADD, sorted: a stable list."""
    known = set(add_ips)
    return sorted(ip for ip in seen if ip not in known)


def next_live(entry: dict[str, Any], stored: dict[str, Any], seen: Observed, now: str,
              report_added: bool = False) -> dict[str, Any]:
    """The `live` value to store after an observation.

    {} while nothing ever differed from the ADD: the ADD's entry is the truth and
    nothing is written. Once something differed the observation is kept, so a
    recovery moves Ready's lastTransitionTime instead of reverting to the ADD's.
    `since` moves only when the state does. `ips` holds the ADD's addresses still
    there; `added` (only with `report_added`, the network's opt-in) what it gained;
    `mac` is the MAC seen, for the record: the ADD's is the one shown.
    """
    _name, add_ips, _mac = add_truth(entry)
    state, message = judge(entry, seen)
    ips = kept_ips(add_ips, set(seen.ips)) if seen.present else []
    added = added_ips(add_ips, seen.ips)[: max(0, limits.MAX_IPS - len(ips))] if seen.present and report_added else []
    if not stored and state == OK and ips == add_ips and not added:
        return {}
    since = stored.get("since", "") if stored.get("state") == state else now
    if not stored and state == OK:
        since = ""  # addresses changed, never unready: Ready keeps the ADD's transition time
    live = {"state": state, "message": message, "since": since, "ifname": seen.ifname, "ips": ips,
            "mac": seen.mac if seen.present else ""}
    if added:
        live["added"] = added
    return live


def shown_ips(add_ips: list[str], live: dict[str, Any]) -> list[str]:
    """The ADD's addresses the netns still had, then those gained that the network reports."""
    return (kept_ips(add_ips, set(live.get("ips") or [])) + list(live.get("added") or []))[: limits.MAX_IPS]


def shown_entry(entry: dict[str, Any], live: dict[str, Any]) -> dict[str, Any]:
    """The entry to publish: the ADD's, with what the netns took away (see the module docstring)."""
    if not live:
        return entry
    out = dict(entry)
    name, add_ips, add_mac = add_truth(entry)
    net: dict[str, Any] = {"interfaceName": name or live.get("ifname", "")}
    ips = shown_ips(add_ips, live)
    if ips:
        net["ips"] = ips
    if add_mac and live.get("state") != INTERFACE_GONE:
        net["hardwareAddress"] = add_mac
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
