"""CNI result validation and conversion between spec versions.

The plugin speaks every version from 0.3.0 to 1.1.0 to the runtime, but the
event it hands to the publisher always carries the 1.1.0 form, so the
publisher has one shape to map. Shapes:

- 0.3.0 / 0.3.1 / 0.4.0: `ips[]` carry `version` ("4"/"6"); interfaces have
  name, mac, sandbox only; routes have dst and gw.
- 1.0.0 / 1.1.0: no `ips[].version`; interfaces may carry `mtu`, `socketPath`,
  `pciID`; routes may carry mtu/advmss/priority/table/scope. (libcni uses one
  type for both 1.x versions, so 1.0.0 output keeps the 1.1.0 fields.)
"""

from __future__ import annotations

from ..lean.errors import config_error

TYPE_CHECKING = False
if TYPE_CHECKING:  # pragma: no cover
    from typing import Any

CURRENT = "1.1.0"
_V0_INTERFACE_KEYS = ("name", "mac", "sandbox")
_V0_ROUTE_KEYS = ("dst", "gw")
_STR = str


def _check_str(obj: dict[str, Any], key: str, field: str, required: bool = False) -> None:
    if key not in obj:
        if required:
            raise config_error(field, f"'{key}' is required")
        return
    if not isinstance(obj[key], _STR):
        raise config_error(f"{field}.{key}", "must be a string")


def validate(result: dict[str, Any], field: str = "prevResult") -> None:
    """Reject a prevResult we could not convert or report faithfully (error 7)."""
    interfaces = result.get("interfaces", [])
    if not isinstance(interfaces, list):
        raise config_error(f"{field}.interfaces", "must be a list")
    for i, iface in enumerate(interfaces):
        where = f"{field}.interfaces[{i}]"
        if not isinstance(iface, dict):
            raise config_error(where, "must be an object")
        _check_str(iface, "name", where, required=True)
        for key in ("mac", "sandbox", "socketPath", "pciID"):
            _check_str(iface, key, where)
        mtu = iface.get("mtu")
        if mtu is not None and (isinstance(mtu, bool) or not isinstance(mtu, int) or mtu < 0):
            raise config_error(f"{where}.mtu", "must be a non-negative integer")
    ips = result.get("ips", [])
    if not isinstance(ips, list):
        raise config_error(f"{field}.ips", "must be a list")
    for i, ip in enumerate(ips):
        where = f"{field}.ips[{i}]"
        if not isinstance(ip, dict):
            raise config_error(where, "must be an object")
        _check_str(ip, "address", where, required=True)
        if "/" not in ip["address"]:
            raise config_error(f"{where}.address", "must be an address with prefix length (CIDR)")
        _check_str(ip, "gateway", where)
        index = ip.get("interface")
        if index is not None and (isinstance(index, bool) or not isinstance(index, int)
                                  or not 0 <= index < len(interfaces)):
            raise config_error(f"{where}.interface", "must be an index into interfaces")
    routes = result.get("routes", [])
    if not isinstance(routes, list) or not all(isinstance(r, dict) and isinstance(r.get("dst"), _STR) for r in routes):
        raise config_error(f"{field}.routes", "must be a list of objects with a 'dst' string")
    dns = result.get("dns", {})
    if not isinstance(dns, dict):
        raise config_error(f"{field}.dns", "must be an object")


def _ip_version(address: str) -> str:
    return "6" if ":" in address else "4"


def to_current(result: dict[str, Any]) -> dict[str, Any]:
    """Any supported version -> 1.1.0 form (a new dict; the input is not changed)."""
    out: dict[str, Any] = {"cniVersion": CURRENT}
    out["interfaces"] = [dict(i) for i in result.get("interfaces", [])]
    ips = []
    for ip in result.get("ips", []):
        ip = dict(ip)
        ip.pop("version", None)
        ips.append(ip)
    out["ips"] = ips
    out["routes"] = [dict(r) for r in result.get("routes", [])]
    out["dns"] = dict(result.get("dns", {}))
    return out


def from_current(result: dict[str, Any], version: str) -> dict[str, Any]:
    """1.1.0 form -> the runtime's cniVersion (what the plugin prints)."""
    if version.startswith("1."):
        out = to_current(result)
        out["cniVersion"] = version
        return out
    out = {"cniVersion": version}
    out["interfaces"] = [{k: i[k] for k in _V0_INTERFACE_KEYS if k in i} for i in result.get("interfaces", [])]
    ips = []
    for ip in result.get("ips", []):
        converted = {"version": _ip_version(ip["address"])}
        converted.update((k, v) for k, v in ip.items() if k != "version")
        ips.append(converted)
    out["ips"] = ips
    out["routes"] = [{k: r[k] for k in _V0_ROUTE_KEYS if k in r} for r in result.get("routes", [])]
    out["dns"] = dict(result.get("dns", {}))
    return out


def sandbox_interface(result: dict[str, Any], ifname: str) -> int | None:
    """Index of the pod-side entry for CNI_IFNAME (named so and has a sandbox), else None.

    THE rule for "the sandbox interface", shared by the plugin's CHECK and the
    publisher's mapping (publisher/reconcile/mapper.py): host-side entries (bridge, veth,
    ifb) have no sandbox and never count.
    """
    for i, iface in enumerate(result.get("interfaces") or []):
        if isinstance(iface, dict) and iface.get("name") == ifname and iface.get("sandbox"):
            return i
    return None


def addresses_for(result: dict[str, Any], index: int | None) -> list[str]:
    """THE rule for "the sandbox interface's IPs" (plugin CHECK and publisher mapping).

    An ips[] entry belongs to interface `index` when its `interface` field is
    that index. An entry without `interface` belongs to it only when the result
    has at most one sandbox interface (then there is nobody else it could be
    for). Entries that are not objects with a string address are skipped. The
    addresses are returned as written, in order, without duplicates; the
    publisher canonicalizes them for the API.
    """
    interfaces = result.get("interfaces") or []
    single_sandbox = sum(1 for i in interfaces if isinstance(i, dict) and i.get("sandbox")) <= 1
    out: list[str] = []
    for ip in result.get("ips") or []:
        if not isinstance(ip, dict) or not isinstance(ip.get("address"), str):
            continue
        owner = ip.get("interface")
        if (owner is None and single_sandbox) or (owner is not None and owner == index):
            if ip["address"] not in out:
                out.append(ip["address"])
    return out
