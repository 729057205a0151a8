"""The fleet view: each publisher's heartbeat Lease, and `netclaim-publisher fleet` reading them all.

Unit half: the keeper's status line as the Lease reads it, when a Lease is written (the period,
a change sooner but spread), how it is written (create, then replace with the resourceVersion;
a conflict re-reads), and what `fleet` makes of Leases and Nodes (rows, table, JSON, exit codes).
Real half: a publisher against the real API server writes its Lease, `fleet` shows the node, a
node without a publisher and a contested conflist fail it, and a stopped publisher turns stale;
`fleet` run as an operator runs it (its own process, a terminal) on Leases a compromised node or
another writer made: their text reaches the terminal escaped, their word on freshness and on whose
they are is judged by fleet's own rules.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import socketserver
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from kubernetes import client

from publisher import cli, limits
from publisher.keeper.conflist import MaintainedElsewhere
from publisher.keeper.keeper import KeeperStatus
from publisher.kube.calls import NotFound, PermanentError, TransientError
from publisher.observe import fleet as fleetmod
from publisher.observe import nodelease as nodelease_mod
from publisher.observe.fleet import fleet_rows, row_of, summary, table
from publisher.observe.nodelease import (ANNOTATION, ChainView, KeeperWatch, LeaseSettings, NodeLease, NodeState,
                                         Sources, chain_view, lease_body, micro_time, settings_from)

from publisher_testkit import BIN, REPO, wait_until

# ---------------------------------------------------------------- the keeper's line


@pytest.mark.parametrize("status, chained, conflist, contested", [
    (KeeperStatus("10-net.conflist", True), "yes", "10-net.conflist", ()),
    (KeeperStatus("10-net.conflist", False, problem="rewritten right after the keeper's write"), "no",
     "10-net.conflist", ()),
    (KeeperStatus("10-net.conflist", False, ("10-net.conflist",), "contested, backing off"), "no", "10-net.conflist",
     ("10-net.conflist",)),
    (KeeperStatus("", False, problem="no network config in the conf dir yet"), "no", "", ()),
    (KeeperStatus(looked=False), "unknown", "", ()),
])
def test_the_lease_reads_what_the_keepers_status_line_says(status: KeeperStatus, chained: str, conflist: str,
                                                           contested: tuple[str, ...]) -> None:
    view = chain_view(status.line())
    assert (view.chained, view.conflist, view.contested) == (chained, conflist, contested)


def test_the_lease_keeps_the_keepers_whole_reason_for_a_symlinked_primary() -> None:
    """The keeper's longest real line: a symlinked primary under a deep conf dir names its target and the fix.
    Cut at 200 characters it ended mid-word, before the fix; the operator reads it in `fleet` and `why`."""
    refused = MaintainedElsewhere(Path("/etc/cni/net.d/10-primary.conflist"),
                                  "/var/lib/config-management/rendered/cni/primary-network-of-this-pool.conflist")
    line = KeeperStatus("10-primary.conflist", False, problem=str(refused)).line()
    assert len(line) > 200, "the positive control: a line the old cut shortened"
    view = chain_view(line)
    assert view.chained == "no" and view.detail.endswith("or make this a regular file)"), view.detail


# ---------------------------------------------------------------- when and how the Lease is written


def state(**kw: Any) -> NodeState:
    base: dict[str, Any] = dict(chain=ChainView("yes", "10-net.conflist"), pods_unchained=0, backlog=0,
                                oldest_pending_seconds=0.0, claims=3, attachments=4, apply_errors=0,
                                last_apply_error=None, ready=True, not_ready_reason="")
    return NodeState(**(base | kw))


class FakeKube:
    """Leases in a dict, with resourceVersions, and the calls made."""

    def __init__(self) -> None:
        self.leases: dict[str, dict[str, Any]] = {}
        self.calls: list[str] = []
        self.rv = 0
        self.fail: Exception | None = None

    def purpose(self, _name: str) -> Any:
        import contextlib

        return contextlib.nullcontext()

    def _stored(self, lease: dict[str, Any]) -> dict[str, Any]:
        self.rv += 1
        lease = json.loads(json.dumps(lease))
        lease["metadata"]["resourceVersion"] = str(self.rv)
        self.leases[lease["metadata"]["name"]] = lease
        return json.loads(json.dumps(lease))

    def get_lease(self, _ns: str, name: str) -> dict[str, Any]:
        self.calls.append("get")
        if name not in self.leases:
            raise NotFound(404, "not found")
        return json.loads(json.dumps(self.leases[name]))

    def create_lease(self, _ns: str, lease: dict[str, Any]) -> dict[str, Any]:
        self.calls.append("create")
        if self.fail:
            raise self.fail
        return self._stored(lease)

    def update_lease(self, _ns: str, name: str, lease: dict[str, Any]) -> dict[str, Any]:
        self.calls.append("update")
        if self.fail:
            raise self.fail
        if lease["metadata"].get("resourceVersion") != self.leases[name]["metadata"]["resourceVersion"]:
            raise PermanentError(409, "the object has been modified")
        return self._stored(lease)


def sources(now_state: list[NodeState]) -> Sources:
    """Sources that say whatever now_state[0] says (the unit tests swap it)."""
    s = now_state
    return Sources(
        journal_depth=lambda: s[0].backlog, oldest_journaled_age=lambda: s[0].oldest_pending_seconds or None,
        spool_times=lambda: [], claims=lambda: s[0].claims, attachments=lambda: s[0].attachments,
        claim_states=lambda: ({"ns/c": {"state": "error", "error": "422: no", "updated": 1.0}}
                              if s[0].apply_errors else {}),
        pods_unchained=lambda: s[0].pods_unchained, ready=lambda: (s[0].ready, s[0].not_ready_reason),
        keeper=lambda: s[0].chain)


def test_a_lease_is_created_once_then_replaced_with_its_resource_version() -> None:
    kube, failures = FakeKube(), []
    lease = NodeLease(kube, LeaseSettings("ns", "node-a", period=60), sources([state()]),  # type: ignore[arg-type]
                      lambda: failures.append(1))
    assert lease.write(state(), 100.0) and kube.calls == ["get", "create"]
    assert lease.write(state(backlog=2), 160.0) and kube.calls[-1] == "update"
    stored = kube.leases["netclaim-node-node-a"]
    assert stored["spec"]["holderIdentity"] == "node-a" and stored["spec"]["leaseDurationSeconds"] == 180
    assert json.loads(stored["metadata"]["annotations"][ANNOTATION])["backlog"] == 2
    assert stored["metadata"]["labels"]["app.kubernetes.io/component"] == "node-heartbeat"
    # Someone else wrote it (an earlier run, an operator's annotation): re-read, keep theirs, write ours.
    kube.leases["netclaim-node-node-a"]["metadata"]["annotations"]["team"] = "net"
    kube.rv += 1
    kube.leases["netclaim-node-node-a"]["metadata"]["resourceVersion"] = str(kube.rv)
    assert lease.write(state(backlog=0), 220.0)
    assert kube.calls[-3:] == ["update", "get", "update"]
    assert kube.leases["netclaim-node-node-a"]["metadata"]["annotations"]["team"] == "net"
    assert failures == []


def test_a_failed_write_is_counted_and_tried_again_after_a_backoff() -> None:
    kube, failures = FakeKube(), []
    lease = NodeLease(kube, LeaseSettings("ns", "node-a"), sources([state()]),  # type: ignore[arg-type]
                      lambda: failures.append(1))
    kube.fail = TransientError(503, "unavailable")
    assert not lease.write(state(), 100.0)
    assert failures == [1] and lease.retry_at > 100.0 and lease.last_write is None
    kube.fail = None
    assert lease.write(state(), lease.retry_at) and lease.failures == 0


def test_a_lease_is_renewed_every_period_and_a_change_sooner_but_not_at_once() -> None:
    now_state = [state()]
    lease = NodeLease(FakeKube(), LeaseSettings("ns", "node-a", period=60), sources(now_state))  # type: ignore[arg-type]
    assert lease.due(0.0, state())  # never written: now
    lease.last_write, lease.written = 0.0, state().signature()
    assert not lease.due(30.0, state(backlog=0, claims=9, oldest_pending_seconds=0.0))  # counts wait
    assert not lease.due(53.9, state()) and lease.due(66.1, state())  # the period, jittered by up to 10 %
    # Unchained: written after the minimum gap plus a random spread, not at once.
    lease.last_write = 100.0
    changed = state(chain=ChainView("no", "10-net.conflist"))
    assert not lease.due(101.0, changed)
    assert lease.change_due is not None and 115.0 <= lease.change_due <= 125.0
    assert lease.due(lease.change_due, changed)
    # A change that is undone before it was written is not written.
    lease.change_due = None
    assert not lease.due(102.0, changed) and not lease.due(103.0, state()) and lease.change_due is None


def test_the_lease_carries_the_apply_error_and_what_the_keeper_said() -> None:
    now = [state(apply_errors=1, chain=ChainView("no", "10-net.conflist", ("10-net.conflist",), "not chained ..."))]
    kube = FakeKube()
    lease = NodeLease(kube, LeaseSettings("ns", "node-a"), sources(now))  # type: ignore[arg-type]
    assert lease.step()
    doc = json.loads(kube.leases["netclaim-node-node-a"]["metadata"]["annotations"][ANNOTATION])
    assert doc["chained"] == "no" and doc["contested"] == ["10-net.conflist"]
    assert doc["applyErrors"] == 1 and doc["lastApplyError"]["claim"] == "ns/c"
    assert doc["lastApplyError"]["error"] == "422: no" and doc["version"]


def test_no_namespace_or_an_impossible_name_keeps_no_lease() -> None:
    assert settings_from({"node_lease": True}, "node-a", "/some/kubeconfig") is None
    assert settings_from({"node_lease": False, "node_lease_namespace": "ns"}, "node-a", None) is None
    assert settings_from({"node_lease": True, "node_lease_namespace": "ns"}, "n" * 250, None) is None
    cfg = settings_from({"node_lease": True, "node_lease_namespace": "ns", "node_lease_period": 30,
                         "node_lease_prefix": "nc-node-"}, "node-a", "/some/kubeconfig")
    assert cfg is not None and (cfg.name, cfg.duration) == ("nc-node-node-a", 90)


def test_the_pod_owns_its_lease_only_in_its_own_namespace(monkeypatch) -> None:
    monkeypatch.setattr(nodelease_mod, "pod_namespace", lambda: "netclaim")
    given = {"node_lease": True, "node_lease_namespace": "netclaim", "pod_name": "netclaim-x7", "pod_uid": "u-1"}
    cfg = settings_from(given, "node-a", None)
    assert cfg is not None and cfg.owner == ("netclaim-x7", "u-1")
    # Another namespace: an owner there would read as missing and the Lease be deleted at once.
    assert settings_from({**given, "node_lease_namespace": "elsewhere"}, "node-a", None).owner is None
    assert settings_from({**given, "pod_uid": ""}, "node-a", None).owner is None

    kube = FakeKube()
    lease = NodeLease(kube, cfg, sources([state()]))  # type: ignore[arg-type]
    assert lease.write(state(), 100.0)
    stored = kube.leases["netclaim-node-node-a"]
    assert stored["metadata"]["ownerReferences"] == [{"apiVersion": "v1", "kind": "Pod", "name": "netclaim-x7",
                                                      "uid": "u-1"}]
    # A new pod (an upgrade) takes it over; an owner someone else added stays.
    stored["metadata"]["ownerReferences"].append({"apiVersion": "v1", "kind": "ConfigMap", "name": "x", "uid": "c"})
    kube.rv += 1
    stored["metadata"]["resourceVersion"] = str(kube.rv)
    lease.cfg = LeaseSettings("netclaim", "node-a", period=60, owner=("netclaim-b2", "u-2"))
    assert lease.write(state(backlog=1), 200.0)
    refs = kube.leases["netclaim-node-node-a"]["metadata"]["ownerReferences"]
    assert [(r["kind"], r["uid"]) for r in refs] == [("ConfigMap", "c"), ("Pod", "u-2")]


class OwnerRefusingKube(FakeKube):
    """A cluster that enforces owner-reference permissions: no delete on Leases, no owner."""

    def create_lease(self, ns: str, lease: dict[str, Any]) -> dict[str, Any]:
        if lease["metadata"].get("ownerReferences"):
            self.calls.append("create")
            raise PermanentError(403, 'leases "netclaim-node-node-a" is forbidden: cannot set an ownerRef on a '
                                      "resource you can't delete")
        return super().create_lease(ns, lease)


def test_a_cluster_that_refuses_the_owner_still_gets_the_heartbeat() -> None:
    kube, failures = OwnerRefusingKube(), []
    cfg = LeaseSettings("netclaim", "node-a", period=60, owner=("netclaim-x7", "u-1"))
    lease = NodeLease(kube, cfg, sources([state()]), lambda: failures.append(1))  # type: ignore[arg-type]
    assert lease.write(state(), 100.0)
    assert "ownerReferences" not in kube.leases["netclaim-node-node-a"]["metadata"] and failures == []
    assert lease.write(state(backlog=3), 200.0) and kube.calls[-1] == "update"


# ---------------------------------------------------------------- what `fleet` makes of them


def a_lease(node: str, age: float, now: float, **doc: Any) -> dict[str, Any]:
    full = {"chained": "yes", "contested": [], "backlog": 0, "oldestPendingSeconds": 0, "claims": 2,
            "ready": True, "version": "0.1.0"} | doc
    return {"metadata": {"name": f"netclaim-node-{node}", "annotations": {ANNOTATION: json.dumps(full)}},
            "spec": {"holderIdentity": node, "leaseDurationSeconds": 180, "renewTime": micro_time(now - age)}}


def test_each_node_is_a_row_and_only_the_problems_fail() -> None:
    now = 1_800_000_000.0
    leases = [a_lease("ok-1", 10, now), a_lease("unchained", 5, now, chained="no", chain="not chained conflist=-"),
              a_lease("contested", 5, now, chained="no", contested=["10-net.conflist"]),
              a_lease("stale", 400, now), a_lease("busy", 5, now, backlog=40, oldestPendingSeconds=90),
              a_lease("systemd", 5, now, chained="unknown"), a_lease("gone", 900, now)]
    nodes = ["ok-1", "unchained", "contested", "stale", "busy", "systemd", "bare"]
    rows = {r.node: r for r in fleet_rows(leases, nodes, now)}
    failing = {n for n, r in rows.items() if r.failing}
    assert failing == {"unchained", "contested", "stale", "bare"}
    assert rows["bare"].problems[0].startswith("no publisher")
    assert rows["stale"].stale and rows["stale"].problems[0].startswith("stale: last heartbeat 7m ago")
    assert rows["busy"].backlog == 40 and rows["busy"].oldest_pending_seconds == 90
    assert rows["systemd"].notes == ["chain unknown (no chain keeper answer)"]
    assert not rows["gone"].failing and rows["gone"].notes[-1].startswith("node gone")
    # A contested conflist has netclaim out of the chain: that node counts under both.
    assert summary(list(rows.values())) == {"nodes": 8, "ok": 4, "not_chained": 2, "contested": 1,
                                            "keeper_unreachable": 0, "stale": 1, "renewed_in_the_future": 0,
                                            "control_characters": 0, "foreign": 0, "no_publisher": 1}
    # The problems come first in the table.
    ordered = [r.node for r in fleet_rows(leases, nodes, now)]
    assert set(ordered[:4]) == failing


def test_a_keeper_that_does_not_answer_fails_fleet_and_a_node_without_one_does_not(monkeypatch) -> None:
    now = time.time()
    unreachable = "chain keeper unreachable at 127.0.0.1:9467: URLError"
    leases = [a_lease("down", 5, now, chained="unknown", keeper="unreachable", chain=unreachable),
              a_lease("older", 5, now, chained="unknown", chain=unreachable),  # a publisher before `keeper`
              a_lease("systemd", 5, now, chained="unknown", keeper="none",
                      chain="no chain keeper configured (--keeper-address)"),
              a_lease("starting", 5, now, chained="unknown", keeper="answered",
                      chain="starting: the CNI conf dir is not read yet"),
              a_lease("just-installed", 5, now, chained="unknown", keeper="silent", chain=unreachable)]
    nodes = ["down", "older", "systemd", "starting", "just-installed"]
    rows = {r.node: r for r in fleet_rows(leases, nodes, now)}
    assert rows["down"].problems == [f"keeper unreachable: {unreachable}"]
    assert rows["older"].problems == rows["down"].problems
    assert not rows["systemd"].failing and not rows["starting"].failing and not rows["just-installed"].failing
    assert rows["just-installed"].notes == ["chain unknown (the chain keeper has not answered yet)"]
    assert summary(list(rows.values()))["keeper_unreachable"] == 2
    monkeypatch.setattr(fleetmod, "client_getter", lambda _kubeconfig: None)
    monkeypatch.setattr(fleetmod, "read_fleet", lambda *_a: (leases[:1], ["down"]))
    result = CliRunner().invoke(cli.cli, ["fleet"])
    assert result.exit_code == 1 and "keeper unreachable" in result.output, result.output


def test_a_lease_without_renewal_or_state_is_stale_and_unknown() -> None:
    row = row_of({"metadata": {"name": "netclaim-node-x"}, "spec": {"holderIdentity": "x"}}, time.time())
    assert row.stale and row.chained == "unknown" and row.heartbeat_age_seconds is None
    assert row.problems == ["stale: last heartbeat never (publisher down or cut off from the API)"]


def test_a_lease_speaks_only_for_the_node_its_name_and_holder_agree_on() -> None:
    """The node is the Lease's name less the prefix (the name the admission policy gives a node's
    publisher alone) and the holder must say the same; any other labelled Lease is foreign."""
    now = 1_800_000_000.0
    impostor = a_lease("node-b", -365 * 86400, now) | {"metadata": {"name": "zz"}}  # holder node-b, a year ahead
    taken = a_lease("node-a", 5, now)
    taken["metadata"] = {"name": "netclaim-node-node-b"}  # node-b's name, held by node-a
    other_release = a_lease("node-c", 5, now, chained="no")
    other_release["metadata"]["name"] = "edge-netclaim-node-node-c"
    rows = fleet_rows([a_lease("node-a", 5, now), impostor, taken, other_release], ["node-a", "node-b"], now)
    by_lease = {r.lease: r for r in rows}
    assert {r.node for r in rows} == {"node-a", "node-b", ""}
    assert by_lease["zz"].foreign and by_lease["zz"].problems == [(
        "foreign: Lease zz is held by 'node-b', not named netclaim-node-<node>; it speaks for no node (not "
        "written by a publisher: delete it)")]
    assert by_lease["netclaim-node-node-b"].foreign and "held by 'node-a', not 'node-b'" in by_lease[
        "netclaim-node-node-b"].problems[0]
    node_b = next(r for r in rows if r.node == "node-b")
    assert node_b.problems == ["no publisher: the node has no heartbeat Lease"]
    assert "edge-netclaim-node-node-c" not in by_lease  # another release's: its own --lease-prefix shows it
    assert (summary(rows)["nodes"], summary(rows)["ok"], summary(rows)["foreign"]) == (2, 1, 2)
    # Control: the same Leases read with that release's prefix show its node and none of ours.
    theirs = fleet_rows([other_release], None, now, prefix="edge-netclaim-node-")
    assert [(r.node, r.chained) for r in theirs] == [("node-c", "no")]


def test_staleness_and_the_future_are_judged_by_fleets_bounds_not_the_leases() -> None:
    now = 1_800_000_000.0
    ten_years = a_lease("forever", 30 * 86400, now)
    ten_years["spec"]["leaseDurationSeconds"] = 315_360_000
    ahead = a_lease("ahead", -365 * 86400, now)
    skewed = a_lease("skewed", -limits.NODE_LEASE_CLOCK_SKEW / 2, now)
    hour = a_lease("hour", 3600, now)
    hour["spec"]["leaseDurationSeconds"] = 3 * 3600  # a publisher with the longest period: still fresh
    rows = {r.node: r for r in fleet_rows([ten_years, ahead, skewed, hour, a_lease("fresh", 5, now)], None, now)}
    assert rows["forever"].stale and rows["forever"].problems[0].startswith("stale: last heartbeat 30d ago")
    assert "lease duration 3650d is over the 3h any publisher writes: judged by 3h" in rows["forever"].notes
    assert rows["ahead"].problems == [("renewed in the future: renewTime is 365d ahead of this clock (a clock "
                                       "gone wrong, or a forged Lease)")]
    assert not rows["skewed"].failing and not rows["hour"].failing and not rows["fresh"].failing


def test_every_cell_is_escaped_and_cut_and_a_lease_with_control_characters_is_a_problem() -> None:
    now = time.time()
    hostile = "0.2.0\x1b[2J\x1b]52;c;ZXZpbA==\x07\x9b\x7f\u202e\\x41"
    leases = [a_lease("node-a", 5, now, version=hostile, chained="no", contested=["c" * 100],
                      chain="not chained conflist=x problem=\x1b[1Aok", ready=False, notReadyReason="\r" + "x" * 500),
              a_lease("node-b", 5, now, version="9.9.9")]
    rows = fleet_rows(leases, None, now)
    text = table(rows)
    assert not [c for c in text if c != "\n" and (ord(c) < 0x20 or 0x7f <= ord(c) < 0xa0 or c == "\u202e")], text
    node_a = next(r for r in rows if r.node == "node-a")
    assert node_a.problems[0] == ("control characters: 8 in the Lease's state, shown escaped (no publisher "
                                  "writes them: a forged or corrupt Lease)")
    line_a, line_b = (next(line for line in text.splitlines() if line.startswith(n)) for n in ("node-a", "node-b"))
    assert "  0.2.0\\x1b[2J\\x1b]52;c;ZXZpbA==\\x07\\x9b\\x7f\\u202e\\\\x41  " in line_a, line_a
    assert "not chained: \\x1b[1Aok" in line_a and "not ready: \\x0dxxx" in line_a
    # Cut: a cell at its width, the problems at theirs.
    assert " " + "c" * (limits.FLEET_CELL_CHARS - 3) + "...  " in line_a
    problems = line_a[line_a.index("control characters"):]
    assert len(problems) == limits.FLEET_PROBLEMS_CHARS and problems.endswith("xxx...")
    assert line_b.split()[7] == "9.9.9" and line_b.rstrip().endswith("-")  # control: plain text as it is
    assert len(line_a) < 12 * limits.FLEET_CELL_CHARS + limits.FLEET_PROBLEMS_CHARS
    assert fleetmod.document(rows, "ns")["nodes"][0]["version"] == hostile  # JSON says it as it is, escaped


def test_fleet_needs_a_lease_prefix_to_tell_whose_a_lease_is(monkeypatch) -> None:
    monkeypatch.setattr(fleetmod, "client_getter", lambda _kubeconfig: None)
    monkeypatch.setattr(fleetmod, "read_fleet", lambda *_a: ([], []))
    result = CliRunner().invoke(cli.cli, ["fleet", "--lease-prefix", ""])
    assert result.exit_code == 2 and "must not be empty" in result.output, result.output
    seen: list[str] = []

    def rows(_leases: Any, _nodes: Any, _now: float, prefix: str) -> list[Any]:
        seen.append(prefix)
        return []

    monkeypatch.setattr(fleetmod, "fleet_rows", rows)
    assert CliRunner().invoke(cli.cli, ["fleet"]).exit_code == 0 and seen == [limits.NODE_LEASE_PREFIX]


def test_the_table_has_a_column_for_each_figure() -> None:
    now = time.time()
    text = table(fleet_rows([a_lease("node-a", 12, now, backlog=3, oldestPendingSeconds=150)], ["node-a", "node-b"],
                            now))
    header, *lines = text.splitlines()
    assert header.split() == ["NODE", "CHAINED", "CONTESTED", "BACKLOG", "OLDEST", "CLAIMS", "HEARTBEAT", "VERSION",
                              "PROBLEMS"]
    assert lines[0].split()[:2] == ["node-b", "-"] and "no publisher" in lines[0]
    assert lines[1].split()[:8] == ["node-a", "yes", "-", "3", "2m", "2", "12s", "0.1.0"]


@pytest.mark.parametrize("leases, code", [(["node-a"], 0), ([], 1)], ids=["all-well", "a-node-without-publisher"])
def test_fleet_exits_by_the_problems_with_either_output(monkeypatch, leases: list[str], code: int) -> None:
    now = time.time()
    monkeypatch.setattr(fleetmod, "client_getter", lambda _kubeconfig: None)
    monkeypatch.setattr(fleetmod, "read_fleet", lambda *_a: ([a_lease(n, 5, now) for n in leases], ["node-a"]))
    for output in ("table", "json"):
        result = CliRunner().invoke(cli.cli, ["fleet", "-o", output])
        assert result.exit_code == code, result.output
    doc = json.loads(CliRunner().invoke(cli.cli, ["fleet", "-o", "json"]).output)
    assert doc["summary"]["nodes"] == 1 and doc["summary"]["ok"] == 1 - code


def test_fleet_says_in_one_line_that_it_could_not_ask_and_exits_3(tmp_path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text("apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster: {server: 'https://127.0.0.1:9'"
                          ", insecure-skip-tls-verify: true}\nusers:\n- name: u\n  user: {token: t}\ncontexts:\n"
                          "- name: c\n  context: {cluster: c, user: u}\ncurrent-context: c\n")
    assert cli.main(["fleet", "--kubeconfig", str(kubeconfig)]) == fleetmod.EXIT_API


# ---------------------------------------------------------------- the real API server


class UnixHTTPServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True


class KeeperStub:
    """The chain keeper's probe socket (its --probe-socket, the publisher's --keeper-socket): /readyz answers
    with a status line the test sets. `tcp`: on a loopback port instead (what --keeper-address asks)."""

    def __init__(self, tcp: bool = False) -> None:
        self.line = KeeperStatus("10-net.conflist", True).line()
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                body = stub.line.encode()
                self.send_response(200 if stub.line.startswith("chained") else 503)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *_a: Any) -> None:
                pass

        self.dir = tempfile.mkdtemp(prefix="nc-keeper-")
        self.server: socketserver.BaseServer = (HTTPServer(("127.0.0.1", 0), Handler) if tcp else
                                                UnixHTTPServer(os.path.join(self.dir, "keeper-probe.sock"), Handler))
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def address(self) -> str:
        where = self.server.server_address
        return f"127.0.0.1:{where[1]}" if isinstance(where, tuple) else str(where)

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        shutil.rmtree(self.dir, ignore_errors=True)


class ProxyStandIn(KeeperStub):
    """An HTTP proxy that answers every request 502, as a proxy that cannot reach a node's loopback would."""

    def __init__(self) -> None:
        super().__init__(tcp=True)
        self.line = "bad gateway"


