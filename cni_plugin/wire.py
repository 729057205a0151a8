"""The wire format between the netclaim CNI plugin and netclaim-publisher.

This is the one module both sides import, so a change to the format is made in
one place. It is on the plugin's hot path: it imports only the standard library
and does no work at import time.

Framing: every message is a 4-byte big-endian length followed by that many bytes
of UTF-8 JSON (an object). A peer that sends a frame larger than MAX_FRAME, or a
frame that is not a JSON object, gets an error reply and the connection is
closed. The same JSON object (one event) is what a spool file holds.

One event is at most MAX_EVENT_BYTES encoded and MAX_JSON_DEPTH levels deep,
whichever channel carries it: the plugin refuses to hand off a bigger one, the
publisher's socket reads at most MAX_FRAME (that cap plus the request's
envelope) and `read_spool` checks the file's size before reading it, so an
oversized event is refused before anything parses it.

Requests (client -> publisher):
    {"kind": "event", "event": {...Event...}}
    {"kind": "status"}
Replies (publisher -> client):
    {"ok": true, "id": "<event id>"}      event committed to the journal
    {"ok": false, "error": "..."}         rejected; the client may spool it
    {"ok": true, "status": {...}}         answer to a status request

Growing the format (docs/publisher.md "Versions, rollout and downgrades"): a
publisher ignores event fields it does not know (and tells the hook set with
`on_unknown_fields`, so it can log and count them), so a new optional field
needs no new version. A version is for a change an older publisher must not
read as if it knew it: the publisher reads versions 1..WIRE_VERSION_MAX and
refuses a higher one as NewerVersion, which is not malformed (the plugin
spools it; a spooled one is kept for a newer publisher, never quarantined).
Publishers roll out first: WIRE_VERSION_MAX is raised one release before the
plugin's WIRE_VERSION, and a new field is sent only once every supported
publisher ignores or reads it.
"""

from __future__ import annotations

import time

from . import posixos as os
from .deviceid import problem as device_id_problem
from .jsonio import MAX_JSON_DEPTH, JSONError, dumps, loads, too_deep
from .safefs import (
    DIR_FLAGS as _DIR_FLAGS,
    NEW_FILE,
    TMP_SUFFIX,
    open_private_dir,
    pid_gone,
    read_at,
    stale_temp,
    temp_name,
    write_all,
    write_file_at,
)
from .record import REQUIRED as _REQUIRED
from .record import Record as _Record

TYPE_CHECKING = False
if TYPE_CHECKING:  # pragma: no cover
    from typing import Callable

# What this plugin writes into every event: the newest version every supported publisher reads.
WIRE_VERSION = 1
# The newest version this publisher reads. Nothing has needed a version 2 yet: fields added
# since version 1 are optional and ignored by publishers that do not know them.
WIRE_VERSION_MAX = 1
PROTOCOL_VERSION = WIRE_VERSION  # the name `--version` and netclaim_build_info show
# One event, encoded, on either channel. The API keeps at most ~10 KiB of it
# (`data` <= 10240 bytes, 16 IPs); a real result - even 16 interfaces, 64 IPs
# and hundreds of routes - is tens of KiB. 256 KiB leaves ample room for that
# and bounds what one event costs the publisher to parse (a few MiB) and the
# spool to hold (its 64 MiB default still fits 256 worst-case events).
MAX_EVENT_BYTES = 256 << 10
_ENVELOPE = 64  # {"kind":"event","event":...}
MAX_FRAME = MAX_EVENT_BYTES + _ENVELOPE  # what the publisher reads from a client: one request
MAX_REPLY_FRAME = 1 << 20  # replies (a status listing can be larger than one event)
_HEADER_SIZE = 4

OPS = ("ADD", "DEL", "CHECK", "GC")

DEFAULT_SOCKET = "/run/netclaim/publisher.sock"
DEFAULT_SPOOL_DIR = "/var/lib/netclaim/spool"
SPOOL_SUFFIX = ".event.json"


class WireError(ValueError):
    """A frame or event that does not follow this format."""


class NewerVersion(WireError):
    """An event of a wire version above WIRE_VERSION_MAX: a newer plugin's, not a malformed one.

    A newer publisher reads it, so it must survive: the socket refuses it (the
    plugin spools it) and the spool keeps it (publisher/intake/spool.py).
    """


