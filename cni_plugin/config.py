"""Parse and validate what the runtime hands the plugin: env, stdin netconf, CNI_ARGS.

Everything a user can get wrong is caught here, before any side effect, and
reported with the spec's code: 4 for the environment, 6 for undecodable stdin,
7 (naming the field) for the network config, 1 for an unsupported cniVersion.

The models are small `__slots__` classes rather than dataclasses on purpose:
`dataclasses` imports `inspect` and costs ~2x the interpreter start-up, and this
module runs on every pod start.
"""

from __future__ import annotations

from .lean.errors import (
    DECODING_FAILURE,
    INCOMPATIBLE_VERSION,
    INVALID_ENVIRONMENT,
    CNIError,
    config_error,
)
from .lean.jsonio import MAX_JSON_DEPTH, JSONError, loads, too_deep

TYPE_CHECKING = False
if TYPE_CHECKING:  # pragma: no cover
    from typing import Any, Mapping

SUPPORTED_VERSIONS = ("0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0")
LATEST_VERSION = "1.1.0"
COMMANDS = ("ADD", "DEL", "CHECK", "GC", "STATUS", "VERSION")

DEFAULT_SOCKET = "/run/netclaim/publisher.sock"
DEFAULT_SPOOL_DIR = "/var/lib/netclaim/spool"
DEFAULT_STATE_DIR = "/var/lib/netclaim/plugin-state"
DEFAULT_LOG_FILE = ""  # no log file unless the entry names one (cni_plugin/log.py)
DEFAULT_ACK_TIMEOUT_MS = 1000
# A publisher restart leaves the socket absent for about a second; when the spool cannot take
# the event either, the plugin keeps trying the socket this long before the event is lost.
DEFAULT_HANDOFF_WAIT_MS = 3000
DEFAULT_SPOOL_MAX_FILES = 1024
# How long an ADD waits for the result's tentative addresses to finish duplicate address detection.
# None by default: the ADD reports them tentative and the publisher's live watch publishes each once
# usable, so a pod's sandbox never waits on DAD; a node without the live watch can wait up to 3 s.
DEFAULT_ADDRESS_WAIT_MS = 0
DEFAULT_SPOOL_MAX_BYTES = 64 << 20
FAILURE_POLICIES = ("Ignore", "Fail")
# The entry's top-level settings an installer writes from KEY=VALUE text (the chain keeper, the
# one-shot installer's conflist editor), by the JSON type the plugin reads each as. parse_netconf
# takes its integer ranges from here and the installers type their values by it
# (publisher/keeper/conflist.py build_entry): a JSON string where an integer belongs is refused by
# the plugin (ADD error 7 on every pod start), so the two must never disagree.
STRING_SETTINGS = ("driverName", "request", "extendedResourceName", "socketPath", "spoolDir", "stateDir", "logFile",
                   "failurePolicy")
INT_SETTINGS = {  # key: (lowest, highest) accepted
    "ackTimeoutMs": (1, 60000),
    "handoffWaitMs": (0, 60000),
    "addressWaitMs": (0, 3000),
    "spoolMaxFiles": (1, 1 << 24),
    "spoolMaxBytes": (4096, 1 << 40),
}
# Left next to the executable by the chain keeper when it uninstalls netclaim but must keep the
# executable for sandboxes whose runtime tears down with a cached config that runs it.
RETIRED_MARKER = ".netclaim-retired"

_NAME_FIRST = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789")
_NAME_REST = _NAME_FIRST | frozenset("_.-")
_IFNAME_MAX = 15
_HEX = frozenset("0123456789abcdefABCDEF")
_DNS_ALNUM = frozenset("abcdefghijklmnopqrstuvwxyz0123456789")
_DNS_INNER = _DNS_ALNUM | frozenset("-")
_DNS_SUBDOMAIN_MAX = 253
_QUALIFIED_NAME_MAX = 63


def version_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in version.split("."))


def version_at_least(version: str, minimum: str) -> bool:
    return version_tuple(version) >= version_tuple(minimum)