def test_the_keepers_answer_reaches_the_lease_when_the_publisher_has_an_http_proxy() -> None:
    keeper, proxy = KeeperStub(), ProxyStandIn()
    env = {k: v for k, v in os.environ.items() if k.lower() not in ("no_proxy", "http_proxy", "all_proxy")}
    env |= {"HTTP_PROXY": f"http://{proxy.address}", "http_proxy": f"http://{proxy.address}",
            "PYTHONPATH": str(REPO)}
    # A process of its own: urllib reads the proxy variables once per process.
    code = ("import json, sys; from publisher.observe.nodelease import ask_keeper; v = ask_keeper(sys.argv[1]); "
            "print(json.dumps([v.chained, v.conflist, v.keeper, v.detail]))")
    try:
        out = subprocess.run([sys.executable, "-c", code, keeper.address], env=env, capture_output=True, text=True,
                             timeout=60, check=True).stdout
    finally:
        keeper.stop()
        proxy.stop()
    assert json.loads(out)[:3] == ["yes", "10-net.conflist", "answered"], out


def test_a_keeper_not_up_yet_is_silent_and_only_one_silent_for_the_grace_is_unreachable() -> None:
    """The publisher's container starts before the keeper's listener: the first Leases must not fail fleet."""
    keeper = KeeperStub()
    address = keeper.address
    keeper.stop()  # its port, with nothing listening on it yet
    clock = [100.0]
    watch = KeeperWatch(address, grace=60.0, clock=lambda: clock[0])
    assert watch().keeper == "silent"
    clock[0] += 59.0
    assert watch().keeper == "silent"
    clock[0] += 1.0
    gone = watch()
    assert (gone.keeper, gone.chained) == ("unreachable", "unknown"), gone
    back = KeeperStub()
    try:
        answered = KeeperWatch(back.address, grace=60.0, clock=lambda: clock[0])
        assert answered().keeper == "answered"
        watch.address = back.address
        assert watch().chained == "yes"
        watch.address = address
        assert watch().keeper == "silent", "an answer ends the silence: the grace starts again"
    finally:
        back.stop()


