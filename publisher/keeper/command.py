"""`netclaim-publisher chain-keeper`: install the plugin and keep netclaim chained into the node's conflist.

The keeper is a program of its own beside the publisher in the DaemonSet (an init container with
--once, the keeper container, and --uninstall for scripts); publisher/cli.py only registers this
command on its group. Its options and the settings they make are publisher/keeper/options.py; what
it does to a node is publisher/keeper/keeper.py and publisher/keeper/program.py.
"""

from __future__ import annotations

import sys
from typing import Any, Callable

import click

from publisher.keeper import options
from publisher.kube.options import api_client_for


@click.command("chain-keeper")
@options.options
def chain_keeper(once: bool, uninstall_now: bool, log_format: str, log_level: str, **values: Any) -> None:
    """Install the plugin and keep netclaim chained into the primary conflist; clean up on uninstall."""
    from publisher import logs
    from publisher.keeper import program as keeperprogram

    # First of all: a SIGTERM that comes while the API client is still loading must not be lost.
    stop = keeperprogram.StopSignal.install() if not (once or uninstall_now) else None

    logs.setup(log_format, log_level)
    cfg = options.settings_from(values, uninstall_now)
    contact = options.contact_from(values)
    from publisher.keeper.runtime import RuntimeTeardown

    if uninstall_now:
        cfg.teardown = RuntimeTeardown(contact.runtime_teardown)
        sys.exit(keeperprogram.uninstall_now(cfg))
    if contact.daemonset and not contact.namespace:
        raise click.UsageError("--daemonset needs --namespace")
    kube = None if once else api_client_or_none(contact)
    decide, looked = owner_decision(kube, contact)
    cfg.teardown = RuntimeTeardown(contact.runtime_teardown, kube, contact.node_name)
    cfg.teardown.learn()  # now: the release's RBAC is being deleted when an uninstall's SIGTERM comes
    reporting = options.reporting_from(values)
    reporting.owner_looked = looked
    if kube is not None and contact.node_name:
        reporting.events = contest_events(kube, contact.node_name)
    sys.exit(keeperprogram.run_keeper(cfg, once, decide, stop, reporting))


def api_client_or_none(contact: options.Contact) -> Any:
    """The keeper's API client when it watches a DaemonSet or posts Events, or None (said in the log).

    The client is made now, not on SIGTERM: importing it takes seconds on a busy node, and the
    decision must fit in the pod's grace period.
    """
    if not (contact.daemonset or contact.node_name):
        return None
    try:
        return keeper_kube(contact.kubeconfig)
    except click.ClickException as exc:
        from publisher import logs

        logs.get().warning("no API client; no Events, and on SIGTERM the node stays chained",
                           extra={"error": exc.format_message()})
        return None


def owner_decision(kube: Any, contact: options.Contact) -> tuple[Callable[[], str] | None,
                                                                  Callable[[], bool] | None]:
    """The uninstall-or-upgrade decision on SIGTERM and whether the watch has looked yet (readiness waits
    for it), or (None, None) when no --daemonset is watched (never clean up).

    The DaemonSet is watched from the first moment: the proof of an uninstall must be in hand
    before SIGTERM. Without an API client the answer is `unknown`, which keeps the node as it is
    (and readiness does not wait on a look that can never come: the log said why at start).
    """
    if not contact.daemonset:
        return None, None
    from publisher.keeper import keeper as chainkeeper

    owner = None
    if kube is not None:
        from publisher.keeper.ownerwatch import OwnerWatch

        owner = OwnerWatch(kube, contact.namespace, contact.daemonset)
        owner.start()

    def decide() -> str:
        return owner.decide(chainkeeper.DECIDE_WITHIN) if owner is not None else "unknown"

    return decide, (owner.looked if owner is not None else None)


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
