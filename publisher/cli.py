"""netclaim-publisher: the node service and the commands a node operator needs.

Every option can also come from an environment variable (shown in --help),
so a systemd unit or a DaemonSet can configure it without a wrapper script.
A configuration error (bad flag value, missing or broken kubeconfig, a state
directory that cannot be opened) is one line on stderr and a non-zero exit,
never a traceback: an operator reads it in `kubectl logs` or the journal.
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
from typing import Any

import click

from cni_plugin import __version__
from cni_plugin.config import (
    DEFAULT_ACK_TIMEOUT_MS,
    DEFAULT_ADDRESS_WAIT_MS,
    DEFAULT_HANDOFF_WAIT_MS,
    DEFAULT_SPOOL_MAX_BYTES,
    DEFAULT_SPOOL_MAX_FILES,
    INT_SETTINGS,
)
from cni_plugin.wire.event import PROTOCOL_VERSION
from cni_plugin.wire.frame import DEFAULT_SOCKET, encode_frame, read_frame
from cni_plugin.wire.spool import DEFAULT_SPOOL_DIR
from publisher import limits
from publisher.observe import nodelease
from publisher.observe.fleet import fleet

PROG = "netclaim-publisher"

DEFAULT_STATE_DIR = "/var/lib/netclaim/publisher"
DEFAULT_NETNS_DIRS = ("/var/run/netns",)  # publisher/nsopen/netnsfile.py; containerd's and CRI-O's default
DEFAULT_METRICS = "127.0.0.1:9464"

socket_option = click.option(
    "--socket", "socket_path", envvar="NETCLAIM_SOCKET", show_envvar=True, default=DEFAULT_SOCKET,
    show_default=True, help="Unix socket the plugin sends events to (created 0600, parent dir 0700).")


def metrics_address_value(_ctx: Any, _param: Any, value: str) -> str:
    """HOST:PORT (or empty: off), checked before anything starts."""
    if not value:
        return value
    _host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise click.BadParameter(f"{value!r} is not HOST:PORT")
    return value


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


def one_line(text: str) -> str:
    """Collapse a multi-line message (YAML parser errors, API Status) into one line."""
    return " ".join(str(text).split())


def config_error(what: str, exc: BaseException) -> click.ClickException:
    return click.ClickException(f"{what}: {one_line(str(exc)) or type(exc).__name__}")


def api_client_for(kubeconfig: str | None, pool_size: int) -> Any:
    """The API client, or one clear line about why the credential cannot be used."""
    from publisher.kube.apiclient import ConfigError
    from publisher.kube.calls import load_client

    if kubeconfig:
        paths = [p for p in kubeconfig.split(os.pathsep) if p]
        if not any(os.path.isfile(p) for p in paths):
            raise click.ClickException(f"kubeconfig {kubeconfig}: no such file")
        what = f"kubeconfig {kubeconfig}"
    else:
        what = "no --kubeconfig or KUBECONFIG given and the in-cluster service account is unusable"
    try:
        client = load_client(kubeconfig, pool_size=pool_size)
    except (ConfigError, OSError, ValueError, TypeError, KeyError, AttributeError) as exc:
        raise config_error(what, exc) from None
    if getattr(getattr(client, "endpoint", None), "system_roots", False):
        from publisher import logs

        logs.get().warning("the kubeconfig names no certificate-authority: the API server's certificate is "
                           "checked against the system's CA store (as kubectl does); name the cluster's CA to "
                           "trust it alone", extra={"kubeconfig": kubeconfig or ""})
    return client


@cli.command()
@click.option("--node-name", envvar="NETCLAIM_NODE_NAME", show_envvar=True, required=True,
              help="This node's name: the field manager is netclaim/<node>, and only claims allocated "
                   "to this node are written.")
@click.option("--kubeconfig", envvar=["NETCLAIM_KUBECONFIG", "KUBECONFIG"], show_envvar=True, default=None,
              help="Kubeconfig file (KUBECONFIG may list several, colon-separated, as for kubectl); "
                   "without it the in-cluster service account is used.")
@socket_option
@click.option("--state-dir", envvar="NETCLAIM_STATE_DIR", show_envvar=True, default=DEFAULT_STATE_DIR,
              show_default=True, help="Directory of the SQLite journal (pending events, desired state).")
@click.option("--spool-dir", envvar="NETCLAIM_SPOOL_DIR", show_envvar=True, default=DEFAULT_SPOOL_DIR,
              show_default=True, help="Where the plugin spools events while the publisher is down; "
                                      "ingested at start and every few seconds.")
@click.option("--metrics-address", envvar="NETCLAIM_METRICS_ADDRESS", show_envvar=True, default=DEFAULT_METRICS,
              show_default=True, callback=metrics_address_value,
              help="HOST:PORT serving /metrics, /healthz and /readyz (empty: off).")
@click.option("--probe-address", envvar="NETCLAIM_PROBE_ADDRESS", show_envvar=True, default="",
              callback=metrics_address_value,
              help="HOST:PORT serving only /healthz and /readyz, on threads of their own, for the kubelet's "
                   "probes: connections held open on --metrics-address cannot make them fail. Use a loopback "
                   "address (the chart: 127.0.0.1, which pods cannot reach). Empty: off.")
@click.option("--probe-socket", envvar="NETCLAIM_PROBE_SOCKET", show_envvar=True, default="",
              type=click.Path(dir_okay=False),
              help="Unix socket serving only /healthz and /readyz (created 0600; put it in a root-owned directory), "
                   "for exec probes (`python -m publisher.observe.localprobe SOCKET /healthz`): no local account "
                   "can take it or answer in its place, as it can a TCP port. Empty: off.")
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
@click.option("--verify-after", envvar="NETCLAIM_VERIFY_AFTER", show_envvar=True, default=86400.0,
              show_default=True, type=click.FloatRange(0.05, None),
              help="Safety net: each tracked claim is read again and repaired if needed this many seconds "
                   "(plus --verify-spread jitter) after it was last verified. Drift is repaired by events "
                   "first; this covers what no event shows.")
@click.option("--verify-spread", envvar="NETCLAIM_VERIFY_SPREAD", show_envvar=True, default=43200.0,
              show_default=True, type=click.FloatRange(0, None),
              help="Random extra seconds (uniform) added to each claim's --verify-after, so the reads are spread "
                   "evenly over time and nodes.")
@click.option("--sibling-hold", envvar="NETCLAIM_SIBLING_HOLD", show_envvar=True, default=limits.SIBLING_HOLD,
              show_default=True, type=click.FloatRange(0, 30),
              help="Seconds a claim's apply may wait, after a sandbox's first ADD on it, for the same sandbox's "
                   "ADDs of the claim's other devices (Multus runs networks one after another): one apply for "
                   "them all. 0: every ADD applies at once.")
@click.option("--device-id-attribute", "device_id_attributes", envvar="NETCLAIM_DEVICE_ID_ATTRIBUTES",
              show_envvar=True, multiple=True,
              help="A ResourceSlice attribute that holds a device's ID, qualified with its domain (repeatable, "
                   "first found wins; the variable: space-separated). An interface whose meta plugin handed it a "
                   "device ID (Multus: deviceID) is mapped to the allocated device carrying that ID. Default: "
                   "k8s.cni.cncf.io/deviceID, then resource.kubernetes.io/pciBusID.")
@click.option("--claim-window", envvar="NETCLAIM_CLAIM_WINDOW", show_envvar=True, default=0.0,
              show_default=True, type=click.FloatRange(0, 3600),
              help="Seconds a claim stays watched after netclaim's apply: a change that drops or alters its "
                   "entries is repaired at once. Off by default (0: claims are read with GET and not watched): "
                   "a windowed watch costs the API server about 3x the CPU of a GET per ADD (docs/scale.md).")
@click.option("--max-claim-windows", envvar="NETCLAIM_MAX_CLAIM_WINDOWS", show_envvar=True, default=32,
              show_default=True, type=click.IntRange(0, 1024),
              help="Claim watches open at once at most (a thread and a connection each); beyond, a claim is "
                   "read with GET and not watched.")
@click.option("--resync-interval", envvar="NETCLAIM_RESYNC_INTERVAL", show_envvar=True, default=None,
              type=click.FloatRange(0.05, None),
              help="Deprecated: the same as --verify-after S --verify-spread 0 (each claim verified every S "
                   "seconds). Kept for existing installs; will be removed.")
@click.option("--retry-max-delay", envvar="NETCLAIM_RETRY_MAX_DELAY", show_envvar=True, default=5.0,
              show_default=True, type=float, help="Cap of the backoff between retries of a failed apply (429/5xx/"
                                                  "no connection).")
@click.option("--emit-events/--no-emit-events", envvar="NETCLAIM_EMIT_EVENTS", show_envvar=True, default=True,
              show_default=True,
              help="Post a Warning Event (events.k8s.io/v1) on the claim, or the pod, when an attachment cannot "
                   "be published (apply refused, unresolvable); at most one per object and reason per 10 min.")
@click.option("--spool-interval", envvar="NETCLAIM_SPOOL_INTERVAL", show_envvar=True, default=5.0,
              show_default=True, type=click.FloatRange(0.05, 3600),
              help="Seconds between looks at the spool dir (and retries of claims whose apply failed).")
@click.option("--driver-name", "driver_names", envvar="NETCLAIM_DRIVER_NAMES", show_envvar=True, multiple=True,
              help="A DRA driver netclaim reports for (repeatable; the variable: space-separated). A Running pod "
                   "with a claim of one of them whose sandbox never ran netclaim gets a NetclaimNotChained "
                   "Warning Event (none here nor in --drivers-file: not looked for, and the start says so).")
@click.option("--drivers-file", envvar="NETCLAIM_DRIVERS_FILE", show_envvar=True, default="",
              help="A file of more driver names, as scripts/install.sh records them: one `DRIVER CONFLIST` line "
                   "per conflist it chained netclaim into (the systemd unit: /etc/netclaim/drivers). Read again "
                   "whenever it changes; missing: it names none.")
@click.option("--unchained-grace", envvar="NETCLAIM_UNCHAINED_GRACE", show_envvar=True, default=30.0,
              show_default=True, type=click.FloatRange(1, 3600),
              help="Seconds after a claimed pod is seen Running before a missing ADD counts as not chained.")
@click.option("--durable-commits", envvar="NETCLAIM_DURABLE_COMMITS", show_envvar=True, default="auto",
              show_default=True, type=click.Choice(["auto", "always", "never"]),
              help="fsync every journal commit before the ack. auto: only when the state dir is on a network or "
                   "FUSE filesystem; use always for a publisher in a VM-isolated runtime (docs/publisher.md).")
@click.option("--live-watch/--no-live-watch", envvar="NETCLAIM_LIVE_WATCH", show_envvar=True, default=True,
              show_default=True,
              help="Follow each attachment's interface in its pod's netns after ADD: Ready and networkData show "
                   "link down, lost carrier, addresses added or removed (needs CAP_SYS_ADMIN and the netns "
                   "directory; without them the watch is off and says so in /readyz).")
@click.option("--live-added-addresses", "live_added_addresses", envvar="NETCLAIM_LIVE_ADDED_ADDRESSES",
              show_envvar=True, multiple=True, metavar="NETWORK",
              help="A CNI network (its conflist's name) whose interfaces show addresses gained after the ADD "
                   "(SLAAC, DHCP) in networkData.ips (repeatable; the variable: space-separated). Elsewhere the "
                   "watch only takes away: the pod's own workload can add any address to its interface.")
@click.option("--netns-dir", "netns_dirs", envvar="NETCLAIM_NETNS_DIRS", show_envvar=True, multiple=True,
              default=DEFAULT_NETNS_DIRS, show_default=True,
              help="The runtime's directory of pod netns (repeatable; the variable: space-separated). The live "
                   "watch opens only a netns named directly in one of them, never a symlink, a FIFO or a "
                   "/proc/<pid>/ns/net path: such an attachment keeps what the ADD said.")
@click.option("--netns-opener", envvar="NETCLAIM_NETNS_OPENER", show_envvar=True, default="",
              help="Socket of a `netclaim-publisher netns-opener` that opens each netns for the live watch: "
                   "this process then needs no capability (the chart's layout). Empty: it enters them itself "
                   "(needs CAP_SYS_ADMIN).")
@nodelease.options
def run(node_name: str, kubeconfig: str | None, socket_path: str, state_dir: str, spool_dir: str,
        metrics_address: str, probe_address: str, probe_socket: str, log_format: str, log_level: str,
        allowed_uid: tuple[int, ...],
        allowed_gid: tuple[int, ...], workers: int, resolve_timeout: float, sibling_hold: float, verify_after: float,
        verify_spread: float, claim_window: float, max_claim_windows: int, resync_interval: float | None,
        retry_max_delay: float, emit_events: bool, spool_interval: float, driver_names: tuple[str, ...],
        drivers_file: str, unchained_grace: float, durable_commits: str, live_watch: bool,
        live_added_addresses: tuple[str, ...],
        netns_dirs: tuple[str, ...], netns_opener: str, device_id_attributes: tuple[str, ...],
        **node_lease: Any) -> None:
    """Run the publisher: receive events, journal them, publish claim status."""
    import sqlite3

    from publisher.reconcile.slices import DEFAULT_DEVICE_ID_ATTRIBUTES, check_attribute_names

    try:
        id_attributes = check_attribute_names(device_id_attributes) or DEFAULT_DEVICE_ID_ATTRIBUTES
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--device-id-attribute") from None

    # Nothing the publisher creates (journal, its -wal/-shm, socket dir) is for other users,
    # whatever umask the unit or the container runtime started us with.
    os.umask(0o077)

    from publisher import logs
    from publisher.journal.durability import durable_commits as decide_durability
    from publisher.kube.calls import Credentials, Kube
    from publisher.observe.listeners import keep_listening
    from publisher.observe.metrics import HealthServer, Metrics
    from publisher.intake.server import SocketServer
    from publisher.nsopen.access import NetnsAccess
    from publisher.service import Service, Settings

    limit_malloc_arenas()
    log = logs.setup(log_format, log_level)
    metrics = Metrics()
    if resync_interval is not None:
        log.warning("--resync-interval (NETCLAIM_RESYNC_INTERVAL) is deprecated: use --verify-after and "
                    "--verify-spread", extra={"resync_interval": resync_interval})
        verify_after, verify_spread = resync_interval, 0.0
    durable, why = decide_durability(durable_commits, state_dir)  # logged once started (a bad config: one line)
    pool = workers + 4 + (max_claim_windows if claim_window > 0 else 0)  # an open claim window holds a connection
    kube = Kube(api_client_for(kubeconfig, pool), metrics.record_api, record_duration=metrics.record_api_duration,
                credentials=Credentials(kubeconfig, pool), count_purpose=metrics.record_purpose)
    settings = Settings(node_name=node_name, state_dir=state_dir, spool_dir=spool_dir, workers=workers,
                        resolve_timeout=resolve_timeout, sibling_hold=sibling_hold,
                        verify_after=verify_after, verify_spread=verify_spread,
                        claim_window=claim_window, max_claim_windows=max_claim_windows,
                        spool_interval=spool_interval, retry_cap=retry_max_delay, emit_events=emit_events,
                        driver_names=driver_names, drivers_file=drivers_file, unchained_grace=unchained_grace,
                        durable_commits=durable, live_watch=live_watch,
                        live_added_addresses=tuple(live_added_addresses),
                        netns=NetnsAccess(dirs=tuple(netns_dirs), opener=netns_opener),
                        device_id_attributes=id_attributes,
                        node_lease=nodelease.settings_from(node_lease, node_name, kubeconfig))
    done = threading.Event()

    def on_signal(signum: int, _frame: Any) -> None:
        log.info("signal received, stopping", extra={"signal": signal.Signals(signum).name})
        done.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    tenure = take_state_dir(state_dir, socket_path, done)
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
    log.info("publisher started", extra={"node": node_name, "socket": socket_path, "state_dir": state_dir,
                                         "spool_dir": spool_dir, "metrics": metrics_address,
                                         "probes": probe_address, "probe_socket": probe_socket,
                                         "emit_events": emit_events,
                                         "driver_names": sorted(service.unchained.drivers),
                                         "journal_depth": service.journal.depth()})
    unchained_off = service.unchained.off_reason()
    if unchained_off:
        log.warning("pods started without netclaim in their chain are not reported (the unchained check is "
                    "off): " + unchained_off, extra={"drivers_file": drivers_file or None})
    log.info("journal commits " + ("fsync before the ack" if durable else "ack without fsync (the boot rule covers an "
                                                                         "OS crash)"), extra={"why": why})
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
    from publisher.nodelock import NodeLock
    from publisher.intake.server import served

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


def plugin_int_help(key: str, default: int) -> str:
    """An integer setting's help, from the plugin's own table (its range) and default."""
    lo, hi = INT_SETTINGS[key]
    return f"The entry's {key}, an integer {lo}-{hi} (empty: the plugin's default, {default})."


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


@cli.command("chain-keeper")
@click.option("--cni-conf-dir", envvar="NETCLAIM_CNI_CONF_DIR", show_envvar=True, default="/etc/cni/net.d",
              show_default=True, type=click.Path(file_okay=False), help="The node's CNI config dir, as mounted here.")
@click.option("--cni-bin-dir", envvar="NETCLAIM_CNI_BIN_DIR", show_envvar=True, default="/opt/cni/bin",
              show_default=True, type=click.Path(file_okay=False), help="The node's CNI bin dir, as mounted here.")
@click.option("--conflist", envvar="NETCLAIM_CNI_CONFLIST", show_envvar=True, default="",
              help="File name in the conf dir to chain into; empty: the first network file by name "
                   "(the one the runtime uses).")
@click.option("--plugin-binary", envvar="NETCLAIM_PLUGIN_BINARY", show_envvar=True,
              default="/opt/netclaim/bin/netclaim", show_default=True,
              type=click.Path(dir_okay=False), help="The self-contained plugin executable to install.")
@click.option("--driver-name", envvar="NETCLAIM_DRIVER_NAME", show_envvar=True, default="",
              help="The DRA driver whose devices netclaim reports (the entry's driverName).")
@click.option("--request", envvar="NETCLAIM_REQUEST", show_envvar=True, default="",
              help="The claim request whose device an attachment is (empty: decided per claim).")
@click.option("--failure-policy", envvar="NETCLAIM_FAILURE_POLICY", show_envvar=True, default="Ignore",
              show_default=True, type=click.Choice(["Ignore", "Fail"]), help="The entry's failurePolicy.")
@click.option("--plugin-socket", envvar="NETCLAIM_PLUGIN_SOCKET", show_envvar=True, default=DEFAULT_SOCKET,
              show_default=True, help="The publisher's socket as the plugin on the node sees it.")
@click.option("--plugin-spool-dir", envvar="NETCLAIM_PLUGIN_SPOOL_DIR", show_envvar=True,
              default=DEFAULT_SPOOL_DIR, show_default=True, help="The spool dir as the plugin on the node sees it.")
@click.option("--plugin-log-file", envvar="NETCLAIM_PLUGIN_LOG_FILE", show_envvar=True, default="",
              help="The plugin's log file on the node (empty: none).")
@click.option("--plugin-ack-timeout-ms", envvar="NETCLAIM_PLUGIN_ACK_TIMEOUT_MS", show_envvar=True, default="",
              metavar="MS", help=plugin_int_help("ackTimeoutMs", DEFAULT_ACK_TIMEOUT_MS))
@click.option("--plugin-handoff-wait-ms", envvar="NETCLAIM_PLUGIN_HANDOFF_WAIT_MS", show_envvar=True, default="",
              metavar="MS", help=plugin_int_help("handoffWaitMs", DEFAULT_HANDOFF_WAIT_MS))
@click.option("--plugin-address-wait-ms", envvar="NETCLAIM_PLUGIN_ADDRESS_WAIT_MS", show_envvar=True, default="",
              metavar="MS", help=plugin_int_help("addressWaitMs", DEFAULT_ADDRESS_WAIT_MS))
@click.option("--plugin-spool-max-files", envvar="NETCLAIM_PLUGIN_SPOOL_MAX_FILES", show_envvar=True, default="",
              metavar="N", help=plugin_int_help("spoolMaxFiles", DEFAULT_SPOOL_MAX_FILES))
@click.option("--plugin-spool-max-bytes", envvar="NETCLAIM_PLUGIN_SPOOL_MAX_BYTES", show_envvar=True, default="",
              metavar="BYTES", help=plugin_int_help("spoolMaxBytes", DEFAULT_SPOOL_MAX_BYTES))
@click.option("--cni-cache-dir", envvar="NETCLAIM_CNI_CACHE_DIR", show_envvar=True, default="/var/lib/cni",
              show_default=True, type=click.Path(file_okay=False),
              help="The runtimes' libcni cache dir, as mounted here: on uninstall the plugin is kept while a "
                   "cached config there still runs it (empty: not looked at).")
@click.option("--plugin-cni-cache-dir", envvar="NETCLAIM_PLUGIN_CNI_CACHE_DIR", show_envvar=True, default="",
              help="The libcni cache dir as the plugin on the node sees it, written into the marker of a kept "
                   "plugin so that its last DEL can remove it (empty: --cni-cache-dir).")
@click.option("--runtime-teardown", envvar="NETCLAIM_RUNTIME_TEARDOWN", show_envvar=True, default="auto",
              show_default=True, type=click.Choice(["auto", "cached-config", "loaded-config"]),
              help="How the node's runtime runs a sandbox's CNI DEL: with the config cached at its ADD (CRI-O; "
                   "the plugin is kept on uninstall while a cached config runs it) or with the config it has "
                   "loaded (containerd; the plugin goes at once). auto: learnt from the kubelet's pod status "
                   "(needs --node-name and the API), cached-config until known.")
@click.option("--cleanup-dir", envvar="NETCLAIM_CLEANUP_DIRS", show_envvar=True, multiple=True,
              type=click.Path(file_okay=False), help="Emptied on uninstall (spool, journal, socket dir); repeatable.")
@click.option("--poll-interval", envvar="NETCLAIM_POLL_INTERVAL", show_envvar=True, default=1.0,
              show_default=True, type=click.FloatRange(0.1, 60), help="Seconds between looks at the conf dir.")
@click.option("--daemonset", envvar="NETCLAIM_DAEMONSET", show_envvar=True, default="",
              help="This pod's DaemonSet, watched while the keeper runs: on SIGTERM the node is cleaned up "
                   "only on proof that it is gone or being deleted (404, deletionTimestamp, a DELETED watch "
                   "event); 401/403/no answer keep everything (empty: never clean up).")
@click.option("--namespace", envvar="NETCLAIM_NAMESPACE", show_envvar=True, default="",
              help="The DaemonSet's namespace.")
@click.option("--kubeconfig", envvar=["NETCLAIM_KUBECONFIG", "KUBECONFIG"], show_envvar=True, default=None,
              help="Kubeconfig for the DaemonSet check; without it the in-cluster service account.")
@click.option("--once", is_flag=True, help="Install and chain once, then exit (an init container).")
@click.option("--uninstall", "uninstall_now", is_flag=True,
              help="Unchain the entry of --driver-name and --request, remove the plugin (unless a cached config "
                   "still runs it) and empty the cleanup dirs now, then exit.")
@click.option("--log-format", envvar="NETCLAIM_LOG_FORMAT", show_envvar=True, default="json", show_default=True,
              type=click.Choice(["json", "text"]), help="Log lines on stderr: JSON or text.")
@click.option("--log-level", envvar="NETCLAIM_LOG_LEVEL", show_envvar=True, default="info", show_default=True,
              type=click.Choice(["debug", "info", "warning", "error"]), help="Least severe level logged.")
@click.option("--node-name", envvar="NETCLAIM_NODE_NAME", show_envvar=True, default="",
              help="This node: a chain contest is posted as a Warning Event on it (empty: no Event).")
@click.option("--metrics-address", envvar="NETCLAIM_KEEPER_METRICS_ADDRESS", show_envvar=True, default="",
              help="host:port for /metrics, /readyz (chained, or the contest reported) and /healthz (the "
                   "keeper's loop turns; see --stall-after) (empty: none).")
@click.option("--lock-dir", envvar="NETCLAIM_KEEPER_LOCK_DIR", show_envvar=True, default="",
              type=click.Path(file_okay=False),
              help="The node dir (the state dir, as mounted here) of the keeper's lock: a new install's keeper "
                   "waits there while an uninstall's cleanup runs, and the cleanup leaves a newer install's files "
                   "alone (empty: no lock).")
@click.option("--probe-address", envvar="NETCLAIM_KEEPER_PROBE_ADDRESS", show_envvar=True, default="",
              callback=metrics_address_value,
              help="host:port serving only /readyz and /healthz on threads of their own, for the kubelet's probes "
                   "(the chart: 127.0.0.1, which pods cannot reach; empty: none).")
@click.option("--probe-socket", envvar="NETCLAIM_KEEPER_PROBE_SOCKET", show_envvar=True, default="",
              type=click.Path(dir_okay=False),
              help="Unix socket serving only /readyz and /healthz (created 0600; put it in a root-owned directory): "
                   "the exec probes' and the publisher's --keeper-socket, which believes only root's answer there "
                   "(empty: none).")
@click.option("--stall-after", envvar="NETCLAIM_KEEPER_STALL_AFTER", show_envvar=True, default=0.0,
              type=click.FloatRange(0, 3600),
              help="Seconds without a turn of the keeper's loop after which /healthz fails (the kubelet then "
                   "restarts it); waiting for the node lock never fails it. 0: 60 poll intervals, at least 60 s.")
@click.option("--test-pause", multiple=True, hidden=True, metavar="POINT=SECONDS",
              help="Tests only: stop at a point of an edit (before-replace, after-write).")
@click.option("--test-hold", multiple=True, hidden=True, metavar="POINT=FILE",
              help="Tests only: at a point of the uninstall (before-cleanup, after-unchain), wait until FILE is gone.")
def chain_keeper(cni_conf_dir: str, cni_bin_dir: str, conflist: str, plugin_binary: str, driver_name: str,
                 request: str, failure_policy: str, plugin_socket: str, plugin_spool_dir: str,
                 plugin_log_file: str, plugin_ack_timeout_ms: str, plugin_handoff_wait_ms: str,
                 plugin_address_wait_ms: str, plugin_spool_max_files: str, plugin_spool_max_bytes: str,
                 cni_cache_dir: str, plugin_cni_cache_dir: str, runtime_teardown: str,
                 cleanup_dir: tuple[str, ...], poll_interval: float,
                 daemonset: str, namespace: str, kubeconfig: str | None, once: bool, uninstall_now: bool,
                 log_format: str, log_level: str, node_name: str, metrics_address: str, probe_address: str,
                 lock_dir: str, probe_socket: str, stall_after: float,
                 test_pause: tuple[str, ...],
                 test_hold: tuple[str, ...]) -> None:
    """Install the plugin and keep netclaim chained into the primary conflist; clean up on uninstall."""
    from pathlib import Path

    from publisher.keeper import keeper as chainkeeper
    from publisher.keeper import program as keeperprogram
    from publisher import logs
    from publisher.keeper.conflist import BadSetting, Refused, build_entry

    # First of all: a SIGTERM that comes while the API client is still loading must not be lost.
    stop = keeperprogram.StopSignal.install() if not (once or uninstall_now) else None

    logs.setup(log_format, log_level)
    if not uninstall_now and not os.path.isfile(plugin_binary):
        raise click.ClickException(f"plugin executable {plugin_binary}: no such file")
    if uninstall_now and not driver_name:
        # Only the keeper's own entry (its driver and request) is taken out; another network's stays.
        raise click.UsageError("--uninstall needs --driver-name (and --request, when the install set one): "
                               "it removes only the entry of that driver and request")
    pairs = [f"driverName={driver_name}", f"request={request}", f"socketPath={plugin_socket}",
             f"spoolDir={plugin_spool_dir}", f"failurePolicy={failure_policy}", f"logFile={plugin_log_file}"]
    if not uninstall_now:  # the uninstall finds the entry by driver and request; nothing else of it matters
        pairs += [f"ackTimeoutMs={plugin_ack_timeout_ms}", f"handoffWaitMs={plugin_handoff_wait_ms}",
                  f"addressWaitMs={plugin_address_wait_ms}",
                  f"spoolMaxFiles={plugin_spool_max_files}", f"spoolMaxBytes={plugin_spool_max_bytes}"]
    try:
        entry = build_entry(pairs, empty_is_default=True)  # the chart states every setting: empty is its default
    except BadSetting as exc:
        # Before anything is written: an entry the plugin would refuse fails every pod start on the node.
        raise click.UsageError(f"{exc} ({KEEPER_OPTION_OF[exc.key]}); nothing was written") from None
    except Refused as exc:
        raise click.UsageError(str(exc)) from None
    cfg = chainkeeper.KeeperConfig(
        conf_dir=Path(cni_conf_dir), bin_dir=Path(cni_bin_dir), plugin_binary=Path(plugin_binary), entry=entry,
        conflist=conflist, cleanup_dirs=[Path(d) for d in cleanup_dir], poll_interval=poll_interval,
        cache_dir=Path(cni_cache_dir) if cni_cache_dir else None, node_cache_dir=plugin_cni_cache_dir,
        lock_dir=Path(lock_dir) if lock_dir else None, stall_after=stall_after,
        test_pauses={k: float(v) for k, _, v in (p.partition("=") for p in test_pause)},
        test_holds={k: Path(v) for k, _, v in (h.partition("=") for h in test_hold)})
    from publisher.keeper.runtime import RuntimeTeardown

    if uninstall_now:
        cfg.teardown = RuntimeTeardown(runtime_teardown)
        sys.exit(keeperprogram.uninstall_now(cfg))
    if daemonset and not namespace:
        raise click.UsageError("--daemonset needs --namespace")

    # The client is made now, not on SIGTERM: importing it takes seconds on a
    # busy node, and the decision must fit in the pod's grace period.
    kube = None
    if (daemonset or node_name) and not once:
        try:
            kube = keeper_kube(kubeconfig)
        except click.ClickException as exc:
            logs.get().warning("no API client; no Events, and on SIGTERM the node stays chained",
                               extra={"error": exc.format_message()})

    owner = None
    if kube is not None and daemonset:
        from publisher.keeper.ownerwatch import OwnerWatch

        owner = OwnerWatch(kube, namespace, daemonset)
        owner.start()  # from the first moment: the proof of an uninstall must be in hand before SIGTERM

    def decide() -> str:
        return owner.decide(chainkeeper.DECIDE_WITHIN) if owner is not None else "unknown"

    cfg.teardown = RuntimeTeardown(runtime_teardown, kube, node_name)
    cfg.teardown.learn()  # now: the release's RBAC is being deleted when an uninstall's SIGTERM comes
    reporting = keeperprogram.Reporting(metrics_address=metrics_address, probe_address=probe_address,
                                        probe_socket=probe_socket)
    if kube is not None and node_name:
        reporting.events = contest_events(kube, node_name)
    sys.exit(keeperprogram.run_keeper(cfg, once, decide if daemonset else None, stop, reporting))


# The chain keeper's option (and environment variable, the chart's ConfigMap key) for each entry key it writes.
KEEPER_OPTION_OF = {
    "driverName": "--driver-name, NETCLAIM_DRIVER_NAME",
    "request": "--request, NETCLAIM_REQUEST",
    "socketPath": "--plugin-socket, NETCLAIM_PLUGIN_SOCKET",
    "spoolDir": "--plugin-spool-dir, NETCLAIM_PLUGIN_SPOOL_DIR",
    "failurePolicy": "--failure-policy, NETCLAIM_FAILURE_POLICY",
    "logFile": "--plugin-log-file, NETCLAIM_PLUGIN_LOG_FILE",
    "ackTimeoutMs": "--plugin-ack-timeout-ms, NETCLAIM_PLUGIN_ACK_TIMEOUT_MS",
    "handoffWaitMs": "--plugin-handoff-wait-ms, NETCLAIM_PLUGIN_HANDOFF_WAIT_MS",
    "addressWaitMs": "--plugin-address-wait-ms, NETCLAIM_PLUGIN_ADDRESS_WAIT_MS",
    "spoolMaxFiles": "--plugin-spool-max-files, NETCLAIM_PLUGIN_SPOOL_MAX_FILES",
    "spoolMaxBytes": "--plugin-spool-max-bytes, NETCLAIM_PLUGIN_SPOOL_MAX_BYTES",
}


def keeper_kube(kubeconfig: str | None) -> Any:
    """The keeper's API client, which re-reads its credentials like the publisher's does.

    The keeper lives as long as the node's DaemonSet pod, far longer than a projected token
    (the chart asks for 3600 s) or a kubeconfig `tokenFile` that is renewed: a client that
    read the token once is refused (401) an hour later, its owner watch cannot list again,
    and on SIGTERM after `helm uninstall` it could no longer tell the node to be cleaned.
    Three connections: the DaemonSet watch holds one, Events and the final GET the others.
    """
    from publisher.kube.calls import Credentials, Kube

    return Kube(api_client_for(kubeconfig, 3), credentials=Credentials(kubeconfig, 3))


def contest_events(kube: Any, node_name: str) -> Any:
    """ChainContested Warning Events on the Node, through the publisher's bounded, deduplicated recorder.

    Returns a factory: given the keeper's outcome counter, the (conflist, note) warner.
    """
    from publisher.observe.events import EventRecorder, node_ref

    def make(count: Any) -> Any:
        recorder = EventRecorder(kube, node_name, count, action="ChainPlugin")
        recorder.start()

        def warn(conflist: str, note: str) -> None:
            recorder.warn(node_ref(node_name), "ChainContested", note, fields={"conflist": conflist})

        return warn

    return make


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

if __name__ == "__main__":
    sys.exit(main())
