"""Prometheus metrics plus /healthz and /readyz on one small HTTP server.

A private registry keeps the exposition to the publisher's own series (plus
process metrics), so what a dashboard sees is what this module defines.

Names follow the Prometheus conventions: a `netclaim_` prefix, base units in
the name (`_seconds`), counters end in `_total` (written out here; the client
library would add it anyway), and `netclaim_build_info` is a constant 1 whose
labels say which build is running. A counter is exposed as `<name>_total` and
nothing else: the client library's `<name>_created` series are off for the
whole process. A labelled counter whose label takes a known set of values
(reasons, results, purposes) starts with each of them at 0, so a `rate()` over
it is 0 from the first scrape instead of "no data" until the first increment.
The backlog gauges (journal and spool depth, age of the oldest pending event)
are computed when scraped, so an alert on a stuck publisher needs no
cooperation from the stuck part; a gauge that reads the journal uses its read
connection with a bound, and shows its last value when that fails, so a
scrape never blocks on it.

The HTTP server is reachable from every pod of the node (the chart listens on
the node's IP), so it is bounded like any production server: a fixed pool of
threads, a short queue (connections beyond it are closed at once), a socket
timeout and an overall deadline per connection. Bounded is not enough for the
kubelet's probes, though: a pod holding a few dozen slow connections keeps
every handler and queue slot busy, and a liveness probe that finds them full
fails, so the kubelet restarts a healthy publisher. So the probes get a
listener of their own (`--probe-address`, the chart: 127.0.0.1, which no pod
network reaches) with its own threads and queue, that serves /healthz and
/readyz only: whatever the metrics listener suffers never reaches it.
"""

from __future__ import annotations

import errno
import os
import platform
import queue
import socket
import stat
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any, Callable

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import Collector

from cni_plugin.wire.event import PROTOCOL_VERSION
from cni_plugin.wire.spool import SPOOL_SUFFIX
from cni_plugin.wire.version import __version__
from publisher import limits

# No `_created` series beside the counters and histograms (module docstring); the keeper's registry too.
disable_created_metrics()

# The values a labelled counter can take, each exposed at 0 from the start (module docstring).
# Where they are counted: publisher/intake/ (ops, rejections), publisher/reconcile/rules.py (failures,
# ignored), publisher/repair/resync.py (drift causes), publisher/kube/calls.py (purposes),
# publisher/observe/events.py (Event outcomes), publisher/live/ (interface changes).
OPS = ("ADD", "DEL", "CHECK", "GC")
REJECTED_REASONS = ("bad_frame", "bad_request", "bad_event", "too_many_connections", "no_pod_identity",
                    "bad_spool_file", "newer_version", "earlier_boot")
FAILED_REASONS = ("invalid_entry", "unresolvable", "unresolved", "internal_error")
IGNORED_REASONS = ("no_claim", "no_request", "earlier_boot")
DRIFT_CAUSES = ("window", "outcome", "pod_deleted", "safety_net")
API_PURPOSES = ("resolve-watch", "resolve-get", "apply", "verify", "reconcile", "get", "list", "watch", "event",
                "node-lease")
EVENT_RESULTS = ("created", "failed", "deduplicated", "series_updated", "dropped", "disabled")
INTERFACE_CHANGES = ("LinkDown", "NoCarrier", "AddressLost", "InterfaceGone", "Recovered", "AddressesChanged",
                     "MacChanged", "Changed", "DuplicateAddress", "AddressDeprecated", "AddressesPending")
LIVE_JOURNAL_STEPS = ("read", "write", "retire")  # publisher/live/watcher.py: its journal steps that can fail
APPLY_ERROR_CODES = ("409", "422")  # the refusals an apply meets in practice (a 403 is retried, not counted)
LISTENERS = ("metrics", "probe", "probe-socket")  # publisher/observe/listeners.py: what a listener serves
UNKNOWN_FIELD_OTHER = "(other)"  # publisher/intake/spool.py: names past its cap
# An API request's latency, from sending it until its answer is read (a watch: until its stream opens):
# 1 ms (a cached GET on a local server) to 30 s (a slow apply, or a request that ends at its timeout).
API_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)