_UNKNOWN_FIELDS_HOOK: list = []  # [hook] once the publisher set one; the plugin never does


def on_unknown_fields(hook: Callable[[list[str]], None] | None) -> None:
    """Call `hook(names)` for every event that parsed with fields this code does not know.

    Names of `pod`'s fields are given as "pod.<name>". The publisher logs and
    counts them (publisher/intake/spool.py); None removes the hook.
    """
    _UNKNOWN_FIELDS_HOOK[:] = [hook] if hook is not None else []


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
# A simulated reboot (tests only: a host cannot be rebooted under a test) names a file of its own here,
# in the runtime's environment (every plugin run inherits it) and the publisher's. A container mounts a
# fresh procfs, so the kernel's file cannot be bind-mounted over for a containerized publisher.
_BOOT_ID_FILE_ENV = b"NETCLAIM_BOOT_ID_FILE"
_BOOT_ID = []  # cached per process: [boot id] once read


def _boot_id_path() -> str:
    import posix  # built in: no `os` on the plugin's hot path

    override = posix.environ.get(_BOOT_ID_FILE_ENV)
    return override.decode(errors="surrogateescape") if override else _BOOT_ID_PATH


def _boot_id() -> str:
    if not _BOOT_ID:
        for path in dict.fromkeys((_boot_id_path(), _BOOT_ID_PATH)):  # a simulated boot not begun yet: the kernel's
            try:
                with open(path, "rb") as fh:
                    _BOOT_ID.append(fh.read().decode().strip())
                break
            except OSError:
                continue
        else:
            _BOOT_ID.append("")
    return _BOOT_ID[0]


def new_order() -> list:
    """Where an event happened on the node: [boot id, CLOCK_BOOTTIME ns, wall clock ns].

    Stamped once, when the plugin creates the event; the socket and the spool
    carry the same stamp. CLOCK_BOOTTIME never goes back within a boot (and
    counts suspend), so it orders events of one boot even when the wall clock
    is stepped; the boot id tells whether two stamps share that clock. Stamps
    of different boots are never ordered by wall clock: the publisher's boot
    rule makes every event of an earlier boot a no-op (publisher/journal/order.py).
    """
    return [_boot_id(), time.clock_gettime_ns(time.CLOCK_BOOTTIME), time.time_ns()]


def legacy_order(timestamp: float) -> list:
    """The order of an event written before stamps existed: its wall-clock timestamp only."""
    return ["", 0, int(timestamp * 1e9)]