def run_fleet(kubeconfig: str, namespace: str, selector: str) -> tuple[int, dict[str, Any]]:
    result = CliRunner().invoke(cli.cli, ["fleet", "--kubeconfig", kubeconfig, "-n", namespace, "-l", selector,
                                          "-o", "json"])
    assert result.exit_code in (0, 1), result.output
    return result.exit_code, json.loads(result.output)


@pytest.mark.controlplane
def test_a_real_publisher_keeps_its_lease_and_fleet_shows_it_until_it_stops(control_plane, api_client, cluster,
                                                                             publisher_factory) -> None:
    core = client.CoreV1Api(api_client)
    label = f"fleet-{uuid.uuid4().hex[:6]}"
    node_a, node_b = f"{label}-a", f"{label}-b"
    for node in (node_a, node_b):
        core.create_node({"apiVersion": "v1", "kind": "Node", "metadata": {"name": node,
                                                                           "labels": {"netclaim-test/fleet": label}}})
    keeper = KeeperStub()
    selector = f"netclaim-test/fleet={label}"
    try:
        pub = publisher_factory(start=False, extra=["--node-lease-namespace", cluster.namespace,
                                                    "--node-lease-period", "2", "--keeper-socket", keeper.address])
        pub.node = node_a
        pub.start()

        def row(node: str) -> dict[str, Any]:
            code, doc = run_fleet(control_plane.kubeconfig, cluster.namespace, selector)
            return {"code": code, **next(r for r in doc["nodes"] if r["node"] == node)}

        first = wait_until("the publisher's Lease", lambda: (r := row(node_a))["lease"] and r, timeout=30)
        assert first["chained"] == "yes" and first["contested"] == [] and not first["stale"]
        assert first["backlog"] == 0 and first["claims"] == 0 and first["version"]
        assert first["code"] == 1 and row(node_b)["problems"][0].startswith("no publisher")
        lease = client.CoordinationV1Api(api_client).read_namespaced_lease(f"netclaim-node-{node_a}",
                                                                           cluster.namespace)
        assert lease.spec.holder_identity == node_a and lease.spec.lease_duration_seconds == 6
        core.delete_node(node_b)
        wait_until("every selected node to be well", lambda: row(node_a)["code"] == 0, timeout=30)

        keeper.line = KeeperStatus("10-net.conflist", False, ("10-net.conflist",), "contested, backing off").line()
        contested = wait_until("the contest in the Lease", lambda: (r := row(node_a))["contested"] and r, timeout=30)
        assert contested["code"] == 1 and contested["chained"] == "no"
        keeper.line = KeeperStatus("10-net.conflist", True).line()
        wait_until("the contest to end", lambda: row(node_a)["code"] == 0, timeout=30)
        keeper.stop()  # the keeper is configured and no longer answers: the chain is unknown where it matters
        # Silent for a heartbeat period (2 s here; a minute at most): unreachable, and a problem.
        silent = wait_until("the unreachable keeper in the Lease",
                            lambda: (r := row(node_a))["chained"] == "unknown" and r["code"] == 1 and r, timeout=30)
        assert silent["problems"][0].startswith("keeper unreachable: chain keeper unreachable")

        assert pub.metric("netclaim_node_lease_write_failures_total") == 0
        assert pub.metric('netclaim_api_requests_by_purpose_total{purpose="node-lease"}') >= 2
        pub.stop()
        stale = wait_until("the stopped publisher's Lease to turn stale",
                           lambda: (r := row(node_a))["stale"] and r, timeout=30)
        assert stale["code"] == 1 and stale["problems"][0].startswith("stale: last heartbeat")
        assert "node lease not written" not in pub.logs(), pub.logs()[-3000:]
    finally:
        keeper.stop()
        for node in (node_a, node_b):
            try:
                core.delete_node(node)
            except client.exceptions.ApiException:
                pass



