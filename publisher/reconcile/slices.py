"""What this node's ResourceSlices say about a driver's devices: the interface and device ID of each.

The allocation names a device (pool/device); the plugin names an interface and, behind a meta
plugin such as Multus, the device ID it was handed (a VF's PCI address). The slices tie the
two together when a request alone cannot: several devices under one request (`count: 2`, the
same NetworkAttachmentDefinition twice). They are read only for such a choice or an event that
carries a device ID, never for an ordinary pod, and kept for limits.SLICE_CACHE: a burst of
multi-VF pods costs one list, not one per ADD.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable

from cni_plugin.deviceid import normalize

from publisher import limits
from publisher.kube.calls import Forbidden, Kube, PermanentError

# Where the device ID of a network device is published, first found wins: Multus's own attribute
# (its DRA client hands it to the delegates), then the standard PCI address. Never the driver's
# own `deviceID`: dra-driver-sriov publishes the PCI *product* ID under that name.
DEFAULT_DEVICE_ID_ATTRIBUTES = ("k8s.cni.cncf.io/deviceID", "resource.kubernetes.io/pciBusID")

DeviceKey = tuple[str, str]  # (pool, device)


@dataclass(frozen=True)
class DeviceFacts:
    interface: str = ""  # the slice attribute `interfaceName`
    device_id: str = ""  # normalised (cni_plugin/deviceid.py)


def check_attribute_names(names: Iterable[str]) -> tuple[str, ...]:
    """The configured device-ID attributes, each fully qualified: ValueError naming a bare one.

    A bare name in a slice belongs to the driver's own domain, so `deviceID` would read what
    each driver means by it (the PCI product ID for dra-driver-sriov), not an address.
    """
    out = tuple(n.strip() for n in names if n.strip())
    for name in out:
        domain, _, attr = name.rpartition("/")
        if not domain or not attr:
            raise ValueError(f"device-ID attribute {name!r} must be qualified with its domain "
                             "(for example k8s.cni.cncf.io/deviceID)")
    return out


def device_facts(slices: list[dict[str, Any]], driver: str, id_attributes: tuple[str, ...]) -> dict[DeviceKey, DeviceFacts]:
    """(pool, device) -> its facts, from a list of the driver's slices on this node."""
    out: dict[DeviceKey, DeviceFacts] = {}
    for sl in slices:
        spec = sl.get("spec") or {}
        pool = (spec.get("pool") or {}).get("name", "")
        for dev in spec.get("devices") or []:
            attrs = {(k if "/" in k else f"{driver}/{k}"): v for k, v in (dev.get("attributes") or {}).items()}
            out[(pool, dev.get("name", ""))] = DeviceFacts(
                interface=_string(attrs.get(f"{driver}/interfaceName")),
                device_id=next((normalize(v) for v in (_string(attrs.get(a)) for a in id_attributes) if v), ""))
    return out


def _string(attr: object) -> str:
    value = attr.get("string") if isinstance(attr, dict) else None
    return value if isinstance(value, str) else ""


class SliceFacts:
    """The node's slices per driver, read on demand and kept a short while; thread-safe."""

    def __init__(self, kube: Kube, node: str, id_attributes: tuple[str, ...] = DEFAULT_DEVICE_ID_ATTRIBUTES,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.kube = kube
        self.node = node
        self.id_attributes = id_attributes
        self.clock = clock
        self._lock = threading.Lock()
        self._kept: dict[str, tuple[float, dict[DeviceKey, DeviceFacts]]] = {}

    def facts(self, driver: str, wanted: Iterable[DeviceKey] = ()) -> dict[DeviceKey, DeviceFacts]:
        """The driver's devices on this node. Read again when the copy is older than SLICE_CACHE, or
        lacks a wanted device and is older than SLICE_REREAD (a slice republished since)."""
        now = self.clock()
        with self._lock:
            kept = self._kept.get(driver)
        if kept is not None:
            age = now - kept[0]
            if age < limits.SLICE_CACHE and (age < limits.SLICE_REREAD or all(k in kept[1] for k in wanted)):
                return kept[1]
        try:
            items = self.kube.list_resource_slices(self.node, driver).get("items") or []
        except (PermanentError, Forbidden):  # RBAC without `list resourceslices`: decide without them
            return kept[1] if kept else {}
        fresh = device_facts(items, driver, self.id_attributes)
        with self._lock:
            self._kept[driver] = (now, fresh)
        return fresh
