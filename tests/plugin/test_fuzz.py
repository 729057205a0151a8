"""Hypothesis fuzz of env + stdin: every run ends with one JSON document on
stdout (or nothing, for a successful DEL/CHECK/GC/STATUS) and, on failure, a
spec error code. Code 199 (internal error) means a bug and fails the fuzz."""

from __future__ import annotations

import io
import json
import shutil
import subprocess
import tempfile

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cni_plugin.lean.errors import INTERNAL_ERROR, PLUGIN_CODES, SPEC_CODES
from cni_plugin.main import main

ALLOWED_CODES = (SPEC_CODES | PLUGIN_CODES) - {INTERNAL_ERROR}
QUIET_ON_SUCCESS = {"DEL", "CHECK", "GC", "STATUS"}

SANDBOX_DIR = tempfile.mkdtemp(prefix="ncpl-fuzz-")

json_scalars = st.none() | st.booleans() | st.integers(-(2**40), 2**40) | st.text(max_size=20) | st.floats(
    allow_nan=False, allow_infinity=False)
json_any = st.recursive(json_scalars, lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=8), c, max_size=4),
                        max_leaves=12)

versions = st.sampled_from(["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"]) | st.text(max_size=6) | json_scalars
interface_block = st.fixed_dictionaries({}, optional={
    "mtu": st.integers(0, 70000) | json_scalars,
    "mac": st.sampled_from(["02:00:00:00:00:01", "01:00:00:00:00:01", "x"]) | json_scalars,
    "txQueueLen": st.integers(-5, 5000) | json_scalars,
    "altName": st.text(max_size=20) | json_scalars,
    "up": st.booleans() | json_scalars,
    "sysctl": st.dictionaries(st.sampled_from(["net.ipv4.conf.IFNAME.arp_filter", "kernel.x", "net..x", "net"]),
                              st.text(max_size=4) | json_scalars, max_size=2) | json_scalars,
    "bogus": json_scalars,
})
prev_results = st.fixed_dictionaries({}, optional={
    "cniVersion": versions,
    "interfaces": st.lists(st.fixed_dictionaries({"name": st.sampled_from(["eth0", "cni0"]) | json_scalars},
                                                 optional={"mac": json_scalars, "sandbox": st.sampled_from(["/run/netns/ncpl-fuzz-none", ""]),
                                                           "mtu": json_scalars}), max_size=3) | json_scalars,
    "ips": st.lists(st.fixed_dictionaries({"address": st.sampled_from(["10.0.0.2/24", "fd00::2/64", "10.0.0.2"]) | json_scalars},
                                          optional={"interface": st.integers(-1, 3) | json_scalars,
                                                    "version": st.sampled_from(["4", "6"])}), max_size=3) | json_scalars,
    "routes": st.lists(st.fixed_dictionaries({}, optional={"dst": st.text(max_size=10) | json_scalars}), max_size=2) | json_scalars,
    "dns": json_any,
})
configs = st.fixed_dictionaries(
    {  # paths always point into a temp dir: the fuzz must never touch the node's real dirs
        "socketPath": st.just(f"{SANDBOX_DIR}/pub.sock"),
        "spoolDir": st.just(f"{SANDBOX_DIR}/spool"),
        "stateDir": st.just(f"{SANDBOX_DIR}/state"),
        "logFile": st.just(f"{SANDBOX_DIR}/log/p.log"),
    },
    optional={
        "cniVersion": versions,
        "name": st.sampled_from(["net", "bad name", ""]) | json_scalars,
        "type": st.just("netclaim") | json_scalars,
        "driverName": st.sampled_from(["net.example.com", "", "x" * 70]) | json_scalars,
        "request": st.text(max_size=8) | json_scalars,
        "failurePolicy": st.sampled_from(["Ignore", "Fail", "fail"]) | json_scalars,
        "ackTimeoutMs": st.integers(-1, 100) | json_scalars,
        "interface": interface_block | json_scalars,
        "prevResult": prev_results | json_scalars,
        "cni.dev/valid-attachments": st.lists(st.fixed_dictionaries({"containerID": st.text(max_size=5),
                                                                     "ifname": st.text(max_size=5)})) | json_scalars,
        "runtimeConfig": json_any,
    },
)
stdin_data = (
    configs.map(lambda c: json.dumps(c).encode())
    | json_any.map(lambda v: json.dumps(v).encode())
    | st.binary(max_size=64)
    | configs.map(lambda c: json.dumps(c).encode()[: len(json.dumps(c)) // 2])
)
envs = st.fixed_dictionaries({}, optional={
    "CNI_COMMAND": st.sampled_from(["ADD", "DEL", "CHECK", "GC", "STATUS", "VERSION", "add", ""]),
    "CNI_CONTAINERID": st.sampled_from(["ctr1", "", "bad/id"]) | st.text(max_size=10),
    "CNI_NETNS": st.sampled_from(["", "/run/netns/ncpl-fuzz-none", ".", "/dev/null"]),
    "CNI_IFNAME": st.sampled_from(["eth0", "", "x" * 20, "a b"]) | st.text(max_size=16),
    "CNI_ARGS": st.sampled_from(["", "K8S_POD_NAMESPACE=a;K8S_POD_NAME=b", "broken", "IgnoreUnknown=1;"])
    | st.text(max_size=20),
    "CNI_PATH": st.just("/nonexistent"),
})


def check_outcome(command: str, rc: int, out: str) -> None:
    assert rc in (0, 1)
    if rc == 0:
        if out == "":
            assert command in QUIET_ON_SUCCESS
            return
        document = json.loads(out)
        assert isinstance(document, dict) and "cniVersion" in document and "code" not in document
        assert out.count("\n") == 1
        return
    error = json.loads(out)
    assert set(error) == {"cniVersion", "code", "msg", "details"}, error
    assert error["code"] in ALLOWED_CODES, error
    assert isinstance(error["msg"], str) and error["msg"]


@settings(max_examples=1200, deadline=None, suppress_health_check=list(HealthCheck))
@given(env=envs, data=stdin_data)
def test_fuzz_main_in_process(env: dict, data: bytes) -> None:
    out = io.BytesIO()
    rc = main(env, io.BytesIO(data), out)
    check_outcome(env.get("CNI_COMMAND", ""), rc, out.getvalue().decode())


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(env=envs, data=stdin_data)
def test_fuzz_subprocess(plugin_exe: str, env: dict, data: bytes) -> None:
    env = {k: v for k, v in env.items() if "\x00" not in v}
    proc = subprocess.run([plugin_exe], input=data, env=env, capture_output=True, timeout=30)
    out = proc.stdout.decode()
    assert "Traceback" not in out
    check_outcome(env.get("CNI_COMMAND", ""), proc.returncode, out)


def teardown_module() -> None:
    shutil.rmtree(SANDBOX_DIR, ignore_errors=True)
