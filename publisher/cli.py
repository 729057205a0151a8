"""netclaim-publisher: the node service and the commands a node operator needs.

Every option can also come from an environment variable (shown in --help),
so a systemd unit or a DaemonSet can configure it without a wrapper script.
A configuration error (bad flag value, missing or broken kubeconfig, a state
directory that cannot be opened) is one line on stderr and a non-zero exit,
never a traceback: an operator reads it in `kubectl logs` or the journal.

`run`'s options belong to the rooms that use them: each room's `options` module adds its flags and
builds its settings (`settings_from`); `run` hands them the values it does not name itself. The chain
keeper is a program of its own (publisher/keeper/command.py), registered here as `chain-keeper`.
"""

from __future__ import annotations

import functools
import json
import os
import signal
import socket
import sys
import threading
from pathlib import Path
from typing import Any, Callable

import click

from cni_plugin.wire.event import PROTOCOL_VERSION
from cni_plugin.wire.frame import encode_frame, read_frame
from cni_plugin.wire.version import __version__
from publisher.endpoints.command import endpoints
from publisher.intake import options as intake_options
from publisher.intake.options import socket_option
from publisher.journal import options as journal_options
from publisher.keeper.command import chain_keeper
from publisher.kube.options import api_client_for, config_error, one_line
from publisher.live import options as live_options
from publisher.nsopen import options as nsopen_options
from publisher.nsopen.options import DEFAULT_NETNS_DIRS
from publisher.observe import nodelease, options as observe_options
from publisher.observe.fleet import fleet
from publisher.reconcile import options as reconcile_options
from publisher.repair import options as repair_options

PROG = "netclaim-publisher"

# `run --help` lists the options in this order (parameter names), whichever room adds them.
RUN_HELP_ORDER = (
    "node_name", "kubeconfig", "socket_path", "state_dir", "spool_dir", "metrics_address", "probe_address",
    "probe_socket", "log_format", "log_level", "allowed_uid", "allowed_gid", "workers", "resolve_timeout",
    "verify_after", "verify_spread", "sibling_hold", "device_id_attributes", "shared_attachments", "claim_window",
    "max_claim_windows",
    "resync_interval", "retry_max_delay", "emit_events", "spool_interval", "driver_names", "drivers_file",
    "unchained_grace", "durable_commits", "live_watch", "live_added_addresses", "netns_dirs", "netns_opener",
    "node_lease", "node_lease_namespace", "node_lease_period", "node_lease_prefix", "pod_name", "pod_uid",
    "keeper_socket", "keeper_address",
)


def in_order(*names: str) -> Callable[[click.Command], click.Command]:
    """Put a command's options in this order (by parameter name) in --help.

    The rooms' `options` decorators add their options room by room; --help keeps the order operators
    and the docs know. Every option must be named, so that a new one cannot land in an unplanned place.
    """
    rank = {name: i for i, name in enumerate(names)}

    def apply(command: click.Command) -> click.Command:
        unplaced = [p.name for p in command.params if p.name not in rank]
        if unplaced:
            raise ValueError(f"{command.name}: options without a place in --help: {unplaced}")
        command.params.sort(key=lambda p: rank[p.name or ""])
        return command

    return apply


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, "--version", prog_name=PROG,
                      message=f"%(prog)s %(version)s (wire protocol {PROTOCOL_VERSION})")
def cli() -> None:
    """Publish pod network attachments (CNI results) into ResourceClaim.status.devices."""


def main(argv: list[str] | None = None) -> int:
    """Console entry point: errors of the operator's making are one line, exit 2 (usage) or 1."""
    try:
        return int(cli.main(args=argv, prog_name=PROG, standalone_mode=False) or 0)
    except click.exceptions.NoArgsIsHelpError as exc:
        click.echo(exc.ctx.get_help() if exc.ctx else str(exc), err=True)
        return 2
    except click.ClickException as exc:
        ctx = getattr(exc, "ctx", None)
        hint = f" (see {ctx.command_path} --help)" if isinstance(exc, click.UsageError) and ctx else ""
        click.echo(f"{PROG}: error: {one_line(exc.format_message())}{hint}", err=True)
        return exc.exit_code
    except click.Abort:
        click.echo(f"{PROG}: aborted", err=True)
        return 1



