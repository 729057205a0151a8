"""`netclaim-publisher fleet`: how every node stands, from the publishers' heartbeat Leases.

Run by an operator with a kubeconfig, not on a node. It lists the node Leases of the release
namespace (publisher/observe/nodelease.py writes one per node) and the cluster's Nodes, and shows a
row per node: chained, contested, backlog, the oldest pending event, tracked claims, the age of the
heartbeat, the version, and what is wrong. A node is a problem, and the exit code 1, when its keeper
says netclaim is not chained, a conflist is contested, a keeper is configured but did not answer
the publisher (the chain is unknown where it must be known), its heartbeat is stale, or it runs no
publisher at all (a Node without a Lease). 0: no problem; 3: the API could not be asked. A node
with no keeper configured (a systemd install) has its chain unknown as a note only.

What a Lease says is judged, not believed. A node's publisher (or its stolen token) writes its own
Lease, and another principal with `leases create` in the namespace may write labelled Leases too:
- whose it is: the node is the Lease's name less `--lease-prefix` (`<release>-node-<node>`, the
  name the chart's admission policy lets only that node's publisher write), and `holderIdentity`
  must say the same node. Any other labelled Lease is `foreign`, a problem row that speaks for no
  node (a Lease of another release, `<other>-node-<holder>`, is left out as before);
- freshness: stale once the renewal is older than the Lease's duration or
  limits.NODE_LEASE_DURATION_MAX, whichever is shorter (no publisher writes a longer one), and a
  renewal more than limits.NODE_LEASE_CLOCK_SKEW ahead of this clock is a problem;
- text: every table cell is shown with control characters (C0, C1, DEL, Unicode format and
  separator characters) escaped (`\\x1b`) and cut to a width, so no Lease writes to the operator's
  terminal; a Lease whose state holds any is a problem (`control characters`). `-o json` is JSON.

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
import unicodedata
import urllib.parse
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any, Callable, Iterator

import click

from publisher import limits
from publisher.observe.nodelease import ANNOTATION, COMPONENT, KEEPER_SILENT, KEEPER_UNREACHABLE

EXIT_PROBLEM = 1
EXIT_API = 3
PAGE = 500
METADATA_ONLY = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json"
# What makes a row a problem (the exit code); anything else a row says is a note.
PROBLEMS = ("not chained", "contested", "keeper unreachable", "stale", "renewed in the future", "control characters",
            "foreign", "no publisher")
# What a publisher that predates the Lease's `keeper` wrote as `chain` when its keeper did not answer.
_UNREACHABLE_LINE = "chain keeper unreachable at "


@dataclass
class Row:
    """One node as `fleet` shows it; numbers are None when the node has no readable heartbeat."""

    node: str  # "" for a foreign Lease: it speaks for no node
    lease: str = ""
    foreign: bool = False
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


def node_of(lease: dict[str, Any], prefix: str) -> str:
    """The node a Lease speaks for: its name less the prefix, when its holder says the same node; else ""."""
    name = str((lease.get("metadata") or {}).get("name") or "")
    holder = (lease.get("spec") or {}).get("holderIdentity")
    node = name[len(prefix):] if name.startswith(prefix) else ""
    return node if node and holder == node else ""


def another_release(lease: dict[str, Any], prefix: str) -> bool:
    """A Lease of another release in the namespace (`<other>-node-<holder>`): not this release's to judge."""
    name = str((lease.get("metadata") or {}).get("name") or "")
    holder = str((lease.get("spec") or {}).get("holderIdentity") or "")
    return bool(holder) and not name.startswith(prefix) and name.endswith(f"-node-{holder}")


def foreign_row(lease: dict[str, Any], prefix: str) -> Row:
    """A labelled Lease that is not `<prefix><node>` held by that node: shown, failing, never a node's."""
    name = str((lease.get("metadata") or {}).get("name") or "")
    holder = str((lease.get("spec") or {}).get("holderIdentity") or "")
    why = (f"held by {holder!r}, not {name[len(prefix):]!r}" if name.startswith(prefix) and name != prefix
           else f"held by {holder!r}, not named {prefix}<node>")
    return Row(node="", lease=name, foreign=True, problems=[
        f"foreign: Lease {name} is {why}; it speaks for no node (not written by a publisher: delete it)"])


