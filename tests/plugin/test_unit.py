"""Unit tests: env, CNI_ARGS, config validation, versions, result conversion, error codes.

The plugin starts no subprocesses (netlink and setns are done in-process), so
nothing here needs faking; in-process calls of main() use real temp dirs.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import socket
import tempfile

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cni_plugin import config
from cni_plugin.lean import jsonio
from cni_plugin.wire import results
from cni_plugin.lean.errors import CNIError
from cni_plugin.main import main


def call(command: str, conf: dict | bytes | None, **env: str) -> tuple[int, str]:
    environ = {"CNI_COMMAND": command, **env}
    data = conf if isinstance(conf, bytes) else json.dumps(conf).encode() if conf is not None else b""
    out = io.BytesIO()
    rc = main(environ, io.BytesIO(data), out)
    return rc, out.getvalue().decode()


def code_of(fn, *args) -> int:
    with pytest.raises(CNIError) as info:
        fn(*args)
    return info.value.code


# ------------------------------------------------------------------ CNI_ARGS and env


def test_cni_args_parse_in_any_order() -> None:
    a = config.parse_cni_args("IgnoreUnknown=1;K8S_POD_NAMESPACE=ns;K8S_POD_NAME=p;K8S_POD_UID=u")
    b = config.parse_cni_args("K8S_POD_UID=u;K8S_POD_NAME=p;IgnoreUnknown=1;K8S_POD_NAMESPACE=ns;")
    assert a == b and a["K8S_POD_NAME"] == "p"
    assert config.parse_cni_args("") == {}
    assert config.parse_cni_args("A=x=y")["A"] == "x=y"


@pytest.mark.parametrize("raw", ["novalue", "=v", "A=1;;broken"])
def test_malformed_cni_args_are_error_4(raw: str) -> None:
    assert code_of(config.parse_cni_args, raw) == 4


def test_pod_identity_needs_namespace_and_name() -> None:
    env = config.parse_env({"CNI_COMMAND": "DEL", "CNI_CONTAINERID": "c", "CNI_IFNAME": "eth0",
                            "CNI_ARGS": "K8S_POD_NAMESPACE=ns;K8S_POD_NAME=p"})
    assert env.pod == ("ns", "p", "")
    env = config.parse_env({"CNI_COMMAND": "DEL", "CNI_CONTAINERID": "c", "CNI_IFNAME": "eth0",
                            "CNI_ARGS": "K8S_POD_NAME=p"})
    assert env.pod is None


@pytest.mark.parametrize("environ", [
    {},
    {"CNI_COMMAND": "FROB"},
    {"CNI_COMMAND": "ADD", "CNI_CONTAINERID": "c", "CNI_IFNAME": "eth0"},  # no netns
    {"CNI_COMMAND": "DEL", "CNI_IFNAME": "eth0"},  # no container id
    {"CNI_COMMAND": "DEL", "CNI_CONTAINERID": "bad/id", "CNI_IFNAME": "eth0"},
    {"CNI_COMMAND": "DEL", "CNI_CONTAINERID": "c", "CNI_IFNAME": "a-very-long-interface-name"},
    {"CNI_COMMAND": "DEL", "CNI_CONTAINERID": "c", "CNI_IFNAME": "eth 0"},
])
def test_bad_environment_is_error_4(environ: dict) -> None:
    assert code_of(config.parse_env, environ) == 4


def test_del_needs_no_netns() -> None:
    env = config.parse_env({"CNI_COMMAND": "DEL", "CNI_CONTAINERID": "c", "CNI_IFNAME": "eth0"})
    assert env.netns == ""


# ------------------------------------------------------------------ stdin, versions, config


@pytest.mark.parametrize("data", [b"\xff\xfe", b"{", b"[1]", b"", b"{} {}", b'{"a": NaN}'])
def test_undecodable_stdin_is_error_6(data: bytes) -> None:
    assert code_of(config.decode_stdin, data) == 6


def test_unsupported_version_is_error_1_missing_is_7() -> None:
    assert code_of(config.cni_version_of, {"cniVersion": "0.2.0"}) == 1
    assert code_of(config.cni_version_of, {"cniVersion": "2.0.0"}) == 1
    assert code_of(config.cni_version_of, {}) == 7


SCRATCH = tempfile.mkdtemp(prefix="ncpl-unit-")


def teardown_module() -> None:
    shutil.rmtree(SCRATCH, ignore_errors=True)


def base(**extra) -> dict:
    """A valid ADD config whose paths all point into a temp dir (never the node's dirs)."""
    conf = {"cniVersion": "1.0.0", "name": "net", "type": "netclaim", "driverName": "net.example.com",
            "prevResult": {"interfaces": [], "ips": []}, "logFile": f"{SCRATCH}/log/p.log",
            "socketPath": f"{SCRATCH}/pub.sock", "spoolDir": f"{SCRATCH}/spool", "stateDir": f"{SCRATCH}/state"}
    conf.update(extra)
    return conf


@pytest.mark.parametrize("extra,field", [
    ({"driverName": None}, "driverName"),
    ({"driverName": 5}, "driverName"),
    ({"name": "bad name"}, "name"),
    ({"failurePolicy": "Sometimes"}, "failurePolicy"),
    ({"socketPath": "relative.sock"}, "socketPath"),
    ({"spoolDir": 7}, "spoolDir"),
    ({"ackTimeoutMs": 0}, "ackTimeoutMs"),
    ({"interface": {"mtu": 10}}, "interface.mtu"),
    ({"interface": {"mtu": "1500"}}, "interface.mtu"),
    ({"interface": {"txQueueLen": -1}}, "interface.txQueueLen"),
    ({"interface": {"mac": "01:00:5e:00:00:01"}}, "interface.mac"),
    ({"interface": {"mac": "zz:00:00:00:00:01"}}, "interface.mac"),
    ({"interface": {"up": "yes"}}, "interface.up"),
    ({"interface": {"altName": "a/b"}}, "interface.altName"),
    ({"interface": {"mtuu": 1500}}, "interface.mtuu"),
    ({"interface": {"sysctl": {"kernel.panic": "1"}}}, "interface.sysctl"),
    ({"interface": {"sysctl": {"net.ipv4.conf...IFNAME": "1"}}}, "interface.sysctl"),
    ({"interface": {"sysctl": {"net.ipv4.conf.IFNAME.x/../../../kernel": "1"}}}, "interface.sysctl"),
    ({"prevResult": None}, "prevResult"),
    ({"prevResult": []}, "prevResult"),
])
def test_invalid_config_is_error_7_naming_the_field(extra: dict, field: str) -> None:
    conf = base(**extra)
    if extra.get("driverName", 1) is None:
        del conf["driverName"]
    if "prevResult" in extra and extra["prevResult"] is None:
        del conf["prevResult"]
    rc, out = call("ADD", conf, CNI_CONTAINERID="c", CNI_NETNS="/nonexistent", CNI_IFNAME="eth0")
    error = json.loads(out)
    assert rc == 1 and error["code"] == 7, error
    assert field in error["msg"]
    assert error["cniVersion"] == "1.0.0"


def test_valid_interface_block_is_normalized() -> None:
    conf = config.parse_interface({"mtu": 9000, "mac": "02-AA-bb-cc-dd-ee", "txQueueLen": 0, "up": True,
                                   "altName": "uplink", "sysctl": {"net.ipv4.conf.IFNAME.arp_filter": 1}})
    assert conf.mac == "02:aa:bb:cc:dd:ee" and conf.sysctl == {"net.ipv4.conf.IFNAME.arp_filter": "1"}


def test_keys_multus_injects_into_every_plugin_of_a_nad_are_accepted() -> None:
    """Multus's DRA path writes the matched device's ID as `deviceID` and `pciBusID` into every plugin of a
    NetworkAttachmentDefinition's chain, netclaim's entry included (docs/multi-network.md); a NAD must not
    fail over them."""
    conf = config.parse_netconf(base(request="storage", deviceID="0000:3b:02.1", pciBusID="0000:3b:02.1"),
                                "1.0.0", "ADD")
    assert (conf.driver, conf.request) == ("net.example.com", "storage")


@pytest.mark.parametrize("command,version", [("CHECK", "0.3.1"), ("GC", "1.0.0"), ("STATUS", "0.4.0")])
def test_verbs_newer_than_the_config_version_are_error_1(command: str, version: str) -> None:
    rc, out = call(command, base(cniVersion=version), CNI_CONTAINERID="c", CNI_NETNS="/x", CNI_IFNAME="eth0")
    assert rc == 1 and json.loads(out)["code"] == 1


def test_invalid_prev_result_is_error_7() -> None:
    for prev in ({"interfaces": [{"mac": "x"}]}, {"ips": [{"address": "10.0.0.1"}]},
                 {"ips": [{"address": "10.0.0.1/8", "interface": 3}]}, {"routes": [{}]}):
        rc, out = call("ADD", base(prevResult=prev), CNI_CONTAINERID="c", CNI_NETNS="/x", CNI_IFNAME="eth0")
        assert rc == 1 and json.loads(out)["code"] == 7, out


# ------------------------------------------------------------------ results

V04 = {"cniVersion": "0.4.0",
       "interfaces": [{"name": "cni0", "mac": "aa:bb:cc:dd:ee:01"},
                      {"name": "eth0", "mac": "aa:bb:cc:dd:ee:02", "sandbox": "/run/netns/x"}],
       "ips": [{"version": "4", "address": "10.1.0.5/16", "gateway": "10.1.0.1", "interface": 1},
               {"version": "6", "address": "2001:db8::5/64", "interface": 1}],
       "routes": [{"dst": "0.0.0.0/0"}], "dns": {"nameservers": ["10.1.0.10"]}}


def test_0x_to_current_drops_ip_version_and_back_restores_it() -> None:
    current = results.to_current(V04)
    assert current["cniVersion"] == "1.1.0"
    assert all("version" not in ip for ip in current["ips"])
    current["interfaces"][1]["mtu"] = 1500
    back = results.from_current(current, "0.3.1")
    assert back["cniVersion"] == "0.3.1"
    assert [ip["version"] for ip in back["ips"]] == ["4", "6"]
    assert "mtu" not in back["interfaces"][1]
    assert {k: v for k, v in back.items() if k != "cniVersion"} == {k: v for k, v in V04.items() if k != "cniVersion"}


def test_1x_output_keeps_mtu_and_route_fields() -> None:
    current = results.to_current(V04)
    current["interfaces"][1]["mtu"] = 1400
    current["routes"][0]["mtu"] = 1300
    out = results.from_current(current, "1.0.0")
    assert out["cniVersion"] == "1.0.0" and out["interfaces"][1]["mtu"] == 1400 and out["routes"][0]["mtu"] == 1300
    assert results.from_current(current, "0.4.0")["routes"] == [{"dst": "0.0.0.0/0"}]


def test_sandbox_interface_and_its_addresses() -> None:
    current = results.to_current(V04)
    assert results.sandbox_interface(current, "eth0") == 1
    assert results.sandbox_interface(current, "cni0") is None
    assert results.addresses_for(current, 1) == ["10.1.0.5/16", "2001:db8::5/64"]
    no_index = {"interfaces": [{"name": "eth0", "sandbox": "/x"}], "ips": [{"address": "10.0.0.2/24"}]}
    assert results.addresses_for(no_index, 0) == ["10.0.0.2/24"]


# ------------------------------------------------------------------ commands through main()


def test_version_lists_every_supported_version() -> None:
    rc, out = call("VERSION", {"cniVersion": "0.4.0"})
    assert rc == 0 and json.loads(out) == {"cniVersion": "1.1.0", "supportedVersions": list(config.SUPPORTED_VERSIONS)}


def test_status_ready_with_writable_spool_and_50_without_under_fail(tmp_path) -> None:
    ok = base(cniVersion="1.1.0", spoolDir=str(tmp_path / "spool"), socketPath=str(tmp_path / "none.sock"),
              logFile=str(tmp_path / "log"), failurePolicy="Fail")
    assert call("STATUS", ok) == (0, "")
    blocker = tmp_path / "file"
    blocker.write_text("")
    bad = dict(ok, spoolDir=str(blocker / "spool"))
    rc, out = call("STATUS", bad)
    assert rc == 1 and json.loads(out)["code"] == 50
    assert call("STATUS", dict(bad, failurePolicy="Ignore")) == (0, "")
    (tmp_path / "stale.sock").write_text("")  # a stale file is not a publisher
    rc, out = call("STATUS", dict(bad, socketPath=str(tmp_path / "stale.sock")))
    assert rc == 1 and json.loads(out)["code"] == 50
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:  # a listening publisher is ready
        listener.bind(str(tmp_path / "pub.sock"))
        listener.listen(1)
        assert call("STATUS", dict(bad, socketPath=str(tmp_path / "pub.sock")))[0] == 0


def test_gc_without_attachment_list_means_none_are_valid(tmp_path) -> None:
    """libcni omits the list when called without GC args (cnitool) and sends null for an empty one."""
    conf = base(cniVersion="1.1.0", stateDir=str(tmp_path), logFile=str(tmp_path / "log"),
                spoolDir=str(tmp_path / "spool"), socketPath=str(tmp_path / "none.sock"))
    assert call("GC", conf) == (0, "")
    assert call("GC", dict(conf, **{"cni.dev/valid-attachments": None, "cni.dev/attachments": None})) == (0, "")
    rc, out = call("GC", dict(conf, **{"cni.dev/valid-attachments": "all"}))
    assert rc == 1 and json.loads(out)["code"] == 7 and "valid-attachments" in json.loads(out)["msg"]


def test_unexpected_exception_becomes_error_json_not_a_traceback(monkeypatch, tmp_path) -> None:
    from cni_plugin import commands

    def boom(*_a):
        raise RuntimeError("kaboom")

    monkeypatch.setitem(commands.COMMANDS, "GC", boom)
    conf = base(cniVersion="1.1.0", logFile=str(tmp_path / "p.log"))
    rc, out = call("GC", conf)
    error = json.loads(out)
    assert rc == 1 and error["code"] == 199 and "Traceback" not in out
    assert "Traceback" in (tmp_path / "p.log").read_text()


def test_a_bug_in_del_is_logged_and_del_still_exits_0(monkeypatch, tmp_path) -> None:
    """Node safety: even an unanticipated exception must not block the chain's DEL."""
    from cni_plugin import commands

    def boom(*_a):
        raise RuntimeError("kaboom")

    monkeypatch.setattr(commands, "cmd_del", boom)
    rc, out = call("DEL", base(logFile=str(tmp_path / "p.log")), CNI_CONTAINERID="c", CNI_IFNAME="eth0")
    assert (rc, out) == (0, "")
    assert "kaboom" in (tmp_path / "p.log").read_text()


def test_logs_never_reach_stdout(tmp_path, capfd) -> None:
    conf = base(logFile=str(tmp_path / "p.log"), spoolDir=str(tmp_path / "spool"),
                socketPath=str(tmp_path / "none.sock"), stateDir=str(tmp_path / "state"))
    rc, out = call("DEL", conf, CNI_CONTAINERID="c", CNI_IFNAME="eth0")
    assert (rc, out) == (0, "")
    assert capfd.readouterr().out == ""
    records = [json.loads(line) for line in (tmp_path / "p.log").read_text().splitlines()]
    assert records[-1]["msg"] == "DEL done" and records[-1]["containerID"] == "c"


# ------------------------------------------------------------------ lean JSON

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda children: st.lists(children, max_size=5) | st.dictionaries(st.text(), children, max_size=5),
    max_leaves=30,
)


@settings(max_examples=300, deadline=None)
@given(json_values)
def test_jsonio_agrees_with_the_json_module(value) -> None:
    text = jsonio.dumps(value)
    assert json.loads(text) == value
    assert jsonio.loads(json.dumps(value, indent=1)) == value
    assert text == json.dumps(value, separators=(",", ":"))


def test_launcher_runs_under_isolated_python(plugin_exe) -> None:
    import subprocess

    first = open(plugin_exe).readline()
    assert first.rstrip().endswith(" -IS") and os.access(plugin_exe, os.X_OK)
    proc = subprocess.run([plugin_exe], input=b"{}", env={"CNI_COMMAND": "VERSION", "PYTHONPATH": "/nonexistent"},
                          capture_output=True)
    assert proc.returncode == 0 and json.loads(proc.stdout)["supportedVersions"][-1] == "1.1.0"