@in_order(*RUN_HELP_ORDER)
@cli.command()
@click.option("--node-name", envvar="NETCLAIM_NODE_NAME", show_envvar=True, required=True,
              help="This node's name: the field manager is netclaim/<node>, and only claims allocated "
                   "to this node are written.")
@click.option("--kubeconfig", envvar=["NETCLAIM_KUBECONFIG", "KUBECONFIG"], show_envvar=True, default=None,
              help="Kubeconfig file (KUBECONFIG may list several, colon-separated, as for kubectl); "
                   "without it the in-cluster service account is used.")
@click.option("--log-format", envvar="NETCLAIM_LOG_FORMAT", show_envvar=True, default="json", show_default=True,
              type=click.Choice(["json", "text"]), help="Log lines on stderr: JSON (one event a line) or text.")
@click.option("--log-level", envvar="NETCLAIM_LOG_LEVEL", show_envvar=True, default="info", show_default=True,
              type=click.Choice(["debug", "info", "warning", "error"]), help="Least severe level logged.")
@intake_options.options
@journal_options.options
@observe_options.options
@reconcile_options.options
@repair_options.options
@live_options.options
@nsopen_options.options
@nodelease.options
def run(node_name: str, kubeconfig: str | None, log_format: str, log_level: str, **values: Any) -> None:
    """Run the publisher: receive events, journal them, publish claim status."""
    import sqlite3

    rules = reconcile_options.settings_from(values)  # a bad --device-id-attribute: before anything starts

    # Nothing the publisher creates (journal, its -wal/-shm, socket dir) is for other users,
    # whatever umask the unit or the container runtime started us with.
    os.umask(0o077)

    from publisher import logs
    from publisher.intake.server import SocketServer
    from publisher.kube.calls import Credentials, Kube
    from publisher.observe.listeners import keep_listening
    from publisher.observe.metrics import HealthServer, Metrics
    from publisher.service import Service, Settings

    limit_malloc_arenas()
    log = logs.setup(log_format, log_level)
    metrics = Metrics()
    repair = repair_options.settings_from(values)  # after the log's setup: it warns of --resync-interval
    journal = journal_options.settings_from(values)  # logged once started (a bad config: one line)
    intake = intake_options.settings_from(values)
    observe = observe_options.settings_from(values)
    live = live_options.settings_from(values)
    pool = rules.workers + 4 + repair.open_windows  # an open claim window holds a connection
    kube = Kube(api_client_for(kubeconfig, pool), metrics.record_api, record_duration=metrics.record_api_duration,
                credentials=Credentials(kubeconfig, pool), count_purpose=metrics.record_purpose)
    settings = Settings(node_name=node_name, state_dir=journal.state_dir, spool_dir=intake.spool_dir,
                        workers=rules.workers, resolve_timeout=rules.resolve_timeout, sibling_hold=rules.sibling_hold,
                        verify_after=repair.verify_after, verify_spread=repair.verify_spread,
                        claim_window=repair.claim_window, max_claim_windows=repair.max_claim_windows,
                        spool_interval=intake.spool_interval, retry_cap=rules.retry_cap,
                        emit_events=observe.emit_events, driver_names=repair.driver_names,
                        drivers_file=repair.drivers_file, unchained_grace=repair.unchained_grace,
                        durable_commits=journal.durable_commits, live_watch=live.live_watch,
                        live_added_addresses=live.live_added_addresses, netns=nsopen_options.settings_from(values),
                        device_id_attributes=rules.device_id_attributes, shared_attachments=rules.shared_attachments,
                        node_lease=nodelease.settings_from(values, node_name, kubeconfig))
    socket_path, spool_dir = intake.socket_path, intake.spool_dir
    allowed_uid, allowed_gid = intake.allowed_uids, intake.allowed_gids
    metrics_address, probe_address, probe_socket = observe.metrics_address, observe.probe_address, observe.probe_socket
    done = threading.Event()

    def on_signal(signum: int, _frame: Any) -> None:
        log.info("signal received, stopping", extra={"signal": signal.Signals(signum).name})
        done.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    tenure = take_state_dir(journal.state_dir, socket_path, done)
    if tenure is None:
        log.info("publisher stopped while waiting for the previous one: nothing done")
        return
    try:
        service = Service(settings, kube, metrics,
                          socket=functools.partial(SocketServer, socket_path, metrics=metrics,
                                                   allowed_uids=allowed_uid, allowed_gids=allowed_gid))
        server = service.server

        def http(address: str, probes_only: bool) -> Any:
            listener = HealthServer(address, metrics, service.ready, service.live, probes_only=probes_only)
            listener.start()
            return listener

        def taken(name: str) -> None:
            metrics.listen_taken.labels(name).inc()

        # A port (or socket) another process holds is opened once it is free: the work starts regardless.
        listeners = [keep_listening(name, address, functools.partial(http, address, probes_only), taken)
                     for name, address, probes_only in (("metrics", metrics_address, False),
                                                        ("probe", probe_address, True),
                                                        ("probe-socket", probe_socket, True))]
    except (OSError, sqlite3.Error) as exc:
        raise config_error("cannot start", exc) from None
    server.start()
    service.start()
    log.info("publisher started", extra={"node": node_name, "socket": socket_path, "state_dir": journal.state_dir,
                                         "spool_dir": spool_dir, "metrics": metrics_address,
                                         "probes": probe_address, "probe_socket": probe_socket,
                                         "emit_events": observe.emit_events,
                                         "driver_names": sorted(service.unchained.drivers),
                                         "journal_depth": service.journal.depth()})
    unchained_off = service.unchained.off_reason()
    if unchained_off:
        log.warning("pods started without netclaim in their chain are not reported (the unchained check is "
                    "off): " + unchained_off, extra={"drivers_file": repair.drivers_file or None})
    log.info("journal commits " + ("fsync before the ack" if journal.durable_commits
                                   else "ack without fsync (the boot rule covers an OS crash)"),
             extra={"why": journal.why})
    done.wait()
    server.stop()
    service.stop()
    for listener in listeners:
        if listener:
            listener.stop()
    tenure.release()
    log.info("publisher stopped")


