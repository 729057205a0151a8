"""Map a CNI result (1.1.0 form) to one AllocatedDeviceStatus entry.

The rules are docs/design.md "Mapping a CNI result to a device status": the pod-side
interface named CNI_IFNAME, its canonical IPs, its MAC, the CNI result in
`data` (trimmed in a fixed order to fit 10 KiB) and a `Ready` condition whose
lastTransitionTime moves only when its status changes.

`data` names its own form: `apiVersion` and `kind` come first (docs/publisher.md "The
`data` field", conf/schema/netclaim.dev_v1_CNIResult.schema.json), so a consumer can tell
netclaim's record from another writer's and from a later version of its own. An entry an older
release journaled without them gets them wherever an entry is sent (`current_form`).

Every string of the entry is made valid text first (limits.valid_text: a lone
surrogate from a prevResult becomes U+FFFD), before `data` is measured: the API
server refuses the whole apply of a claim over one such string, which would
keep every other entry of that claim unpublished.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from cni_plugin.wire import results
from cni_plugin.wire.event import Event
from publisher import limits
from publisher.clock import now_rfc3339

READY = "Ready"
REASON_CONFIGURED = "NetworkConfigured"
REASON_DRIFT = "NetworkDrift"

# The form of `data`: which record it is and in which version (docs/publisher.md "The `data`
# field"). A new optional field stays in v1; anything a v1 reader would misread is a new version.
DATA_API_VERSION = "netclaim.dev/v1"
DATA_KIND = "CNIResult"
# What build_data keeps under the API's 10 KiB: room for the `trimmed` list it adds after trimming.
TRIM_MARGIN = 64

# The order in which `data` sheds content when it is over the API's limit:
# least useful to a consumer first; the attachment's own addresses last.
TRIM_ORDER = ("dns", "routes", "other_interfaces", "other_ips", "ips", "interfaces")


@dataclass
class Condition:
    type: str
    status: str
    reason: str
    message: str
    lastTransitionTime: str

    def to_api(self) -> dict[str, Any]:
        return {
            "type": self.type,
            "status": self.status,
            "reason": self.reason,
            "message": self.message,
            "lastTransitionTime": self.lastTransitionTime,
        }


@dataclass
class NetworkData:
    interfaceName: str
    ips: list[str] = field(default_factory=list)
    hardwareAddress: str = ""

    def to_api(self) -> dict[str, Any]:
        out: dict[str, Any] = {"interfaceName": self.interfaceName}
        if self.ips:
            out["ips"] = list(self.ips)
        if self.hardwareAddress:
            out["hardwareAddress"] = self.hardwareAddress
        return out


@dataclass
class DeviceStatus:
    """One entry of ResourceClaim.status.devices, as this publisher owns it."""

    driver: str
    pool: str
    device: str
    network_data: NetworkData
    conditions: list[Condition]
    data: dict[str, Any]
    share_id: str = ""

    def to_api(self) -> dict[str, Any]:
        out: dict[str, Any] = {"driver": self.driver, "pool": self.pool, "device": self.device}
        if self.share_id:
            out["shareID"] = self.share_id
        out["conditions"] = [c.to_api() for c in self.conditions]
        out["data"] = self.data
        out["networkData"] = self.network_data.to_api()
        return out


def sandbox_interface(result: dict[str, Any], ifname: str) -> tuple[int | None, dict[str, Any]]:
    """(index, entry) of the pod-side interface: cni_plugin/wire/results.py's rule, shared with CHECK."""
    index = results.sandbox_interface(result, ifname)
    return index, (result["interfaces"][index] if index is not None else {})


def attachment_ips(result: dict[str, Any], index: int | None) -> list[str]:
    """The interface's addresses (cni_plugin/wire/results.py's rule) in the API's canonical form,
    de-duplicated, at most 16; an address the API could never accept is left out."""
    chosen: list[str] = []
    for address in results.addresses_for(result, index):
        try:
            cidr = limits.canonical_cidr(address)
        except ValueError:
            continue
        if cidr not in chosen:
            chosen.append(cidr)
    return chosen[: limits.MAX_IPS]


def _strip_sandbox(interfaces: list[Any]) -> list[Any]:
    """Sandbox paths are node-local netns paths: no use to API readers."""
    out = []
    for iface in interfaces:
        if isinstance(iface, dict):
            iface = {k: v for k, v in iface.items() if k != "sandbox"}
        out.append(iface)
    return out


