"""The real chain in real network namespaces: bridge + host-local (IPv4 and
IPv6), then netclaim, run exactly as a runtime runs them (env + stdin, the
previous plugin's stdout as prevResult)."""

from __future__ import annotations

import json
import os
import stat

import pytest

from cni_plugin.wire import event as wire_event

from .conftest import Chain, run_plugin

pytestmark = pytest.mark.netns


def _sandbox(result: dict, ifname: str = "eth0") -> dict:
    return next(i for i in result["interfaces"] if i["name"] == ifname and i.get("sandbox"))


def test_report_only_add_fills_mtu_and_hands_off_to_publisher(chain: Chain, publisher) -> None:
    prev = chain.bridge_add()
    assert "mtu" not in _sandbox(prev), "the reference bridge plugin leaves mtu out; read-back fills it"
    rc, out, err = chain.netclaim("ADD", prev)
    assert rc == 0, out + err
    result = json.loads(out)
    kernel = chain.netns.link("eth0")
    assert result["cniVersion"] == "1.0.0"
    assert _sandbox(result)["mac"] == kernel["mac"]
    assert _sandbox(result)["mtu"] == kernel["mtu"] == 1500
    assert [ip["address"] for ip in result["ips"]] == [ip["address"] for ip in prev["ips"]]
    assert any(":" in ip["address"] for ip in result["ips"]) and any("." in ip["address"] for ip in result["ips"])
    assert out.strip() == json.dumps(result, separators=(",", ":")), "stdout holds the result and nothing else"
    # Acknowledged delivery: exactly one ADD event, in 1.1.0 form, with pod identity from CNI_ARGS.
    assert len(publisher.events) == 1 and chain.dirs.spooled() == []
    event = publisher.events[0]
    assert (event.op, event.container_id, event.ifname, event.driver, event.network) == (
        "ADD", chain.container_id, "eth0", "net.example.com", chain.network)
    assert event.pod == wire_event.PodRef("team-a", "web-0", "uid-123")
    assert event.result["cniVersion"] == "1.1.0"
    assert all("version" not in ip for ip in event.result["ips"])
    assert _sandbox(event.result)["mtu"] == 1500
    logs = chain.dirs.log_records()
    assert any(r["msg"] == "ADD done" and r["containerID"] == chain.container_id and r["pod"] == "team-a/web-0"
               and r["handoff"] == "acked" for r in logs)


def test_add_with_interface_setup_then_del_restores(chain: Chain, publisher) -> None:
    prev = chain.bridge_add()
    before = chain.netns.link("eth0")
    iface = {"mtu": 1400, "txQueueLen": 321, "mac": "02:aa:bb:cc:dd:ee", "altName": "pod-uplink",
             "sysctl": {"net.ipv4.conf.IFNAME.arp_filter": "1", "net.ipv6.conf.IFNAME.hop_limit": "33"}}
    rc, out, err = chain.netclaim("ADD", prev, interface=iface)
    assert rc == 0, out + err
    after = chain.netns.link("eth0")
    assert (after["mtu"], after["txqlen"], after["mac"]) == (1400, 321, "02:aa:bb:cc:dd:ee")
    assert "pod-uplink" in after["altnames"]
    assert chain.netns.read("/proc/sys/net/ipv4/conf/eth0/arp_filter") == "1"
    assert chain.netns.read("/proc/sys/net/ipv6/conf/eth0/hop_limit") == "33"
    result = json.loads(out)
    assert _sandbox(result)["mac"] == "02:aa:bb:cc:dd:ee" and _sandbox(result)["mtu"] == 1400
    state_files = os.listdir(chain.dirs.state)
    assert len(state_files) == 1
    assert stat.S_IMODE(os.stat(chain.dirs.state).st_mode) == 0o700

    # CHECK on the configured sandbox passes (prevResult is what netclaim printed).
    rc, out, err = chain.netclaim("CHECK", result, interface=iface)
    assert (rc, out) == (0, ""), out + err

    rc, out, err = chain.netclaim("DEL", result, interface=iface)
    assert (rc, out) == (0, ""), out + err
    restored = chain.netns.link("eth0")
    assert (restored["mtu"], restored["txqlen"], restored["mac"]) == (before["mtu"], before["txqlen"], before["mac"])
    assert "pod-uplink" not in restored["altnames"]
    assert chain.netns.read("/proc/sys/net/ipv4/conf/eth0/arp_filter") == "0"
    assert chain.netns.read("/proc/sys/net/ipv6/conf/eth0/hop_limit") == "64"
    assert os.listdir(chain.dirs.state) == []
    assert [e.op for e in publisher.events] == ["ADD", "CHECK", "DEL"]
    assert publisher.events[1].check_error == ""


