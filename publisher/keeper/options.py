"""The chain keeper's options (`netclaim-publisher chain-keeper`) and the settings they make.

The entry the keeper writes (driver, request, extended resource, the plugin's socket, spool and
integer settings) is checked here against the plugin's own rules before anything is written: an
entry the plugin would refuse fails every pod start on the node. publisher/keeper/command.py runs
the keeper with them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from cni_plugin.config import (
    DEFAULT_ACK_TIMEOUT_MS,
    DEFAULT_ADDRESS_WAIT_MS,
    DEFAULT_HANDOFF_WAIT_MS,
    DEFAULT_SPOOL_MAX_BYTES,
    DEFAULT_SPOOL_MAX_FILES,
    INT_SETTINGS,
)
from cni_plugin.wire.frame import DEFAULT_SOCKET
from cni_plugin.wire.spool import DEFAULT_SPOOL_DIR
from publisher.clioptions import stacked
from publisher.observe.options import address_value

if TYPE_CHECKING:  # imported where they are used: `chain-keeper --help` stays light
    from publisher.keeper.keeper import KeeperConfig
    from publisher.keeper.program import Reporting


def plugin_int_help(key: str, default: int) -> str:
    """An integer setting's help, from the plugin's own table (its range) and default."""
    lo, hi = INT_SETTINGS[key]
    return f"The entry's {key}, an integer {lo}-{hi} (empty: the plugin's default, {default})."


# The chain keeper's option (and environment variable, the chart's ConfigMap key) for each entry key it writes.
KEEPER_OPTION_OF = {
    "driverName": "--driver-name, NETCLAIM_DRIVER_NAME",
    "request": "--request, NETCLAIM_REQUEST",
    "extendedResourceName": "--extended-resource-name, NETCLAIM_EXTENDED_RESOURCE_NAME",
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

OPTIONS = [
    click.option("--cni-conf-dir", envvar="NETCLAIM_CNI_CONF_DIR", show_envvar=True, default="/etc/cni/net.d",
                 show_default=True, type=click.Path(file_okay=False),
                 help="The node's CNI config dir, as mounted here."),
    click.option("--cni-bin-dir", envvar="NETCLAIM_CNI_BIN_DIR", show_envvar=True, default="/opt/cni/bin",
                 show_default=True, type=click.Path(file_okay=False), help="The node's CNI bin dir, as mounted here."),
    click.option("--conflist", envvar="NETCLAIM_CNI_CONFLIST", show_envvar=True, default="",
                 help="File name in the conf dir to chain into; empty: the first network file by name "
                      "(the one the runtime uses)."),
    click.option("--plugin-binary", envvar="NETCLAIM_PLUGIN_BINARY", show_envvar=True,
                 default="/opt/netclaim/bin/netclaim", show_default=True,
                 type=click.Path(dir_okay=False), help="The self-contained plugin executable to install."),
    click.option("--driver-name", envvar="NETCLAIM_DRIVER_NAME", show_envvar=True, default="",
                 help="The DRA driver whose devices netclaim reports (the entry's driverName)."),
    click.option("--request", envvar="NETCLAIM_REQUEST", show_envvar=True, default="",
                 help="The claim request whose device an attachment is (empty: decided per claim)."),
    click.option("--extended-resource-name", envvar="NETCLAIM_EXTENDED_RESOURCE_NAME", show_envvar=True, default="",
                 help="The DRA extended resource (e.g. example.com/nic) an attachment stands for when a pod asks for "
                      "it in its containers' resources instead of a claim: the scheduler's claim names its requests "
                      "itself (the entry's extendedResourceName; empty: none)."),
    click.option("--failure-policy", envvar="NETCLAIM_FAILURE_POLICY", show_envvar=True, default="Ignore",
                 show_default=True, type=click.Choice(["Ignore", "Fail"]), help="The entry's failurePolicy."),
    click.option("--plugin-socket", envvar="NETCLAIM_PLUGIN_SOCKET", show_envvar=True, default=DEFAULT_SOCKET,
                 show_default=True, help="The publisher's socket as the plugin on the node sees it."),
    click.option("--plugin-spool-dir", envvar="NETCLAIM_PLUGIN_SPOOL_DIR", show_envvar=True,
                 default=DEFAULT_SPOOL_DIR, show_default=True,
                 help="The spool dir as the plugin on the node sees it."),
    click.option("--plugin-log-file", envvar="NETCLAIM_PLUGIN_LOG_FILE", show_envvar=True, default="",
                 help="The plugin's log file on the node (empty: none)."),
    click.option("--plugin-ack-timeout-ms", envvar="NETCLAIM_PLUGIN_ACK_TIMEOUT_MS", show_envvar=True, default="",
                 metavar="MS", help=plugin_int_help("ackTimeoutMs", DEFAULT_ACK_TIMEOUT_MS)),
    click.option("--plugin-handoff-wait-ms", envvar="NETCLAIM_PLUGIN_HANDOFF_WAIT_MS", show_envvar=True,
                 default="", metavar="MS", help=plugin_int_help("handoffWaitMs", DEFAULT_HANDOFF_WAIT_MS)),
    click.option("--plugin-address-wait-ms", envvar="NETCLAIM_PLUGIN_ADDRESS_WAIT_MS", show_envvar=True,
                 default="", metavar="MS", help=plugin_int_help("addressWaitMs", DEFAULT_ADDRESS_WAIT_MS)),
    click.option("--plugin-spool-max-files", envvar="NETCLAIM_PLUGIN_SPOOL_MAX_FILES", show_envvar=True,
                 default="", metavar="N", help=plugin_int_help("spoolMaxFiles", DEFAULT_SPOOL_MAX_FILES)),
    click.option("--plugin-spool-max-bytes", envvar="NETCLAIM_PLUGIN_SPOOL_MAX_BYTES", show_envvar=True,
                 default="", metavar="BYTES", help=plugin_int_help("spoolMaxBytes", DEFAULT_SPOOL_MAX_BYTES)),
    click.option("--cni-cache-dir", envvar="NETCLAIM_CNI_CACHE_DIR", show_envvar=True, default="/var/lib/cni",
                 show_default=True, type=click.Path(file_okay=False),
                 help="The runtimes' libcni cache dir, as mounted here: on uninstall the plugin is kept while a "
                      "cached config there still runs it (empty: not looked at)."),
    click.option("--plugin-cni-cache-dir", envvar="NETCLAIM_PLUGIN_CNI_CACHE_DIR", show_envvar=True, default="",
                 help="The libcni cache dir as the plugin on the node sees it, written into the marker of a kept "
                      "plugin so that its last DEL can remove it (empty: --cni-cache-dir)."),
    click.option("--runtime-teardown", envvar="NETCLAIM_RUNTIME_TEARDOWN", show_envvar=True, default="auto",
                 show_default=True, type=click.Choice(["auto", "cached-config", "loaded-config"]),
                 help="How the node's runtime runs a sandbox's CNI DEL: with the config cached at its ADD (CRI-O; "
                      "the plugin is kept on uninstall while a cached config runs it) or with the config it has "
                      "loaded (containerd; the plugin goes at once). auto: learnt from the kubelet's pod status "
                      "(needs --node-name and the API), cached-config until known."),
    click.option("--cleanup-dir", envvar="NETCLAIM_CLEANUP_DIRS", show_envvar=True, multiple=True,
                 type=click.Path(file_okay=False),
                 help="Emptied on uninstall (spool, journal, socket dir); repeatable."),
    click.option("--poll-interval", envvar="NETCLAIM_POLL_INTERVAL", show_envvar=True, default=1.0,
                 show_default=True, type=click.FloatRange(0.1, 60), help="Seconds between looks at the conf dir."),
    click.option("--daemonset", envvar="NETCLAIM_DAEMONSET", show_envvar=True, default="",
                 help="This pod's DaemonSet, watched while the keeper runs: on SIGTERM the node is cleaned up "
                      "only on proof that it is gone or being deleted (404, deletionTimestamp, a DELETED watch "
                      "event); 401/403/no answer keep everything (empty: never clean up)."),
    click.option("--namespace", envvar="NETCLAIM_NAMESPACE", show_envvar=True, default="",
                 help="The DaemonSet's namespace."),
    click.option("--kubeconfig", envvar=["NETCLAIM_KUBECONFIG", "KUBECONFIG"], show_envvar=True, default=None,
                 help="Kubeconfig for the DaemonSet check; without it the in-cluster service account."),
    click.option("--once", is_flag=True, help="Install and chain once, then exit (an init container)."),
    click.option("--uninstall", "uninstall_now", is_flag=True,
                 help="Unchain the entry of --driver-name and --request, remove the plugin (unless a cached "
                      "config still runs it) and empty the cleanup dirs now, then exit."),
    click.option("--log-format", envvar="NETCLAIM_LOG_FORMAT", show_envvar=True, default="json", show_default=True,
                 type=click.Choice(["json", "text"]), help="Log lines on stderr: JSON or text."),
    click.option("--log-level", envvar="NETCLAIM_LOG_LEVEL", show_envvar=True, default="info", show_default=True,
                 type=click.Choice(["debug", "info", "warning", "error"]), help="Least severe level logged."),
    click.option("--node-name", envvar="NETCLAIM_NODE_NAME", show_envvar=True, default="",
                 help="This node: a chain contest is posted as a Warning Event on it (empty: no Event)."),
    click.option("--metrics-address", envvar="NETCLAIM_KEEPER_METRICS_ADDRESS", show_envvar=True, default="",
                 help="host:port for /metrics, /readyz (chained, or the contest reported) and /healthz (the "
                      "keeper's loop turns; see --stall-after) (empty: none)."),
    click.option("--lock-dir", envvar="NETCLAIM_KEEPER_LOCK_DIR", show_envvar=True, default="",
                 type=click.Path(file_okay=False),
                 help="The node dir (the state dir, as mounted here) of the keeper's lock: a new install's keeper "
                      "waits there while an uninstall's cleanup runs, and the cleanup leaves a newer install's "
                      "files alone (empty: no lock)."),
    click.option("--probe-address", envvar="NETCLAIM_KEEPER_PROBE_ADDRESS", show_envvar=True, default="",
                 callback=address_value,
                 help="host:port serving only /readyz and /healthz on threads of their own, for the kubelet's "
                      "probes (the chart: 127.0.0.1, which pods cannot reach; empty: none)."),
    click.option("--probe-socket", envvar="NETCLAIM_KEEPER_PROBE_SOCKET", show_envvar=True, default="",
                 type=click.Path(dir_okay=False),
                 help="Unix socket serving only /readyz and /healthz (created 0600; put it in a root-owned "
                      "directory): the exec probes' and the publisher's --keeper-socket, which believes only "
                      "root's answer there (empty: none)."),
    click.option("--stall-after", envvar="NETCLAIM_KEEPER_STALL_AFTER", show_envvar=True, default=0.0,
                 type=click.FloatRange(0, 3600),
                 help="Seconds without a turn of the keeper's loop after which /healthz fails (the kubelet then "
                      "restarts it); waiting for the node lock never fails it. 0: 60 poll intervals, at least 60 s."),
    click.option("--test-pause", multiple=True, hidden=True, metavar="POINT=SECONDS",
                 help="Tests only: stop at a point of an edit (before-replace, after-write)."),
    click.option("--test-hold", multiple=True, hidden=True, metavar="POINT=FILE",
                 help="Tests only: at a point of the uninstall (before-cleanup, after-unchain), wait until FILE is "
                      "gone."),
]


options = stacked(OPTIONS)
"""The chain keeper's options, in the order --help shows them."""