def build_data(event: Event, index: int | None) -> dict[str, Any]:
    """The CNI result plus network and containerID, trimmed to the API's 10 KiB.

    apiVersion and kind come first and are never trimmed: the 10 KiB are measured with them.
    """
    result = event.result or {}
    data: dict[str, Any] = limits.valid_text({  # valid_text copies: the event's result stays as received
        "apiVersion": DATA_API_VERSION,
        "kind": DATA_KIND,
        "cniVersion": result.get("cniVersion", event.cni_version),
        "network": event.network,
        "containerID": event.container_id,
        "interfaces": _strip_sandbox(result.get("interfaces") or []),
        "ips": result.get("ips") or [],
        "routes": result.get("routes") or [],
        "dns": result.get("dns") or {},
    })
    trimmed: list[str] = []
    for step in TRIM_ORDER:
        if limits.data_size(data) <= limits.MAX_DATA_BYTES - TRIM_MARGIN:
            break
        _trim(data, step, index)
        trimmed.append(step)
    if trimmed:
        data["trimmed"] = trimmed
    return data


def versioned_data(data: dict[str, Any]) -> dict[str, Any]:
    """`data` in this release's form: one an older release wrote without `apiVersion` (0.1.0 wrote
    none) gets apiVersion and kind put first, and keeps the rest.

    The rest is what build_data wrote then: v1's fields without the two. It was measured without
    them, so one that ends up over the API's limit sheds whole fields in TRIM_ORDER's order and
    lists them in `trimmed`, as build_data would have. Data that names a version is left as it
    is, a newer one too (a rollback): only its writer knows that form.
    """
    if "apiVersion" in data:
        return data
    out = {"apiVersion": DATA_API_VERSION, "kind": DATA_KIND, **data}
    for step in ("dns", "routes", "ips", "interfaces"):
        if limits.data_size(out) <= limits.MAX_DATA_BYTES:
            break
        if out.pop(step, None) is not None:
            shed = out.get("trimmed")
            shed = list(shed) if isinstance(shed, list) else []
            out["trimmed"] = shed if step in shed else shed + [step]
    return out


def current_form(entry: dict[str, Any]) -> dict[str, Any]:
    """The entry as this release sends it: its `data` versioned (versioned_data).

    Every apply body goes through this (publisher/reconcile/reconciler.py plan), so an entry
    journaled by an older release, or adopted from the API by a rebuild, is rewritten on the
    claim's next apply instead of being kept in the old form for as long as it is unchanged.
    """
    data = entry.get("data")
    if not isinstance(data, dict) or "apiVersion" in data:
        return entry
    return {**entry, "data": versioned_data(data)}


def _trim(data: dict[str, Any], step: str, index: int | None) -> None:
    if step in ("dns", "routes", "ips", "interfaces"):
        data.pop(step, None)
    elif step == "other_interfaces":
        ifaces = data.get("interfaces") or []
        data["interfaces"] = [ifaces[index]] if index is not None and index < len(ifaces) else []
    elif step == "other_ips":
        data["ips"] = [ip for ip in data.get("ips") or [] if isinstance(ip, dict) and ip.get("interface") == index]


def ready_condition(event: Event, previous: dict[str, Any] | None) -> Condition:
    """Ready True after ADD (or a clean CHECK), False after a CHECK that found drift.

    lastTransitionTime is carried over from `previous` while the status stays
    the same, so a re-applied ADD changes nothing and is skipped as identical.
    """
    if event.op == "CHECK" and event.check_error:
        status, reason = "False", REASON_DRIFT
        message = f"CHECK found drift on {event.ifname}: {event.check_error}"[: limits.MAX_MESSAGE]
    else:
        status, reason = "True", REASON_CONFIGURED
        where = f" on network {event.network}" if event.network else ""
        message = f"interface {event.ifname} configured{where}"
    ltt = now_rfc3339()
    for cond in (previous or {}).get("conditions") or []:
        if cond.get("type") == READY and cond.get("status") == status and cond.get("lastTransitionTime"):
            ltt = cond["lastTransitionTime"]
    return Condition(READY, status, reason, message, ltt)


def map_event(
    event: Event,
    pool: str,
    device: str,
    previous: dict[str, Any] | None = None,
    share_id: str = "",
) -> dict[str, Any]:
    """The API form of the entry for this attachment; raises limits.InvalidEntry."""
    result = event.result or {}
    index, iface = sandbox_interface(result, event.ifname)
    if event.op == "CHECK" and previous and not result:
        # A CHECK without a result only changes the condition.
        net = previous.get("networkData") or {"interfaceName": event.ifname}
        network_data = NetworkData(net.get("interfaceName", event.ifname), list(net.get("ips") or []),
                                   net.get("hardwareAddress", ""))
        data = versioned_data(previous.get("data") or {})
    else:
        mac = iface.get("mac", "") if isinstance(iface.get("mac", ""), str) else ""
        network_data = NetworkData(event.ifname, attachment_ips(result, index), mac.lower())
        data = build_data(event, index)
    entry = DeviceStatus(
        driver=event.driver,
        pool=pool,
        device=device,
        network_data=network_data,
        conditions=[ready_condition(event, previous)],
        data=data,
        share_id=share_id,
    ).to_api()
    entry = limits.valid_text(entry)  # the interface name, MAC and condition message come from the event too
    limits.validate_entry(entry)
    return entry
