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

# ---- the publisher's own bounds and timings (defined here once, used everywhere)
DONE_RETENTION = 24 * 3600.0  # seconds finished events are kept (their ids drop duplicates)
ORDER_HORIZON = 600.0  # seconds after which no event stamped before a tombstone/fence can still arrive
MAX_FENCES = 16  # GC fences kept per driver and network, whatever their age
DIRTY_LEASE = 30.0  # seconds housekeeping leaves a claim alone that the committing thread reconciles itself
# Seconds a claim's apply waits, after the first ADD of a sandbox on it, for the same sandbox's
# ADDs of the claim's other devices (Multus runs one network after another): one apply instead
# of one per network while the pod starts. The pod is not Ready before its last network anyway.
SIBLING_HOLD = 1.0
MAX_HOLDS = 1024  # sandboxes whose claim apply is being held, at most (beyond: apply at once)
# A driver's ResourceSlices as read for a device choice (interface names, device IDs) are used
# this long; a device asked about that they lack makes them read again, at most once per
# SLICE_REREAD seconds (a device the slices never show costs no request per ADD).
SLICE_CACHE = 30.0
SLICE_REREAD = 1.0
CLAIM_STATE_RETENTION = 3600.0  # seconds an untracked claim's state stays in `status`
STATUS_MAX_CLAIMS = 500  # claims listed by `status` (errors first): one frame stays small
CREDENTIALS_RELOAD = 60.0  # seconds between re-reads of the kubeconfig / projected token
UNAUTHORIZED_NOT_READY = 3  # consecutive 401s after which /readyz says not ready
API_DOWN_NOT_READY = 60.0  # seconds without any API answer after which /readyz says not ready
WORKER_RESTART_DELAY = 1.0  # seconds before a crashed worker thread is started again
POD_WATCH_GRACE = 2.0  # seconds after an event was stamped that its pod may still be on its way in the watch
MAX_GONE_PODS = 4096  # deleted pods the pod watch remembers (a late DEL still knows what its pod was)
# Addresses the live-interface watch reads of one interface per read, at most: a pod that puts tens of
# thousands on its interface costs the watch's one thread (every netns's updates and releases) one
# bounded read, and its entry shows Ready=False TooManyAddresses instead of what could not be checked.
LIVE_MAX_ADDRESSES = 64
# The watches that live as long as the publisher (its node's pods, the keeper's DaemonSet) are renewed
# after a random 30-60 minutes: every renewal is a request, and 5,000 nodes renewing every 300 s would
# be 17 requests/s at rest for nothing. A quiet watch still gets a bookmark from the API server every
# minute, so a read that waits WATCH_SILENCE seconds without one means the connection is dead.
WATCH_RENEW = (1800, 3600)
WATCH_SILENCE = 300.0
# An API server restart breaks every node's watches at the same instant. As client-go's reflector does,
# publisher/kube/listwatch.py then waits a random time in [0, window] before each relist (full jitter, so 5,000
# nodes do not come back in lockstep); the window starts at WATCH_BACKOFF_BASE and grows WATCH_BACKOFF_FACTOR
# times per failure up to WATCH_BACKOFF_CAP (0.8, 3.2, 12.8, 30 s: client-go doubles, but then a node a few
# seconds into an outage is still in a window only about as wide as the outage, and a fifth of the nodes
# relist in the first second after the API is back; listwatch.Backoff says why). Only a watch that lived
# WATCH_BACKOFF_RESET seconds resets it (a good LIST does not: a WATCH refused after each LIST would otherwise
# cost a LIST per second), and a watch that ends within WATCH_TOO_SHORT seconds without any event is a
# failure (else a proxy ending streams makes a tight loop).
WATCH_BACKOFF_BASE = 0.8
WATCH_BACKOFF_FACTOR = 4.0
WATCH_BACKOFF_CAP = 30.0
WATCH_BACKOFF_RESET = 120.0
WATCH_TOO_SHORT = 1.0
RETRY_AFTER_MAX = 300.0  # an API server's Retry-After (429, 503) is a floor for the next try, up to this
# Client-side rate limit of each process's API requests (a token bucket, publisher/kube/ratelimit.py). client-go's
# library defaults (5/s, burst 10) would queue a node's ordinary pod-start burst (2 requests per claimed ADD,
# 20 ADDs/s in the publisher bench), so a kubelet's defaults: it bounds a runaway loop, not normal work.
# A watch counts once, when it is opened.
API_QPS = 50.0  # requests per second the publisher or keeper of one node sends at most (a kubelet's own default)
API_BURST = 100  # requests sent at once after a quiet spell

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


