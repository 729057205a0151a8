"""the plugin's own log: "" means no log file, and a named one is bounded.

Each test runs the real plugin executable the way a runtime does. The no-file
test runs it in a private mount namespace whose /var/log is a fresh tmpfs, so
the default path the old code fell back to (/var/log/netclaim/plugin.log) is
observable without touching this machine's /var/log.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from cni_plugin.log import MAX_LOG_BYTES

from .conftest import CNI_BIN, POD_ARGS, Dirs, run_plugin
from .test_plugin_input_and_handoff_limits import prev_result

# Runs inside `unshare -m`: a tmpfs on /var/log, the plugin with cwd and HOME in
# a scratch dir, then every file found under /var/log and the scratch dir.
_PRIVATE_VAR_LOG = r"""
import json, os, subprocess, sys
exe, conf, env, scratch = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), sys.argv[4]
subprocess.run(["mount", "--make-rprivate", "/"], check=True)
subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,mode=0755", "nc-logtest", "/var/log"], check=True)
env["HOME"] = scratch
proc = subprocess.run([exe], input=conf.encode(), env=env, cwd=scratch, capture_output=True, timeout=60)
found = [os.path.join(d, f) for top in ("/var/log", scratch) for d, _, fs in os.walk(top) for f in fs]
print(json.dumps({"rc": proc.returncode, "out": proc.stdout.decode(), "err": proc.stderr.decode(), "files": found}))
"""


def run_with_private_var_log(exe: str, conf: dict) -> dict:
    scratch = tempfile.mkdtemp(prefix="ncpl-home-")
    env = {"CNI_COMMAND": "ADD", "CNI_CONTAINERID": "ctr1", "CNI_NETNS": "/run/netns/ncpl-none",
           "CNI_IFNAME": "eth0", "CNI_PATH": str(CNI_BIN), "CNI_ARGS": POD_ARGS, "PATH": os.environ.get("PATH", "")}
    try:
        proc = subprocess.run(["unshare", "--mount", "--propagation", "private", sys.executable, "-c",
                               _PRIVATE_VAR_LOG, exe, json.dumps(conf), json.dumps(env), scratch],
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        return json.loads(proc.stdout)
    finally:
        subprocess.run(["rm", "-rf", "--", scratch], check=False)


@pytest.mark.parametrize("how", ["empty string", "absent"])
def test_plugin_log_file_empty_writes_no_file(plugin_exe: str, dirs: Dirs, how: str) -> None:
    """The chart's `cni.pluginLogFile: ""` (which the chain keeper leaves out of the entry) means no file."""
    conf = dirs.conf(cniVersion="1.0.0", name="log-net", prevResult=prev_result())
    if how == "absent":
        del conf["logFile"]
    else:
        conf["logFile"] = ""
    got = run_with_private_var_log(plugin_exe, conf)
    assert got["rc"] == 0, got
    assert json.loads(got["out"])["interfaces"], "ADD still passes the result on"
    assert got["files"] == [], f"a log file was written: {got['files']}"
    assert not Path(dirs.log).exists()
    assert len(dirs.spooled()) == 1, "the event itself is spooled as usual (no publisher here)"
    # Info lines are dropped without a file; nothing but warnings/errors may reach the runtime's log.
    levels = {json.loads(line)["level"] for line in got["err"].splitlines() if line.startswith("{")}
    assert "info" not in levels, got["err"]


def _fill(path: Path, size: int, marker: str) -> None:
    path.parent.mkdir(mode=0o750, parents=True, exist_ok=True)
    line = (json.dumps({"msg": marker, "pad": "x" * 200}) + "\n").encode()
    path.write_bytes(line * (size // len(line) + 1))


def _adds(exe: str, dirs: Dirs, ids: list[str]) -> None:
    """ADDs for these container ids, all started at once (concurrent plugin runs)."""
    env_base = {"CNI_COMMAND": "ADD", "CNI_NETNS": "/run/netns/ncpl-none", "CNI_IFNAME": "eth0",
                "CNI_PATH": str(CNI_BIN), "CNI_ARGS": POD_ARGS, "PATH": os.environ.get("PATH", "")}
    conf = json.dumps(dirs.conf(cniVersion="1.0.0", name="log-net", prevResult=prev_result())).encode()
    procs = [subprocess.Popen([exe], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              env={**env_base, "CNI_CONTAINERID": cid}) for cid in ids]
    for proc in procs:
        out, err = proc.communicate(conf, timeout=120)
        assert proc.returncode == 0, (out, err)


def _containers(path: Path) -> set[str]:
    if not path.exists():
        return set()
    return {r.get("containerID", "") for r in map(json.loads, path.read_text().splitlines())} - {""}


def test_plugin_log_rotates_at_the_cap_under_concurrent_runs(plugin_exe: str, dirs: Dirs) -> None:
    log = Path(dirs.log)
    rotated = Path(dirs.log + ".1")
    _fill(log, MAX_LOG_BYTES, "old")
    first = [f"ctr-a{i}" for i in range(6)]
    _adds(plugin_exe, dirs, first)
    assert rotated.exists(), "the oversized log was rotated"
    # Rotated once, not once per run: the old content is all in .1, and no record is lost.
    assert rotated.stat().st_size >= MAX_LOG_BYTES
    assert log.stat().st_size < MAX_LOG_BYTES
    assert _containers(log) | _containers(rotated) == set(first)
    assert all(json.loads(line) for line in log.read_text().splitlines())
    # Over the cap again: .1 is replaced, never a .2; the pair stays bounded.
    _fill(log, MAX_LOG_BYTES, "older")
    _adds(plugin_exe, dirs, ["ctr-b0"])
    assert sorted(p.name for p in log.parent.iterdir()) == [log.name, rotated.name]
    assert "old" not in {r["msg"] for r in map(json.loads, rotated.read_text().splitlines())}
    assert log.stat().st_size + rotated.stat().st_size < 2 * MAX_LOG_BYTES + 64 * 1024
    assert _containers(log) == {"ctr-b0"}


def test_a_small_log_is_appended_to_not_rotated(plugin_exe: str, dirs: Dirs) -> None:
    rc, _, err = run_plugin(plugin_exe, "ADD", dirs.conf(cniVersion="1.0.0", name="log-net", prevResult=prev_result()),
                            netns="/run/netns/ncpl-none", args=POD_ARGS)
    assert rc == 0, err
    rc, _, err = run_plugin(plugin_exe, "ADD", dirs.conf(cniVersion="1.0.0", name="log-net", prevResult=prev_result()),
                            netns="/run/netns/ncpl-none", args=POD_ARGS, container_id="ctr2")
    assert rc == 0, err
    assert not Path(dirs.log + ".1").exists()
    assert _containers(Path(dirs.log)) == {"ctr1", "ctr2"}
