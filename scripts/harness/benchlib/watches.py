"""Watches through an API-server restart: how spread out 100 nodes' relists come back.

An API server restart breaks every node's pod watch at the same instant and
refuses connections for a while. This suite runs 100 nodes' real pod caches
(publisher/reconcile/podcache.py: the real follow() loop, Kube, ApiClient, rate limiter
and event parser, one thread each, each with its own connection pool) against
a local stand-in API server over HTTPS: it answers the pod LIST (no pods) and
holds each WATCH open with chunked encoding. Once every node watches, the
stand-in "restarts": it cuts every connection mid-stream, stops listening for
`--outages` seconds (connection refused), then listens again. Counted at the
stand-in: the LISTs that arrive after it is back, per second. Figures per
outage length: the largest share of the nodes' relists that arrived in any one
second (target <= 20 %: 5,000 nodes' paged pod LISTs must not hit an API
server that just came back in the same second), how long until every node
watches again, and the requests each node sent from the restart to then
(refused ones included: what an outage costs the node and the network).

No reference run: the figure is a share of the same run's relists. The
stand-in answers at once, so every delay measured is the loop's own backoff.
"""

from __future__ import annotations

import argparse
import json
import logging
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from .stats import percentile

REPO = Path(__file__).resolve().parents[3]


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, and chunked watch streams as the API server sends them

    def log_message(self, *args: Any) -> None:  # quiet: 100 nodes
        pass

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        api: StandInApi = self.server.api  # type: ignore[attr-defined]
        url = urllib.parse.urlsplit(self.path)
        query = dict(urllib.parse.parse_qsl(url.query))
        node = query.get("fieldSelector", "").partition("=")[2]
        if url.path != "/api/v1/pods" or not node:
            self._answer(404, {"kind": "Status", "code": 404, "message": "not served by the stand-in"})
        elif query.get("watch") == "true":
            self._watch(api, node)
        else:
            api.seen("list", node)
            self._answer(200, {"kind": "PodList", "metadata": {"resourceVersion": str(api.rv)}, "items": []})

    def _answer(self, code: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _watch(self, api: "StandInApi", node: str) -> None:
        """Hold the stream open until the stand-in restarts; then cut it without the last chunk."""
        generation = api.generation
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self.wfile.flush()
        api.watching(node, +1)
        try:
            while api.generation == generation and not api.broken.wait(0.2):
                pass
        finally:
            api.watching(node, -1)
            self.close_connection = True


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 256

    def __init__(self, api: "StandInApi", port: int, context: ssl.SSLContext) -> None:
        self.api = api
        self.context = context
        super().__init__(("127.0.0.1", port), _Handler)

    def finish_request(self, request: Any, client_address: Any) -> None:
        """TLS in the connection's own thread (not in the accept loop), tracked so a restart cuts it."""
        try:
            conn = self.context.wrap_socket(request, server_side=True)
        except (OSError, ssl.SSLError):
            return
        self.api.connected(conn, +1)
        try:
            super().finish_request(conn, client_address)
        except (OSError, ssl.SSLError):
            pass
        finally:
            self.api.connected(conn, -1)


class StandInApi:
    """The pod LIST and WATCH of an API server that can be restarted; counts what arrives when."""

    def __init__(self, workdir: Path) -> None:
        self.cert, key = workdir / "cert.pem", workdir / "key.pem"
        subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key),
                        "-out", str(self.cert), "-days", "1", "-subj", "/CN=127.0.0.1",
                        "-addext", "subjectAltName=IP:127.0.0.1"], check=True, capture_output=True, timeout=60)
        self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.context.load_cert_chain(str(self.cert), str(key))
        probe = socket.socket()
        probe.bind(("127.0.0.1", 0))
        self.port = probe.getsockname()[1]
        probe.close()
        self.rv = 1000
        self.generation = 0
        self.broken = threading.Event()
        self._lock = threading.Lock()
        self.lists: list[tuple[float, str]] = []
        self.watches: dict[str, int] = {}
        self._conns: set[Any] = set()
        self._server: _Server | None = None

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def seen(self, kind: str, node: str) -> None:
        with self._lock:
            self.lists.append((time.monotonic(), node))

    def watching(self, node: str, delta: int) -> None:
        with self._lock:
            self.watches[node] = self.watches.get(node, 0) + delta

    def open_watches(self) -> int:
        with self._lock:
            return sum(1 for n in self.watches.values() if n > 0)

    def connected(self, conn: Any, delta: int) -> None:
        with self._lock:
            (self._conns.add if delta > 0 else self._conns.discard)(conn)

    def start(self) -> None:
        self.broken.clear()
        self._server = _Server(self, self.port, self.context)
        threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def stop(self) -> None:
        """What a restart looks like from a node: every stream cut, then connection refused."""
        self.generation += 1
        self.broken.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        with self._lock:
            conns = list(self._conns)
        for conn in conns:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