def _check_version(version: object) -> None:
    """WireError unless a positive integer; NewerVersion above WIRE_VERSION_MAX."""
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise WireError(f"event field 'version' must be a positive integer, not {version!r}")
    if version > WIRE_VERSION_MAX:
        raise NewerVersion(f"event of wire version {version} is newer than this publisher reads "
                           f"(1..{WIRE_VERSION_MAX}): the plugin is newer than the publisher; upgrade the publisher "
                           "(publishers roll out first)")


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
        "device_id": "",
        "pod": None,
        "result": None,
        "check_error": "",
        "valid_attachments": None,
        "cni_version": "",
        "timestamp": 0.0,
        "event_id": "",
        "version": WIRE_VERSION,
        "order": None,
        "unusable_ips": None,
    }
    __slots__ = tuple(FIELDS)

    op: str
    container_id: str
    ifname: str
    driver: str
    netns: str
    network: str
    request: str
    device_id: str  # normalised (cni_plugin/deviceid.py); "" when the meta plugin gave none
    pod: PodRef | None
    result: dict | None
    check_error: str
    valid_attachments: list | None
    cni_version: str
    timestamp: float
    event_id: str
    version: int  # as sent: 1..WIRE_VERSION_MAX
    order: list | None
    # ADD only: the result's addresses the interface held but could not use when the plugin looked,
    # {address as the result writes it: "tentative" | "dadfailed" | "deprecated"} (cni_plugin/netlink.py)
    unusable_ips: dict | None

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
        if not self.device_id:  # sent only when there is one: every other event stays as before
            del out["device_id"]
        if not self.unusable_ips:  # likewise: an older publisher never sees it unless there is news in it
            del out["unusable_ips"]
        if self.pod is not None:
            out["pod"] = self.pod.to_dict()
        return out

    @classmethod
    def from_dict(cls, data: object) -> "Event":
        """Build an Event from decoded JSON: WireError when malformed, NewerVersion when newer.

        The version is judged first: a newer format may change any other field,
        and such an event must not be quarantined as malformed for it. Fields
        this code does not know are left out of the Event and told to the hook
        (on_unknown_fields) once the event has parsed.
        """
        if not isinstance(data, dict):
            raise WireError("event must be a JSON object")
        if too_deep(data, MAX_JSON_DEPTH):
            raise WireError(f"event is nested more than {MAX_JSON_DEPTH} levels deep")
        _check_version(data.get("version", WIRE_VERSION))
        unknown = [name for name in data if name not in cls.FIELDS]
        for name in ("op", "container_id", "ifname", "driver"):
            if not isinstance(data.get(name), str) or not data.get(name):
                raise WireError(f"event field {name!r} must be a non-empty string")
        if data["op"] not in OPS:
            raise WireError(f"event op {data['op']!r} is not one of {', '.join(OPS)}")
        for name in ("netns", "network", "request", "device_id", "check_error", "cni_version", "event_id"):
            if name in data and not isinstance(data[name], str):
                raise WireError(f"event field {name!r} must be a string")
        pod = data.get("pod")
        if pod is not None:
            if not isinstance(pod, dict) or not all(
                    isinstance(pod.get(k, ""), str) for k in ("namespace", "name", "uid")):
                raise WireError("event field 'pod' must be {namespace, name, uid} strings")
            unknown += [f"pod.{k}" for k in pod if k not in PodRef.FIELDS]
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
        if data.get("device_id") and device_id_problem(data["device_id"]):
            raise WireError(f"event field 'device_id' {device_id_problem(data['device_id'])}")
        unusable = data.get("unusable_ips")
        if unusable is not None and not (isinstance(unusable, dict) and all(
                isinstance(k, str) and isinstance(v, str) for k, v in unusable.items())):
            raise WireError("event field 'unusable_ips' must be an object of address: state strings")
        order = data.get("order")
        if order is not None and not _valid_order(order):
            raise WireError("event field 'order' must be [boot id, boottime ns, wall ns]")
        fields = {name: data[name] for name in cls.FIELDS if name in data}
        fields["pod"] = pod
        fields["timestamp"] = float(ts)
        # An event journaled or spooled before stamps existed is ordered by its timestamp.
        fields["order"] = list(order) if order else legacy_order(float(ts) or time.time())
        event = cls(**fields)
        if unknown and _UNKNOWN_FIELDS_HOOK:
            _UNKNOWN_FIELDS_HOOK[0](sorted(unknown))
        return event

    @property
    def has_pod_identity(self) -> bool:
        """Whether the runtime named the pod (K8S_POD_NAMESPACE and K8S_POD_NAME)."""
        return self.pod is not None and bool(self.pod.namespace) and bool(self.pod.name)

    @property
    def attachment(self) -> tuple:
        """The key events are ordered by: (containerID, ifname)."""
        return (self.container_id, self.ifname)


# ---------------------------------------------------------------- framing


class EventTooLarge(WireError):
    """An event over MAX_EVENT_BYTES: refused on both channels, never retried."""


def encode_event(event: Event) -> bytes:
    """The event as one JSON object (what a spool file holds); EventTooLarge over the cap."""
    data = dumps(event.to_dict()).encode()
    if len(data) > MAX_EVENT_BYTES:
        raise EventTooLarge(f"event of {len(data)} bytes exceeds the {MAX_EVENT_BYTES}-byte event cap")
    return data


def event_frame(data: bytes) -> bytes:
    """The request frame for an event already encoded by encode_event (no second encoding)."""
    body = b'{"kind":"event","event":' + data + b"}"
    return len(body).to_bytes(_HEADER_SIZE, "big") + body


def encode_frame(message: dict, max_frame: int = MAX_REPLY_FRAME) -> bytes:
    body = dumps(message).encode()
    if len(body) > max_frame:
        raise WireError(f"frame of {len(body)} bytes exceeds {max_frame}")
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


