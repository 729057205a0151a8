"""Device IDs: which allocated device an interface is on, as the meta plugin and the driver name it.

A network DRA driver in Multus's mode (SR-IOV VFs, RDMA NICs) allocates several devices under
one request, and Multus hands each delegate the ID of the device it chose for that network (a
PCI address for a VF). The same ID is a ResourceSlice attribute of the allocated device, so it
is what ties an interface to its `status.devices` entry when the request name cannot.

Shared by the plugin (what it sends) and the publisher (what it matches against the slices),
so both sides compare the same spelling. No imports: it is on the plugin's ADD path.
"""

from __future__ import annotations

# The longest device ID carried on the wire. A PCI address is 12 characters; vDPA or auxiliary
# device names are longer, but never near this.
MAX_DEVICE_ID = 256

_HEX = frozenset("0123456789abcdef")


def _hex_field(text: str, width: int) -> str | None:
    """`text` as a zero-padded lowercase hex field of `width` digits, None when it is not one."""
    text = text.lower()
    if not text or len(text) > width or not set(text) <= _HEX:
        return None
    return text.rjust(width, "0")


def normalize(value: str) -> str:
    """The canonical spelling of a device ID, so `03:00.1`, `0000:03:00.1` and `0000:03:00.1 `
    compare equal.

    A PCI address ([domain:]bus:device.function) becomes `dddd:bb:dd.f`, lowercase, the domain
    0000 when left out: drivers, Multus and plugins each print it their own way. Anything else
    (a vDPA or auxiliary device name) is only stripped: it is compared as it is.
    """
    text = value.strip()
    head, dot, function = text.rpartition(".")
    parts = head.split(":") if dot else []
    if len(parts) == 2:
        parts.insert(0, "0")
    if len(parts) == 3 and len(function) == 1 and function in "01234567":
        domain, bus, device = _hex_field(parts[0], 4), _hex_field(parts[1], 2), _hex_field(parts[2], 2)
        if domain and bus and device and int(device, 16) < 32:
            return f"{domain}:{bus}:{device}.{function}"
    return text


def problem(value: object) -> str:
    """Why `value` cannot be a device ID ('' when it can)."""
    if not isinstance(value, str):
        return "must be a string"
    if len(value) > MAX_DEVICE_ID:
        return f"must be at most {MAX_DEVICE_ID} characters"
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in value):
        return "must not contain control characters"
    return ""
