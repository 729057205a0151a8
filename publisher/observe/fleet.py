"""`netclaim-publisher fleet`: how every node stands, from the publishers' heartbeat Leases.

Run by an operator with a kubeconfig, not on a node. It lists the node Leases of the release
namespace (publisher/observe/nodelease.py writes one per node) and the cluster's Nodes, and shows a
row per node: chained, contested, backlog, the oldest pending event, tracked claims, the age of the
heartbeat, the version, and what is wrong. A node is a problem, and the exit code 1, when its keeper
says netclaim is not chained, a conflist is contested, a keeper is configured but did not answer
the publisher (the chain is unknown where it must be known), its heartbeat is stale (renewTime plus
the Lease's duration is past: the publisher is down, or cannot reach the API server), or it runs no
publisher at all (a Node without a Lease). 0: no problem; 3: the API could not be asked. A node
with no keeper configured (a systemd install) has its chain unknown as a note only.

Two requests for the whole cluster: Leases by label, Nodes as metadata only (a PartialObjectMetadata
list: a 5,000-node list of full Node objects would be hundreds of MB). Both are paged. The operator's
own RBAC needs list on leases in the namespace and on nodes; the publishers' service account has
neither. The client is the publisher's (publisher/kube/apiclient.py): a kubeconfig with a token,
`tokenFile` or client certificate, or an exec credential plugin (run once, as kubectl runs it:
the kubeconfigs of managed clusters name one).
"""

from __future__ import annotations

import json
import os
import sys
import time
import urllib.parse
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any, Callable, Iterator

import click

from publisher.observe.nodelease import ANNOTATION, COMPONENT, KEEPER_SILENT, KEEPER_UNREACHABLE

EXIT_PROBLEM = 1
EXIT_API = 3
PAGE = 500
METADATA_ONLY = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json"
# What makes a row a problem (the exit code); anything else a row says is a note.
PROBLEMS = ("not chained", "contested", "keeper unreachable", "stale", "no publisher")
# What a publisher that predates the Lease's `keeper` wrote as `chain` when its keeper did not answer.
_UNREACHABLE_LINE = "chain keeper unreachable at "


@dataclass
class Row:
    """One node as `fleet` shows it; numbers are None when the node has no readable heartbeat."""

    node: str
    lease: str = ""
    chained: str = "-"
    contested: list[str] = field(default_factory=list)
    backlog: int | None = None
    oldest_pending_seconds: float | None = None
    claims: int | None = None
    heartbeat_age_seconds: float | None = None
    stale: bool = False
    version: str = ""
    ready: bool | None = None
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    state: dict[str, Any] = field(default_factory=dict)

    @property
    def failing(self) -> bool:
        return bool(self.problems)