def take_state_dir(state_dir: str, socket_path: str, stop: threading.Event) -> Any:
    """Wait until no other publisher runs on this state dir and socket; the held lock, or None if stopped.

    Two publishers of a node overlap in a surge rollout (`maxSurge`): the new pod starts while the old
    one still serves, and the old pod is deleted only once the new one is ready. The new publisher
    waits here without touching the journal, the socket or the listeners (its probes reach the old
    one's: the pods share the host's network) and takes over once the old one has stopped; plugins
    spool meanwhile. The socket is checked too: a publisher of a release without this lock."""
    from publisher import logs
    from publisher.intake.server import served
    from publisher.nodelock import NodeLock

    log = logs.get()
    tenure = NodeLock(Path(state_dir), lock_name=".netclaim-publisher.lock", owner_name=".netclaim-publisher.owner")
    told: list[bool] = []

    def waiting() -> None:
        if not told:
            told.append(True)
            log.info("waiting for the publisher already running on this node to stop (a rollout's previous pod?)",
                     extra={"state_dir": state_dir, "socket": socket_path})

    if not tenure.acquire(stop, on_wait=waiting):
        return None
    while served(socket_path):
        waiting()
        if stop.wait(0.1):
            tenure.release()
            return None
    return tenure



@cli.command("netns-opener")
@click.option("--socket", "socket_path", envvar="NETCLAIM_NETNS_OPENER", show_envvar=True, required=True,
              help="Unix socket to serve (SOCK_SEQPACKET, created 0600; the publisher's --netns-opener).")
@click.option("--netns-dir", "netns_dirs", envvar="NETCLAIM_NETNS_DIRS", show_envvar=True, multiple=True,
              default=DEFAULT_NETNS_DIRS, show_default=True,
              help="The runtime's directory of pod netns (repeatable; the variable: space-separated): only a "
                   "netns named directly in one of them is opened.")
