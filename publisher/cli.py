"""netclaim-publisher: the node service and the commands a node operator needs.

Every option can also come from an environment variable (shown in --help),
so a systemd unit or a DaemonSet can configure it without a wrapper script.
"""

from __future__ import annotations

import json
import signal
import socket
import sys
import threading
import time
from typing import Any

import click

from cni_plugin.wire import DEFAULT_SOCKET, DEFAULT_SPOOL_DIR, encode_frame, read_frame

DEFAULT_STATE_DIR = "/var/lib/netclaim/publisher"
DEFAULT_METRICS = "127.0.0.1:9464"

socket_option = click.option(
    "--socket", "socket_path", envvar="NETCLAIM_SOCKET", show_envvar=True, default=DEFAULT_SOCKET,
    show_default=True, help="Unix socket the plugin sends events to (created 0600, parent dir 0700).")


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
def main() -> None:
    """Publish pod network attachments (CNI results) into ResourceClaim.status.devices."""


@main.command()
@click.option("--node-name", envvar="NETCLAIM_NODE_NAME", show_envvar=True, required=True,
              help="This node's name: the field manager is netclaim/<node>, and only claims allocated "
                   "to this node are written.")
@click.option("--kubeconfig", envvar="NETCLAIM_KUBECONFIG", show_envvar=True, default=None,
              help="Kubeconfig file; without it the in-cluster service account is used.")
@socket_option
@click.option("--state-dir", envvar="NETCLAIM_STATE_DIR", show_envvar=True, default=DEFAULT_STATE_DIR,
              show_default=True, help="Directory of the SQLite journal (pending events, desired state).")
@click.option("--spool-dir", envvar="NETCLAIM_SPOOL_DIR", show_envvar=True, default=DEFAULT_SPOOL_DIR,
              show_default=True, help="Where the plugin spools events while the publisher is down; "
                                      "ingested at start and every few seconds.")
@click.option("--metrics-address", envvar="NETCLAIM_METRICS_ADDRESS", show_envvar=True, default=DEFAULT_METRICS,
              show_default=True, help="HOST:PORT serving /metrics, /healthz and /readyz (empty: off).")
@click.option("--log-format", envvar="NETCLAIM_LOG_FORMAT", show_envvar=True, default="json", show_default=True,
              type=click.Choice(["json", "text"]), help="Log lines on stderr: JSON (one event a line) or text.")
@click.option("--log-level", envvar="NETCLAIM_LOG_LEVEL", show_envvar=True, default="info", show_default=True,
              type=click.Choice(["debug", "info", "warning", "error"]), help="Least severe level logged.")
@click.option("--allowed-uid", envvar="NETCLAIM_ALLOWED_UIDS", show_envvar=True, type=int, multiple=True,
              help="Also accept socket peers with this uid (repeatable; root is always accepted). "
                   "The peer also needs filesystem access to the socket.")
@click.option("--allowed-gid", envvar="NETCLAIM_ALLOWED_GIDS", show_envvar=True, type=int, multiple=True,
              help="Also accept peers with this primary gid (repeatable); the socket becomes 0660 "
                   "owned by the lowest of these groups.")
@click.option("--workers", envvar="NETCLAIM_WORKERS", show_envvar=True, default=4, show_default=True,
              type=click.IntRange(1, 64), help="Worker threads (events of one sandbox always go to the same one).")
@click.option("--resolve-timeout", envvar="NETCLAIM_RESOLVE_TIMEOUT", show_envvar=True, default=120.0,
              show_default=True, type=float,
              help="Seconds an event may wait for its pod to be visible or its claim allocated before it "
                   "is reported and dropped.")
@click.option("--resync-interval", envvar="NETCLAIM_RESYNC_INTERVAL", show_envvar=True, default=300.0,
              show_default=True, type=float,
              help="Seconds between resyncs: repair claim status that differs from the desired state, "
                   "drop attachments whose pod or claim is gone.")
@click.option("--retry-max-delay", envvar="NETCLAIM_RETRY_MAX_DELAY", show_envvar=True, default=5.0,
              show_default=True, type=float, help="Cap of the backoff between retries of a failed apply (429/5xx/"
                                                  "no connection).")
@click.option("--emit-events/--no-emit-events", envvar="NETCLAIM_EMIT_EVENTS", show_envvar=True, default=True,
              show_default=True,
              help="Post a Warning Event (events.k8s.io/v1) on the claim, or the pod, when an attachment cannot "
                   "be published (apply refused, unresolvable); at most one per object and reason per 10 min.")