def test_check_detects_drift_and_reports_it(chain: Chain, publisher) -> None:
    prev = chain.bridge_add()
    rc, out, _ = chain.netclaim("ADD", prev, interface={"mtu": 1450})
    assert rc == 0
    result = json.loads(out)
    # Someone changes the pod interface behind the runtime's back.
    chain.netns.ip("link", "set", "eth0", "mtu", "1300")
    v4 = next(ip["address"] for ip in result["ips"] if "." in ip["address"])
    chain.netns.ip("addr", "del", v4, "dev", "eth0")
    rc, out, err = chain.netclaim("CHECK", result, interface={"mtu": 1450})
    assert rc == 1, out + err
    error = json.loads(out)
    assert error["code"] == 100 and error["cniVersion"] == "1.0.0"
    assert "mtu is 1300, config says 1450" in error["details"]
    assert f"address {v4} is missing" in error["details"]
    check = publisher.events[-1]
    assert check.op == "CHECK" and "mtu is 1300" in check.check_error


def test_check_detects_missing_interface(chain: Chain, publisher) -> None:
    prev = chain.bridge_add()
    chain.netns.ip("link", "del", "eth0")
    rc, out, _ = chain.netclaim("CHECK", prev)
    assert rc == 1 and json.loads(out)["code"] == 100
    assert "eth0 is missing" in json.loads(out)["details"]


def test_no_publisher_spools_durably_and_add_succeeds(chain: Chain) -> None:
    prev = chain.bridge_add()
    rc, out, err = chain.netclaim("ADD", prev)
    assert rc == 0, out + err
    spooled = chain.dirs.spooled()
    assert [e.op for e in spooled] == ["ADD"]
    assert spooled[0].pod == wire_event.PodRef("team-a", "web-0", "uid-123")
    assert spooled[0].result["ips"] == json.loads(out)["ips"] or all(
        "version" not in ip for ip in spooled[0].result["ips"])
    assert stat.S_IMODE(os.stat(chain.dirs.spool).st_mode) == 0o700
    assert not [n for n in os.listdir(chain.dirs.spool) if n.endswith(".tmp")]


def test_rejecting_publisher_falls_back_to_spool(chain: Chain, publisher) -> None:
    publisher.reply_ok = False
    prev = chain.bridge_add()
    rc, out, _ = chain.netclaim("ADD", prev)
    assert rc == 0
    assert [e.op for e in chain.dirs.spooled()] == ["ADD"]


def test_hanging_publisher_times_out_into_spool(chain: Chain, publisher) -> None:
    publisher.hang = True
    prev = chain.bridge_add()
    rc, out, _ = chain.netclaim("ADD", prev, ackTimeoutMs=200)
    assert rc == 0
    assert [e.op for e in chain.dirs.spooled()] == ["ADD"]


def test_failure_policy_fail_when_neither_path_works(chain: Chain) -> None:
    prev = chain.bridge_add()
    blocker = chain.dirs.root / "not-a-dir"
    blocker.write_text("x")
    rc, out, _ = chain.netclaim("ADD", prev, failurePolicy="Fail", spoolDir=str(blocker / "spool"))
    assert rc == 1 and json.loads(out)["code"] == 11
    rc, out, _ = chain.netclaim("ADD", prev, failurePolicy="Ignore", spoolDir=str(blocker / "spool"))
    assert rc == 0 and json.loads(out)["ips"]