def is_cni_name(value: str) -> bool:
    """CNI's rule for network names and container IDs: [a-zA-Z0-9][a-zA-Z0-9_.-]*."""
    return bool(value) and value[0] in _NAME_FIRST and all(c in _NAME_REST for c in value)


def check_ifname(value: str) -> str | None:
    """Linux interface name rules (as libcni's ValidateInterfaceName); None when valid."""
    if not value:
        return "is empty"
    if len(value.encode("utf-8", "surrogateescape")) > _IFNAME_MAX:
        return f"is longer than {_IFNAME_MAX} bytes"
    if value in (".", ".."):
        return "may not be . or .."
    if any(c in "/:" or c.isspace() for c in value):
        return "may not contain '/', ':' or whitespace"
    return None


def _dns_subdomain_problem(value: str) -> str | None:
    """Kubernetes' DNS-1123 subdomain: dot-separated labels of lowercase alphanumerics and '-', each
    starting and ending alphanumeric, at most 253 characters in all; None when valid."""
    if len(value) > _DNS_SUBDOMAIN_MAX:
        return f"is longer than {_DNS_SUBDOMAIN_MAX} characters"
    for label in value.split("."):
        if not label or label[0] not in _DNS_ALNUM or label[-1] not in _DNS_ALNUM \
                or not all(c in _DNS_INNER for c in label):
            return "must be a DNS subdomain (lowercase letters, digits, '-' and '.', alphanumeric at each end)"
    return None


def _qualified_name_problem(value: str) -> str | None:
    """The name part of a Kubernetes qualified name: at most 63 alphanumerics, '-', '_' and '.',
    alphanumeric at both ends (upper case allowed); None when valid."""
    if not value:
        return "is empty"
    if len(value) > _QUALIFIED_NAME_MAX:
        return f"is longer than {_QUALIFIED_NAME_MAX} characters"
    if value[0] not in _NAME_FIRST or value[-1] not in _NAME_FIRST or not all(c in _NAME_REST for c in value):
        return "must be alphanumerics, '-', '_' or '.', alphanumeric at both ends"
    return None


def extended_resource_problem(value: str) -> str | None:
    """Why `value` is not a Kubernetes extended resource name (`example.com/nic`); None when it is.

    A pod names the resource in its containers' resources and the scheduler's claim carries it
    in the pod's requestMappings: a name the API could never hold would silently match nothing,
    so it is refused where the operator wrote it. Strings only, no regex: the plugin starts on
    every pod start and `re` costs its import.
    """
    prefix, sep, name = value.partition("/")
    if not sep or "/" in name:
        return "must be DOMAIN/NAME with exactly one '/' (e.g. example.com/nic)"
    problem = _dns_subdomain_problem(prefix)
    if problem:
        return f"domain {prefix!r} {problem}" if len(prefix) <= _DNS_SUBDOMAIN_MAX else f"domain {problem}"
    problem = _qualified_name_problem(name)
    if problem:
        return f"name {name!r} {problem}" if len(name) <= _QUALIFIED_NAME_MAX else f"name {problem}"
    return None


# ------------------------------------------------------------------ environment


class Env:
    """The CNI_* environment of one invocation."""

    __slots__ = ("command", "container_id", "netns", "ifname", "args", "path")

    def __init__(self, command: str, container_id: str = "", netns: str = "", ifname: str = "",
                 args: dict[str, str] | None = None, path: str = "") -> None:
        self.command = command
        self.container_id = container_id
        self.netns = netns
        self.ifname = ifname
        self.args = args or {}
        self.path = path

    @property
    def pod(self) -> tuple[str, str, str] | None:
        """(namespace, name, uid) from CNI_ARGS, or None when the runtime gave none."""
        ns = self.args.get("K8S_POD_NAMESPACE", "")
        name = self.args.get("K8S_POD_NAME", "")
        if not ns or not name:
            return None
        return (ns, name, self.args.get("K8S_POD_UID", ""))


