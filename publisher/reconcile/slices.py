"""What this node's ResourceSlices say about a driver's devices: the interface and device ID of each.

The allocation names a device (pool/device); the plugin names an interface and, behind a meta
plugin such as Multus, the device ID it was handed (a VF's PCI address). The slices tie the
two together when a request alone cannot: several devices under one request (`count: 2`, the
same NetworkAttachmentDefinition twice). They are read only for such a choice or an event that
carries a device ID, never for an ordinary pod, and kept for limits.SLICE_CACHE: a burst of
multi-VF pods costs one list, not one per ADD.

A driver that re-enumerates its devices (VFs recreated, a restart that renames them) publishes
the pool again at a higher `spec.pool.generation` before it deletes the old slices. As the API
prescribes, only the slices of a pool's highest generation count, and only once that generation
is complete (as many slices as its `resourceSliceCount`): until then the pool's devices are
unknown and a choice that needs them waits (SlicesUnsettled), rather than map an interface to
the device that used to carry its ID. A listing caught in such a change is never kept.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable

from cni_plugin.wire.deviceid import normalize
from publisher import limits
from publisher.kube.calls import Forbidden, Kube, PermanentError, TransientError

# Where the device ID of a network device is published, first found wins: Multus's own attribute
# (its DRA client hands it to the delegates), then the standard PCI address. Never the driver's
# own `deviceID`: dra-driver-sriov publishes the PCI *product* ID under that name.
DEFAULT_DEVICE_ID_ATTRIBUTES = ("k8s.cni.cncf.io/deviceID", "resource.kubernetes.io/pciBusID")

DeviceKey = tuple[str, str]  # (pool, device)


@dataclass(frozen=True)
class DeviceFacts:
    interface: str = ""  # the slice attribute `interfaceName`
    device_id: str = ""  # normalised (cni_plugin/wire/deviceid.py)


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


class SlicesUnsettled(TransientError):
    """A wanted device's pool is being republished: its newest generation is not complete yet.

    Transient by nature (the driver is writing the remaining slices): the resolver waits for
    it as for a claim not yet allocated, a reconcile keeps the claim dirty and retries it.
    """

    def __init__(self, message: str) -> None:
        super().__init__(0, message)


@dataclass(frozen=True)
class SliceView:
    """What one listing of a driver's slices on this node tells."""

    devices: dict[DeviceKey, DeviceFacts]
    # pool -> why its devices are unknown now (its newest generation lacks slices)
    unsettled: dict[str, str]
    # a pool showed slices of several generations: the driver is mid-change, the old ones go soon
    superseded: bool = False

    @property
    def keepable(self) -> bool:
        """Whether this listing may be kept for SLICE_CACHE: only one of pools at rest."""
        return not self.unsettled and not self.superseded


def read_slices(slices: list[dict[str, Any]], driver: str, id_attributes: tuple[str, ...]) -> SliceView:
    """The devices of each pool's newest complete generation, from a list of the driver's slices."""
    pools: dict[str, list[dict[str, Any]]] = {}
    for sl in slices:
        pools.setdefault(_pool(sl).get("name", ""), []).append(sl)
    out: dict[DeviceKey, DeviceFacts] = {}
    unsettled: dict[str, str] = {}
    superseded = False
    for pool, members in pools.items():
        newest = max(_generation(sl) for sl in members)
        current = [sl for sl in members if _generation(sl) == newest]
        superseded = superseded or len(current) < len(members)
        why = _incomplete(current)
        if why:
            unsettled[pool] = f"pool {pool!r} of driver {driver} is being republished: generation {newest} {why}"
            continue
        for sl in current:
            out.update(_devices(sl, pool, driver, id_attributes))
    return SliceView(out, unsettled, superseded)


def device_facts(slices: list[dict[str, Any]], driver: str,
                 id_attributes: tuple[str, ...]) -> dict[DeviceKey, DeviceFacts]:
    """(pool, device) -> its facts, from a list of the driver's slices on this node: the pools' newest
    complete generations only (read_slices)."""
    return read_slices(slices, driver, id_attributes).devices


def _pool(sl: dict[str, Any]) -> dict[str, Any]:
    return (sl.get("spec") or {}).get("pool") or {}


def _generation(sl: dict[str, Any]) -> int:
    value = _pool(sl).get("generation")
    return value if isinstance(value, int) else 0


def _incomplete(current: list[dict[str, Any]]) -> str:
    """Why a generation's slices are not all there ("" when they are): the API's rule, as many
    slices as `resourceSliceCount` says (a slice count the slices disagree on is not complete)."""
    counts = {_pool(sl).get("resourceSliceCount") for sl in current}
    if len(counts) != 1:
        return f"has slices that disagree on resourceSliceCount ({sorted(map(str, counts))})"
    count = counts.pop()
    if isinstance(count, int) and count > 0 and len(current) != count:
        return f"has {len(current)} of its {count} ResourceSlices"
    return ""


def _devices(sl: dict[str, Any], pool: str, driver: str,
             id_attributes: tuple[str, ...]) -> dict[DeviceKey, DeviceFacts]:
    out: dict[DeviceKey, DeviceFacts] = {}
    for dev in (sl.get("spec") or {}).get("devices") or []:
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
        lacks a wanted device and is older than SLICE_REREAD (a slice republished since).

        Raises SlicesUnsettled when a wanted device's pool is being republished (its newest
        generation incomplete): the caller waits and asks again, never guesses.
        """
        wanted = list(wanted)
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
        view = read_slices(items, driver, self.id_attributes)
        with self._lock:
            if view.keepable:
                self._kept[driver] = (now, view.devices)
            else:  # mid-change: the next choice lists again
                self._kept.pop(driver, None)
        waits = sorted({view.unsettled[pool] for pool, _ in wanted if pool in view.unsettled})
        if waits:
            raise SlicesUnsettled("; ".join(waits))
        return view.devices