@dataclass(frozen=True)
class Contact:
    """Whom the keeper talks to besides the node's files: its DaemonSet, the API, the Node's Events."""

    daemonset: str
    namespace: str
    kubeconfig: str | None
    node_name: str
    runtime_teardown: str


def entry_from(values: dict[str, Any], uninstall: bool) -> dict[str, Any]:
    """The conflist entry the options describe, checked by the plugin's rules; a bad one is a usage error."""
    from publisher.keeper.conflist import BadSetting, Refused, build_entry

    pairs = [f"driverName={values['driver_name']}", f"request={values['request']}",
             f"socketPath={values['plugin_socket']}", f"spoolDir={values['plugin_spool_dir']}",
             f"failurePolicy={values['failure_policy']}", f"logFile={values['plugin_log_file']}"]
    if not uninstall:  # the uninstall finds the entry by driver and request; nothing else of it matters
        pairs += [f"extendedResourceName={values['extended_resource_name']}",
                  f"ackTimeoutMs={values['plugin_ack_timeout_ms']}",
                  f"handoffWaitMs={values['plugin_handoff_wait_ms']}",
                  f"addressWaitMs={values['plugin_address_wait_ms']}",
                  f"spoolMaxFiles={values['plugin_spool_max_files']}",
                  f"spoolMaxBytes={values['plugin_spool_max_bytes']}"]
    try:
        return build_entry(pairs, empty_is_default=True)  # the chart states every setting: empty is its default
    except BadSetting as exc:
        # Before anything is written: an entry the plugin would refuse fails every pod start on the node.
        raise click.UsageError(f"{exc} ({KEEPER_OPTION_OF[exc.key]}); nothing was written") from None
    except Refused as exc:
        raise click.UsageError(str(exc)) from None