def listen_taken_counter(registry: CollectorRegistry) -> Counter:
    """publisher/observe/listeners.py: tries to open a listener whose address another process held."""
    return preset(Counter(
        "netclaim_listen_address_taken_total", "Tries to open a listener (metrics, probe, probe-socket) whose "
        "address another process held (its uid is logged); tried again with a backoff", ["listener"],
        registry=registry), *LISTENERS)


def preset(counter: Counter, *values: Any) -> Counter:
    """Create `counter`'s series for each label value (a tuple for several labels), at 0."""
    for value in values:
        counter.labels(*(value if isinstance(value, tuple) else (value,)))
    return counter


class CountRead(Collector):
    """A counter whose count another object keeps (read when scraped), exposed as `<name>_total`."""

    def __init__(self, name: str, documentation: str, registry: CollectorRegistry) -> None:
        self.name, self.documentation = name, documentation
        self.read: Callable[[], float] = lambda: 0.0
        registry.register(self)

    def read_from(self, read: Callable[[], float]) -> None:
        self.read = read

    def describe(self) -> list[CounterMetricFamily]:
        return [CounterMetricFamily(self.name, self.documentation)]

    def collect(self) -> list[CounterMetricFamily]:
        return [CounterMetricFamily(self.name, self.documentation, value=float(self.read()))]


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        ProcessCollector(registry=r)
        self.events_received = preset(Counter("netclaim_events_received_total", "Events received on the socket",
                                              ["op"], registry=r), *OPS)
        self.events_acked = preset(Counter("netclaim_events_acked_total", "Events committed to the journal and "
                                           "acknowledged", ["op"], registry=r), *OPS)
        self.events_spooled = Counter("netclaim_events_spooled_total", "Events ingested from the spool directory",
                                      registry=r)
        self.events_duplicate = Counter("netclaim_events_duplicate_total",
                                        "Events dropped as already journaled (same event id)", registry=r)
        self.events_rejected = preset(Counter("netclaim_events_rejected_total", "Events or frames refused", ["reason"],
                                              registry=r), *REJECTED_REASONS)
        self.wire_unknown_fields = preset(Counter(
            "netclaim_wire_unknown_fields_total", "Event fields ignored because this publisher does not know them "
            "(sent by a newer plugin), by name (at most 32 names; more count as (other))", ["field"], registry=r),
            UNKNOWN_FIELD_OTHER)
        self.events_failed = preset(Counter("netclaim_events_failed_total", "Events dropped after a permanent error "
                                            "or timeout", ["reason"], registry=r), *FAILED_REASONS)
        self.peers_refused = Counter("netclaim_peers_refused_total", "Socket peers refused by SO_PEERCRED", registry=r)
        self.journal_depth = Gauge("netclaim_journal_depth", "Pending events in the journal", registry=r)
        self.attachments = Gauge("netclaim_attachments", "Attachments tracked (desired state)", registry=r)
        self.publish_latency = Histogram(
            "netclaim_add_to_published_seconds", "From the plugin's ADD to the apply that published it",
            buckets=(0.01, 0.025, 0.05, 0.1, 0.15, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120), registry=r)
        self.api_requests = Counter("netclaim_api_requests_total", "Kubernetes API requests", ["verb", "code"],
                                    registry=r)
        self.api_latency = Histogram(
            "netclaim_api_request_duration_seconds", "Kubernetes API requests: from sending one until its answer "
            "was read (a watch: until its stream opened), by verb and code (error: no answer)", ["verb", "code"],
            buckets=API_LATENCY_BUCKETS, registry=r)
        self.apply_skips = Counter("netclaim_apply_skips_total",
                                   "Applies skipped because the body equals the last applied one", registry=r)
        self.apply_holds = Counter("netclaim_apply_holds_total", "ADDs whose claim apply waited for the same "
                                   "sandbox's ADDs of the claim's other devices (one apply for them all)", registry=r)
        self.apply_errors = preset(Counter("netclaim_apply_errors_total", "Permanent apply errors", ["code"],
                                           registry=r), *APPLY_ERROR_CODES)
        self.resyncs = Counter("netclaim_resyncs_total", "Times every tracked claim had been verified by the "
                               "safety net (or a reconcile) since the last count", registry=r)
        self.claims_verified = Counter("netclaim_claims_verified_total", "Claims the safety net compared with "
                                       "the live cluster (one GET each)", registry=r)
        self.drift_repaired = preset(Counter(
            "netclaim_drift_repaired_total", "Reconciles that wrote because the claim was not as desired, by what "
            "found it (window, outcome, pod_deleted, safety_net)", ["cause"], registry=r), *DRIFT_CAUSES)
        self.api_purpose = preset(Counter(
            "netclaim_api_requests_by_purpose_total", "Kubernetes API requests sent, by purpose (resolve-watch, "
            "resolve-get, apply, verify, reconcile, get, list, watch, event, node-lease)", ["purpose"], registry=r),
            *API_PURPOSES)
        self.claim_windows = Gauge("netclaim_claim_windows_open", "Claim watches open (resolving, or the window "
                                   "after netclaim's apply)", registry=r)
        self.k8s_events = preset(Counter(
            "netclaim_k8s_events_total", "Warning Events about permanent failures, by outcome "
            "(created, failed, deduplicated, series_updated, dropped, disabled)", ["result"], registry=r),
            *EVENT_RESULTS)
        self.build_info = Gauge(
            "netclaim_build_info", "Always 1; the labels name the running build",
            ["version", "wire_protocol", "python_version"], registry=r)
        self.build_info.labels(__version__, str(PROTOCOL_VERSION), platform.python_version()).set(1)
        self.spool_depth = Gauge(
            "netclaim_spool_depth", "Events the plugin spooled to disk that are not ingested yet", registry=r)
        self.oldest_pending_age = Gauge(
            "netclaim_oldest_pending_event_age_seconds",
            "Age of the oldest event not yet published (journal or spool); 0 when none is pending", registry=r)
        # Reported by the publisher's intake / kube client / service (publisher/intake/spool.py, kube/calls.py).
        self.spool_overflow = Counter(
            "netclaim_spool_overflow_events_total", "Events the plugin could not spool (spool at its cap), "
            "from the spool's overflow marker", registry=r)
        # A count kept by the API client's credentials (publisher/kube/calls.py), read when scraped.
        self.credential_reloads = CountRead("netclaim_credential_reloads", "Times the API credentials were "
                                            "re-read because they changed on disk or a request got 401", r)
        self.unauthorized = Gauge("netclaim_api_unauthorized_consecutive", "Consecutive 401 answers "
                                  "(credentials rejected); /readyz fails past a threshold", registry=r)
        self.ready = Gauge("netclaim_ready", "1 when /readyz answers ready", registry=r)
        # Events finished without anything to publish and without being a failure (publisher/observe/report.py
        # `ignored`): no_claim = the pod has no claim that can be the driver's (most pods on a node);
        # no_request = its claims have devices of the driver, none for the entry's request (with several
        # networks, each chaining netclaim with its own request, a pod that claimed only some of them).
        self.events_ignored = preset(Counter(
            "netclaim_events_ignored_total", "Events that need no publishing and are no failure, by reason",
            ["reason"], registry=r), *IGNORED_REASONS)
        # The boot rule (publisher/journal/store.py): attachments of sandboxes of an earlier boot, removed at
        # the first start of a boot; their events arriving later count as events_ignored{earlier_boot}.
        self.boot_retired = Counter(
            "netclaim_boot_retired_attachments_total",
            "Attachments of an earlier boot's sandboxes removed at the first start of this boot", registry=r)
        # publisher/repair/unchained.py: claimed pods of netclaim's drivers running with no ADD seen (started while
        # netclaim was not in the CNI chain); each also gets a NetclaimNotChained Warning Event.
        self.pods_unchained = Gauge(
            "netclaim_pods_unchained", "Running pods with a claim of netclaim's drivers whose sandbox never ran "
            "netclaim (started while it was not chained)", registry=r)
        self.pods_unchained_reported = Counter(
            "netclaim_pods_unchained_reported_total", "Pods found started while netclaim was not chained", registry=r)
        self.devices_unchained_reported = Counter(
            "netclaim_devices_unchained_reported_total", "Devices of netclaim's drivers in a claimed pod's claims "
            "that no CNI ADD of netclaim attached, though the pod's sandbox ran netclaim (a network not chained)",
            registry=r)
        # publisher/live/: the entry follows the interface in the pod's netns after ADD.
        self.interface_changes = preset(Counter(
            "netclaim_interface_changes_total", "Changes of an attachment's interface seen in its netns and "
            "written (Ready=False reasons, Recovered, AddressesChanged, MacChanged)", ["reason"], registry=r),
            *INTERFACE_CHANGES)
        self.live_debounced = Counter(
            "netclaim_interface_changes_held_total", "Interface changes held back to the end of an "
            "attachment's write hold (a flapping link costs a claim read and an apply per hold)", registry=r)
        self.live_vanished = Counter(
            "netclaim_interface_netns_vanished_total", "Attachments retired because their sandbox's netns was "
            "removed without a DEL", registry=r)
        self.live_watched = Gauge("netclaim_interface_watched_attachments", "Attachments whose interface the live "
                                  "watch follows in their netns", registry=r)
        self.live_namespaces = Gauge("netclaim_interface_watched_namespaces", "Pod network namespaces the live "
                                     "watch holds sockets in", registry=r)
        self.live_journal_errors = preset(Counter(
            "netclaim_interface_watch_journal_errors_total", "Journal steps of the live interface watch that "
            "failed (read, write, retire) and are tried again after a backoff", ["step"], registry=r),
            *LIVE_JOURNAL_STEPS)
        self.http_refused = Counter(
            "netclaim_http_connections_refused_total", "Connections to /metrics, /healthz, /readyz closed at "
            "once because every handler was busy and the queue was full", registry=r)
        self.probe_refused = Counter(
            "netclaim_probe_connections_refused_total", "Connections to the probe listener (/healthz, /readyz "
            "for the kubelet) closed at once because every probe handler was busy and its queue was full",
            registry=r)
        self.listen_taken = listen_taken_counter(r)
        # publisher/observe/nodelease.py: the node's heartbeat Lease (`netclaim-publisher fleet` reads it).
        self.node_lease_failures = Counter(
            "netclaim_node_lease_write_failures_total", "Writes of the node's heartbeat Lease that failed (no "
            "answer, refused, or a conflict); the next look tries again", registry=r)

    def watch_backlog(self, spool_dir: str, oldest_journaled_age: Callable[[], float | None],
                      spooled: Callable[[], list[float]] | None = None) -> None:
        """Compute the spool depth and oldest-pending age at scrape time.

        `oldest_journaled_age` returns the age in seconds of the oldest pending
        journal event, or None; when it fails (journal busy) the last value
        is shown. `spooled` returns the write times (wall seconds) of the spool
        files still to ingest (default: from the names in `spool_dir`, so no
        file is opened for this).
        """
        times_of = spooled or (lambda: spool_times(spool_dir))
        self.spool_depth.set_function(lambda: len(times_of()))
        last = [0.0]

        def journaled_age() -> float | None:
            try:
                return oldest_journaled_age()
            except Exception:  # noqa: BLE001 - a scrape shows the last known value, never blocks or fails
                return last[0] or None

        def oldest_age() -> float:
            times = times_of()
            ages = [max(0.0, time.time() - min(times))] if times else []
            journaled = journaled_age()
            if journaled is not None:
                ages.append(journaled)
            last[0] = journaled or 0.0
            return max(ages) if ages else 0.0

        self.oldest_pending_age.set_function(oldest_age)

    def record_api(self, verb: str, code: str) -> None:
        self.api_requests.labels(verb, code).inc()

    def record_api_duration(self, verb: str, code: str, seconds: float) -> None:
        self.api_latency.labels(verb, code).observe(seconds)

    def record_purpose(self, purpose: str) -> None:
        self.api_purpose.labels(purpose).inc()

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