# ---------------------------------------------------------------- Leases others wrote, read by the operator's fleet


def fleet_nodes(core: client.CoreV1Api, label: str, names: tuple[str, ...]) -> str:
    """Nodes of this test only (a label of their own): the selector fleet is run with."""
    for name in names:
        core.create_node({"apiVersion": "v1", "kind": "Node",
                          "metadata": {"name": name, "labels": {"netclaim-test/fleet": label}}})
    return f"netclaim-test/fleet={label}"


def written(api_client: Any, namespace: str, node: str, renewed: float, name: str = "",
            duration: int | None = None, **doc: Any) -> None:
    """A Lease as a publisher writes it (nodelease.lease_body), with what a writer may change in it."""
    body = lease_body(LeaseSettings(namespace, node, period=600), state(**doc), renewed, renewed)
    body["metadata"]["name"] = name or body["metadata"]["name"]
    if duration is not None:
        body["spec"]["leaseDurationSeconds"] = duration
    client.CoordinationV1Api(api_client).create_namespaced_lease(namespace, body)


def run_fleet_process(argv: list[str], terminal: bool = False) -> subprocess.CompletedProcess[bytes]:
    """`netclaim-publisher fleet` as the operator runs it: its own process; on a terminal (a pty, through
    script(1)) when `terminal`, where escapes would act."""
    cmd = [str(BIN / "netclaim-publisher"), "fleet", *argv]
    if terminal:
        cmd = ["script", "-q", "-e", "-c", " ".join(shlex.quote(a) for a in cmd), "/dev/null"]
    return subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, timeout=120, check=False)


