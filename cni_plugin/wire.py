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

import os
import time

from .jsonio import JSONError, dumps, loads

PROTOCOL_VERSION = 1
MAX_FRAME = 1 << 20  # 1 MiB: a CNI result is a few KiB; anything bigger is abuse
_HEADER_SIZE = 4

OPS = ("ADD", "DEL", "CHECK", "GC")

DEFAULT_SOCKET = "/run/netclaim/publisher.sock"
DEFAULT_SPOOL_DIR = "/var/lib/netclaim/spool"
SPOOL_SUFFIX = ".event.json"


class WireError(ValueError):
    """A frame or event that does not follow this format."""


class _Record:
    """A small stand-in for @dataclass: declared fields, keyword init, eq, repr.

    The plugin imports this module on every pod start. Measured here, importing
    `dataclasses` costs ~35 ms and `typing` ~20 ms on a ~12 ms interpreter start,
    which alone would break the plugin's start-up budget, so the wire records
    declare their fields in FIELDS (name -> default) instead.
    """

    FIELDS: dict = {}
    __slots__ = ()

    def __init__(self, *args: object, **kwargs: object) -> None:
        names = list(self.FIELDS)
        if len(args) > len(names):
            raise TypeError(f"{type(self).__name__} takes at most {len(names)} positional arguments")
        values = dict(zip(names, args))
        for key, value in kwargs.items():
            if key not in self.FIELDS:
                raise TypeError(f"{type(self).__name__} has no field {key!r}")
            if key in values:
                raise TypeError(f"{type(self).__name__} got {key!r} twice")
            values[key] = value
        for name, default in self.FIELDS.items():
            if name not in values:
                if default is _REQUIRED:
                    raise TypeError(f"{type(self).__name__} needs field {name!r}")
                values[name] = default
            object.__setattr__(self, name, values[name])

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return all(getattr(self, n) == getattr(other, n) for n in self.FIELDS)

    __hash__ = None  # type: ignore[assignment]  # mutable, like a dataclass

    def __repr__(self) -> str:
        inner = ", ".join(f"{n}={getattr(self, n)!r}" for n in self.FIELDS)
        return f"{type(self).__name__}({inner})"


_REQUIRED = object()


class PodRef(_Record):
    """Pod identity as the runtime passed it in CNI_ARGS."""

    FIELDS = {"namespace": _REQUIRED, "name": _REQUIRED, "uid": ""}
    __slots__ = tuple(FIELDS)

    namespace: str
    name: str
    uid: str

    def to_dict(self) -> dict:
        return {"namespace": self.namespace, "name": self.name, "uid": self.uid}


_BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"
_BOOT_ID = []  # cached per process: [boot id] once read


def _boot_id() -> str:
    if not _BOOT_ID:
        try:
            with open(_BOOT_ID_PATH, "rb") as fh:
                _BOOT_ID.append(fh.read().decode().strip())
        except OSError:
            _BOOT_ID.append("")
    return _BOOT_ID[0]


def new_order() -> list:
    """Where an event happened on the node: [boot id, CLOCK_BOOTTIME ns, wall clock ns].

    Stamped once, when the plugin creates the event; the socket and the spool
    carry the same stamp. CLOCK_BOOTTIME never goes back within a boot (and
    counts suspend), so it orders events of one boot even when the wall clock
    is stepped; the boot id tells whether two stamps share that clock. Across
    boots only the wall clock can order them.
    """
    return [_boot_id(), time.clock_gettime_ns(time.CLOCK_BOOTTIME), time.time_ns()]


def legacy_order(timestamp: float) -> list:
    """The order of an event written before stamps existed: its wall-clock timestamp only."""
    return ["", 0, int(timestamp * 1e9)]


def order_before(a: list, b: list) -> bool:
    """True when stamp `a` happened before stamp `b` (see new_order).

    Same boot: CLOCK_BOOTTIME, ties broken by the wall clock. Different or
    unknown boots: the wall clock, ties broken by CLOCK_BOOTTIME.
    """
    if a[0] and a[0] == b[0]:
        return (a[1], a[2]) < (b[1], b[2])
    return (a[2], a[1]) < (b[2], b[1])


def _valid_order(value: object) -> bool:
    return (isinstance(value, list) and len(value) == 3 and isinstance(value[0], str)
            and all(isinstance(v, int) and not isinstance(v, bool) for v in value[1:]))


