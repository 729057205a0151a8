"""The wire format between the netclaim CNI plugin and netclaim-publisher.

This is the one module both sides import, so a change to the format is made in
one place. It is on the plugin's hot path: it imports only the standard library
and does no work at import time.

Framing: every message is a 4-byte big-endian length followed by that many bytes
of UTF-8 JSON (an object). A peer that sends a frame larger than MAX_FRAME, or a
frame that is not a JSON object, gets an error reply and the connection is
closed. The same JSON object (one event) is what a spool file holds.

Requests (client -> publisher):
    {"kind": "event", "event": {...Event...}}
    {"kind": "status"}
Replies (publisher -> client):
    {"ok": true, "id": "<event id>"}      event committed to the journal
    {"ok": false, "error": "..."}         rejected; the client may spool it
    {"ok": true, "status": {...}}         answer to a status request
"""

from __future__ import annotations

import json
import os
import struct
import time
from dataclasses import asdict, dataclass
from typing import Any

PROTOCOL_VERSION = 1
MAX_FRAME = 1 << 20  # 1 MiB: a CNI result is a few KiB; anything bigger is abuse
_HEADER = struct.Struct("!I")

OPS = ("ADD", "DEL", "CHECK", "GC")

DEFAULT_SOCKET = "/run/netclaim/publisher.sock"
DEFAULT_SPOOL_DIR = "/var/lib/netclaim/spool"
SPOOL_SUFFIX = ".event.json"


class WireError(ValueError):
    """A frame or event that does not follow this format."""


@dataclass
class PodRef:
    """Pod identity as the runtime passed it in CNI_ARGS."""

    namespace: str
    name: str
    uid: str = ""


@dataclass
class Event:
    """One CNI operation on one attachment (containerID + ifname).

    `result` is always the CNI result converted to cniVersion 1.1.0 form
    (interfaces[], ips[] with an `interface` index, routes[], dns), whatever
    version the runtime spoke, so the publisher handles one shape only.
    `check_error` is set on a CHECK that found drift; the publisher turns it
    into Ready=False. `valid_attachments` is set on GC only.
    """

    op: str
    container_id: str
    ifname: str
    driver: str
    netns: str = ""
    network: str = ""
    request: str = ""
    pod: PodRef | None = None
    result: dict[str, Any] | None = None
    check_error: str = ""
    valid_attachments: list[dict[str, str]] | None = None
    cni_version: str = ""
    timestamp: float = 0.0
    event_id: str = ""
    version: int = PROTOCOL_VERSION

    def __post_init__(self) -> None:
        if not self.timestamp:
            self.timestamp = time.time()
        if not self.event_id:
            # Unique per plugin invocation without importing uuid: time, pid and
            # 4 random bytes. Used to de-duplicate an event that was both
            # spooled and delivered (e.g. an ack lost after the commit).
            self.event_id = f"{time.time_ns():x}-{os.getpid():x}-{os.urandom(4).hex()}"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Any) -> "Event":
        """Build an Event from decoded JSON, rejecting anything malformed."""
        if not isinstance(data, dict):
            raise WireError("event must be a JSON object")
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(data) - known)
        if unknown:
            raise WireError(f"unknown event fields: {', '.join(unknown)}")
        for name in ("op", "container_id", "ifname", "driver"):
            if not isinstance(data.get(name), str) or not data.get(name):
                raise WireError(f"event field {name!r} must be a non-empty string")
        if data["op"] not in OPS:
            raise WireError(f"event op {data['op']!r} is not one of {', '.join(OPS)}")
        for name in ("netns", "network", "request", "check_error", "cni_version", "event_id"):
            if name in data and not isinstance(data[name], str):
                raise WireError(f"event field {name!r} must be a string")
        pod = data.get("pod")
        if pod is not None:
            if not isinstance(pod, dict) or not all(
                isinstance(pod.get(k, ""), str) for k in ("namespace", "name", "uid")
            ) or set(pod) - {"namespace", "name", "uid"}:
                raise WireError("event field 'pod' must be {namespace, name, uid} strings")
            pod = PodRef(pod.get("namespace", ""), pod.get("name", ""), pod.get("uid", ""))
        result = data.get("result")
        if result is not None and not isinstance(result, dict):
            raise WireError("event field 'result' must be an object")
        valid = data.get("valid_attachments")
        if valid is not None:
            if not isinstance(valid, list) or not all(
                isinstance(a, dict)
                and isinstance(a.get("containerID"), str)
                and isinstance(a.get("ifname"), str)
                for a in valid
            ):
                raise WireError("'valid_attachments' must be a list of {containerID, ifname}")
        ts = data.get("timestamp", 0.0)
        if not isinstance(ts, (int, float)) or isinstance(ts, bool):
            raise WireError("event field 'timestamp' must be a number")
        version = data.get("version", PROTOCOL_VERSION)
        if version != PROTOCOL_VERSION:
            raise WireError(f"unsupported wire version {version!r}")
        fields = dict(data)
        fields["pod"] = pod
        fields["timestamp"] = float(ts)
        return cls(**fields)

    @property
    def attachment(self) -> tuple[str, str]:
        """The key events are ordered by: (containerID, ifname)."""
        return (self.container_id, self.ifname)


