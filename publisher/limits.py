"""THE one place that knows what the API server accepts in status.devices.

The API server rejects a whole apply with 422 when one entry breaks a rule,
which would also block every sibling entry of the claim. So each entry is
checked here first, with the server's own limits (kubernetes
pkg/apis/resource/validation), and a bad entry is reported instead of sent.
"""

from __future__ import annotations

import ipaddress
import json
import re
from typing import Any

MAX_IPS = 16
MAX_DATA_BYTES = 10 * 1024
MAX_INTERFACE_NAME = 256
MAX_HARDWARE_ADDRESS = 128
MAX_CONDITIONS = 8
MAX_DRIVER_NAME = 63
MAX_POOL_NAME = 253
MAX_REASON = 1024
MAX_MESSAGE = 32768
MAX_CONDITION_TYPE = 316

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_REASON = re.compile(r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$")
_QUALIFIED_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")


class InvalidEntry(ValueError):
    """An entry the API server would reject; the message says which rule."""


def is_dns_label(value: str) -> bool:
    return len(value) <= 63 and bool(_DNS_LABEL.match(value))


def is_dns_subdomain(value: str, max_len: int = 253) -> bool:
    return len(value) <= max_len and bool(_DNS_SUBDOMAIN.match(value))


def is_pool_name(value: str) -> bool:
    """A pool name is DNS subdomains joined by '/', at most 253 characters."""
    return 0 < len(value) <= MAX_POOL_NAME and all(is_dns_subdomain(part) for part in value.split("/"))


def canonical_cidr(value: str) -> str:
    """`2001:0db8:0:0::5/64` -> `2001:db8::5/64`; host bits are kept (an interface address).

    Raises ValueError for anything that is not an address with a prefix.
    """
    if "/" not in value:
        raise ValueError(f"{value!r} has no prefix length")
    iface = ipaddress.ip_interface(value.strip())
    return f"{iface.ip}/{iface.network.prefixlen}"


def data_size(data: Any) -> int:
    return len(json.dumps(data, separators=(",", ":")).encode())


def _check_condition(cond: dict[str, Any], where: str) -> list[str]:
    errors = []
    ctype = cond.get("type", "")
    if not ctype or len(ctype) > MAX_CONDITION_TYPE or not _QUALIFIED_NAME.match(ctype.rsplit("/", 1)[-1]):
        errors.append(f"{where}.type {ctype!r} is not a qualified name")
    if cond.get("status") not in ("True", "False", "Unknown"):
        errors.append(f"{where}.status must be True, False or Unknown")
    reason = cond.get("reason", "")
    if not reason or len(reason) > MAX_REASON or not _REASON.match(reason):
        errors.append(f"{where}.reason {reason!r} is not a valid reason")
    if len(cond.get("message", "")) > MAX_MESSAGE:
        errors.append(f"{where}.message is longer than {MAX_MESSAGE}")
    if not cond.get("lastTransitionTime"):
        errors.append(f"{where}.lastTransitionTime is required")
    return errors


def check_entry(entry: dict[str, Any]) -> list[str]:
    """All the reasons the API server would reject this AllocatedDeviceStatus."""
    errors: list[str] = []
    driver, pool, device = entry.get("driver", ""), entry.get("pool", ""), entry.get("device", "")
    if not is_dns_subdomain(driver, MAX_DRIVER_NAME):
        errors.append(f"driver {driver!r} is not a DNS subdomain of at most {MAX_DRIVER_NAME} characters")
    if not is_pool_name(pool):
        errors.append(f"pool {pool!r} is not a valid pool name")
    if not is_dns_label(device):
        errors.append(f"device {device!r} is not a DNS label")
    conditions = entry.get("conditions") or []
    if len(conditions) > MAX_CONDITIONS:
        errors.append(f"{len(conditions)} conditions, at most {MAX_CONDITIONS} allowed")
    types = [c.get("type") for c in conditions]
    if len(set(types)) != len(types):
        errors.append("condition types are not unique")
    for i, cond in enumerate(conditions):
        errors += _check_condition(cond, f"conditions[{i}]")
    if "data" in entry:
        if not isinstance(entry["data"], dict):
            errors.append("data must be a JSON object")
        elif data_size(entry["data"]) > MAX_DATA_BYTES:
            errors.append(f"data is {data_size(entry['data'])} bytes, at most {MAX_DATA_BYTES} allowed")
    net = entry.get("networkData") or {}
    if len(net.get("interfaceName", "").encode()) > MAX_INTERFACE_NAME:
        errors.append(f"networkData.interfaceName is longer than {MAX_INTERFACE_NAME} bytes")
    if len(net.get("hardwareAddress", "").encode()) > MAX_HARDWARE_ADDRESS:
        errors.append(f"networkData.hardwareAddress is longer than {MAX_HARDWARE_ADDRESS} bytes")
    ips = net.get("ips") or []
    if len(ips) > MAX_IPS:
        errors.append(f"networkData.ips has {len(ips)} entries, at most {MAX_IPS} allowed")
    if len(set(ips)) != len(ips):
        errors.append("networkData.ips are not unique")
    for ip in ips:
        try:
            if canonical_cidr(ip) != ip:
                errors.append(f"networkData.ips {ip!r} is not in canonical form")
        except ValueError:
            errors.append(f"networkData.ips {ip!r} is not an address with a prefix")
    return errors


def validate_entry(entry: dict[str, Any]) -> None:
    errors = check_entry(entry)
    if errors:
        raise InvalidEntry("; ".join(errors))
