"""`netclaim-publisher status`, the operator's first look at a node, run as the real CLI.

The command is what a person types on a node when a pod's claim has no
network data, so it is tested end to end: the installed entry point, talking
over the publisher's socket, after a published ADD (plus one event still
waiting for its claim to be allocated) and after the API refused an apply (409).
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from typing import Any

import pytest

from cni_plugin.wire.event import PodRef
from publisher_testkit import BIN, Cluster, add, apply_as, send_check, suffix, take_interface_name

pytestmark = pytest.mark.controlplane


def cli(socket_path: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "netclaim-publisher"), "status", "--socket", socket_path, *args],
                          capture_output=True, text=True, timeout=30)


def cli_json(socket_path: str, rc: int = 0) -> dict[str, Any]:
    """The JSON answer; `rc` the exit code expected: 1 when it holds a problem."""
    out = cli(socket_path, "-o", "json")
    assert out.returncode == rc, (out.returncode, out.stdout, out.stderr)
    return json.loads(out.stdout)


def cli_text(socket_path: str, rc: int = 0) -> str:
    out = cli(socket_path)
    assert out.returncode == rc, (out.returncode, out.stdout, out.stderr)
    return out.stdout


def wait_status(publisher, predicate: Any, timeout: float = 30.0) -> dict[str, Any]:
    deadline = time.time() + timeout
    st: dict[str, Any] = {}
    while time.time() < deadline:
        st = publisher.status()
        if predicate(st):
            return st
        time.sleep(0.1)
    raise AssertionError(f"status never matched: {st}")


def line(text: str, label: str) -> str:
    """The value of `label:` in the human output."""
    m = re.search(rf"^{re.escape(label)}:\s+(.*)$", text, re.M)
    assert m, f"no {label!r} line in:\n{text}"
    return m.group(1)


def test_status_cli_after_publish_and_after_a_refusal(cluster: Cluster, publisher, plugin):
    claim, uid = cluster.pod_with_claim("web", [("nic", "nic0")])
    key = f"{cluster.namespace}/{claim}"
    pod, cid = PodRef(cluster.namespace, "web", uid), "c" + suffix()
    add(plugin, cid, pod)
    cluster.wait_devices(claim, lambda d: len(d) == 1)
    # A second pod whose claim is not allocated yet: its ADD stays in the journal.
    cluster.claim("late-net")
    late_uid = cluster.pod("late", ["late-net"])
    late_cid = "late" + suffix()
    add(plugin, late_cid, PodRef(cluster.namespace, "late", late_uid))
    wait_status(publisher, lambda s: (s["oldest_pending"] or {}).get("attempts", 0) >= 1
                and s["claims"].get(key, {}).get("state") == "published")

    # 1. After a published ADD.
    st = cli_json(publisher.socket)
    assert st["node"] == "node-a" and st["journal_depth"] == 1 and st["attachments"] == 1
    assert st["oldest_pending"]["op"] == "ADD" and st["oldest_pending"]["containerID"] == late_cid
    assert "not allocated" in st["oldest_pending"]["last_error"]
    assert st["last_error"] is None and st["failed_events"] == []
    assert st["claims"][key]["state"] == "published" and st["claims"][key]["devices"] == ["node-a/nic0"]
    brief = publisher.status(brief=True)  # what a quiescence poll asks for: counters only
    assert brief["journal_depth"] == 1 and brief["quiescent"] is False and "claims" not in brief
    text = cli_text(publisher.socket)
    assert line(text, "node") == "node-a"
    assert line(text, "journal depth") == "1"
    assert line(text, "oldest pending").startswith(f"ADD {late_cid[:12]}/eth0 age ")
    assert "not allocated" in line(text, "oldest pending")
    assert line(text, "attachments") == "1"
    assert line(text, "last error") == "-"
    assert re.search(rf"^  {re.escape(key)}\s+published\s+node-a/nic0$", text, re.M), text
    assert "recently dropped events" not in text
    assert line(text, "problems") == "-"  # an event waiting for its claim is no problem yet

    # 2. After the API refused the claim's apply (409: another manager owns a field).
    take_interface_name(cluster, claim)
    send_check(publisher, cid, pod)
    wait_status(publisher, lambda s: s["claims"][key]["state"] == "error")
    st = cli_json(publisher.socket, rc=1)
    api_error = st["claims"][key]["error"]
    assert api_error.startswith("409: ") and "conflict" in api_error.lower()
    assert st["journal_depth"] == 1  # the late ADD still waits; the refused claim is not retried
    assert st["dirty_claims"] == 0
    assert st["last_error"]["claim"] == key and st["last_error"]["error"] == api_error
    text = cli_text(publisher.socket, rc=1)
    assert line(text, "problems") == f"1 claim(s) in error: {key}"
    assert line(text, "journal depth") == "1"
    last = line(text, "last error")
    assert re.match(r"[0-9.]+s ago ", last) and key in last and "409: " in last
    assert re.search(rf"^  {re.escape(key)}\s+error\s+node-a/nic0  error: {re.escape(api_error)}$", text, re.M), text


def test_status_cli_without_a_publisher_says_so(workdir):
    out = cli(str(workdir / "absent.sock"))
    assert out.returncode == 1
    assert "cannot reach the publisher" in out.stderr and "absent.sock" in out.stderr


def test_resync_repairs_at_once_an_entry_removed_behind_the_publishers_back(cluster: Cluster, publisher, plugin):
    """No claim window and the safety net a day away (the defaults): only `resync` brings it back now."""
    claim, uid = cluster.pod_with_claim("web", [("nic", "nic0")])
    add(plugin, "c" + suffix(), PodRef(cluster.namespace, "web", uid))
    cluster.wait_devices(claim, lambda d: len(d) == 1)
    apply_as(cluster, claim, "netclaim/node-a", [])  # netclaim's own manager, applying nothing
    cluster.wait_devices(claim, lambda d: d == [])
    out = subprocess.run([str(BIN / "netclaim-publisher"), "resync", "--socket", publisher.socket],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0 and "due for verification now" in out.stdout, out.stdout + out.stderr
    [entry] = cluster.wait_devices(claim, lambda d: len(d) == 1)
    assert entry["device"] == "nic0" and entry["networkData"]["interfaceName"] == "eth0"


def test_resync_without_a_publisher_says_so(workdir):
    out = subprocess.run([str(BIN / "netclaim-publisher"), "resync", "--socket", str(workdir / "absent.sock")],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 1 and "cannot reach the publisher" in out.stderr