def delete_nodes(core: client.CoreV1Api, nodes: tuple[str, ...]) -> None:
    for name in nodes:
        try:
            core.delete_node(name)
        except client.exceptions.ApiException:
            pass


@pytest.mark.controlplane
def test_a_nodes_lease_cannot_write_escapes_to_the_operators_terminal(control_plane, api_client, cluster) -> None:
    """A compromised node may write its own Lease (the admission policy allows it): a version that clears
    the screen and sets the clipboard (OSC 52) reaches the operator's terminal only escaped."""
    core, label = client.CoreV1Api(api_client), f"esc-{uuid.uuid4().hex[:6]}"
    nodes = (f"{label}-a", f"{label}-b")
    attack = "\x1b[2J\x1b]52;c;ZXZpbA==\x07"
    try:
        selector = fleet_nodes(core, label, nodes)
        now = time.time()
        written(api_client, cluster.namespace, nodes[0], now, version=f"0.2.0{attack}")
        written(api_client, cluster.namespace, nodes[1], now, version="9.9.9")
        args = ["--kubeconfig", control_plane.kubeconfig, "-n", cluster.namespace, "-l", selector]
        shown = run_fleet_process(args, terminal=True)
        out = shown.stdout
        assert b"\x1b" not in out and b"\x07" not in out, out
        assert shown.returncode == 1, out
        row_a = next(line for line in out.decode().splitlines() if line.startswith(nodes[0]))
        assert "0.2.0\\x1b[2J\\x1b]52;c;ZXZpbA==\\x07" in row_a and "control characters: 3" in row_a, row_a
        # Control: the other node's plain version as it is, and its row well.
        row_b = next(line for line in out.decode().splitlines() if line.startswith(nodes[1]))
        assert row_b.split()[7] == "9.9.9" and row_b.rstrip().endswith("  -"), row_b
        # -o json stays JSON, and says the version as the Lease has it.
        doc = json.loads(run_fleet_process([*args, "-o", "json"]).stdout)
        assert {r["node"]: r["version"] for r in doc["nodes"]} == {nodes[0]: f"0.2.0{attack}", nodes[1]: "9.9.9"}
    finally:
        delete_nodes(core, nodes)