# ---------------------------------------------------------------- framing


def encode_frame(message: dict[str, Any]) -> bytes:
    body = json.dumps(message, separators=(",", ":")).encode()
    if len(body) > MAX_FRAME:
        raise WireError(f"frame of {len(body)} bytes exceeds {MAX_FRAME}")
    return _HEADER.pack(len(body)) + body


def _recv_exact(sock: Any, n: int) -> bytes:
    chunks = []
    while n:
        chunk = sock.recv(min(n, 65536))
        if not chunk:
            raise WireError("connection closed mid-frame")
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def read_frame(sock: Any, max_frame: int = MAX_FRAME) -> dict[str, Any]:
    """Read one frame from a blocking socket.

    Raises WireError for an oversized, truncated or non-object frame and
    EOFError when the peer closed cleanly before a new frame.
    """
    first = sock.recv(_HEADER.size)
    if not first:
        raise EOFError("peer closed")
    header = first + (_recv_exact(sock, _HEADER.size - len(first)) if len(first) < _HEADER.size else b"")
    (length,) = _HEADER.unpack(header)
    if length > max_frame:
        raise WireError(f"frame of {length} bytes exceeds {max_frame}")
    return decode_body(_recv_exact(sock, length))


def decode_body(body: bytes) -> dict[str, Any]:
    try:
        message = json.loads(body)
    except (UnicodeDecodeError, ValueError) as exc:
        raise WireError(f"frame is not JSON: {exc}") from None
    if not isinstance(message, dict):
        raise WireError("frame must be a JSON object")
    return message


def event_request(event: Event) -> dict[str, Any]:
    return {"kind": "event", "event": event.to_dict()}


# ---------------------------------------------------------------- spool


def spool_name(event: Event) -> str:
    """Spool files sort by time, so a replay keeps the plugin's order."""
    return f"{time.time_ns():020d}-{event.event_id}{SPOOL_SUFFIX}"


def write_spool(spool_dir: str, event: Event) -> str:
    """Write one event durably: temp file, fsync, rename, fsync the dir.

    The directory is created 0700; files are 0600. Returns the final path.
    """
    os.makedirs(spool_dir, mode=0o700, exist_ok=True)
    os.chmod(spool_dir, 0o700)
    final = os.path.join(spool_dir, spool_name(event))
    tmp = final + ".tmp"
    data = json.dumps(event.to_dict(), separators=(",", ":")).encode()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.rename(tmp, final)
    dfd = os.open(spool_dir, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)
    return final


def read_spool(path: str) -> Event:
    with open(path, "rb") as fh:
        return Event.from_dict(decode_body(fh.read()))


def list_spool(spool_dir: str) -> list[str]:
    """Complete spool files in write order (temp files are skipped)."""
    try:
        names = os.listdir(spool_dir)
    except FileNotFoundError:
        return []
    return [os.path.join(spool_dir, n) for n in sorted(names) if n.endswith(SPOOL_SUFFIX)]


__all__ = [
    "DEFAULT_SOCKET",
    "DEFAULT_SPOOL_DIR",
    "Event",
    "MAX_FRAME",
    "OPS",
    "PodRef",
    "WireError",
    "decode_body",
    "encode_frame",
    "event_request",
    "list_spool",
    "read_frame",
    "read_spool",
    "write_spool",
]