def spool_times(spool_dir: str) -> list[float]:
    """Write times (epoch seconds) of the spooled event files, from their names."""
    try:
        names = os.listdir(spool_dir)
    except OSError:
        return []
    out = []
    for name in names:
        if name.endswith(SPOOL_SUFFIX) and not name.startswith("."):
            stamp = name.partition("-")[0]
            if stamp.isdigit():
                out.append(int(stamp) / 1e9)
    return out


class HealthServer:
    """Serves /metrics, /healthz (liveness) and /readyz (readiness) with bounded threads.

    With `probes_only` it is the probe listener: /healthz and /readyz, no /metrics (a scrape
    is the expensive request; the kubelet never sends one), its own pool and queue
    (`limits.PROBE_WORKERS`, `limits.PROBE_QUEUE`) and its own refusal counter.
    """

    def __init__(self, address: str, metrics: Any, ready: Callable[[], tuple[bool, str]],
                 live: Callable[[], tuple[bool, str]] = lambda: (True, ""), probes_only: bool = False) -> None:
        handler = _handler(None if probes_only else metrics, ready, live)
        name = "probe" if probes_only else "metrics"
        refused = getattr(metrics, "probe_refused" if probes_only else "http_refused", None)
        workers, waiting = ((limits.PROBE_WORKERS, limits.PROBE_QUEUE) if probes_only
                            else (limits.HTTP_WORKERS, limits.HTTP_QUEUE))
        where: str | tuple[str, int] = address
        if not address.startswith("/"):  # a path is a unix socket (the exec probes' and the heartbeat's)
            host, _, port = address.rpartition(":")
            where = (host.strip("[]") or "127.0.0.1", int(port))
        self.httpd = BoundedHTTPServer(where, handler,
                                       refused.inc if refused is not None else (lambda: None),
                                       workers=workers, waiting=waiting, name=name)
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.5,), name=name, daemon=True)

    @property
    def port(self) -> int:
        """The TCP port listened on (0 for a unix socket)."""
        return self.httpd.server_address[1] if isinstance(self.httpd.server_address, tuple) else 0

    def start(self) -> None:
        self.httpd.start_pool()
        self.thread.start()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.stop_pool()
        self.httpd.server_close()