class Event(_Record):
    """One CNI operation on one attachment (containerID + ifname).

    `result` is always the CNI result converted to cniVersion 1.1.0 form
    (interfaces[], ips[] with an `interface` index, routes[], dns), whatever
    version the runtime spoke, so the publisher handles one shape only.
    `check_error` is set on a CHECK that found drift; the publisher turns it
    into Ready=False. `valid_attachments` is set on GC only (whose container_id
    and ifname are "*"). `order` is the stamp of where the event happened on
    the node (new_order), set at creation; the publisher orders an
    attachment's events, tombstones and GC fences by it, never by arrival.
    """

    FIELDS = {
        "op": _REQUIRED,
        "container_id": _REQUIRED,
        "ifname": _REQUIRED,
        "driver": _REQUIRED,
        "netns": "",
        "network": "",
        "request": "",
        "pod": None,
        "result": None,
        "check_error": "",
        "valid_attachments": None,
        "cni_version": "",
        "timestamp": 0.0,
        "event_id": "",
        "version": PROTOCOL_VERSION,
        "order": None,
    }
    __slots__ = tuple(FIELDS)

    op: str
    container_id: str
    ifname: str
    driver: str
    netns: str
    network: str
    request: str
    pod: PodRef | None
    result: dict | None
    check_error: str
    valid_attachments: list | None
    cni_version: str
    timestamp: float
    event_id: str
    version: int
    order: list | None

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        if not self.timestamp:
            self.timestamp = time.time()
        if not self.event_id:
            # Unique per plugin invocation without importing uuid: time, pid and
            # 4 random bytes. Used to de-duplicate an event that was both
            # spooled and delivered (e.g. an ack lost after the commit).
            self.event_id = f"{time.time_ns():x}-{os.getpid():x}-{os.urandom(4).hex()}"
        if not self.order:
            self.order = new_order()

    def to_dict(self) -> dict:
        out = {name: getattr(self, name) for name in self.FIELDS}
        if self.pod is not None:
            out["pod"] = self.pod.to_dict()
        return out

    @classmethod
    def from_dict(cls, data: object) -> "Event":
        """Build an Event from decoded JSON, rejecting anything malformed."""
        if not isinstance(data, dict):
            raise WireError("event must be a JSON object")
        unknown = sorted(set(data) - set(cls.FIELDS))
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
            if (
                not isinstance(pod, dict)
                or set(pod) - {"namespace", "name", "uid"}
                or not all(isinstance(pod.get(k, ""), str) for k in ("namespace", "name", "uid"))
            ):
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
        order = data.get("order")
        if order is not None and not _valid_order(order):
            raise WireError("event field 'order' must be [boot id, boottime ns, wall ns]")
        fields = dict(data)
        fields["pod"] = pod
        fields["timestamp"] = float(ts)
        # An event journaled or spooled before stamps existed is ordered by its timestamp.
        fields["order"] = list(order) if order else legacy_order(float(ts) or time.time())
        return cls(**fields)

    @property
    def has_pod_identity(self) -> bool:
        """Whether the runtime named the pod (K8S_POD_NAMESPACE and K8S_POD_NAME)."""
        return self.pod is not None and bool(self.pod.namespace) and bool(self.pod.name)

    @property
    def attachment(self) -> tuple:
        """The key events are ordered by: (containerID, ifname)."""
        return (self.container_id, self.ifname)


# ---------------------------------------------------------------- framing


def encode_frame(message: dict) -> bytes:
    body = dumps(message).encode()
    if len(body) > MAX_FRAME:
        raise WireError(f"frame of {len(body)} bytes exceeds {MAX_FRAME}")
    return len(body).to_bytes(_HEADER_SIZE, "big") + body


def _recv_exact(sock: object, n: int) -> bytes:
    chunks = []
    while n:
        chunk = sock.recv(min(n, 65536))
        if not chunk:
            raise WireError("connection closed mid-frame")
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def read_frame(sock: object, max_frame: int = MAX_FRAME) -> dict:
    """Read one frame from a blocking socket.

    Raises WireError for an oversized, truncated or non-object frame and
    EOFError when the peer closed cleanly before a new frame.
    """
    first = sock.recv(_HEADER_SIZE)
    if not first:
        raise EOFError("peer closed")
    header = first + (_recv_exact(sock, _HEADER_SIZE - len(first)) if len(first) < _HEADER_SIZE else b"")
    length = int.from_bytes(header, "big")
    if length > max_frame:
        raise WireError(f"frame of {length} bytes exceeds {max_frame}")
    return decode_body(_recv_exact(sock, length))