@click.option("--allowed-uid", envvar="NETCLAIM_ALLOWED_UIDS", show_envvar=True, type=int, multiple=True,
              help="Also serve peers with this uid (repeatable; root is always served), as SO_PEERCRED shows it.")
@click.option("--log-format", envvar="NETCLAIM_LOG_FORMAT", show_envvar=True, default="json", show_default=True,
              type=click.Choice(["json", "text"]), help="Log lines on stderr: JSON (one event a line) or text.")
@click.option("--log-level", envvar="NETCLAIM_LOG_LEVEL", show_envvar=True, default="info", show_default=True,
              type=click.Choice(["debug", "info", "warning", "error"]), help="Least severe level logged.")
def netns_opener(socket_path: str, netns_dirs: tuple[str, ...], allowed_uid: tuple[int, ...], log_format: str,
                 log_level: str) -> None:
    """Open pods' netns for the live watch: the one process that needs CAP_SYS_ADMIN.

    No TCP listener, no API token, no journal: it answers the publisher's requests on a unix socket
    with two netlink sockets made in the requested netns (docs/publisher.md, "Live interfaces")."""
    from publisher import logs
    from publisher.nsopen.opener import Opener, OpenerSettings

    log = logs.setup(log_format, log_level)
    opener = Opener(OpenerSettings(socket_path, tuple(netns_dirs), tuple(allowed_uid)), log)
    stopping = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stopping.set())
    try:
        opener.listen()
    except OSError as exc:
        raise config_error("cannot listen", exc) from None
    log.info("netns opener serving", extra={"component": "netns-opener", "socket": socket_path,
                                            "netns_dirs": list(netns_dirs), "allowed_uids": list(allowed_uid)})
    try:
        opener.serve(stopping)
    finally:
        opener.close()
    log.info("netns opener stopped", extra={"component": "netns-opener"})


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


def _ask(socket_path: str, message: dict[str, Any], timeout: float = 10.0) -> dict[str, Any]:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        sock.connect(socket_path)
        sock.sendall(encode_frame(message))
        reply = read_frame(sock)
    if not reply.get("ok"):
        raise click.ClickException(str(reply.get("error")))
    return reply


def request_status(socket_path: str, timeout: float = 10.0) -> dict[str, Any]:
    return _ask(socket_path, {"kind": "status"}, timeout)["status"]


@cli.command()
@socket_option
@click.option("--output", "-o", type=click.Choice(["text", "json"]), default="text", show_default=True,
              help="Human summary or the raw JSON answer.")
def status(socket_path: str, output: str) -> None:
    """Ask the running publisher: journal depth, oldest pending event, last error, claims.

    Exits 1 when the answer holds a problem (not ready or not live, a claim in error, events
    dropped, spool files stuck), so a script or a probe can act on it; 0 when all is well.
    """
    from publisher.observe.statustext import problems, text

    try:
        st = request_status(socket_path)
    except OSError as exc:
        raise click.ClickException(f"cannot reach the publisher at {socket_path}: {exc}") from None
    found = problems(st)
    click.echo(json.dumps(st, indent=2, sort_keys=True) if output == "json" else text(st, found))
    sys.exit(1 if found else 0)


@cli.command()
@socket_option
def resync(socket_path: str) -> None:
    """Verify every tracked claim now: read it and repair its entries where they differ.

    The recovery after events were lost (a spool overflow): claims the journal knows are read
    again at once instead of when the safety net's spread would reach them.
    """
    try:
        _ask(socket_path, {"kind": "resync"})
    except OSError as exc:
        raise click.ClickException(f"cannot reach the publisher at {socket_path}: {exc}") from None
    click.echo("every tracked claim is due for verification now (netclaim-publisher status shows the progress)")


@cli.command()
def version() -> None:
    """Print the publisher's version and wire protocol version (same as --version)."""
    click.echo(f"{PROG} {__version__} (wire protocol {PROTOCOL_VERSION})")


cli.add_command(fleet)
cli.add_command(chain_keeper)
cli.add_command(endpoints)

if __name__ == "__main__":
    sys.exit(main())