def _ipv4_sloppy(text: str) -> str:
    """Dotted quad as the API server's parser reads it: decimal, leading zeros allowed (`010` is 10)."""
    parts = text.split(".")
    if len(parts) != 4 or not all(p.isascii() and p.isdigit() for p in parts) or any(int(p) > 255 for p in parts):
        raise ValueError(f"{text!r} is not an IPv4 address")
    return ".".join(str(int(p)) for p in parts)


def canonical_cidr(value: str) -> str:
    """The interface address exactly as kube-apiserver's IsValidInterfaceAddress wants it.

    The server parses with a lenient parser (IPv4 parts may have leading zeros)
    and requires the value to equal `<ip>/<prefix>` where `<ip>` is Go's
    String() form: IPv4-mapped IPv6 (`::ffff:a.b.c.d`, also in hex) is printed
    as IPv4 with the prefix reduced by 96 (`::ffff:1.2.3.4/120` -> `1.2.3.4/24`),
    IPv6 per RFC 5952 (lower case, longest zero run compressed). Host bits are
    kept. Raises ValueError when the server would refuse every form (no prefix,
    a zone, a mapped address with a prefix below 96).
    """
    value = value.strip()
    addr, sep, prefix = value.partition("/")
    if not sep or not prefix.isascii() or not prefix.isdigit():
        raise ValueError(f"{value!r} is not an address with a prefix length")
    if "%" in addr:
        raise ValueError(f"{value!r} has a zone, which the API does not accept")
    if ":" in addr:
        head, _, tail = addr.rpartition(":")
        if "." in tail:  # embedded dotted quad, parsed as leniently as a plain one
            addr = f"{head}:{_ipv4_sloppy(tail)}"
        ip6 = ipaddress.IPv6Interface(f"{addr}/{int(prefix)}")
        mapped = ip6.ip.ipv4_mapped
        if mapped is None:
            return f"{ip6.ip}/{ip6.network.prefixlen}"
        if ip6.network.prefixlen < 96:
            raise ValueError(f"{value!r} is IPv4-mapped with a prefix shorter than 96")
        return f"{mapped}/{ip6.network.prefixlen - 96}"
    ip4 = ipaddress.IPv4Interface(f"{_ipv4_sloppy(addr)}/{int(prefix)}")
    return f"{ip4.ip}/{ip4.network.prefixlen}"


# Text the API cannot take: a lone UTF-16 surrogate has no UTF-8 form (Python's JSON
# decoder turns a "\ud800" escape on the plugin's stdin into one), and the API server's
# YAML decoder refuses the escape with 400, failing the whole apply of the claim.
_SURROGATE = re.compile("[\ud800-\udfff]")
REPLACEMENT = "\ufffd"


def valid_text(value: Any) -> Any:
    """`value` with every string (keys too) valid UTF-8: lone surrogates become U+FFFD.

    Measured on kube-apiserver 1.37: other odd text (NUL and control characters,
    U+FFFE/U+FFFF, a BOM, U+2028) is stored as sent, so only surrogates are replaced.
    """
    if isinstance(value, str):
        return _SURROGATE.sub(REPLACEMENT, value)
    if isinstance(value, dict):
        return {valid_text(k): valid_text(v) for k, v in value.items()}
    if isinstance(value, list):
        return [valid_text(v) for v in value]
    return value


def invalid_text(value: Any, where: str = "entry") -> list[str]:
    """Where `value` still holds text the API cannot take (see valid_text)."""
    if isinstance(value, str):
        return [f"{where} has a lone surrogate (not valid UTF-8)"] if _SURROGATE.search(value) else []
    if isinstance(value, dict):
        return [e for k, v in value.items()
                for e in invalid_text(k, f"{where} key") + invalid_text(v, f"{where}.{valid_text(k)}")]
    if isinstance(value, list):
        return [e for i, v in enumerate(value) for e in invalid_text(v, f"{where}[{i}]")]
    return []


# What the API server's JSON encoder writes longer than Python's UTF-8 JSON does: it
# escapes <, > and & (6 bytes instead of 1), U+2028/U+2029 (6 instead of 3) and writes
# \b and \f as \u0008/\u000c (6 instead of 2). An escaped backslash is matched first so
# that its second half is never read as the start of an escape.
_GO_LONGER = re.compile(r"\\\\|\\[bf]|[<>&\u2028\u2029]")
_GO_EXTRA = {"<": 5, ">": 5, "&": 5, "\u2028": 3, "\u2029": 3, "\\b": 4, "\\f": 4}