def row_of(lease: dict[str, Any], now: float, prefix: str = limits.NODE_LEASE_PREFIX) -> Row:
    """A Lease read as a row: its name (and holder) say whose, its renewal judged by our bounds says
    whether the publisher runs, the annotation the rest."""
    node = node_of(lease, prefix)
    if not node:
        return foreign_row(lease, prefix)
    meta, spec = lease.get("metadata") or {}, lease.get("spec") or {}
    row = Row(node=node, lease=str(meta.get("name") or ""))
    renewed = micro_seconds(spec.get("renewTime"))
    judge_renewal(row, renewed, _float(spec.get("leaseDurationSeconds")) or 0.0, now)
    try:
        state = json.loads((meta.get("annotations") or {}).get(ANNOTATION) or "{}")
    except ValueError:
        state = {}
    state = state if isinstance(state, dict) else {}
    row.state = state
    hidden = control_characters(state)
    if hidden:
        row.problems.append(f"control characters: {hidden} in the Lease's state, shown escaped (no publisher "
                            "writes them: a forged or corrupt Lease)")
    row.chained = str(state.get("chained") or "unknown")
    row.contested = [str(c) for c in state.get("contested") or []]
    row.backlog, row.claims = _int(state.get("backlog")), _int(state.get("claims"))
    row.oldest_pending_seconds = _float(state.get("oldestPendingSeconds"))
    row.version, row.ready = str(state.get("version") or ""), state.get("ready")
    judge(row)
    return row


def judge_renewal(row: Row, renewed: float | None, lease_duration: float, now: float) -> None:
    """Stale by the shorter of the Lease's duration and the longest any publisher writes; a renewal ahead
    of this clock by more than the skew allowed is a problem (it would keep the row fresh until then)."""
    cap = float(limits.NODE_LEASE_DURATION_MAX)
    limit = min(lease_duration, cap) if lease_duration > 0 else cap
    if renewed is None:
        row.stale = True
        return
    row.heartbeat_age_seconds = max(0.0, now - renewed)
    row.stale = now - renewed > limit
    if renewed - now > limits.NODE_LEASE_CLOCK_SKEW:
        row.problems.append(f"renewed in the future: renewTime is {duration(renewed - now)} ahead of this "
                            "clock (a clock gone wrong, or a forged Lease)")
    if lease_duration > cap:
        row.notes.append(f"lease duration {duration(lease_duration)} is over the {duration(cap)} any publisher "
                         f"writes: judged by {duration(cap)}")


_SHOWN_ESCAPED = frozenset(("Cc", "Cf", "Zl", "Zp", "Cs", "Co", "Cn"))


def hidden(char: str) -> bool:
    """A character a terminal acts on or hides rather than shows: C0, DEL, C1, Unicode format characters
    (bidirectional overrides, zero widths), line and paragraph separators, surrogates, private and unassigned."""
    return unicodedata.category(char) in _SHOWN_ESCAPED


def control_characters(value: Any) -> int:
    """How many such characters the Lease's state holds, in any key or string of it."""
    if isinstance(value, str):
        return sum(hidden(c) for c in value)
    if isinstance(value, dict):
        return sum(control_characters(k) + control_characters(v) for k, v in value.items())
    if isinstance(value, list):
        return sum(control_characters(v) for v in value)
    return 0


def escaped(text: str, width: int) -> str:
    """Text a terminal shows as it is: each hidden character as `\\xNN` / `\\uNNNN` (a backslash as two, so
    an escape is never mistaken for text that looks like one), cut to `width` characters."""
    out = "".join("\\\\" if c == "\\" else _escape(c) if hidden(c) else c for c in text)
    return out if len(out) <= width else out[:max(0, width - 3)] + "..."


def _escape(char: str) -> str:
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


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