def decode_body(body: bytes) -> dict:
    try:
        message = loads(body.decode())
    except (UnicodeDecodeError, JSONError) as exc:
        raise WireError(f"frame is not JSON: {exc}") from None
    if not isinstance(message, dict):
        raise WireError("frame must be a JSON object")
    return message


def event_request(event: Event) -> dict:
    return {"kind": "event", "event": event.to_dict()}


# ---------------------------------------------------------------- spool
#
# The spool is bounded (count and bytes): a publisher gone for good must not
# fill the node's disk. An event over the cap is not written; the drop is
# counted in the marker file `overflow` (no `.json` suffix, so no listing
# mistakes it for an event), which the publisher reports and takes away.
# The marker is updated under flock(2) on the spool directory itself, not on
# the marker: the marker is replaced by rename, so a lock on it would guard
# an inode that the next writer no longer opens, and counts would be lost.
# The directory is opened with O_NOFOLLOW and chmod-ed through that fd only:
# a symlink planted in its place is refused, never followed.

DEFAULT_SPOOL_MAX_FILES = 1024
DEFAULT_SPOOL_MAX_BYTES = 64 << 20
OVERFLOW_NAME = "overflow"
_ENOSPC = 28
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


class SpoolFull(OSError):
    """The spool is at its cap: the event was counted in the overflow marker, not written."""


def open_private_dir(path: str) -> int:
    """Open (creating it 0700 if missing) a directory of the plugin's own; returns an fd.

    The last component must be a real directory: a symlink there fails with
    ELOOP instead of being followed, and the mode is fixed with fchmod on the
    opened directory, so nothing is ever chmod-ed through a link.
    """
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except FileNotFoundError:
        os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            pass
    fd = os.open(path, _DIR_FLAGS)
    try:
        if os.fstat(fd).st_mode & 0o7777 != 0o700:
            os.fchmod(fd, 0o700)
    except BaseException:
        os.close(fd)
        raise
    return fd


def write_file_at(dir_fd: int, name: str, data: bytes) -> None:
    """Durably replace `name` in the directory: temp file, fsync, rename, fsync the dir."""
    tmp = f"{name}.{os.getpid()}.tmp"
    try:
        os.unlink(tmp, dir_fd=dir_fd)  # left by a crashed run with our pid
    except FileNotFoundError:
        pass
    fd = os.open(tmp, _NEW_FILE, 0o600, dir_fd=dir_fd)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.rename(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    os.fsync(dir_fd)


def spool_name(event: Event) -> str:
    """Spool files sort by time, so a replay keeps the plugin's order."""
    return f"{time.time_ns():020d}-{event.event_id}{SPOOL_SUFFIX}"


def spool_usage(dir_fd: int) -> tuple[int, int]:
    """(event files, their bytes) in the spool directory."""
    count = size = 0
    with os.scandir(dir_fd) as entries:
        for entry in entries:
            if entry.name.endswith(SPOOL_SUFFIX):
                count += 1
                size += entry.stat(follow_symlinks=False).st_size
    return count, size


def write_spool(spool_dir: str, event: Event, max_files: int = DEFAULT_SPOOL_MAX_FILES,
                max_bytes: int = DEFAULT_SPOOL_MAX_BYTES) -> str:
    """Write one event durably (0600 file in a 0700 dir); returns the final path.

    Raises SpoolFull (after counting the drop in the overflow marker) when the
    event would take the spool over `max_files` or `max_bytes`. The check and
    the write are not one atomic step, so concurrent plugin runs can overshoot
    the cap by at most their number.
    """
    data = dumps(event.to_dict()).encode()
    dfd = open_private_dir(spool_dir)
    try:
        count, size = spool_usage(dfd)
        if count + 1 > max_files or size + len(data) > max_bytes:
            record_overflow(dfd, event.op)
            raise SpoolFull(_ENOSPC, f"spool is full ({count} files, {size} bytes; caps {max_files}, {max_bytes})")
        name = spool_name(event)
        write_file_at(dfd, name, data)
    finally:
        os.close(dfd)
    return os.path.join(spool_dir, name)


def spool_has_room(spool_dir: str, max_files: int = DEFAULT_SPOOL_MAX_FILES,
                   max_bytes: int = DEFAULT_SPOOL_MAX_BYTES) -> bool:
    """Could an event be spooled now? Cheap: no write, no fsync (STATUS uses it)."""
    try:
        fd = os.open(spool_dir, _DIR_FLAGS)
    except FileNotFoundError:
        return _creatable(spool_dir)
    except OSError:
        return False
    try:
        if not os.access(spool_dir, os.W_OK | os.X_OK):
            return False
        count, size = spool_usage(fd)
    except OSError:
        return False
    finally:
        os.close(fd)
    return count < max_files and size < max_bytes


def _creatable(path: str) -> bool:
    """True when the nearest existing ancestor of `path` is a writable directory."""
    while path and path != "/":
        path = os.path.dirname(path)
        if os.path.isdir(path):
            return os.access(path, os.W_OK | os.X_OK)
        if os.path.lexists(path):
            return False
    return os.access("/", os.W_OK | os.X_OK)


def read_spool(path: str) -> Event:
    with open(path, "rb") as fh:
        return Event.from_dict(decode_body(fh.read()))


def list_spool(spool_dir: str) -> list[str]:
    """Complete spool files in write order (temp files and the overflow marker are skipped)."""
    try:
        names = os.listdir(spool_dir)
    except FileNotFoundError:
        return []
    return [os.path.join(spool_dir, n) for n in sorted(names) if n.endswith(SPOOL_SUFFIX)]


def record_overflow(dir_fd: int, command: str) -> dict:
    """Count one dropped event in the marker, under the directory's lock; returns the marker."""
    import fcntl

    fcntl.flock(dir_fd, fcntl.LOCK_EX)
    try:
        try:
            current = _parse_overflow(_read_at(dir_fd, OVERFLOW_NAME)) or {}
        except FileNotFoundError:
            current = {}
        now = time.time()
        marker = {"dropped": current.get("dropped", 0) + 1, "firstDroppedAt": current.get("firstDroppedAt", now),
                  "lastDroppedAt": now, "lastCommand": command}
        write_file_at(dir_fd, OVERFLOW_NAME, dumps(marker).encode())
    finally:
        fcntl.flock(dir_fd, fcntl.LOCK_UN)
    return marker


def _read_at(dir_fd: int, name: str) -> bytes:
    fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    try:
        chunks = []
        while True:
            chunk = os.read(fd, 65536)
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)
    finally:
        os.close(fd)


