"""Grammar-based fuzz of the plugin's input: stdin and the CNI_* environment.

Every case is built from a valid invocation by ONE mutation whose spec
outcome is known in advance, so each run is checked against the exact code
the spec (and docs/plugin.md's node-safety policy) demands, not merely
"some allowed code":

  env      a CNI_* variable missing, malformed, NUL, lone surrogate  -> 4
  decode   truncation, non-UTF-8, CESU surrogates, BOM, non-object,
           NaN/Infinity, 1e400, 5000-digit ints, 5000-deep nesting,
           trailing data, random bytes                              -> 6
  version  cniVersion of a wrong type / empty -> 7; unknown -> 1;
           a verb the version predates -> 1
  field    every config field with every wrong JSON type and bad
           values (relative paths, NUL, lone surrogates, ranges)     -> 7
  valid    valid configs with random extra keys/values (unicode,
           lone-surrogate escapes, deep-but-sane nesting, big floats) -> 0
  random   random JSON documents                                      -> 6 or 7

DEL maps every config problem to exit 0 and STATUS under Ignore does too
(node-safety policy); the oracle applies that. The bulk runs main()
in-process (cheap on 2 shared cores); a sample runs the real executable.
Seeds are fixed so CI is reproducible; NETCLAIM_FUZZ_SEED picks another.
"""

from __future__ import annotations

import io
import json
import os
import random
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field

import pytest

from cni_plugin.config import SUPPORTED_VERSIONS
from cni_plugin.main import main