def settings_from(values: dict[str, Any], uninstall: bool) -> KeeperConfig:
    """The keeper's config (entry, node dirs, poll and stall times); usage errors before anything is written."""
    from publisher.keeper.keeper import KeeperConfig

    plugin_binary = values["plugin_binary"]
    if not uninstall and not os.path.isfile(plugin_binary):
        raise click.ClickException(f"plugin executable {plugin_binary}: no such file")
    if uninstall and not values["driver_name"]:
        # Only the keeper's own entry (its driver and request) is taken out; another network's stays.
        raise click.UsageError("--uninstall needs --driver-name (and --request, when the install set one): "
                               "it removes only the entry of that driver and request")
    entry = entry_from(values, uninstall)
    cache_dir, lock_dir = values["cni_cache_dir"], values["lock_dir"]
    return KeeperConfig(
        conf_dir=Path(values["cni_conf_dir"]), bin_dir=Path(values["cni_bin_dir"]), plugin_binary=Path(plugin_binary),
        entry=entry, conflist=values["conflist"], cleanup_dirs=[Path(d) for d in values["cleanup_dir"]],
        poll_interval=values["poll_interval"], cache_dir=Path(cache_dir) if cache_dir else None,
        node_cache_dir=values["plugin_cni_cache_dir"], lock_dir=Path(lock_dir) if lock_dir else None,
        stall_after=values["stall_after"],
        test_pauses={k: float(v) for k, _, v in (p.partition("=") for p in values["test_pause"])},
        test_holds={k: Path(v) for k, _, v in (h.partition("=") for h in values["test_hold"])})


def contact_from(values: dict[str, Any]) -> Contact:
    """The keeper's DaemonSet, API credential and node, and how the runtime tears down sandboxes."""
    return Contact(daemonset=values["daemonset"], namespace=values["namespace"], kubeconfig=values["kubeconfig"],
                   node_name=values["node_name"], runtime_teardown=values["runtime_teardown"])


def reporting_from(values: dict[str, Any]) -> Reporting:
    """Where the keeper serves /metrics and its probes (empty: none)."""
    from publisher.keeper.program import Reporting

    return Reporting(metrics_address=values["metrics_address"], probe_address=values["probe_address"],
                     probe_socket=values["probe_socket"])
