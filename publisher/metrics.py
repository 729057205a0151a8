"""Prometheus metrics plus /healthz and /readyz on one small HTTP server.

A private registry keeps the exposition to the publisher's own series (plus
process metrics), so what a dashboard sees is what this module defines.
"""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client import CONTENT_TYPE_LATEST
from prometheus_client.process_collector import ProcessCollector


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        ProcessCollector(registry=r)
        self.events_received = Counter("netclaim_events_received", "Events received on the socket", ["op"], registry=r)
        self.events_acked = Counter("netclaim_events_acked", "Events committed to the journal and acknowledged", ["op"], registry=r)
        self.events_spooled = Counter("netclaim_events_spooled", "Events ingested from the spool directory", registry=r)
        self.events_duplicate = Counter("netclaim_events_duplicate", "Events dropped as already journaled (same event id)", registry=r)
        self.events_rejected = Counter("netclaim_events_rejected", "Events or frames refused", ["reason"], registry=r)
        self.events_failed = Counter("netclaim_events_failed", "Events dropped after a permanent error or timeout", ["reason"], registry=r)
        self.peers_refused = Counter("netclaim_peers_refused", "Socket peers refused by SO_PEERCRED", registry=r)
        self.journal_depth = Gauge("netclaim_journal_depth", "Pending events in the journal", registry=r)
        self.attachments = Gauge("netclaim_attachments", "Attachments tracked (desired state)", registry=r)
        self.publish_latency = Histogram(
            "netclaim_add_to_published_seconds", "From the plugin's ADD to the apply that published it",
            buckets=(0.01, 0.025, 0.05, 0.1, 0.15, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120), registry=r)
        self.api_requests = Counter("netclaim_api_requests", "Kubernetes API requests", ["verb", "code"], registry=r)
        self.apply_skips = Counter("netclaim_apply_skips", "Applies skipped because the body equals the last applied one", registry=r)
        self.apply_errors = Counter("netclaim_apply_errors", "Permanent apply errors", ["code"], registry=r)
        self.resyncs = Counter("netclaim_resyncs", "Resync passes", registry=r)
        self.k8s_events = Counter(
            "netclaim_k8s_events", "Warning Events about permanent failures, by outcome "
            "(created, failed, deduplicated, dropped, disabled)", ["result"], registry=r)

    def record_api(self, verb: str, code: str) -> None:
        self.api_requests.labels(verb, code).inc()

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


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