def parse_cni_args(raw: str) -> dict[str, str]:
    """CNI_ARGS is `K=V;K=V`; key order varies between runtimes, so parse, never compare."""
    args: dict[str, str] = {}
    for pair in raw.split(";"):
        if not pair:
            continue
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise CNIError(INVALID_ENVIRONMENT, f"invalid CNI_ARGS pair {pair!r}: want KEY=VALUE")
        args[key] = value
    return args


_ENV_NAMES = ("CNI_COMMAND", "CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME", "CNI_ARGS", "CNI_PATH")


def _check_env_text(environ: Mapping[str, str]) -> None:
    """Every CNI_* value must be something the OS can carry: no NUL, and
    encodable the way os.environ decoded it (UTF-8 + surrogateescape). A lone
    surrogate or NUL would otherwise surface later as an OS call's ValueError."""
    for name in _ENV_NAMES:
        value = environ.get(name)
        if not value:
            continue
        if "\x00" in value:
            raise CNIError(INVALID_ENVIRONMENT, f"{name} may not contain NUL")
        try:
            value.encode("utf-8", "surrogateescape")
        except UnicodeEncodeError:
            raise CNIError(INVALID_ENVIRONMENT, f"{name} is not valid text (lone surrogate)") from None


_REQUIRED_ENV = {
    "ADD": ("CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME"),
    "DEL": ("CNI_CONTAINERID", "CNI_IFNAME"),
    "CHECK": ("CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME"),
}


def parse_env(environ: Mapping[str, str]) -> Env:
    """Validate the environment for the command (error 4 on anything missing or malformed)."""
    command = environ.get("CNI_COMMAND", "")
    if not command:
        raise CNIError(INVALID_ENVIRONMENT, "CNI_COMMAND is not set")
    if command not in COMMANDS:
        raise CNIError(INVALID_ENVIRONMENT, f"unknown CNI_COMMAND {command!r}")
    _check_env_text(environ)
    for name in _REQUIRED_ENV.get(command, ()):
        if not environ.get(name):
            raise CNIError(INVALID_ENVIRONMENT, f"{name} is required for {command}")
    env = Env(
        command,
        container_id=environ.get("CNI_CONTAINERID", ""),
        netns=environ.get("CNI_NETNS", ""),
        ifname=environ.get("CNI_IFNAME", ""),
        path=environ.get("CNI_PATH", ""),
    )
    if env.container_id and not is_cni_name(env.container_id):
        raise CNIError(INVALID_ENVIRONMENT, "CNI_CONTAINERID must match [a-zA-Z0-9][a-zA-Z0-9_.-]*")
    if env.ifname:
        problem = check_ifname(env.ifname)
        if problem:
            raise CNIError(INVALID_ENVIRONMENT, f"CNI_IFNAME {problem}")
    env.args = parse_cni_args(environ.get("CNI_ARGS", ""))
    return env


# ------------------------------------------------------------------ stdin


# What the plugin reads from stdin at most. A config, pod annotations in
# runtimeConfig (the API caps them at 256 KiB) and a prevResult (the event cap
# is 256 KiB) fit many times over; the bound keeps a runaway caller from
# making a root process on the pod start path parse (and hold) megabytes.
MAX_STDIN_BYTES = 4 << 20


