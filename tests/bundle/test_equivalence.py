"""The bundle answers exactly as the source plugin does.

The same invocations go to the static executable and to the plugin run from
the source tree on the interpreter whose static library the bundle embeds
(Debian's python3.11 with `-I -S`): stdout and exit code must be byte for byte
equal, on success paths (every verb, with and without MAC/MTU read-back from a
real veth) and on error paths (malformed stdin, bad config, bad environment,
and the internal-error path that formats a traceback from frozen code).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from .conftest import DRIVER, Sandbox, cni_env

WORK = Path(tempfile.gettempdir()) / f"ncbd-equiv-{os.getpid()}"  # one path for both plugins: outputs may name it


@dataclass
class Case:
    name: str
    command: str
    stdin: bytes
    netns: bool = True
    env: dict[str, str] = field(default_factory=dict)
    args: tuple[str, ...] = ()


def _conf(sandbox: Sandbox, version: str = "1.1.0", **extra: object) -> dict:
    return {"cniVersion": version, "name": "podnet", "type": "netclaim", "driverName": DRIVER,
            "socketPath": str(WORK / "absent.sock"), "spoolDir": str(WORK / "spool"),
            "stateDir": str(WORK / "state"), "logFile": str(WORK / "plugin.log"), **extra}


def cases(sandbox: Sandbox) -> list[Case]:
    enc = lambda doc: json.dumps(doc).encode()  # noqa: E731
    prev = sandbox.prev_result()
    full = sandbox.prev_result(with_mtu=True)
    no_driver = _conf(sandbox, prevResult=prev)
    del no_driver["driverName"]
    return [
        Case("version", "VERSION", b'{"cniVersion": "1.1.0"}', netns=False),
        Case("add read-back", "ADD", enc(_conf(sandbox, prevResult=prev))),
        Case("add 1.0.0 full prevResult", "ADD", enc(_conf(sandbox, "1.0.0", prevResult=full))),
        Case("add 0.4.0", "ADD", enc(_conf(sandbox, "0.4.0", prevResult=dict(prev, cniVersion="0.4.0")))),
        Case("add no prevResult", "ADD", enc(_conf(sandbox))),
        Case("check", "CHECK", enc(_conf(sandbox, prevResult=full))),
        Case("del", "DEL", enc(_conf(sandbox, prevResult=full))),
        Case("status", "STATUS", enc(_conf(sandbox)), netns=False),
        Case("status not allowed", "STATUS", enc(_conf(sandbox, "1.0.0")), netns=False),
        Case("gc", "GC", enc(_conf(sandbox, **{"cni.dev/valid-attachments": []})), netns=False),
        Case("garbage stdin", "ADD", b"not json at all"),
        Case("truncated", "ADD", enc(_conf(sandbox, prevResult=prev))[:57]),
        Case("not utf-8", "ADD", b'{"cniVersion": "1.1.0", "name": "\xff\xfe"}'),
        Case("lone surrogate", "ADD", enc(_conf(sandbox, spoolDir="/tmp/x\ud800", prevResult=prev))),
        Case("deep nesting", "ADD", b"[" * 100000 + b"]" * 100000),
        Case("huge number", "ADD", enc(_conf(sandbox, prevResult=prev))[:-1] + b', "n": 1' + b"0" * 5000 + b"}"),
        Case("missing driverName", "ADD", enc(no_driver)),
        Case("wrong type", "ADD", enc(_conf(sandbox, driverName=7, prevResult=prev))),
        Case("no CNI_COMMAND", "", enc(_conf(sandbox))),
        Case("unknown command", "FROB", enc(_conf(sandbox))),
        Case("no netns for ADD", "ADD", enc(_conf(sandbox, prevResult=prev)), netns=False),
        Case("del of a gone netns", "DEL", enc(_conf(sandbox, prevResult=prev)),
             env={"CNI_NETNS": "/run/netns/ncbd-gone"}),
        Case("--version", "", b"", netns=False, args=("--version",)),
        Case("--help", "", b"", netns=False, args=("--help",)),
        Case("arguments a runtime never passes", "VERSION", b"{}", netns=False, args=("extra", "--x")),
    ]


def _run(exe: str, case: Case, sandbox: Sandbox, stdout_fd: int | None = None) -> tuple[int, bytes, list[dict]]:
    shutil.rmtree(WORK, ignore_errors=True)
    WORK.mkdir(mode=0o700)
    env = cni_env(case.command, netns=sandbox.path if case.netns else "")
    if not case.command:
        del env["CNI_COMMAND"]
    env.update(case.env)
    proc = subprocess.run([exe, *case.args], input=case.stdin, env=env, timeout=60,
                          stdout=stdout_fd if stdout_fd is not None else subprocess.PIPE, stderr=subprocess.PIPE)
    log = WORK / "plugin.log"
    lines = log.read_text().splitlines() if log.exists() else []
    lines += [line for line in proc.stderr.decode(errors="replace").splitlines() if line.startswith("{")]
    return proc.returncode, proc.stdout or b"", [json.loads(line) for line in lines]


def test_stdout_and_exit_code_equal_the_source_plugin(bundle: Path, source_plugin: str, sandbox: Sandbox) -> None:
    differences = []
    try:
        for case in cases(sandbox):
            want = _run(source_plugin, case, sandbox)
            got = _run(str(bundle), case, sandbox)
            if got[:2] != want[:2]:
                differences.append(f"{case.name}: source {want[:2]!r} bundle {got[:2]!r}")
            assert [r.get("msg") for r in got[2]] == [r.get("msg") for r in want[2]], case.name
    finally:
        shutil.rmtree(WORK, ignore_errors=True)
    assert not differences, "\n".join(differences)


def test_internal_error_path_formats_the_traceback_from_frozen_code(bundle: Path, source_plugin: str,
                                                                  sandbox: Sandbox) -> None:
    """A stdout the plugin cannot write to: the unexpected OSError takes the
    internal-error path (import traceback, format, log), in both forms alike."""
    case = Case("stdout not writable", "VERSION", b"{}", netns=False)
    results = []
    try:
        for exe in (source_plugin, str(bundle)):
            fd = os.open(os.devnull, os.O_RDONLY)
            try:
                results.append(_run(exe, case, sandbox, stdout_fd=fd))
            finally:
                os.close(fd)
    finally:
        shutil.rmtree(WORK, ignore_errors=True)
    (src_rc, _, src_log), (bundle_rc, _, bundle_log) = results
    assert bundle_rc == src_rc != 0
    src_err = [r for r in src_log if r.get("msg") == "internal error"]
    bundle_err = [r for r in bundle_log if r.get("msg") == "internal error"]
    assert len(bundle_err) == len(src_err) == 1
    assert bundle_err[0]["error"] == src_err[0]["error"] == "OSError(9, 'Bad file descriptor')"
    tb = bundle_err[0]["traceback"]
    assert tb.startswith("Traceback (most recent call last):") and '"<frozen cni_plugin.main>"' in tb
    assert tb.splitlines()[-1] == src_err[0]["traceback"].splitlines()[-1]


def test_a_fifo_planted_as_the_log_file_is_refused_alike_and_blocks_no_add(bundle: Path, source_plugin: str,
                                                                          sandbox: Sandbox) -> None:
    """The frozen log module opens logFile O_NONBLOCK and checks it as the source does (docs/plugin.md, "Paths")."""
    stdin = json.dumps(_conf(sandbox, prevResult=sandbox.prev_result())).encode()
    results = {}
    try:
        for name, exe in (("source", source_plugin), ("bundle", str(bundle))):
            shutil.rmtree(WORK, ignore_errors=True)
            WORK.mkdir(mode=0o700)
            os.mkfifo(WORK / "plugin.log", 0o600)
            try:
                proc = subprocess.run([exe], input=stdin, env=cni_env("ADD", netns=sandbox.path), timeout=60,
                                      capture_output=True)
            except subprocess.TimeoutExpired:
                pytest.fail(f"{name}: the ADD never completed: opening the FIFO for writing blocked it")
            refused = [json.loads(line) for line in proc.stderr.decode().splitlines()
                       if line.startswith("{") and json.loads(line)["msg"].startswith("logFile refused")]
            results[name] = (proc.returncode, proc.stdout, [r["logFileError"] for r in refused])
    finally:
        shutil.rmtree(WORK, ignore_errors=True)
    assert results["bundle"] == results["source"], results
    rc, out, errors = results["bundle"]
    assert rc == 0 and json.loads(out)["interfaces"], results
    assert len(errors) == 1 and "FIFO" in errors[0], errors
