"""Prometheus metrics plus /healthz and /readyz on one small HTTP server.

A private registry keeps the exposition to the publisher's own series (plus
process metrics), so what a dashboard sees is what this module defines.

Names follow the Prometheus conventions: a `netclaim_` prefix, base units in
the name (`_seconds`), counters end in `_total` (written out here; the client
library would add it anyway), and `netclaim_build_info` is a constant 1 whose
labels say which build is running. The backlog gauges (journal and spool
depth, age of the oldest pending event) are computed when scraped, so an
alert on a stuck publisher needs no cooperation from the stuck part.
"""

from __future__ import annotations

import os
import platform
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client import CONTENT_TYPE_LATEST
from prometheus_client.process_collector import ProcessCollector

from cni_plugin import __version__
from cni_plugin.wire import PROTOCOL_VERSION, SPOOL_SUFFIX


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        ProcessCollector(registry=r)
        self.events_received = Counter("netclaim_events_received_total", "Events received on the socket", ["op"], registry=r)
        self.events_acked = Counter("netclaim_events_acked_total", "Events committed to the journal and acknowledged", ["op"], registry=r)
        self.events_spooled = Counter("netclaim_events_spooled_total", "Events ingested from the spool directory", registry=r)
        self.events_duplicate = Counter("netclaim_events_duplicate_total", "Events dropped as already journaled (same event id)", registry=r)
        self.events_rejected = Counter("netclaim_events_rejected_total", "Events or frames refused", ["reason"], registry=r)
        self.events_failed = Counter("netclaim_events_failed_total", "Events dropped after a permanent error or timeout", ["reason"], registry=r)
        self.peers_refused = Counter("netclaim_peers_refused_total", "Socket peers refused by SO_PEERCRED", registry=r)
        self.journal_depth = Gauge("netclaim_journal_depth", "Pending events in the journal", registry=r)
        self.attachments = Gauge("netclaim_attachments", "Attachments tracked (desired state)", registry=r)
        self.publish_latency = Histogram(
            "netclaim_add_to_published_seconds", "From the plugin's ADD to the apply that published it",
            buckets=(0.01, 0.025, 0.05, 0.1, 0.15, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120), registry=r)
        self.api_requests = Counter("netclaim_api_requests_total", "Kubernetes API requests", ["verb", "code"], registry=r)
        self.apply_skips = Counter("netclaim_apply_skips_total", "Applies skipped because the body equals the last applied one", registry=r)
        self.apply_errors = Counter("netclaim_apply_errors_total", "Permanent apply errors", ["code"], registry=r)
        self.resyncs = Counter("netclaim_resyncs_total", "Resync passes", registry=r)
        self.k8s_events = Counter(
            "netclaim_k8s_events_total", "Warning Events about permanent failures, by outcome "
            "(created, failed, deduplicated, dropped, disabled)", ["result"], registry=r)
        self.build_info = Gauge(
            "netclaim_build_info", "Always 1; the labels name the running build",
            ["version", "wire_protocol", "python_version"], registry=r)
        self.build_info.labels(__version__, str(PROTOCOL_VERSION), platform.python_version()).set(1)
        self.spool_depth = Gauge(
            "netclaim_spool_depth", "Events the plugin spooled to disk that are not ingested yet", registry=r)
        self.oldest_pending_age = Gauge(
            "netclaim_oldest_pending_event_age_seconds",
            "Age of the oldest event not yet published (journal or spool); 0 when none is pending", registry=r)
        # Reported by the publisher's intake / kube client / service (publisher/intake.py, kube.py).
        self.spool_overflow = Counter(
            "netclaim_spool_overflow_events_total", "Events the plugin could not spool (spool at its cap), "
            "from the spool's overflow marker", registry=r)
        self.credential_reloads = Gauge("netclaim_credential_reloads", "Times the API credentials were "
                                        "re-read because they changed on disk or a request got 401", registry=r)
        self.unauthorized = Gauge("netclaim_api_unauthorized_consecutive", "Consecutive 401 answers "
                                  "(credentials rejected); /readyz fails past a threshold", registry=r)
        self.ready = Gauge("netclaim_ready", "1 when /readyz answers ready", registry=r)
        # Events finished without anything to publish and without being a failure (publisher/report.py
        # `ignored`): no_claim = the pod has no claim that can be the driver's (most pods on a node).
        self.events_ignored = Counter(
            "netclaim_events_ignored_total", "Events that need no publishing and are no failure, by reason",
            ["reason"], registry=r)

    def watch_backlog(self, spool_dir: str, oldest_journaled: Callable[[], float | None]) -> None:
        """Compute the spool depth and oldest-pending age at scrape time.

        `oldest_journaled` returns the receive time (epoch seconds) of the
        oldest pending journal event, or None. Spool files carry their write
        time in the name (nanoseconds), so no file is opened for this.
        """
        self.spool_depth.set_function(lambda: len(spool_times(spool_dir)))

        def oldest_age() -> float:
            times = spool_times(spool_dir)
            journaled = oldest_journaled()
            if journaled is not None:
                times.append(journaled)
            return max(0.0, time.time() - min(times)) if times else 0.0

        self.oldest_pending_age.set_function(oldest_age)

    def record_api(self, verb: str, code: str) -> None:
        self.api_requests.labels(verb, code).inc()

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
    """Serves /metrics, /healthz (process alive) and /readyz (journal open and socket serving)."""

    def __init__(self, address: str, metrics: Metrics, ready: Callable[[], tuple[bool, str]]) -> None:
        host, _, port = address.rpartition(":")
        handler = _handler(metrics, ready)
        self.httpd = ThreadingHTTPServer((host.strip("[]") or "127.0.0.1", int(port)), handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, name="metrics", daemon=True)

    @property
    def port(self) -> int:
        return self.httpd.server_address[1]

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def _handler(metrics: Metrics, ready: Callable[[], tuple[bool, str]]) -> Any:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server API)
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                self._send(200, metrics.exposition(), CONTENT_TYPE_LATEST)
            elif path == "/healthz":
                self._send(200, b"ok\n")
            elif path == "/readyz":
                ok, why = ready()
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