def data_size(data: Any) -> int:
    """Bytes of `data` as the API server measures it (its own compact JSON, raw UTF-8)."""
    text = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    extra = sum(_GO_EXTRA.get(token, 0) for token in _GO_LONGER.findall(text))
    return len(text.encode("utf-8", "surrogatepass")) + extra


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
    errors += invalid_text(entry)
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

# ---- Journal, housekeeping and health bounds (publisher/journal/store.py, repair/resync.py, observe/health.py,
# observe/metrics.py).
JOURNAL_BUSY_TIMEOUT = 5.0  # seconds SQLite waits for another process's write lock before a statement fails
JOURNAL_PROBE_WAIT = 1.0  # seconds housekeeping's health probe of the journal waits for that lock
JOURNAL_LOCK_WAIT = 30.0  # seconds a thread waits for the publisher's own write slot before giving up
JOURNAL_READ_WAIT = 2.0  # seconds a probe-side reader (status, /metrics) waits for the read connection
JOURNAL_WAL_KEEP = 4 << 20  # bytes of WAL kept after a checkpoint (SQLite truncates to this)
# KiB of page cache per journal connection (three: writer, reader, checkpoint). SQLite's default
# (2 MiB each) fills only as the database grows past it, which takes hours of pod starts: a
# publisher's RSS then creeps for a whole day like a leak. Pages re-read from the OS page cache
# cost a pread, and the hot rows (pending events, dirty claims) are few.
JOURNAL_PAGE_CACHE_KIB = 256
# Journals of a newer schema this release cannot write, set aside at start (publisher/journal/compat.py):
# the newest this many are kept for a person to look at, older ones removed.
JOURNAL_SET_ASIDE_KEEP = 2
# Attachments of a set-aside journal read as hints for the rebuild (publisher/repair/rebuild.py).
REBUILD_HINTS_MAX = 100_000
JOURNAL_WEDGED = 60.0  # a journal write in flight or failing this long fails liveness (/healthz)
LOOP_STALLED = 300.0  # a worker or housekeeping loop with no completed iteration this long fails liveness
THREAD_RESTART_BUDGET = 5  # crashes of one thread within THREAD_RESTART_WINDOW before liveness fails
THREAD_RESTART_WINDOW = 300.0
STEP_BACKOFF_CAP = 60.0  # cap of the backoff of a failing housekeeping step (spool, retries, resync)
PRUNE_BATCH = 500  # rows one pruning transaction deletes: an ack never waits behind a long prune
INGEST_BATCH = 128  # spooled events one ingestion transaction commits
HTTP_WORKERS = 4  # threads answering /metrics, /healthz, /readyz
HTTP_QUEUE = 16  # accepted connections waiting for one of them; more are closed at once
HTTP_TIMEOUT = 5.0  # seconds a metrics/probe connection may take to send its request
# The probe listener (--probe-address): its own threads and queue, so that connections held open on the
# metrics listener (reachable from every pod) never make the kubelet's liveness probe fail.
PROBE_WORKERS = 2  # threads answering /healthz, /readyz on the probe listener
PROBE_QUEUE = 8  # connections waiting for one of them; more are closed at once
# A listener whose address another process holds (a local account squatting a port, a rollout's previous
# pod still closing): tried again after LISTEN_RETRY_FIRST seconds, doubled up to LISTEN_RETRY_CAP, for as long
# as it takes; the publisher and the keeper do their work meanwhile (publisher/observe/listeners.py).
LISTEN_RETRY_FIRST = 0.1
LISTEN_RETRY_CAP = 5.0
# an event whose handling raised a non-journal error this often is failed, not retried forever
INTERNAL_ERROR_RETRIES = 3

# ---- Chain keeper (publisher/keeper/guard.py): when keeping netclaim chained turns into a fight.
CHAIN_WRITES_MAX = 5  # keeper writes of one conflist within CHAIN_WRITES_WINDOW; one more = contested
CHAIN_WRITES_WINDOW = 60.0  # seconds; also how long a contested conflist must stay chained to be settled
CHAIN_BACKOFF_FIRST = 10.0  # seconds without writing a contested conflist, doubled after each lost retry
CHAIN_BACKOFF_CAP = 600.0  # a contested conflist is still retried this often
CHAIN_WARN_EVERY = 300.0  # the same "not chained" warning is logged at most this often
# Bytes of a CNI network file the keeper reads (and hashes into its snapshot), at most. Conflists are a few
# KiB; a larger file is refused unread (its reason in the keeper's status), never read whole: the conf dir
# is shared with other installers, and the keeper's memory limit is 128 Mi.
NETWORK_FILE_MAX = 1 << 20