@pytest.mark.parametrize("version", ["0.3.0", "0.3.1", "0.4.0", "1.1.0"])
def test_every_version_round_trips_through_the_chain(plugin_exe, netns, dirs, version: str, publisher) -> None:
    chain = Chain(plugin_exe, netns, dirs, version=version)
    try:
        prev = chain.bridge_add()
        rc, out, err = chain.netclaim("ADD", prev)
        assert rc == 0, out + err
        result = json.loads(out)
        assert result["cniVersion"] == version
        if version.startswith("0."):
            assert {ip["version"] for ip in result["ips"]} == {"4", "6"}
            assert "mtu" not in _sandbox(result)
        else:
            assert _sandbox(result)["mtu"] == 1500
        assert publisher.events[-1].result["cniVersion"] == "1.1.0"
        if version != "0.3.0" and version != "0.3.1":
            assert chain.netclaim("CHECK", result)[:2] == (0, "")
        assert chain.netclaim("DEL", result)[:2] == (0, "")
    finally:
        chain.teardown()


def test_del_is_idempotent_and_tolerates_missing_everything(chain: Chain) -> None:
    prev = chain.bridge_add()
    rc, out, _ = chain.netclaim("ADD", prev, interface={"mtu": 1400})
    assert rc == 0
    # containerd: StopPodSandbox DEL (netns + prevResult), RemovePodSandbox DEL (empty netns, no prevResult).
    assert chain.netclaim("DEL", json.loads(out), interface={"mtu": 1400})[:2] == (0, "")
    assert chain.netclaim("DEL", None, netns="")[:2] == (0, "")
    assert chain.netclaim("DEL", None, netns="/run/netns/ncpl-vanished")[:2] == (0, "")
    assert [e.op for e in chain.dirs.spooled()] == ["ADD", "DEL", "DEL", "DEL"]


def test_del_with_vanished_netns_drops_state(chain: Chain) -> None:
    prev = chain.bridge_add()
    rc, out, _ = chain.netclaim("ADD", prev, interface={"txQueueLen": 77})
    assert rc == 0 and os.listdir(chain.dirs.state)
    rc, out, _ = chain.netclaim("DEL", prev, netns="/run/netns/ncpl-gone-away")
    assert (rc, out) == (0, "")
    assert os.listdir(chain.dirs.state) == []


def test_add_setup_on_missing_interface_fails_cleanly(chain: Chain) -> None:
    prev = chain.bridge_add()
    chain.ifname = "eth9"
    rc, out, _ = chain.netclaim("ADD", prev, interface={"mtu": 1400})
    chain.ifname = "eth0"
    assert rc == 1 and json.loads(out)["code"] == 101


def test_add_rejected_mtu_is_rolled_back(chain: Chain) -> None:
    """An MTU above what the bridge-side veth allows fails with the field named; nothing stays changed."""
    prev = chain.bridge_add()
    before = chain.netns.link("eth0")
    rc, out, _ = chain.netclaim("ADD", prev, interface={"txQueueLen": 55, "mtu": 65535,
                                                         "sysctl": {"net.ipv4.conf.IFNAME.no_such_knob": "1"}})
    assert rc == 1
    assert "interface.sysctl" in json.loads(out)["msg"]
    assert chain.netns.link("eth0")["txqlen"] == before["txqlen"]
    assert os.listdir(chain.dirs.state) == [] if os.path.isdir(chain.dirs.state) else True


def test_gc_removes_stale_state_and_sends_event(chain: Chain, publisher) -> None:
    prev = chain.bridge_add()
    assert chain.netclaim("ADD", prev, interface={"txQueueLen": 99})[0] == 0
    stale = os.path.join(chain.dirs.state, f"{chain.network}:oldctr:eth0.state.json")
    other = os.path.join(chain.dirs.state, "other-net:oldctr:eth0.state.json")
    for path in (stale, other):
        with open(path, "w") as fh:
            fh.write("{}")
    conf = chain.netclaim_conf(None)
    conf["cniVersion"] = "1.1.0"
    conf["cni.dev/valid-attachments"] = [{"containerID": chain.container_id, "ifname": "eth0"}]
    conf["cni.dev/attachments"] = conf["cni.dev/valid-attachments"]
    rc, out, err = run_plugin(chain.exe, "GC", conf, container_id="", ifname="")
    assert (rc, out) == (0, ""), out + err
    remaining = sorted(os.listdir(chain.dirs.state))
    assert remaining == sorted([f"{chain.network}:{chain.container_id}:eth0.state.json", os.path.basename(other)])
    gc = publisher.events[-1]
    assert gc.op == "GC" and gc.valid_attachments == [{"containerID": chain.container_id, "ifname": "eth0"}]