def micro_seconds(value: str | None) -> float | None:
    """A MicroTime (RFC 3339) as epoch seconds; None when absent or unreadable."""
    if not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def row_of(lease: dict[str, Any], now: float) -> Row:
    """A Lease read as a row: the heartbeat's age decides staleness, the annotation the rest."""
    meta, spec = lease.get("metadata") or {}, lease.get("spec") or {}
    row = Row(node=str(spec.get("holderIdentity") or ""), lease=str(meta.get("name") or ""))
    renewed = micro_seconds(spec.get("renewTime"))
    duration = float(spec.get("leaseDurationSeconds") or 0)
    if renewed is not None:
        row.heartbeat_age_seconds = max(0.0, now - renewed)
    row.stale = renewed is None or now > renewed + duration
    try:
        state = json.loads((meta.get("annotations") or {}).get(ANNOTATION) or "{}")
    except ValueError:
        state = {}
    state = state if isinstance(state, dict) else {}
    row.state = state
    row.chained = str(state.get("chained") or "unknown")
    row.contested = [str(c) for c in state.get("contested") or []]
    row.backlog, row.claims = _int(state.get("backlog")), _int(state.get("claims"))
    row.oldest_pending_seconds = _float(state.get("oldestPendingSeconds"))
    row.version, row.ready = str(state.get("version") or ""), state.get("ready")
    judge(row)
    return row


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _float(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def judge(row: Row) -> None:
    """Fill problems (they fail the command) and notes (they do not) from what the row says."""
    if row.stale:
        age = "never" if row.heartbeat_age_seconds is None else f"{duration(row.heartbeat_age_seconds)} ago"
        row.problems.append(f"stale: last heartbeat {age} (publisher down or cut off from the API)")
    if row.chained == "no":  # the keeper's line: `not chained conflist=X ... problem=WHY`
        line, conflist = str(row.state.get("chain") or ""), str(row.state.get("conflist") or "")
        why = line.split(" problem=", 1)[1] if " problem=" in line else ""
        row.problems.append("not chained" + (f" in {conflist}" if conflist else "") + (f": {why}" if why else ""))
    elif row.chained == "unknown" and keeper_unreachable(row.state):
        row.problems.append(f"keeper unreachable: {row.state.get('chain') or 'no answer'}")
    elif row.chained == "unknown" and row.state.get("keeper") == KEEPER_SILENT:
        row.notes.append("chain unknown (the chain keeper has not answered yet)")
    elif row.chained == "unknown":
        row.notes.append("chain unknown (no chain keeper answer)")
    if row.contested:
        row.problems.append(f"contested: {','.join(row.contested)}")
    if row.ready is False:
        row.notes.append(f"not ready: {row.state.get('notReadyReason') or '?'}")
    if row.state.get("applyErrors"):
        last = row.state.get("lastApplyError") or {}
        row.notes.append(f"{row.state['applyErrors']} claim(s) in error, last {last.get('claim', '?')}")
    if row.state.get("podsUnchained"):
        row.notes.append(f"{row.state['podsUnchained']} pod(s) started while not chained")


def keeper_unreachable(state: dict[str, Any]) -> bool:
    """The Lease says a chain keeper was configured and did not answer the publisher: whether the
    node is chained is unknown where it should be known. No keeper configured (a systemd install)
    or a keeper still starting is not this."""
    if "keeper" in state:
        return state["keeper"] == KEEPER_UNREACHABLE
    return str(state.get("chain") or "").startswith(_UNREACHABLE_LINE)


def fleet_rows(leases: list[dict[str, Any]], nodes: list[str] | None, now: float) -> list[Row]:
    """A row per node: its Lease's, or `no publisher`; a Lease whose Node is gone is a note, not a problem."""
    rows: dict[str, Row] = {}
    for lease in leases:
        row = row_of(lease, now)
        kept = rows.get(row.node)
        # Two Leases for one node (two releases in one namespace): the fresher one speaks.
        if kept is None or _age(row) < _age(kept):
            rows[row.node] = row
    if nodes is not None:
        known = set(nodes)
        for name in nodes:
            rows.setdefault(name, Row(node=name, problems=["no publisher: the node has no heartbeat Lease"]))
        for name, row in rows.items():
            if name not in known:  # not expected to run a publisher: what its Lease says fails nothing
                row.notes[:0] = row.problems + ["node gone (or not selected): delete its Lease when it is gone"]
                row.problems = []
    return sorted(rows.values(), key=lambda r: (not r.failing, r.node))


def _age(row: Row) -> float:
    return float("inf") if row.heartbeat_age_seconds is None else row.heartbeat_age_seconds


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    if seconds < 172800:
        return f"{seconds / 3600:.0f}h"
    return f"{seconds / 86400:.0f}d"


COLUMNS = ("NODE", "CHAINED", "CONTESTED", "BACKLOG", "OLDEST", "CLAIMS", "HEARTBEAT", "VERSION", "PROBLEMS")


def cells(row: Row) -> tuple[str, ...]:
    heartbeat = duration(row.heartbeat_age_seconds) + (" stale" if row.stale and row.lease else "")
    said = row.problems + row.notes
    return (row.node, row.chained if row.lease else "-", ",".join(row.contested) or "-",
            "-" if row.backlog is None else str(row.backlog),
            duration(row.oldest_pending_seconds) if row.oldest_pending_seconds else "-",
            "-" if row.claims is None else str(row.claims), heartbeat if row.lease else "-",
            row.version or "-", "; ".join(said) or "-")


def table(rows: list[Row]) -> str:
    lines = [COLUMNS, *(cells(r) for r in rows)]
    widths = [max(len(line[i]) for line in lines) for i in range(len(COLUMNS) - 1)]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(line, widths)) + "  " + line[-1] for line in lines)


def summary(rows: list[Row]) -> dict[str, int]:
    """How many nodes have each problem (a node can have several), and how many have none."""
    out = {"nodes": len(rows), "ok": sum(not r.failing for r in rows)}
    for kind in PROBLEMS:
        out[kind.replace(" ", "_")] = sum(any(p.startswith(kind) for p in r.problems) for r in rows)
    return out


def summary_line(counts: dict[str, int]) -> str:
    parts = [f"{counts['ok']} ok"] + [f"{counts[k.replace(' ', '_')]} {k}" for k in PROBLEMS
                                     if counts[k.replace(' ', '_')]]
    return f"{counts['nodes']} node{'' if counts['nodes'] == 1 else 's'}: " + ", ".join(parts)


def document(rows: list[Row], namespace: str) -> dict[str, Any]:
    nodes = [{k: v for k, v in asdict(r).items()} for r in rows]
    return {"namespace": namespace, "summary": summary(rows), "nodes": nodes}


# ---------------------------------------------------------------- reading the API