SEED = int(os.environ.get("NETCLAIM_FUZZ_SEED", "20261129"))
IN_PROCESS_CASES = 10_500
EXECUTABLE_CASES = 240
VERBS = ("ADD", "DEL", "CHECK", "GC", "STATUS")
QUIET = {"DEL", "CHECK", "GC", "STATUS"}
ROOT = tempfile.mkdtemp(prefix="ncfz-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)

# ------------------------------------------------------------------ the valid invocation


def prev_result(version: str) -> dict:
    ip = {"address": "10.1.0.5/24", "gateway": "10.1.0.1", "interface": 0}
    if not version.startswith("1."):
        ip["version"] = "4"
    iface = {"name": "eth0", "mac": "02:00:00:00:00:01", "sandbox": "/run/netns/ncfz-none"}
    if version.startswith("1."):
        iface["mtu"] = 1500
    return {"cniVersion": version, "interfaces": [iface], "ips": [ip], "routes": [{"dst": "0.0.0.0/0"}],
            "dns": {}}


def valid_conf(rng: random.Random, command: str) -> dict:
    minimum = {"CHECK": "0.4.0", "GC": "1.1.0", "STATUS": "1.1.0"}.get(command, "0.3.0")
    versions = [v for v in SUPPORTED_VERSIONS if tuple(map(int, v.split("."))) >= tuple(map(int, minimum.split(".")))]
    version = rng.choice(versions)
    conf = {"cniVersion": version, "name": rng.choice(["net", "pod-net.1", "a", "N_0"]), "type": "netclaim",
            "driverName": rng.choice(["net.example.com", "d", "x" * 63]),
            "socketPath": f"{ROOT}/none.sock", "spoolDir": f"{ROOT}/spool", "stateDir": f"{ROOT}/state",
            "logFile": f"{ROOT}/log/p.log", "failurePolicy": rng.choice(["Ignore", "Fail", None]),
            "prevResult": prev_result(version)}
    if conf["failurePolicy"] is None:
        del conf["failurePolicy"]
    if rng.random() < 0.3:
        conf["request"] = rng.choice(["", "nic", "r-1"])
    if rng.random() < 0.3:
        conf["ackTimeoutMs"] = rng.choice([1, 50, 60000])
    if rng.random() < 0.2:
        conf["spoolMaxFiles"] = rng.choice([1 << 20, 5000])
    if command == "GC":
        conf["cni.dev/valid-attachments"] = [{"containerID": "c1", "ifname": "eth0"}]
    if command == "DEL" and rng.random() < 0.5:
        del conf["prevResult"]
    return conf


def valid_env(rng: random.Random, command: str) -> dict:
    env = {"CNI_COMMAND": command, "CNI_PATH": rng.choice(["/opt/cni/bin", "", "/a:/b"])}
    if command in ("ADD", "DEL", "CHECK") or rng.random() < 0.3:
        env["CNI_CONTAINERID"] = rng.choice(["ctr1", "a" * 64, "A.b_c-d"])
        env["CNI_IFNAME"] = rng.choice(["eth0", "net1", "x" * 15, "\u00e9th0"[:5]])
    if command in ("ADD", "CHECK") or rng.random() < 0.3:
        env["CNI_NETNS"] = rng.choice(["/run/netns/ncfz-none", "/proc/999999999/ns/net", "/var/run/netns/\udcff"])
    env["CNI_ARGS"] = rng.choice(["", "IgnoreUnknown=1", "K8S_POD_NAMESPACE=a;K8S_POD_NAME=b;K8S_POD_UID=u",
                                  "IgnoreUnknown=1;K8S_POD_NAME=p;K8S_POD_NAMESPACE=n;", "A=x=y"])
    return env


def valid_outcome(command: str, conf: dict) -> int:
    """0, except CHECK, which must open CNI_NETNS (none exists here): container unknown."""
    return 3 if command == "CHECK" else 0


# ------------------------------------------------------------------ random JSON


def rand_string(rng: random.Random) -> str:
    pick = rng.random()
    if pick < 0.3:
        return "".join(rng.choice("abcXYZ019 _-./:") for _ in range(rng.randint(0, 12)))
    if pick < 0.5:
        return "".join(chr(rng.choice([rng.randint(0x20, 0x7E), rng.randint(0xA0, 0xD7FF),
                                       rng.randint(0xE000, 0x10FFFF)])) for _ in range(rng.randint(1, 8)))
    if pick < 0.65:
        return rng.choice(["\ud800", "a\udfffb", "\udc80", "\ud83d\ude00"])  # lone and paired surrogates
    if pick < 0.8:
        return rng.choice(["\x00", "\n\t\"\\", "\u2028", "\x7f"])
    return rng.choice(["", "null", "1", "{}", "[]"])


def rand_json(rng: random.Random, depth: int = 0, key_prefix: str = "x") -> object:
    pick = rng.random()
    if depth > 6 or pick < 0.45:
        return rng.choice([
            None, True, False, rng.randint(-10, 10), rng.randint(-(2**70), 2**70), rng.uniform(-1e300, 1e300),
            rng.choice([0.0, -0.0, 1e-320, 5e-324, 1.7976931348623157e308]), rand_string(rng)])
    if pick < 0.7:
        return [rand_json(rng, depth + 1, key_prefix) for _ in range(rng.randint(0, 4))]
    return {key_prefix + rand_string(rng): rand_json(rng, depth + 1, key_prefix) for _ in range(rng.randint(0, 4))}


def encode(doc: object) -> bytes:
    """JSON bytes without trailing whitespace; \\u escapes keep lone surrogates encodable."""
    return json.dumps(doc, ensure_ascii=True).encode()


# ------------------------------------------------------------------ cases


@dataclass
class Case:
    kind: str
    env: dict
    stdin: bytes
    expect: int  # exit 0, or the error code
    note: str = ""
    extra: dict = field(default_factory=dict)

    @property
    def command(self) -> str:
        return self.env.get("CNI_COMMAND", "")


def _policy_expect(command: str, conf: dict, code: int, mutated: str) -> int:
    """The node-safety policy over a config problem: DEL -> 0; STATUS -> 0 unless Fail."""
    if command == "DEL":
        return 0
    if command == "STATUS" and not (conf.get("failurePolicy") == "Fail" and mutated != "failurePolicy"):
        return 0
    return code


ENV_MUTATIONS = {
    "CNI_COMMAND": ["", "add", "Add", "ADD ", "DELETE", "\x00ADD", "\ud800", "VERSION\n"],
    "CNI_CONTAINERID": ["a/b", " a", "-a", ".a", "a b", "\u00e9", "a\x00", "\ud800", "a;b", "a:b"],
    "CNI_IFNAME": ["x" * 16, "\u00e9" * 8, "a/b", "a:b", "a b", ".", "..", "eth\t0", "a\x00", "\ud801", " "],
    "CNI_NETNS": ["/run/netns/\x00x", "\udbff"],
    "CNI_ARGS": ["novalue", "=v", "A=1;;broken", "K8S_POD_NAME", "A=1;=2", "a\x00=1", "K=\ud800"],
    "CNI_PATH": ["/opt\x00/bin", "\udfff"],
}
REQUIRED = {"ADD": ("CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME"), "DEL": ("CNI_CONTAINERID", "CNI_IFNAME"),
            "CHECK": ("CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME")}


def case_env(rng: random.Random) -> Case:
    command = rng.choice(VERBS + ("VERSION",))
    env = valid_env(rng, command)
    conf = valid_conf(rng, command if command != "VERSION" else "ADD")
    name = rng.choice(list(ENV_MUTATIONS) + ["missing"])
    if name == "missing":
        required = REQUIRED.get(command) or ("CNI_COMMAND",)
        var = rng.choice(required)
        if rng.random() < 0.5:
            env.pop(var, None)
        else:
            env[var] = ""
        return Case("env", env, encode(conf), 4, f"{var} missing")
    env[name] = rng.choice(ENV_MUTATIONS[name])
    return Case("env", env, encode(conf), 4, f"{name}={env[name]!r}")


def _truncate(rng: random.Random, data: bytes) -> bytes:
    return data[: rng.randint(0, len(data) - 1)]


def _insert(rng: random.Random, data: bytes, junk: bytes) -> bytes:
    at = rng.randint(0, len(data))
    return data[:at] + junk + data[at:]


def _nest(depth: int, inner: str = "1") -> bytes:
    return ('{"x":' * depth + inner + "}" * depth).encode() if depth % 2 else \
        ("[" * depth + inner + "]" * depth).encode()


def case_decode(rng: random.Random) -> Case:
    command = rng.choice(VERBS)
    env = valid_env(rng, command)
    conf = valid_conf(rng, command)
    data = encode(conf)
    how = rng.choice(["truncate", "non-utf8", "cesu", "raw-surrogate", "bom", "non-object", "nan", "huge-float",
                      "huge-int", "deep", "trailing", "empty", "garbage"])
    if how == "truncate":
        stdin = _truncate(rng, data)
    elif how == "non-utf8":
        stdin = _insert(rng, data, rng.choice([b"\xff", b"\xc3(", b"\xc0\xaf", b"\xe2\x82", b"\xf8\x88\x80\x80\x80",
                                               b"\x80"]))
    elif how == "cesu":
        stdin = data[:-1] + b',"k":"\xed\xa0\x80"}'  # a UTF-16 surrogate encoded as UTF-8: invalid
    elif how == "raw-surrogate":
        stdin = data[:-1] + ',"k":"\ud800"}'.encode("utf-8", "surrogatepass")
    elif how == "bom":
        stdin = b"\xef\xbb\xbf" + data
    elif how == "non-object":
        stdin = encode(rng.choice([[conf], "conf", 1, 1.5, True, None, [], rand_string(rng)]))
    elif how == "nan":
        stdin = data[:-1] + rng.choice([b',"k":NaN}', b',"k":Infinity}', b',"k":-Infinity}', b',"k":nan}'])
    elif how == "huge-float":
        stdin = data[:-1] + rng.choice([b',"k":1e400}', b',"k":-1e999}', b',"k":[1E+309]}', b',"k":123456789e301}'])
    elif how == "huge-int":
        stdin = data[:-1] + b',"k":' + b"9" * rng.randint(4301, 20000) + b"}"
    elif how == "deep":
        stdin = data[:-1] + b',"k":' + _nest(rng.randint(5000, 50000)) + b"}"
    elif how == "trailing":
        stdin = data + rng.choice([b"x", b"{}", b" 1", b",", b"]", b"\x00"])
    elif how == "empty":
        stdin = rng.choice([b"", b" ", b"\n\t\r ", b"\x00"])
    else:
        stdin = bytes(rng.randint(0, 255) for _ in range(rng.randint(1, 40)))
        if _decodes_to_object(stdin):
            stdin = b"{" + stdin
    return Case("decode", env, stdin, 6, how)


def _decodes_to_object(data: bytes) -> bool:
    try:
        return isinstance(json.loads(data.decode("utf-8")), dict)
    except (UnicodeDecodeError, ValueError, RecursionError):
        return False


WRONG_TYPES = {  # field -> values of a wrong JSON type (null is "absent" for optional fields)
    "string": [1, 1.5, True, False, [], ["a"], {}, {"a": "b"}],
    "int": ["1", "1500", 1.5, 1e3, True, False, [], {}, [1]],
    "bool": ["true", 1, 0, [], {}, "yes"],
    "object": ["x", 1, True, [], [{}]],
    "list": ["x", 1, True, {}],
}
BAD_VALUES = {
    "name": ["", "bad name", "-a", "a/b", "\u00e9", "a\x00", None],
    "driverName": ["", "x" * 64, "a\x00b", "\ud800", None],
    "request": ["a\x00", "\udfff"],
    "socketPath": ["", "relative.sock", "./x", "/a\x00b", "/\ud800"],
    "spoolDir": ["relative", "/a\x00", "/\udc00x"],
    "stateDir": ["state", "/x\x00"],
    "logFile": ["p.log", "/l\x00g", "/\ud800.log"],
    "failurePolicy": ["", "fail", "Ignore ", "Sometimes", 0, True, [], {}],
    "ackTimeoutMs": [0, -1, 60001, 2**63, -(2**63)],
    "spoolMaxFiles": [0, -5, (1 << 24) + 1],
    "spoolMaxBytes": [0, 4095, (1 << 40) + 1],
    "prevResult": [[], "x", 1, True, {"interfaces": "x"}, {"interfaces": [1]}, {"ips": [{"address": "10.0.0.1"}]},
                   {"ips": [{"address": 5}]}, {"interfaces": [{"name": 1}]}, {"routes": [{}]}, {"dns": []},
                   {"interfaces": [{"name": "eth0", "mtu": -1}]}, {"ips": [{"address": "1/2", "interface": 3}]}],
    "interface.mtu": [0, 67, 65536, -1],
    "interface.txQueueLen": [-1, 2**31],
    "interface.mac": ["x", "01:00:00:00:00:01", "00:00:00:00:00:00", "02:00:00:00:00", "02:00:00:00:00:0g",
                      "02-00-00-00-00-01-02", "\ud800"],
    "interface.altName": ["", "a/b", "a b", "x" * 128, ".", "\ud800", "a\x00"],
    "interface.sysctl": [{"kernel.panic": "1"}, {"net": "1"}, {"net..x": "1"}, {"net.a/b": "1"},
                         {"net.ipv4.conf.IFNAME.x": "a\nb"}, {"net.ipv4.conf.IFNAME.x": True},
                         {"net.ipv4.conf.IFNAME.x": 1.5}, {"net.ipv4.conf.IFNAME.x": None},
                         {"net.ipv4.\ud800": "1"}, {"net.ipv4.x": "\ud800"}, {"net.x.. ": "1"}],
    "interface.bogus": [1, "x", None],
    "interface": [],
}
FIELD_TYPES = {
    "name": "string", "type": "string", "driverName": "string", "request": "string", "socketPath": "string",
    "spoolDir": "string", "stateDir": "string", "logFile": "string", "failurePolicy": "string",
    "ackTimeoutMs": "int", "spoolMaxFiles": "int", "spoolMaxBytes": "int", "interface": "object",
    "prevResult": "object", "interface.mtu": "int", "interface.txQueueLen": "int", "interface.mac": "string",
    "interface.altName": "string", "interface.up": "bool", "interface.sysctl": "object",
}


def case_field(rng: random.Random) -> Case:
    command = rng.choice(("ADD", "ADD", "DEL", "CHECK", "GC", "STATUS"))
    env = valid_env(rng, command)
    conf = valid_conf(rng, command)
    pool = [(f, v) for f, kind in FIELD_TYPES.items() for v in WRONG_TYPES[kind]]
    pool += [(f, v) for f, values in BAD_VALUES.items() for v in values]
    if command == "GC":
        pool += [("cni.dev/valid-attachments", v) for v in ("x", 1, {}, [1], [{"containerID": 1, "ifname": "a"}],
                                                             [{"containerID": "a"}])]
    name, value = rng.choice(pool)
    if name == "prevResult" and command in ("DEL", "GC", "STATUS") and isinstance(value, dict):
        value = []  # only ADD/CHECK look inside prevResult; a non-object is refused by every verb
    if name.startswith("interface."):
        conf["interface"] = {name.split(".", 1)[1]: value}
    else:
        conf[name] = value
    if name == "type" and value is None:
        return Case("field", env, encode(conf), valid_outcome(command, conf), "type null is absent")
    expect = _policy_expect(command, conf, 7, name)
    return Case("field", env, encode(conf), expect, f"{name}={value!r}"[:80])


def case_version(rng: random.Random) -> Case:
    command = rng.choice(VERBS)
    env = valid_env(rng, command)
    conf = valid_conf(rng, command)
    pick = rng.random()
    if pick < 0.35:
        conf["cniVersion"] = rng.choice([None, 1, 1.0, True, [], {}, ["1.0.0"], ""])
        if conf["cniVersion"] is None and rng.random() < 0.5:
            del conf["cniVersion"]
        expect = _policy_expect(command, conf, 7, "cniVersion")
    elif pick < 0.7:
        conf["cniVersion"] = rng.choice(["0.1.0", "0.2.0", "1.2.0", "2.0.0", "1.0", "v1.0.0", " 1.0.0", "1.0.0\n",
                                         "1.1.0-rc1", "\ud800", "1.0.0\x00"])
        expect = _policy_expect(command, conf, 1, "cniVersion")
    else:  # a verb the config's version predates: the caller's protocol error, every verb but DEL
        old = {"CHECK": ["0.3.0", "0.3.1"], "GC": ["0.4.0", "1.0.0"], "STATUS": ["0.3.1", "1.0.0"]}
        command = rng.choice(list(old))
        env = valid_env(rng, command)
        conf = valid_conf(rng, command)
        conf["cniVersion"] = rng.choice(old[command])
        conf["prevResult"] = prev_result(conf["cniVersion"])
        expect = 1
    return Case("version", env, encode(conf), expect, repr(conf.get("cniVersion", "<absent>")))


def case_valid(rng: random.Random) -> Case:
    command = rng.choice(VERBS + ("VERSION",))
    env = valid_env(rng, command)
    conf = valid_conf(rng, command if command != "VERSION" else "ADD")
    for _ in range(rng.randint(0, 4)):
        conf[rng.choice(["runtimeConfig", "args", "capabilities", "x-other", "ipam", "\u00fcber", "\ud800"])] = \
            rand_json(rng)
    if rng.random() < 0.2:
        conf["runtimeConfig"] = json.loads(_nest(rng.randint(1, 40)))
    if "prevResult" in conf and rng.random() < 0.2:
        conf["prevResult"]["dns"] = {"nameservers": ["10.0.0.10"], "search": [rand_string(rng)],
                                     "x": rand_json(rng)}
    expect = 0 if command == "VERSION" else valid_outcome(command, conf)
    return Case("valid", env, encode(conf), expect, "")


def case_random(rng: random.Random) -> Case:
    command = rng.choice(VERBS)
    env = valid_env(rng, command)
    doc = rand_json(rng, depth=rng.randint(0, 3))
    if isinstance(doc, dict):
        # Keys all start with "x": never a real field, so cniVersion is missing -> 7 (policy applies).
        return Case("random", env, encode(doc), _policy_expect(command, doc, 7, ""), "random object")
    return Case("random", env, encode(doc), 6, "random non-object")


GENERATORS = ((case_env, 14), (case_decode, 22), (case_version, 12), (case_field, 30), (case_valid, 14),
              (case_random, 8))


def cases(seed: int, n: int) -> list[Case]:
    rng = random.Random(seed)
    makers = [g for g, weight in GENERATORS for _ in range(weight)]
    return [rng.choice(makers)(rng) for _ in range(n)]


# ------------------------------------------------------------------ the oracle


def check(case: Case, rc: int, out: bytes) -> None:
    where = f"{case.kind} {case.command} ({case.note}) stdin={case.stdin[:120]!r} env={case.env!r}"
    text = out.decode()
    if case.expect == 0:
        assert rc == 0, f"want exit 0, got {text!r}: {where}"
        if case.command in QUIET:
            assert text == "", where
        else:
            doc = json.loads(text)
            assert isinstance(doc, dict) and "code" not in doc and doc.get("cniVersion") in SUPPORTED_VERSIONS, where
            assert text.count("\n") == 1 and text.endswith("\n"), where
        return
    assert rc == 1, f"want error {case.expect}, got exit {rc} {text!r}: {where}"
    error = json.loads(text)
    assert set(error) == {"cniVersion", "code", "msg", "details"}, where
    assert error["code"] == case.expect, f"want {case.expect}, got {error}: {where}"
    assert error["cniVersion"] in SUPPORTED_VERSIONS and isinstance(error["msg"], str) and error["msg"], where


def run_in_process(case: Case) -> tuple[int, bytes]:
    out = io.BytesIO()
    rc = main(dict(case.env), io.BytesIO(case.stdin), out)
    return rc, out.getvalue()


def _reset_dirs() -> None:
    for sub in ("spool", "state", "log"):
        shutil.rmtree(os.path.join(ROOT, sub), ignore_errors=True)


# ------------------------------------------------------------------ the runs


def test_grammar_fuzz_in_process() -> None:
    failures = []
    kinds: dict[str, int] = {}
    for i, case in enumerate(cases(SEED, IN_PROCESS_CASES)):
        if i % 500 == 0:
            _reset_dirs()  # keep the spool far from its cap: the oracle assumes it has room
        kinds[case.kind] = kinds.get(case.kind, 0) + 1
        try:
            check(case, *run_in_process(case))
        except AssertionError as exc:
            failures.append(str(exc)[:600])
    assert sum(kinds.values()) >= 10_000 and all(kinds.get(k, 0) > 500 for k in
                                                  ("env", "decode", "version", "field", "valid", "random")), kinds
    assert not failures, f"{len(failures)} of {IN_PROCESS_CASES} cases failed; first ones:\n" + "\n".join(failures[:8])


def _exec_env(env: dict) -> dict | None:
    """The env as an exec can carry it: no NUL, every value encodable (lone surrogates cannot)."""
    try:
        return {k: v for k, v in env.items() if not os.fsencode(v).count(b"\0")}
    except UnicodeEncodeError:
        return None


def test_grammar_fuzz_through_the_executable(plugin_exe: str) -> None:
    _reset_dirs()
    picked = [c for c in cases(SEED + 1, EXECUTABLE_CASES * 2) if _exec_env(c.env) == c.env][:EXECUTABLE_CASES]
    assert len(picked) >= 200
    failures = []
    for case in picked:
        proc = subprocess.run([plugin_exe], input=case.stdin, env=case.env, capture_output=True, timeout=60)
        assert b"Traceback" not in proc.stdout
        try:
            check(case, proc.returncode, proc.stdout)
        except AssertionError as exc:
            failures.append(str(exc)[:600])
    assert not failures, f"{len(failures)} failed:\n" + "\n".join(failures[:8])


def teardown_module() -> None:
    shutil.rmtree(ROOT, ignore_errors=True)


# ------------------------------------------------------------------ regressions the fuzz found (named, kept)

ADD_ENV = {"CNI_COMMAND": "ADD", "CNI_CONTAINERID": "c", "CNI_NETNS": "/run/netns/ncfz-none", "CNI_IFNAME": "eth0"}


def _conf_bytes(**extra: object) -> bytes:
    conf = valid_conf(random.Random(0), "ADD")
    conf.update(extra)
    return encode(conf)


@pytest.mark.parametrize("stdin", [
    pytest.param(b'{"cniVersion": "1.0.0", "name": "abc', id="unterminated-string-was-SystemError"),
    pytest.param(b'{"cniVersion" "1.0.0"}', id="missing-colon-was-SystemError"),
    pytest.param(b'{"cniVersion": "\\u12"}', id="short-unicode-escape-was-SystemError"),
    pytest.param(b'{"a": "\\x"}', id="invalid-escape-was-SystemError"),
    pytest.param(b"{", id="lone-brace-was-SystemError"),
    pytest.param(b'{"a": [1 2]}', id="missing-comma-was-SystemError"),
    pytest.param(b'{"a": 1,}', id="trailing-comma"),
    pytest.param(b'{"a": "\t"}', id="control-char-in-string-was-SystemError"),
])
def test_regression_scanner_failures_are_error_6_not_199(stdin: bytes) -> None:
    case = Case("regression", dict(ADD_ENV), stdin, 6)
    check(case, *run_in_process(case))


@pytest.mark.parametrize("number", [b"1e400", b"-1e999", b"1E+309"])
def test_regression_float_overflow_is_error_6_not_199(number: bytes) -> None:
    """1e400 decoded to inf, which the encoder then refused: error 199 on output."""
    stdin = _conf_bytes()[:-1] + b',"prevResult":{"interfaces":[],"ips":[],"dns":{"x":' + number + b"}}}"
    case = Case("regression", dict(ADD_ENV), stdin, 6)
    check(case, *run_in_process(case))


@pytest.mark.parametrize("field,value", [
    ("socketPath", "/\ud800"), ("spoolDir", "/\udc00x"), ("logFile", "/\ud800.log"), ("driverName", "\ud800"),
])
def test_regression_lone_surrogate_in_a_path_is_error_7_not_199(field: str, value: str) -> None:
    """A JSON \\ud800 escape decodes to a str no OS call can encode."""
    case = Case("regression", dict(ADD_ENV), _conf_bytes(**{field: value}), 7)
    check(case, *run_in_process(case))


@pytest.mark.parametrize("var,value,command", [
    ("CNI_NETNS", "/run/netns/\x00x", "ADD"), ("CNI_NETNS", "\udbff", "DEL"), ("CNI_PATH", "\udfff", "ADD"),
    ("CNI_IFNAME", "\ud801", "DEL"), ("CNI_ARGS", "K=\ud800", "ADD"),
])
def test_regression_unencodable_env_is_error_4_not_199(var: str, value: str, command: str) -> None:
    env = dict(ADD_ENV, CNI_COMMAND=command, **{var: value})
    case = Case("regression", env, _conf_bytes(), 4)
    check(case, *run_in_process(case))


def test_regression_surrogateescaped_ifname_reaches_netlink_encoded() -> None:
    """A non-UTF-8 CNI_IFNAME arrives as \\udcXX (surrogateescape): valid, and
    must not crash the netlink encoder. No such link exists: the read-back
    failure is only logged on a report-only ADD."""
    env = dict(ADD_ENV, CNI_IFNAME="eth\udcff")
    prev = {"cniVersion": "1.0.0", "interfaces": [{"name": "eth\udcff", "sandbox": "/run/netns/x"}], "ips": []}
    case = Case("regression", env, _conf_bytes(cniVersion="1.0.0", prevResult=prev), 0)
    check(case, *run_in_process(case))


def test_regression_failure_policy_null_means_absent() -> None:
    case = Case("regression", dict(ADD_ENV), _conf_bytes(failurePolicy=None), 0)
    check(case, *run_in_process(case))