def run(node_name: str, kubeconfig: str | None, socket_path: str, state_dir: str, spool_dir: str,
        metrics_address: str, log_format: str, log_level: str, allowed_uid: tuple[int, ...],
        allowed_gid: tuple[int, ...], workers: int, resolve_timeout: float, resync_interval: float,
        retry_max_delay: float, emit_events: bool) -> None:
    """Run the publisher: receive events, journal them, publish claim status."""
    from . import logs
    from .kube import Kube, load_client
    from .metrics import HealthServer, Metrics
    from .server import SocketServer
    from .service import Service, Settings

    limit_malloc_arenas()
    log = logs.setup(log_format, log_level)
    metrics = Metrics()
    kube = Kube(load_client(kubeconfig, pool_size=workers + 4), metrics.record_api)
    settings = Settings(node_name=node_name, state_dir=state_dir, spool_dir=spool_dir, workers=workers,
                        resolve_timeout=resolve_timeout, resync_interval=resync_interval,
                        retry_cap=retry_max_delay, emit_events=emit_events)
    service = Service(settings, kube, metrics)
    server = SocketServer(socket_path, service.submit, service.status, metrics, allowed_uid, allowed_gid)
    health = HealthServer(metrics_address, metrics, service.ready) if metrics_address else None
    done = threading.Event()

    def on_signal(signum: int, _frame: Any) -> None:
        log.info("signal received, stopping", extra={"signal": signal.Signals(signum).name})
        done.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    if health:
        health.start()
    server.start()
    service.start()
    log.info("publisher started", extra={"node": node_name, "socket": socket_path, "state_dir": state_dir,
                                         "spool_dir": spool_dir, "metrics": metrics_address,
                                         "emit_events": emit_events,
                                         "journal_depth": service.journal.depth()})
    done.wait()
    server.stop()
    service.stop()
    if health:
        health.stop()
    log.info("publisher stopped")


def limit_malloc_arenas(arenas: int = 2) -> None:
    """Cap glibc's per-thread malloc arenas before any thread starts.

    Every socket connection and worker is a thread; by default glibc gives
    threads up to 8 arenas per core, which shows up as tens of MiB of RSS that
    a node service does not need (the bench measures RSS with 1000 attachments).
    """
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").mallopt(-8, arenas)  # M_ARENA_MAX
    except (OSError, AttributeError):
        pass  # not glibc: nothing to tune


def request_status(socket_path: str, timeout: float = 10.0) -> dict[str, Any]:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        sock.connect(socket_path)
        sock.sendall(encode_frame({"kind": "status"}))
        reply = read_frame(sock)
    if not reply.get("ok"):
        raise click.ClickException(str(reply.get("error")))
    return reply["status"]


def _age(ts: float | None) -> str:
    return "-" if not ts else f"{time.time() - ts:.1f}s ago"


@main.command()
@socket_option
@click.option("--output", "-o", type=click.Choice(["text", "json"]), default="text", show_default=True,
              help="Human summary or the raw JSON answer.")
def status(socket_path: str, output: str) -> None:
    """Ask the running publisher: journal depth, oldest pending event, last error, claims."""
    try:
        st = request_status(socket_path)
    except OSError as exc:
        raise click.ClickException(f"cannot reach the publisher at {socket_path}: {exc}") from None
    if output == "json":
        click.echo(json.dumps(st, indent=2, sort_keys=True))
        return
    click.echo(f"node:            {st['node']}")
    click.echo(f"journal depth:   {st['journal_depth']}")
    oldest = st.get("oldest_pending")
    click.echo("oldest pending:  " + ("-" if not oldest else
               f"{oldest['op']} {oldest['containerID'][:12]}/{oldest['ifname']} age {oldest['age_seconds']}s "
               f"attempts {oldest['attempts']} {oldest['last_error']}"))
    click.echo(f"attachments:     {st['attachments']}")
    err = st.get("last_error")
    click.echo("last error:      " + ("-" if not err else f"{_age(err.get('time'))} {err.get('claim', '')} {err.get('error')}"))
    click.echo("claims:")
    for key, cs in st.get("claims", {}).items():
        line = f"  {key:<40} {cs['state']:<10} {','.join(cs['devices'])}"
        if cs.get("error"):
            line += f"  error: {cs['error']}"
        click.echo(line)
    if st.get("failed_events"):
        click.echo("recently dropped events:")
        for f in st["failed_events"]:
            click.echo(f"  {f['op']} {f['containerID'][:12]}/{f['ifname']}: {f['error']}")


@main.command()
def version() -> None:
    """Print the publisher's version and wire protocol version."""
    from importlib.metadata import PackageNotFoundError, version as pkg_version

    from cni_plugin.wire import PROTOCOL_VERSION

    try:
        v = pkg_version("netclaim")
    except PackageNotFoundError:
        v = "unknown"
    click.echo(f"netclaim-publisher {v} (wire protocol {PROTOCOL_VERSION})")


if __name__ == "__main__":
    sys.exit(main())