def _parse_overflow(data: bytes) -> dict | None:
    """The marker as a dict with the documented types, or None when it is not one."""
    try:
        marker = loads(data.decode())
    except (UnicodeDecodeError, JSONError):
        return None
    if not isinstance(marker, dict):
        return None
    dropped = marker.get("dropped")
    first, last = marker.get("firstDroppedAt"), marker.get("lastDroppedAt")
    if isinstance(dropped, bool) or not isinstance(dropped, int) or dropped < 0:
        return None
    if not all(isinstance(t, (int, float)) and not isinstance(t, bool) for t in (first, last)):
        return None
    return {"dropped": dropped, "firstDroppedAt": float(first), "lastDroppedAt": float(last),
            "lastCommand": str(marker.get("lastCommand", ""))}


def read_overflow(spool_dir: str) -> dict | None:
    """The overflow marker ({dropped, firstDroppedAt, lastDroppedAt, lastCommand}) or None."""
    try:
        fd = os.open(spool_dir, _DIR_FLAGS)
    except OSError:
        return None
    try:
        return _parse_overflow(_read_at(fd, OVERFLOW_NAME))
    except OSError:
        return None
    finally:
        os.close(fd)


def take_overflow(spool_dir: str) -> dict | None:
    """Atomically take the marker away (rename under the lock) and return it, or None.

    Drops counted after this call start a new marker, so none is lost or
    counted twice between the publisher's report and the plugins' updates.
    """
    import fcntl

    try:
        fd = os.open(spool_dir, _DIR_FLAGS)
    except OSError:
        return None
    taken = f"{OVERFLOW_NAME}.taken.{os.getpid()}"
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            os.rename(OVERFLOW_NAME, taken, src_dir_fd=fd, dst_dir_fd=fd)
        except FileNotFoundError:
            return None
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
        try:
            return _parse_overflow(_read_at(fd, taken))
        finally:
            os.unlink(taken, dir_fd=fd)
    finally:
        os.close(fd)


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
    "legacy_order",
    "new_order",
    "order_before",
    "SpoolFull",
    "list_spool",
    "read_frame",
    "read_overflow",
    "read_spool",
    "spool_has_room",
    "take_overflow",
    "write_spool",
]