class Nodes:
    """`count` nodes' real pod caches against `api`; counts each node's requests by answer."""

    def __init__(self, api: StandInApi, count: int) -> None:
        sys.path.insert(0, str(REPO))
        from publisher.kube.apiclient import ApiClient, Endpoint
        from publisher.kube.calls import Kube
        from publisher.reconcile.podcache import PodCache

        self.stopping = threading.Event()
        self._lock = threading.Lock()
        self.requests: Counter = Counter()  # (node, "refused" | "answered")
        ca = api.cert.read_bytes()
        self.caches = []
        for i in range(count):
            node = f"node-{i:03d}"
            kube = Kube(ApiClient(Endpoint(server=api.url, ca_pem=ca), pool_size=2),
                        record=lambda verb, code, node=node: self._count(node, code))
            self.caches.append(PodCache(kube=kube, node_name=node, stopping=self.stopping))

    def _count(self, node: str, code: str) -> None:
        with self._lock:
            self.requests[(node, "refused" if code == "error" else "answered")] += 1

    def snapshot(self) -> Counter:
        with self._lock:
            return Counter(self.requests)

    def start(self) -> None:
        for cache in self.caches:
            cache.start()


def wait_for(condition: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.05)


def restart_once(workdir: Path, nodes: int, outage: float, settle: float) -> dict[str, Any]:
    """One restart of `outage` seconds with fresh nodes (each starts with no failure behind it)."""
    api = StandInApi(workdir)
    api.start()
    fleet = Nodes(api, nodes)
    fleet.start()
    wait_for(lambda: api.open_watches() == nodes, 60, f"{nodes} nodes to watch")
    before = fleet.snapshot()
    api.stop()
    time.sleep(outage)
    back = time.monotonic()
    api.start()
    try:
        wait_for(lambda: api.open_watches() == nodes, settle, f"{nodes} nodes to watch again")
    finally:
        recovered = time.monotonic() - back
        during = fleet.snapshot() - before
        fleet.stopping.set()
        api.stop()  # cuts the streams: the followers see `stopping` and end
    relists = [t - back for t, _ in api.lists if t >= back]
    per_second = Counter(int(d) for d in relists)
    busiest = max(per_second.values()) if per_second else 0
    refused = sum(n for (_, kind), n in during.items() if kind == "refused")
    answered = sum(n for (_, kind), n in during.items() if kind == "answered")
    return {
        "outage_s": outage,
        "nodes": nodes,
        "relists_after_back": len(relists),
        "max_share_in_one_second": round(busiest / nodes, 3),
        "busiest_second": min((s for s, n in per_second.items() if n == busiest), default=0),
        "relists_per_second": [per_second.get(s, 0) for s in range(max(per_second, default=-1) + 1)],
        "relist_delay_after_back_s": {"p50": round(percentile(relists, 0.5), 2),
                                      "p90": round(percentile(relists, 0.9), 2),
                                      "max": round(max(relists), 2)} if relists else {},
        "all_watching_again_s": round(recovered, 2),
        "requests_per_node": round((refused + answered) / nodes, 2),
        "refused_per_node": round(refused / nodes, 2),
    }


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--nodes", type=int, default=100, help="simulated nodes (one pod cache each)")
    parser.add_argument("--outages", default="5,15",
                        help="comma-separated outage lengths in seconds, one restart each (default 5,15)")
    parser.add_argument("--settle", type=float, default=60.0,
                        help="seconds every node may take to watch again after the stand-in is back")
    parser.add_argument("--target", type=float, default=0.20, help="max share of the relists in any one second")


def run(args: argparse.Namespace) -> dict[str, Any]:
    logging.getLogger("netclaim.publisher").setLevel(logging.ERROR)  # 100 nodes' "watch failed" warnings
    runs = []
    with tempfile.TemporaryDirectory(prefix="bench-watches-") as tmp:
        for outage in [float(x) for x in str(args.outages).split(",") if x.strip()]:
            result = restart_once(Path(tmp), args.nodes, outage, args.settle)
            runs.append(result)
            print(f"outage {outage:g} s, {args.nodes} nodes: max {result['max_share_in_one_second']:.0%} of the "
                  f"relists in one second (second {result['busiest_second']} after the API came back; "
                  f"target <= {args.target:.0%}); per second: {result['relists_per_second']}; "
                  f"all watching again after {result['all_watching_again_s']} s; "
                  f"{result['requests_per_node']} requests per node ({result['refused_per_node']} refused)",
                  file=sys.stderr)
    return {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "target_max_share": args.target,
            "runs": runs, "meets_target": all(r["max_share_in_one_second"] <= args.target for r in runs)}
