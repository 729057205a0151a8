"""The event one CNI operation hands from the plugin to the publisher, and its versions.

Both programs import this module, so a change to the record is made in one place. It is on the
plugin's hot path: it imports only the standard library and the lean primitives, and does no
work at import time. `frame` carries an event over the socket, `spool` in a file; both hold the
same JSON object, so a late channel cannot reorder or reshape history.

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

from ..lean import posixos as os
from ..lean.jsonio import MAX_JSON_DEPTH, JSONError, dumps, loads, too_deep
from ..lean.record import REQUIRED as _REQUIRED, Record as _Record
from .deviceid import problem as device_id_problem

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

OPS = ("ADD", "DEL", "CHECK", "GC")


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
_BOOT_ID: list[str] = []  # cached per process: [boot id] once read


def _boot_id_path() -> str:
    import posix  # built in: no `os` on the plugin's hot path

    override = posix.environ.get(_BOOT_ID_FILE_ENV)
    return override.decode(errors="surrogateescape") if override else _BOOT_ID_PATH


def boot_id() -> str:
    """This boot's id (or the simulated boot's), read once per process."""
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
    return [boot_id(), time.clock_gettime_ns(time.CLOCK_BOOTTIME), time.time_ns()]


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
        "extended_resource": "",
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
    # The DRA extended resource (e.g. example.com/nic) whose device this attachment also is when the
    # pod asked for it in its containers' resources: the scheduler's claim names its requests itself.
    extended_resource: str
    device_id: str  # normalised (cni_plugin/wire/deviceid.py); "" when the meta plugin gave none
    pod: PodRef | None
    result: dict | None
    check_error: str
    valid_attachments: list | None
    cni_version: str
    timestamp: float
    event_id: str
    version: int  # as sent: 1..WIRE_VERSION_MAX
    order: list  # never None once built: __init__ stamps an event given none (new_order)
    # ADD only: the result's addresses the interface held but could not use when the plugin looked,
    # {address as the result writes it: "tentative" | "dadfailed" | "deprecated"} (cni_plugin/lean/netlink.py)
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
        if not self.extended_resource:  # likewise: an entry without one sends what it always did
            del out["extended_resource"]
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
        for name in ("netns", "network", "request", "extended_resource", "device_id", "check_error", "cni_version",
                     "event_id"):
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


class EventTooLarge(WireError):
    """An event over MAX_EVENT_BYTES: refused on both channels, never retried."""


def encode_event(event: Event) -> bytes:
    """The event as one JSON object (what a spool file holds); EventTooLarge over the cap."""
    data = dumps(event.to_dict()).encode()
    if len(data) > MAX_EVENT_BYTES:
        raise EventTooLarge(f"event of {len(data)} bytes exceeds the {MAX_EVENT_BYTES}-byte event cap")
    return data


def decode_body(body: bytes) -> dict:
    """One JSON object from the bytes a frame or a spool file holds; WireError for anything else."""
    try:
        message = loads(body.decode())
    except (UnicodeDecodeError, JSONError) as exc:
        raise WireError(f"frame is not JSON: {exc}") from None
    if not isinstance(message, dict):
        raise WireError("frame must be a JSON object")
    return message