def paged(get: Callable[[str, list[tuple[str, str]], dict[str, str]], dict[str, Any]], path: str,
          query: list[tuple[str, str]], headers: dict[str, str] | None = None) -> Iterator[dict[str, Any]]:
    """Every item of a list, PAGE at a time."""
    cont = ""
    while True:
        page = get(path, query + [("limit", str(PAGE))] + ([("continue", cont)] if cont else []), headers or {})
        yield from page.get("items") or []
        cont = (page.get("metadata") or {}).get("continue") or ""
        if not cont:
            return


class ApiUnavailable(click.ClickException):
    exit_code = EXIT_API


def client_getter(kubeconfig: str | None) -> Callable[[str, list[tuple[str, str]], dict[str, str]], dict[str, Any]]:
    """GET through the publisher's lean client; any failure is one line and exit 3."""
    from publisher.kube.apiclient import ConfigError, load

    path = kubeconfig or os.path.expanduser("~/.kube/config")
    try:
        client = load(path, 2, allow_exec=True)
    except (ConfigError, OSError, ValueError) as exc:
        raise ApiUnavailable(f"kubeconfig {path}: {' '.join(str(exc).split())}") from None

    def get(url: str, query: list[tuple[str, str]], headers: dict[str, str]) -> dict[str, Any]:
        try:
            reply = client.request("GET", url, query, {"Accept": "application/json", **headers}, timeout=(5.0, 60.0))
        except Exception as exc:  # noqa: BLE001 - urllib3/ssl/socket: no answer
            raise ApiUnavailable(f"GET {url}: no answer: {type(exc).__name__}: {exc}") from None
        if reply.status >= 400:
            raise ApiUnavailable(f"GET {url}: {reply.status}: {status_message(reply.data)}")
        return json.loads(reply.data or b"{}")

    return get


def status_message(data: bytes) -> str:
    """The `message` of an API Status answer (what the operator needs: which permission is missing), one line."""
    try:
        message = str((json.loads(data) or {}).get("message") or "")
    except (ValueError, AttributeError):
        message = ""
    return " ".join((message or data.decode("utf-8", "replace")).split())[:500]


def read_fleet(get: Callable[..., dict[str, Any]], namespace: str, node_selector: str,
               prefix: str) -> tuple[list[dict[str, Any]], list[str]]:
    leases = [lease for lease in paged(
        get, f"/apis/coordination.k8s.io/v1/namespaces/{urllib.parse.quote(namespace)}/leases",
        [("labelSelector", f"app.kubernetes.io/component={COMPONENT}")])
        if str((lease.get("metadata") or {}).get("name", "")).startswith(prefix)]
    query = [("labelSelector", node_selector)] if node_selector else []
    nodes = [str((n.get("metadata") or {}).get("name", "")) for n in paged(get, "/api/v1/nodes", query,
                                                                           {"Accept": METADATA_ONLY})]
    return leases, nodes


@click.command("fleet")
@click.option("--kubeconfig", envvar="KUBECONFIG", show_envvar=True, default=None,
              help="The operator's kubeconfig (token, tokenFile or client certificate). Default: ~/.kube/config.")
@click.option("--namespace", "-n", envvar="NETCLAIM_NAMESPACE", show_envvar=True, default="netclaim-system",
              show_default=True, help="The release namespace, where the publishers keep their Leases.")
@click.option("--node-selector", "-l", default="",
              help="Only Nodes with these labels are expected to run a publisher (the DaemonSet's nodeSelector).")
@click.option("--lease-prefix", default="", help="Only Leases whose name starts with this (one release's: "
                                                 "<release>-node-). Default: every netclaim node Lease.")
@click.option("--problems-only", is_flag=True, help="Show only the nodes with a problem (the summary counts all).")
@click.option("--output", "-o", type=click.Choice(["table", "json"]), default="table", show_default=True)
def fleet(kubeconfig: str | None, namespace: str, node_selector: str, lease_prefix: str, problems_only: bool,
          output: str) -> None:
    """Every node's heartbeat: chained, contested, backlog, heartbeat age, version; nodes without a publisher.

    Exits 1 when a node is not chained, contested, its chain keeper does not answer, it is stale (its
    publisher stopped renewing) or runs no publisher; 3 when the API server could not be asked; 0 otherwise.
    """
    leases, nodes = read_fleet(client_getter(kubeconfig), namespace, node_selector, lease_prefix)
    rows = fleet_rows(leases, nodes, time.time())
    shown = [r for r in rows if r.failing] if problems_only else rows
    if output == "json":
        click.echo(json.dumps(document(shown, namespace) | {"summary": summary(rows)}, indent=2, sort_keys=True))
    else:
        if shown:
            click.echo(table(shown))
        click.echo(summary_line(summary(rows)))
    sys.exit(EXIT_PROBLEM if any(r.failing for r in rows) else 0)