class BoundedHTTPServer(HTTPServer):
    """HTTPServer with `workers` handler threads and a queue of `waiting` connections.

    The stock ThreadingHTTPServer starts one thread per connection and never
    times out an idle one, so any pod of the node could pile up threads.
    Here a connection waits in a short queue for a handler, or is closed at
    once when the queue is full; a handler gives it `limits.HTTP_TIMEOUT` per
    read and twice that in all (the serving thread shuts down late ones, which
    ends a slow sender's trickle too).
    """

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int] | str, handler: Any, refused: Callable[[], None],
                 workers: int = limits.HTTP_WORKERS, waiting: int = limits.HTTP_QUEUE, name: str = "metrics") -> None:
        if isinstance(address, str):
            self.address_family = socket.AF_UNIX
        else:
            self.address_family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        self.bound: tuple[int, int] | None = None  # a unix socket's (dev, inode), removed on close if still ours
        super().__init__(address, handler)  # type: ignore[arg-type]
        self.refused = refused
        self.waiting: queue.Queue = queue.Queue(maxsize=waiting)
        self.active: dict[int, tuple[socket.socket, float]] = {}  # handler index -> (connection, deadline)
        self.pool = [threading.Thread(target=self._work, args=(i,), name=f"{name}-{i}", daemon=True)
                     for i in range(workers)]

    def server_bind(self) -> None:
        """TCP as HTTPServer binds; a unix socket born 0600, after a stale one (nobody accepts) is removed."""
        if self.address_family != socket.AF_UNIX:
            super().server_bind()
            return
        path = str(self.server_address)
        clear_stale_socket(path)
        old = os.umask(0o177)  # no window where another user could connect
        try:
            self.socket.bind(path)
        finally:
            os.umask(old)
        st = os.lstat(path)
        self.bound = (st.st_dev, st.st_ino)
        self.server_name, self.server_port = "localhost", 0

    def server_close(self) -> None:
        super().server_close()
        if self.bound is not None:
            path = str(self.server_address)
            try:
                st = os.lstat(path)
                if (st.st_dev, st.st_ino) == self.bound:  # not a successor's socket bound since
                    os.unlink(path)
            except OSError:
                pass
            self.bound = None

    def start_pool(self) -> None:
        for t in self.pool:
            t.start()

    def stop_pool(self) -> None:
        for _ in self.pool:
            try:
                self.waiting.put_nowait(None)
            except queue.Full:
                break

    def process_request(self, request: Any, client_address: Any) -> None:
        try:
            self.waiting.put_nowait((request, client_address))
        except queue.Full:
            self.refused()
            self.shutdown_request(request)

    def _work(self, index: int) -> None:
        while True:
            item = self.waiting.get()
            if item is None:
                return
            request, client_address = item
            self.active[index] = (request, time.monotonic() + 2 * limits.HTTP_TIMEOUT)
            try:
                self.finish_request(request, client_address)
            except Exception:  # noqa: BLE001 - a broken client is not a log event
                pass
            finally:
                self.active.pop(index, None)
                self.shutdown_request(request)

    def service_actions(self) -> None:
        """Called by serve_forever between polls: end connections past their deadline."""
        now = time.monotonic()
        for conn, deadline in list(self.active.values()):
            if now > deadline:
                try:
                    conn.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass


def clear_stale_socket(path: str) -> None:
    """Remove a socket at `path` that nobody accepts on (a crashed process's); EADDRINUSE when one does."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise OSError(errno.EEXIST, f"{path} exists and is not a socket")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(path)
    except ConnectionRefusedError:
        os.unlink(path)
        return
    except FileNotFoundError:
        return
    finally:
        probe.close()
    raise OSError(errno.EADDRINUSE, f"another process serves {path}")


def _handler(metrics: Any | None, ready: Callable[[], tuple[bool, str]],
             live: Callable[[], tuple[bool, str]]) -> Any:
    """The request handler; without `metrics` (the probe listener) /metrics is 404."""

    class Handler(BaseHTTPRequestHandler):
        timeout = limits.HTTP_TIMEOUT  # per read/write on the connection (StreamRequestHandler.setup)

        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/metrics" and metrics is not None:
                self._send(200, metrics.exposition(), CONTENT_TYPE_LATEST)
            elif path in ("/healthz", "/readyz"):
                ok, why = (live if path == "/healthz" else ready)()
                self._send(200 if ok else 503, (why or "ok").encode() + b"\n")
            else:
                self._send(404, b"not found\n")

        def _send(self, code: int, body: bytes, ctype: str = "text/plain; charset=utf-8") -> None:
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:  # scrapes are not log events
            pass

    return Handler