def read_frame(sock: object, max_frame: int = MAX_REPLY_FRAME) -> dict:
    """Read one frame from a blocking socket.

    Raises WireError for an oversized, truncated or non-object frame and
    EOFError when the peer closed cleanly before a new frame. The length is
    checked before the body is read: a server reading requests passes
    MAX_FRAME (one event and its envelope); clients reading replies keep the
    default.
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
# The marker is updated (in place) under flock(2) on the spool directory
# itself, not on the marker: the publisher takes it away by rename, so a lock
# on it would guard an inode that the next writer no longer opens, and counts
# would be lost.
# The directory is opened component by component without following links
# (cni_plugin/safefs.py) and chmod-ed through that fd only. Temp files count
# against the caps while their writer lives; those of dead writers are removed.
#
# An event file is written completely to a temp file and renamed into place, so
# a reader never sees half an event, but nothing is fsynced (not the file, not
# the directory): only an OS crash or power loss can lose or tear it, and that
# crash destroyed the sandbox the event is about. The publisher drops the torn
# files of earlier boots without alarm (publisher/intake/spool.py).

DEFAULT_SPOOL_MAX_FILES = 1024
DEFAULT_SPOOL_MAX_BYTES = 64 << 20
OVERFLOW_NAME = "overflow"
_ENOSPC = 28
_EFBIG = 27
_EDQUOT = 122


class SpoolFull(OSError):
    """The spool is at its cap: the event was counted in the overflow marker, not written."""


def spool_name(event: Event) -> str:
    """Spool files sort by time, so a replay keeps the plugin's order."""
    return f"{time.time_ns():020d}-{event.event_id}{SPOOL_SUFFIX}"


def spool_usage(dir_fd: int, max_files: int | None = None) -> tuple[int, int]:
    """(files, bytes) the spool holds: events plus temp files of live writers.

    Temp files of dead writers (a plugin killed mid-write) are removed here,
    so nothing leaks; those of live ones count, so concurrent writers cannot
    hide bytes from the caps. With `max_files`, a spool already holding that
    many files is not stat-ed: the file cap alone refuses the event, and on a
    node whose publisher is gone every hand-off finds the spool so (a stat per
    file is most of the cost of a hand-off then); its bytes are returned as -1.
    """
    names = []
    for name in os.listdir(dir_fd):
        if name.endswith(TMP_SUFFIX) and stale_temp(name):
            try:
                os.unlink(name, dir_fd=dir_fd)
            except FileNotFoundError:
                pass
        elif name.endswith(SPOOL_SUFFIX) or name.endswith(TMP_SUFFIX):
            names.append(name)
    if max_files is not None and len(names) >= max_files:
        return len(names), -1
    count = size = 0
    for name in names:
        try:
            st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            continue
        size += st.st_size
        count += 1
    return count, size


def _full(count: int, size: int, max_files: int, max_bytes: int) -> str:
    held = f"{count} files" if size < 0 else f"{count} files, {size} bytes"
    return f"spool is full ({held}; caps {max_files}, {max_bytes})"


def write_spool(spool_dir: str, event: Event, max_files: int = DEFAULT_SPOOL_MAX_FILES,
                max_bytes: int = DEFAULT_SPOOL_MAX_BYTES, data: bytes | None = None) -> str:
    """Write one event whole (0600 file in a 0700 dir, temp file + rename, no fsync); returns its path.

    `data` is the event as encode_event made it (encoded here when None).
    Raises EventTooLarge over MAX_EVENT_BYTES, SpoolFull (after counting the
    drop in the overflow marker) when the event would take the spool over
    `max_files` or `max_bytes`, OSError when it cannot be written completely
    (nothing is left behind then). The check and the write are not one atomic
    step, so concurrent plugin runs can overshoot the cap by at most their number.
    """
    if data is None:
        data = encode_event(event)
    dfd = open_private_dir(spool_dir)
    try:
        count, size = spool_usage(dfd, max_files)
        if count + 1 > max_files or size + len(data) > max_bytes:
            record_overflow(dfd, event.op)
            raise SpoolFull(_ENOSPC, _full(count, size, max_files, max_bytes))
        name = spool_name(event)
        write_file_at(dfd, name, data, sync=False)  # no fsync: see the comment above DEFAULT_SPOOL_MAX_FILES
    finally:
        os.close(dfd)
    return os.path.join(spool_dir, name)