def decode_stdin(data: bytes, command: str = "") -> dict[str, Any]:
    """stdin must be one UTF-8 JSON object, at most MAX_JSON_DEPTH deep (error 6 otherwise).

    The depth limit is a limit of this decoder, like the size bound: the
    document is refused before any field is read, for every verb alike (6,
    not 7: nothing of the config was interpreted). One exception keeps DEL's
    promise (docs/plugin.md): on DEL a too-deep prevResult alone is dropped,
    since DEL can clean up without it and must not block the chain.
    """
    if len(data) > MAX_STDIN_BYTES:
        raise CNIError(DECODING_FAILURE, f"stdin is larger than {MAX_STDIN_BYTES} bytes")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CNIError(DECODING_FAILURE, f"stdin is not UTF-8: {exc.reason} at byte {exc.start}") from None
    try:
        value = loads(text)
    except JSONError as exc:
        raise CNIError(DECODING_FAILURE, f"stdin is not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise CNIError(DECODING_FAILURE, "stdin must be a JSON object (the network config)")
    if too_deep(value, MAX_JSON_DEPTH):
        if command == "DEL" and "prevResult" in value:
            value["prevResult"] = None
            if not too_deep(value, MAX_JSON_DEPTH):
                return value
        raise CNIError(DECODING_FAILURE, f"stdin is nested more than {MAX_JSON_DEPTH} levels deep")
    return value


def cni_version_of(raw: dict[str, Any]) -> str:
    """The config's cniVersion; error 7 when absent, 1 when not one we speak."""
    version = raw.get("cniVersion")
    if not isinstance(version, str) or not version:
        raise config_error("cniVersion", "is required and must be a string")
    if version not in SUPPORTED_VERSIONS:
        raise CNIError(
            INCOMPATIBLE_VERSION,
            f"incompatible CNI version {version!r}",
            f"supported: {', '.join(SUPPORTED_VERSIONS)}",
        )
    return version


# ------------------------------------------------------------------ plugin config


class InterfaceConf:
    """The optional `interface` block: settings applied inside the sandbox."""

    __slots__ = ("mtu", "mac", "tx_queue_len", "alt_name", "up", "sysctl")

    def __init__(self, mtu: int | None = None, mac: str | None = None, tx_queue_len: int | None = None,
                 alt_name: str | None = None, up: bool | None = None,
                 sysctl: dict[str, str] | None = None) -> None:
        self.mtu = mtu
        self.mac = mac
        self.tx_queue_len = tx_queue_len
        self.alt_name = alt_name
        self.up = up
        self.sysctl = sysctl or {}

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in (("mtu", self.mtu), ("mac", self.mac), ("txQueueLen", self.tx_queue_len),
                           ("altName", self.alt_name), ("up", self.up)):
            if value is not None:
                out[key] = value
        if self.sysctl:
            out["sysctl"] = dict(self.sysctl)
        return out


class NetConf:
    """The `"type": "netclaim"` entry of a conflist, as the runtime passed it."""

    __slots__ = ("cni_version", "name", "driver", "request", "extended_resource", "device_id", "socket_path",
                 "spool_dir", "state_dir", "log_file", "failure_policy", "ack_timeout", "handoff_wait", "address_wait",
                 "spool_max_files", "spool_max_bytes", "interface", "prev_result", "raw")

    def __init__(self, cni_version: str, name: str, driver: str, request: str = "",
                 socket_path: str = DEFAULT_SOCKET, spool_dir: str = DEFAULT_SPOOL_DIR,
                 state_dir: str = DEFAULT_STATE_DIR, log_file: str = DEFAULT_LOG_FILE,
                 failure_policy: str = "Ignore", ack_timeout: float = DEFAULT_ACK_TIMEOUT_MS / 1000,
                 interface: InterfaceConf | None = None, prev_result: dict[str, Any] | None = None,
                 raw: dict[str, Any] | None = None) -> None:
        self.cni_version = cni_version
        self.name = name
        self.driver = driver
        self.request = request
        # The DRA extended resource (example.com/nic) this network's interface stands for when a pod asks
        # for it in its containers' resources instead of a claim ("" when the entry names none).
        self.extended_resource = ""
        self.device_id = ""  # the device the meta plugin chose for this network (device_id below)
        self.socket_path = socket_path
        self.spool_dir = spool_dir
        self.state_dir = state_dir
        self.log_file = log_file
        self.failure_policy = failure_policy
        self.ack_timeout = ack_timeout
        self.handoff_wait = DEFAULT_HANDOFF_WAIT_MS / 1000
        self.address_wait = DEFAULT_ADDRESS_WAIT_MS / 1000
        self.spool_max_files = DEFAULT_SPOOL_MAX_FILES
        self.spool_max_bytes = DEFAULT_SPOOL_MAX_BYTES
        self.interface = interface
        self.prev_result = prev_result
        self.raw = raw or {}


def _string(raw: dict[str, Any], key: str, default: str, *, required: bool = False,
            absolute_path: bool = False) -> str:
    value = raw.get(key, None)
    if value is None:
        if required:
            raise config_error(key, "is required")
        return default
    if not isinstance(value, str) or (required and not value):
        raise config_error(key, "must be a non-empty string" if required else "must be a string")
    _check_text(value, key)
    if absolute_path and not value.startswith("/"):
        raise config_error(key, "must be an absolute path")
    return value or default


def _log_file(raw: dict[str, Any]) -> str:
    """`logFile`: absent, null or "" mean no log file; anything else an absolute path.

    "" is how an installer says "no log" (the chart's `cni.pluginLogFile: ""`),
    so it must never turn into a default path the operator did not name.
    """
    if raw.get("logFile") == "":
        return ""
    return _string(raw, "logFile", DEFAULT_LOG_FILE, absolute_path=True)


def _check_text(value: str, field: str) -> None:
    """Strings that reach the OS (paths, names, sysctl values) must be NUL-free UTF-8.

    JSON can carry a lone surrogate (`"\\ud800"`), which no file name, netlink
    attribute or log consumer can represent; it is a config error, not a crash.
    """
    if "\x00" in value:
        raise config_error(field, "may not contain NUL")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise config_error(field, "is not valid UTF-8 text (lone surrogate)") from None


def _int(block: dict[str, Any], key: str, field: str, lo: int, hi: int) -> int | None:
    value = block.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise config_error(field, "must be an integer")
    if not lo <= value <= hi:
        raise config_error(field, f"must be between {lo} and {hi}")
    return value


def _setting(raw: dict[str, Any], key: str) -> int | None:
    """An integer setting of INT_SETTINGS, checked against its range (None when absent)."""
    lo, hi = INT_SETTINGS[key]
    return _int(raw, key, key, lo, hi)


def parse_mac(value: object, field: str) -> str:
    """A unicast 6-octet MAC, returned lower case with colons."""
    if not isinstance(value, str):
        raise config_error(field, "must be a string like 02:00:00:00:00:01")
    parts = value.replace("-", ":").split(":")
    if len(parts) != 6 or not all(len(p) == 2 and set(p) <= _HEX for p in parts):
        raise config_error(field, f"{value!r} is not a 6-octet MAC address")
    if int(parts[0], 16) & 1:
        raise config_error(field, f"{value!r} is a multicast address")
    if all(p == "00" for p in parts):
        raise config_error(field, "may not be all zeros")
    return ":".join(parts).lower()


def sysctl_path_parts(key: str) -> list[str]:
    """Split a sysctl key (`net.ipv4.conf.IFNAME.arp_filter`) into path parts.

    Only /proc/sys/net is allowed: the plugin runs as root and a config must not
    be able to write arbitrary kernel knobs or escape /proc/sys with `..`.
    """
    parts = key.split(".")
    if len(parts) < 2 or parts[0] != "net":
        raise config_error(f"interface.sysctl[{key!r}]", "must be a key under net. (/proc/sys/net)")
    _check_text(key, f"interface.sysctl[{key!r}]")
    for part in parts:
        if not part or part in ("..",) or "/" in part or "\x00" in part or part.strip() != part:
            raise config_error(f"interface.sysctl[{key!r}]", "is not a valid sysctl key")
    return parts


_INTERFACE_KEYS = ("mtu", "mac", "txQueueLen", "altName", "up", "sysctl")


def parse_interface(block: object) -> InterfaceConf | None:
    if block is None:
        return None
    if not isinstance(block, dict):
        raise config_error("interface", "must be an object")
    unknown = sorted(set(block) - set(_INTERFACE_KEYS))
    if unknown:
        raise config_error(f"interface.{unknown[0]}", f"unknown field (known: {', '.join(_INTERFACE_KEYS)})")
    conf = InterfaceConf(
        mtu=_int(block, "mtu", "interface.mtu", 68, 65535),
        tx_queue_len=_int(block, "txQueueLen", "interface.txQueueLen", 0, 2**31 - 1),
    )
    if block.get("mac") is not None:
        conf.mac = parse_mac(block["mac"], "interface.mac")
    alt = block.get("altName")
    if alt is not None:
        if not isinstance(alt, str):
            raise config_error("interface.altName", "must be a string")
        _check_text(alt, "interface.altName")
        if not alt or len(alt.encode("utf-8")) > 127 or any(c in "/:" or c.isspace() for c in alt) \
                or alt in (".", ".."):
            raise config_error("interface.altName", "must be 1-127 bytes without '/', ':' or whitespace")
        conf.alt_name = alt
    up = block.get("up")
    if up is not None and not isinstance(up, bool):
        raise config_error("interface.up", "must be true or false")
    conf.up = up
    sysctl = block.get("sysctl")
    if sysctl is not None:
        if not isinstance(sysctl, dict):
            raise config_error("interface.sysctl", "must be an object of key: value")
        for key, value in sysctl.items():
            sysctl_path_parts(key)
            if isinstance(value, bool) or not isinstance(value, (str, int)):
                raise config_error(f"interface.sysctl[{key!r}]", "value must be a string or integer")
            value = str(value)
            _check_text(value, f"interface.sysctl[{key!r}]")
            if "\n" in value:
                raise config_error(f"interface.sysctl[{key!r}]", "value may not contain newlines")
            conf.sysctl[key] = value
    return conf


# Where a meta plugin puts the device it chose for a network, in the order they are believed:
# the `deviceID` capability's runtimeConfig (libcni passes it only to a plugin declaring it),
# then Multus's top-level `deviceID` (injected into every plugin of the delegate), then the
# SR-IOV convention `pciBusID`.
DEVICE_ID_KEYS = (("runtimeConfig", "deviceID"), ("", "deviceID"), ("", "pciBusID"))


def device_id(raw: dict[str, Any]) -> str:
    """The device ID this attachment was given, normalised ('' when none): error 7 naming the
    field when one is not a string of a sane length."""
    from .wire.deviceid import normalize, problem

    for block_key, key in DEVICE_ID_KEYS:
        block = raw.get(block_key) if block_key else raw
        if not isinstance(block, dict) or block.get(key) in (None, ""):
            continue
        field = f"{block_key}.{key}" if block_key else key
        why = problem(block[key])
        if why:
            raise config_error(field, why)
        return normalize(block[key])
    return ""


def _extended_resource(raw: dict[str, Any]) -> str:
    """`extendedResourceName`: absent, null or "" mean none (an installer's empty value); else a valid name."""
    value = _string(raw, "extendedResourceName", "")
    if value:
        problem = extended_resource_problem(value)
        if problem:
            raise config_error("extendedResourceName", problem)
    return value


def _driver(raw: dict[str, Any]) -> str:
    driver = _string(raw, "driverName", "", required=True)
    if len(driver) > 63:
        raise config_error("driverName", "must be at most 63 characters (a DNS subdomain)")
    return driver


def parse_netconf(raw: dict[str, Any], cni_version: str, command: str) -> NetConf:
    """Validate the plugin's fields (error 7 naming the field).

    Unknown *top-level* keys are allowed: runtimes add `runtimeConfig`, `args`,
    `capabilities` and other plugins' conventions. Inside our own `interface`
    block every key is known, so typos are caught.
    """
    name = raw.get("name")
    if not isinstance(name, str) or not is_cni_name(name):
        raise config_error("name", "is required and must match [a-zA-Z0-9][a-zA-Z0-9_.-]*")
    ptype = raw.get("type")
    if ptype is not None and not isinstance(ptype, str):
        raise config_error("type", "must be a string")
    conf = NetConf(
        cni_version,
        name,
        _driver(raw),
        request=_string(raw, "request", ""),
        socket_path=_string(raw, "socketPath", DEFAULT_SOCKET, absolute_path=True),
        spool_dir=_string(raw, "spoolDir", DEFAULT_SPOOL_DIR, absolute_path=True),
        state_dir=_string(raw, "stateDir", DEFAULT_STATE_DIR, absolute_path=True),
        log_file=_log_file(raw),
        raw=raw,
    )
    conf.extended_resource = _extended_resource(raw)
    conf.device_id = device_id(raw)
    policy = raw.get("failurePolicy")
    if policy is None:  # null is "absent", as for every optional field
        policy = "Ignore"
    if policy not in FAILURE_POLICIES:
        raise config_error("failurePolicy", f"must be one of {', '.join(FAILURE_POLICIES)}, not {policy!r}")
    conf.failure_policy = policy
    timeout = _setting(raw, "ackTimeoutMs")
    if timeout is not None:
        conf.ack_timeout = timeout / 1000
    wait = _setting(raw, "handoffWaitMs")
    if wait is not None:
        conf.handoff_wait = wait / 1000
    wait = _setting(raw, "addressWaitMs")
    if wait is not None:
        conf.address_wait = wait / 1000
    conf.spool_max_files = _setting(raw, "spoolMaxFiles") or DEFAULT_SPOOL_MAX_FILES
    conf.spool_max_bytes = _setting(raw, "spoolMaxBytes") or DEFAULT_SPOOL_MAX_BYTES
    conf.interface = parse_interface(raw.get("interface"))
    prev = raw.get("prevResult")
    if prev is not None and not isinstance(prev, dict):
        raise config_error("prevResult", "must be an object")
    if prev is None and command in ("ADD", "CHECK"):
        raise config_error("prevResult", f"is required for {command}: "
                           "netclaim must be chained after the plugins that create the interface")
    conf.prev_result = prev
    return conf


def tolerant_netconf(raw: dict[str, Any]) -> tuple[NetConf, list[str]]:
    """DEL's reading of a config that failed validation: what it can use.

    Every field that validates is kept. An invalid name, driverName or path
    becomes "", never a default: DEL then skips what needs it (state lookup,
    hand-off, spool; the log goes to stderr) rather than writing somewhere the
    operator did not name. Returns the config and the problems found.
    """
    problems: list[str] = []

    def keep(parse: Any, default: Any) -> Any:
        try:
            return parse()
        except CNIError as exc:
            problems.append(exc.msg)
            return default

    version = raw.get("cniVersion")
    name = raw.get("name")
    conf = NetConf(
        version if version in SUPPORTED_VERSIONS else LATEST_VERSION,
        name if isinstance(name, str) and is_cni_name(name) else "",
        keep(lambda: _driver(raw), ""),
        request=keep(lambda: _string(raw, "request", ""), ""),
        socket_path=keep(lambda: _string(raw, "socketPath", DEFAULT_SOCKET, absolute_path=True), ""),
        spool_dir=keep(lambda: _string(raw, "spoolDir", DEFAULT_SPOOL_DIR, absolute_path=True), ""),
        state_dir=keep(lambda: _string(raw, "stateDir", DEFAULT_STATE_DIR, absolute_path=True), ""),
        log_file=keep(lambda: _log_file(raw), ""),
        raw=raw,
    )
    conf.extended_resource = keep(lambda: _extended_resource(raw), "")
    conf.device_id = keep(lambda: device_id(raw), "")
    timeout = keep(lambda: _setting(raw, "ackTimeoutMs"), None)
    if timeout is not None:
        conf.ack_timeout = timeout / 1000
    wait = keep(lambda: _setting(raw, "handoffWaitMs"), None)
    if wait is not None:
        conf.handoff_wait = wait / 1000
    conf.spool_max_files = keep(lambda: _setting(raw, "spoolMaxFiles"), None) or DEFAULT_SPOOL_MAX_FILES
    conf.spool_max_bytes = keep(lambda: _setting(raw, "spoolMaxBytes"), None) or DEFAULT_SPOOL_MAX_BYTES
    prev = raw.get("prevResult")
    conf.prev_result = prev if isinstance(prev, dict) else None
    return conf, problems