# ---- Node heartbeat (publisher/observe/nodelease.py): one Lease per node, read by `netclaim-publisher fleet`.
# 5,000 nodes renewing every 60 s cost 83 writes/s; a change of state is written sooner, but never within
# NODE_LEASE_MIN_GAP of the last write and spread over NODE_LEASE_SPREAD, so a change the whole fleet sees
# at once (a primary CNI restarted everywhere) is not one burst of 5,000 writes.
NODE_LEASE_PERIOD = 600.0  # seconds between renewals when nothing changes: 5,000 nodes cost 8.3 writes/s
NODE_LEASE_PERIODS = 3  # leaseDurationSeconds = this many periods: one lost renewal is not "down"
NODE_LEASE_PERIOD_MAX = 3600.0  # the longest --node-lease-period (and the chart's nodeLease.period) a publisher takes
# The longest leaseDurationSeconds a publisher ever writes: the chart's admission policy refuses a longer one,
# and `fleet` judges a Lease stale after min(its own duration, this), whatever the Lease says (a node that
# writes ten years would otherwise stay fresh for ten years after its publisher stopped).
NODE_LEASE_DURATION_MAX = int(NODE_LEASE_PERIOD_MAX * NODE_LEASE_PERIODS)
# Seconds a Lease's renewTime may lie ahead of the clock of the one reading it (clocks a little apart) before
# `fleet` calls it a problem: a publisher writes its own clock's now, so a renewal far ahead is a clock gone
# wrong or a forged Lease that would otherwise look fresh until then.
NODE_LEASE_CLOCK_SKEW = 120.0
NODE_LEASE_MIN_GAP = 15.0  # seconds between two writes of one node's lease, at least
NODE_LEASE_SPREAD = 10.0  # a change is written after a random wait in [0, this] seconds
NODE_LEASE_LOOK = 5.0  # seconds between looks at the node's state (journal counts, the keeper's /readyz)
NODE_LEASE_PREFIX = "netclaim-node-"  # the Lease is <prefix><node name> (the chart: <release name>-node-)
NODE_LEASE_ERROR_CHARS = 256  # an apply error's message is cut to this in the Lease's annotation
# The chain keeper's status line in the Lease's annotation and the fleet view: long enough for a conflist
# path and the keeper's whole reason (a symlinked primary names its target), which 200 cut mid-word.
NODE_LEASE_CHAIN_CHARS = 512
KEEPER_ASK_TIMEOUT = 1.0  # seconds the publisher waits for the chain keeper's /readyz on the node's loopback
# seconds a configured keeper may not answer before the Lease says `unreachable` (a start, a restart)
KEEPER_SILENT_GRACE = 60.0
FLEET_CELL_CHARS = 64  # a cell of `fleet`'s table (a node, a version, a conflist) is cut to this many characters
FLEET_PROBLEMS_CHARS = 400  # ... and its PROBLEMS cell (every problem and note of the row) to this many

# EndpointSlices of the opt-in endpoints controller (publisher/endpoints/): the API server accepts 1,000
# endpoints per slice and 100 addresses per endpoint (kubernetes pkg/apis/discovery/validation); the
# controller cuts slices at 100 endpoints, as kube-controller-manager does by default, so one change
# rewrites a small object and watchers of slices receive small events.
ENDPOINTS_PER_SLICE = 100
MAX_ENDPOINT_ADDRESSES = 100
MAX_SLICE_PORTS = 100
# The endpoints controller's liveness (publisher/endpoints/probes.py): a watch of it (Services, pods, claims, its
# slices) that neither received an event or a bookmark nor completed a list for this long is stuck, and its
# slices go stale while the pod looks healthy. A quiet watch still gets a bookmark every minute; a dead
# connection ends after WATCH_SILENCE and is listed again within WATCH_BACKOFF_CAP; so 600 s without any means a
# stuck thread, or an API server that refused every list for ten minutes, where a restart costs four lists.
WATCH_STALLED = 600.0