def spool_problem(spool_dir: str, max_files: int = DEFAULT_SPOOL_MAX_FILES,
                  max_bytes: int = DEFAULT_SPOOL_MAX_BYTES) -> str:
    """Why an event could not be spooled now ("" when it could). STATUS uses it.

    It does what write_spool does short of writing an event: opens (creates)
    the directory the same way, checks the caps, checks that the file system
    has room for the largest event and a free inode, and creates and removes
    a probe file (which catches a read-only mount).
    """
    try:
        dfd = open_private_dir(spool_dir)
    except OSError as exc:
        return f"spool dir: {type(exc).__name__}: {exc}"
    try:
        count, size = spool_usage(dfd, max_files)
        if count + 1 > max_files or size >= max_bytes:
            return _full(count, size, max_files, max_bytes)
        fs = os.fstatvfs(dfd)
        if fs.f_bavail * fs.f_frsize < MAX_EVENT_BYTES or fs.f_favail == 0:
            return (f"spool file system is full ({fs.f_bavail * fs.f_frsize} bytes, {fs.f_favail} inodes free; "
                    f"an event needs up to {MAX_EVENT_BYTES} bytes)")
        _probe(dfd)
    except OSError as exc:
        return f"spool: {type(exc).__name__}: {exc}"
    finally:
        os.close(dfd)
    return ""


def _probe(dir_fd: int) -> None:
    """Create, write and remove a temp file (a dead prober's is cleaned like any temp file)."""
    name = temp_name(".probe")
    fd = os.open(name, NEW_FILE, 0o600, dir_fd=dir_fd)
    try:
        write_all(fd, b"{}")
    finally:
        os.close(fd)
        os.unlink(name, dir_fd=dir_fd)


def read_spool(path: str) -> Event:
    """One spooled event; WireError (the publisher quarantines the file) when it is not one.

    The size is checked with fstat before anything is read, so a huge file
    costs no memory; the depth is checked by Event.from_dict.
    """
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if st.st_size > MAX_EVENT_BYTES:
            raise EventTooLarge(f"spool file of {st.st_size} bytes exceeds the {MAX_EVENT_BYTES}-byte event cap")
        chunks = []
        left = MAX_EVENT_BYTES + 1
        while left > 0:
            chunk = os.read(fd, min(left, 65536))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
    finally:
        os.close(fd)
    if left <= 0:
        raise EventTooLarge(f"spool file grew past the {MAX_EVENT_BYTES}-byte event cap while read")
    return Event.from_dict(decode_body(b"".join(chunks)))


def list_spool(spool_dir: str) -> list[str]:
    """Complete spool files in write order (temp files and the overflow marker are skipped)."""
    try:
        names = os.listdir(spool_dir)
    except FileNotFoundError:
        return []
    return [os.path.join(spool_dir, n) for n in sorted(names) if n.endswith(SPOOL_SUFFIX)]


def record_overflow(dir_fd: int, command: str) -> dict:
    """Count one dropped event in the marker, under the directory's lock; returns the marker.

    The marker is rewritten in place (one pwrite of a fixed-width record at
    offset 0), not replaced by rename: on a node whose publisher is gone every
    pod start and stop lands here, and ext4 writes a file renamed over another
    out to disk before the rename (auto_da_alloc), a flush per pod start. In
    place it is a page-cache write, and on a full file system it still counts
    (the block is already there). No fsync, like an event file: an OS crash
    that loses the count destroyed the sandboxes whose events it counted.
    Anything but a plain file of ours at the name is replaced as before.
    """
    import fcntl

    fcntl.flock(dir_fd, fcntl.LOCK_EX)
    try:
        fd = _open_marker(dir_fd)
        if fd is None:
            marker = _next_marker({}, command)
            write_file_at(dir_fd, OVERFLOW_NAME, _marker_record(marker), sync=False)
            return marker
        try:
            current = os.pread(fd, _MARKER_LIMIT + 1, 0)
            marker = _next_marker((_parse_overflow(current) if len(current) <= _MARKER_LIMIT else None) or {},
                                  command)
            record = _marker_record(marker)
            if os.pwrite(fd, record, 0) != len(record):
                raise OSError(_ENOSPC, "overflow marker: short write")
            if len(current) > len(record):
                os.ftruncate(fd, len(record))
        finally:
            os.close(fd)
    finally:
        fcntl.flock(dir_fd, fcntl.LOCK_UN)
    return marker


_MARKER_LIMIT = 4096  # the marker is ~120 bytes; anything bigger is not ours
_MARKER_WIDTH = 256  # every write of the marker is this long (JSON, then spaces): it never leaves a tail
_S_IFMT, _S_IFREG = 0o170000, 0o100000