@pytest.mark.controlplane
def test_fleet_judges_whose_a_lease_is_and_whether_it_is_fresh_by_its_own_rules(control_plane, api_client,
                                                                               cluster) -> None:
    """On an API server without the chart's admission policies (anyone with `leases create` in the namespace
    writes what they like): a node's ten-year Lease does not keep it fresh after its publisher stopped, and a
    labelled Lease held by node-b a year ahead neither makes node-b fresh nor passes for a node."""
    core, label = client.CoreV1Api(api_client), f"trust-{uuid.uuid4().hex[:6]}"
    node_a, node_b, node_c = nodes = (f"{label}-a", f"{label}-b", f"{label}-c")
    year = 365 * 86400.0
    try:
        selector = fleet_nodes(core, label, nodes)
        now = time.time()
        written(api_client, cluster.namespace, node_a, now - 30 * 86400, duration=10 * 365 * 86400)
        written(api_client, cluster.namespace, node_b, now - 2 * 3600)  # its publisher stopped two hours ago
        written(api_client, cluster.namespace, node_b, now + year, name=f"zz-{label}")
        written(api_client, cluster.namespace, node_c, now)  # control: a normal heartbeat
        ran = run_fleet_process(["--kubeconfig", control_plane.kubeconfig, "-n", cluster.namespace, "-l", selector,
                                 "-o", "json"])
        assert ran.returncode == 1, ran.stderr
        rows = json.loads(ran.stdout)["nodes"]
        by_node = {r["node"]: r for r in rows if r["node"]}
        assert by_node[node_a]["stale"] and by_node[node_a]["problems"][0].startswith("stale: last heartbeat 30d ago")
        assert by_node[node_b]["stale"] and by_node[node_b]["lease"] == f"netclaim-node-{node_b}"
        [foreign] = [r for r in rows if r["foreign"]]
        assert foreign["lease"] == f"zz-{label}" and foreign["problems"][0].startswith(
            f"foreign: Lease zz-{label} is held by '{node_b}'"), foreign
        assert not by_node[node_c]["stale"] and by_node[node_c]["problems"] == [], by_node[node_c]
        assert json.loads(ran.stdout)["summary"] | {"nodes": 3, "ok": 1, "stale": 2, "foreign": 1} == json.loads(
            ran.stdout)["summary"]
    finally:
        delete_nodes(core, nodes)