def fleet_rows(leases: list[dict[str, Any]], nodes: list[str] | None, now: float,
               prefix: str = limits.NODE_LEASE_PREFIX) -> list[Row]:
    """A row per node: its Lease's, or `no publisher`; a Lease whose Node is gone is a note, not a problem.
    A foreign Lease is a row of its own, always a problem; another release's is left out."""
    rows: dict[str, Row] = {}
    foreign: list[Row] = []
    for lease in leases:
        if another_release(lease, prefix):
            continue
        row = row_of(lease, now, prefix)
        if row.foreign:
            foreign.append(row)
        else:  # one name per node: the API server keeps one Lease of a name
            rows[row.node] = row
    if nodes is not None:
        known = set(nodes)
        for name in nodes:
            rows.setdefault(name, Row(node=name, problems=["no publisher: the node has no heartbeat Lease"]))
        for name, row in rows.items():
            if name not in known:  # not expected to run a publisher: what its Lease says fails nothing
                row.notes[:0] = row.problems + ["node gone (or not selected): delete its Lease when it is gone"]
                row.problems = []
    return sorted([*rows.values(), *foreign], key=lambda r: (not r.failing, r.node, r.lease))


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
    """The row's cells as the terminal gets them: every one escaped and cut (a Lease's text is its writer's)."""
    shown = row.lease and not row.foreign
    heartbeat = duration(row.heartbeat_age_seconds) + (" stale" if row.stale else "")
    said = row.problems + row.notes
    raw = (row.node or "-", row.chained if shown else "-", ",".join(row.contested) or "-",
           "-" if row.backlog is None else str(row.backlog),
           duration(row.oldest_pending_seconds) if row.oldest_pending_seconds else "-",
           "-" if row.claims is None else str(row.claims), heartbeat if shown else "-", row.version or "-")
    return (*(escaped(c, limits.FLEET_CELL_CHARS) for c in raw),
            escaped("; ".join(said) or "-", limits.FLEET_PROBLEMS_CHARS))


def table(rows: list[Row]) -> str:
    lines = [COLUMNS, *(cells(r) for r in rows)]
    widths = [max(len(line[i]) for line in lines) for i in range(len(COLUMNS) - 1)]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(line, widths)) + "  " + line[-1] for line in lines)


def summary(rows: list[Row]) -> dict[str, int]:
    """How many nodes have each problem (a node can have several), and how many have none; foreign Leases
    are counted as such, not as nodes."""
    nodes = [r for r in rows if not r.foreign]
    out = {"nodes": len(nodes), "ok": sum(not r.failing for r in nodes)}
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


def read_fleet(get: Callable[..., dict[str, Any]], namespace: str,
               node_selector: str) -> tuple[list[dict[str, Any]], list[str]]:
    """Every Lease with the heartbeat's label in the namespace (fleet_rows judges whose each is), and the
    Nodes that should run a publisher."""
    leases = list(paged(get, f"/apis/coordination.k8s.io/v1/namespaces/{urllib.parse.quote(namespace)}/leases",
                        [("labelSelector", f"app.kubernetes.io/component={COMPONENT}")]))
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
@click.option("--lease-prefix", envvar="NETCLAIM_NODE_LEASE_PREFIX", show_envvar=True,
              default=limits.NODE_LEASE_PREFIX, show_default=True, callback=lambda _c, _p, v: _prefix(v),
              help="The release's node Lease prefix, <release>-node- (the publishers' --node-lease-prefix): a "
                   "labelled Lease speaks for node N only when it is named <prefix>N and held by N.")
@click.option("--problems-only", is_flag=True, help="Show only the nodes with a problem (the summary counts all).")
@click.option("--output", "-o", type=click.Choice(["table", "json"]), default="table", show_default=True)
def fleet(kubeconfig: str | None, namespace: str, node_selector: str, lease_prefix: str, problems_only: bool,
          output: str) -> None:
    """Every node's heartbeat: chained, contested, backlog, heartbeat age, version; nodes without a publisher.

    Exits 1 when a node is not chained, contested, its chain keeper does not answer, it is stale (its
    publisher stopped renewing) or runs no publisher, or a Lease is foreign, renewed in the future or holds
    control characters; 3 when the API server could not be asked; 0 otherwise.
    """
    leases, nodes = read_fleet(client_getter(kubeconfig), namespace, node_selector)
    rows = fleet_rows(leases, nodes, time.time(), lease_prefix)
    shown = [r for r in rows if r.failing] if problems_only else rows
    if output == "json":
        click.echo(json.dumps(document(shown, namespace) | {"summary": summary(rows)}, indent=2, sort_keys=True))
    else:
        if shown:
            click.echo(table(shown))
        click.echo(summary_line(summary(rows)))
    sys.exit(EXIT_PROBLEM if any(r.failing for r in rows) else 0)


def _prefix(value: str) -> str:
    """The node is the Lease's name less the prefix: without one, no name says whose a Lease is."""
    if not value:
        raise click.BadParameter("must not be empty: the release's node Lease prefix, <release>-node-")
    return value