def _open_marker(dir_fd: int) -> int | None:
    """The marker opened for update (created when missing), or None when the name is not a plain file of ours."""
    try:
        fd = os.open(OVERFLOW_NAME, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o600,
                     dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in (_ENOSPC, _EDQUOT):
            raise
        return None  # a symlink (ELOOP), a directory (EISDIR), ...: replaced by write_file_at
    st = os.fstat(fd)
    if st.st_mode & _S_IFMT != _S_IFREG or st.st_nlink != 1 or st.st_uid != os.geteuid():
        os.close(fd)
        return None
    return fd


def _next_marker(current: dict, command: str) -> dict:
    now = time.time()
    return {"dropped": current.get("dropped", 0) + 1, "firstDroppedAt": current.get("firstDroppedAt", now),
            "lastDroppedAt": now, "lastCommand": command}


def _marker_record(marker: dict) -> bytes:
    return dumps(marker).encode().ljust(_MARKER_WIDTH)


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
        import fcntl

        fcntl.flock(fd, fcntl.LOCK_SH)  # an update in place is never read half-written
        return _parse_overflow(read_at(fd, OVERFLOW_NAME, _MARKER_LIMIT))
    except OSError:
        return None
    finally:
        os.close(fd)


_TAKEN_PREFIX = f"{OVERFLOW_NAME}.taken."


def take_overflow(spool_dir: str) -> dict | None:
    """Atomically take the marker away (rename under the lock) and return it, or None.

    Drops counted after this call start a new marker, so none is lost or
    counted twice between the publisher's report and the plugins' updates.
    The taken copy (`overflow.taken.<pid>`) is read and removed under the same
    lock, so one found there was left by a taker that died between its rename
    and its unlink: when that pid is gone its count is added to this take.
    """
    import fcntl

    try:
        fd = os.open(spool_dir, _DIR_FLAGS)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            markers = [_take_at(fd, name) for name in sorted(os.listdir(fd))
                       if name.startswith(_TAKEN_PREFIX) and _taker_gone(name)]
            taken = f"{_TAKEN_PREFIX}{os.getpid()}"
            try:
                os.rename(OVERFLOW_NAME, taken, src_dir_fd=fd, dst_dir_fd=fd)
            except FileNotFoundError:
                pass
            else:
                markers.append(_take_at(fd, taken))
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
    return _merge_markers([m for m in markers if m])


def _taker_gone(name: str) -> bool:
    """Is the publisher that took `overflow.taken.<pid>` gone (or this very process)?"""
    pid = name[len(_TAKEN_PREFIX):]
    return pid.isdigit() and (int(pid) == os.getpid() or pid_gone(int(pid)))


def _take_at(dir_fd: int, name: str) -> dict | None:
    """Read a taken marker and remove it (a corrupt one too: there is no count to save)."""
    try:
        return _parse_overflow(read_at(dir_fd, name, _MARKER_LIMIT))
    finally:
        os.unlink(name, dir_fd=dir_fd)


def _merge_markers(markers: list[dict]) -> dict | None:
    """One marker for several takes: drops added, the first and last drop of them all."""
    if not markers:
        return None
    last = max(markers, key=lambda m: m["lastDroppedAt"])
    return {"dropped": sum(m["dropped"] for m in markers),
            "firstDroppedAt": min(m["firstDroppedAt"] for m in markers),
            "lastDroppedAt": last["lastDroppedAt"], "lastCommand": last["lastCommand"]}


__all__ = [
    "DEFAULT_SOCKET",
    "DEFAULT_SPOOL_DIR",
    "Event",
    "EventTooLarge",
    "MAX_EVENT_BYTES",
    "MAX_FRAME",
    "MAX_JSON_DEPTH",
    "MAX_REPLY_FRAME",
    "NewerVersion",
    "OPS",
    "PodRef",
    "WIRE_VERSION",
    "WIRE_VERSION_MAX",
    "WireError",
    "decode_body",
    "encode_event",
    "encode_frame",
    "event_frame",
    "event_request",
    "legacy_order",
    "new_order",
    "SpoolFull",
    "list_spool",
    "on_unknown_fields",
    "read_frame",
    "read_overflow",
    "read_spool",
    "spool_problem",
    "take_overflow",
    "write_spool",
]
