"""conf/systemd/netclaim-publisher.service: valid, locked down, and the layout it deploys.

There is no systemd running here (PID 1 is not systemd), so:
- systemd's own `systemd-analyze verify` and `security --offline` judge the
  unit file (syntax, and the exposure score of its sandboxing);
- the publisher is then started the way the unit starts it: the directories
  systemd would create with the unit's modes, the unit's UMask, and the
  unit's ExecStart command line (paths moved under a temp root). What is
  checked is what an operator would see on the node: a 0600 socket in 0700
  directories that a non-root process cannot connect to.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import socket
import stat
import subprocess
import time
from pathlib import Path

import pytest

from deploylib import CONF, DRIVER, REPO, netclaim_publisher_bin, parse_unit, python_env, run_install, terminate
from runtime.realcluster import free_port, wait_until  # noqa: E402 (deploylib puts the harness on the path)
from cni_plugin.wire.frame import encode_frame, read_frame
from peers import run_as_uid

UNIT = CONF / "systemd" / "netclaim-publisher.service"
SHIPPED_BIN = "/opt/netclaim/venv/bin/netclaim-publisher"
MAX_EXPOSURE = 2.5


def local_unit(tmp: Path) -> Path:
    """The shipped unit with ExecStart pointing at this checkout's publisher."""
    text = UNIT.read_text().replace(SHIPPED_BIN, str(netclaim_publisher_bin()))
    out = tmp / UNIT.name
    out.write_text(text)
    return out


def test_unit_passes_systemd_verify(tmp_root: Path) -> None:
    proc = subprocess.run(["systemd-analyze", "verify", str(local_unit(tmp_root))],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr


def exposure(unit: Path) -> float:
    proc = subprocess.run(["systemd-analyze", "security", "--offline=yes", str(unit)],
                          capture_output=True, text=True, timeout=60)
    match = re.search(r"Overall exposure level for \S+: (\d+\.\d+)", proc.stdout)
    assert match, proc.stdout + proc.stderr
    return float(match.group(1))


def test_unit_sandboxing_exposure_is_low(tmp_root: Path) -> None:
    bare = tmp_root / "bare.service"
    bare.write_text(f"[Service]\nExecStart={netclaim_publisher_bin()} run\n")
    assert exposure(bare) > 9, "systemd-analyze no longer scores an unconfined unit as exposed"
    score = exposure(local_unit(tmp_root))
    assert score <= MAX_EXPOSURE, f"exposure {score} > {MAX_EXPOSURE}"


def test_unit_holds_no_capabilities_and_private_directories() -> None:
    service = parse_unit(UNIT)["Service"]
    assert service["CapabilityBoundingSet"] == [""]
    assert service["NoNewPrivileges"] == ["yes"]
    assert service["UMask"] == ["0077"]
    assert service["RuntimeDirectoryMode"] == ["0700"]
    assert service["StateDirectoryMode"] == ["0700"]
    assert service["ProtectSystem"] == ["strict"]
    assert "AF_NETLINK" not in service["RestrictAddressFamilies"][0]


def unit_argv(root: Path, metrics_port: int) -> tuple[list[str], dict[str, Path]]:
    """ExecStart as systemd would expand it, with the node paths moved under `root`."""
    service = parse_unit(UNIT)["Service"]
    env = {}
    for assignment in service["Environment"]:
        key, _, value = assignment.partition("=")
        env[key] = value.replace("%H", "node-a")
    command = service["ExecStart"][0]
    command = command.replace("${NETCLAIM_NODE_NAME}", env["NETCLAIM_NODE_NAME"])
    command = command.replace("$NETCLAIM_ARGS", env["NETCLAIM_ARGS"])
    dirs = {
        "/run/netclaim": root / "run" / "netclaim",
        "/var/lib/netclaim": root / "var" / "lib" / "netclaim",
        "/etc/netclaim": root / "etc" / "netclaim",
    }
    argv = shlex.split(command)
    argv[0] = str(netclaim_publisher_bin())
    for i, arg in enumerate(argv):
        for node_path, moved in dirs.items():
            if arg.startswith(node_path):
                argv[i] = str(moved) + arg[len(node_path):]
        if arg == "127.0.0.1:9464":
            argv[i] = f"127.0.0.1:{metrics_port}"
    return argv, dirs


def systemd_directories(root: Path, dirs: dict[str, Path]) -> None:
    """What systemd does before ExecStart for RuntimeDirectory=/StateDirectory=/ConfigurationDirectory=."""
    service = parse_unit(UNIT)["Service"]
    plan = {
        "RuntimeDirectory": (root / "run", service["RuntimeDirectoryMode"][0]),
        "StateDirectory": (root / "var" / "lib", service["StateDirectoryMode"][0]),
        "ConfigurationDirectory": (root / "etc", service["ConfigurationDirectoryMode"][0]),
    }
    for key, (base, mode) in plan.items():
        for name in service[key][0].split():
            path = base / name
            path.mkdir(parents=True, exist_ok=True)
            os.chmod(path, int(mode, 8))
    (root / "run").chmod(0o755)
    (root / "var").chmod(0o755)
    (root / "var" / "lib").chmod(0o755)
    (root / "etc").chmod(0o755)
    root.chmod(0o755)  # like / on a node: others may traverse it


def connect_as(uid: int, path: str) -> str:
    """Connect to the socket from a child process running as `uid`; returns the outcome."""

    def attempt() -> str:
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                sock.settimeout(5)
                sock.connect(path)
                sock.sendall(encode_frame({"kind": "status"}))
                reply = read_frame(sock)
                return "ok" if reply.get("ok") else f"refused-by-server: {reply.get('error')}"
        except PermissionError:
            return "EACCES"
        except (OSError, EOFError) as exc:
            return f"error: {type(exc).__name__}: {exc}"

    return run_as_uid(uid, attempt)


@pytest.fixture()
def unit_started(tmp_root: Path):
    """The publisher as netclaim-publisher.service would run it."""
    port = free_port()
    argv, dirs = unit_argv(tmp_root, port)
    systemd_directories(tmp_root, dirs)
    # A kubeconfig an operator would put in /etc/netclaim; the API is not
    # needed for the socket layout, so it points at a closed port.
    kubeconfig = dirs["/etc/netclaim"] / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster: {server: 'https://127.0.0.1:1'}\n"
        "users:\n- name: u\n  user: {token: unused}\ncontexts:\n- name: x\n  context: {cluster: c, user: u}\n"
        "current-context: x\n"
    )
    os.chmod(kubeconfig, 0o600)
    service = parse_unit(UNIT)["Service"]
    umask = int(service["UMask"][0], 8)
    log = (tmp_root / "publisher.log").open("w")
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=python_env(), cwd="/",
                            preexec_fn=lambda: os.umask(umask))
    sock = Path(argv[argv.index("--socket") + 1])
    try:
        deadline = time.monotonic() + 30
        while not sock.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"the publisher did not create {sock}:\n{(tmp_root / 'publisher.log').read_text()}")
            time.sleep(0.1)
        yield {"socket": sock, "dirs": dirs, "root": tmp_root}
    finally:
        terminate(proc)
        log.close()


def test_deployed_layout_is_root_only(unit_started) -> None:
    sock: Path = unit_started["socket"]
    state = unit_started["dirs"]["/var/lib/netclaim"]
    assert stat.S_ISSOCK(sock.stat().st_mode)
    assert stat.S_IMODE(sock.stat().st_mode) == 0o600
    assert sock.stat().st_uid == 0
    for d in (sock.parent, state, state / "publisher", state / "spool"):
        assert stat.S_IMODE(d.stat().st_mode) == 0o700, d
    journal_files = [p for p in (state / "publisher").rglob("*") if p.is_file()]
    assert journal_files, "the publisher wrote no journal under its state dir"
    for f in journal_files:
        assert stat.S_IMODE(f.stat().st_mode) & 0o077 == 0, f


def test_non_root_client_is_refused_root_is_served(unit_started) -> None:
    path = str(unit_started["socket"])
    assert connect_as(65534, path) == "EACCES"
    assert connect_as(0, path) == "ok"


def unchained_check(sock: str) -> dict:
    """What the publisher's `status` answer says of its unchained check: the drivers, or why it is off."""
    from publisher.cli import request_status

    return request_status(sock)["unchained_check"]


def looked_for(sock: str) -> list[str]:
    return unchained_check(sock)["driver_names"]


def test_the_unit_looks_for_every_driver_the_installer_records(unit_started) -> None:
    """A node installed with scripts/install.sh: the publisher knows its drivers only from the file the
    installer writes and the unit names (--drivers-file /etc/netclaim/drivers). Started before any install,
    it says once that pods started without netclaim in their chain are not reported; then it looks for the
    driver of every network installed (so such a pod of any of them gets its NetclaimNotChained Event),
    without a restart, and the uninstall of one network takes that network's driver away only."""
    root: Path = unit_started["root"]
    sock = str(unit_started["socket"])
    log = root / "publisher.log"
    wait_until(lambda: "unchained check is off" in log.read_text(), "the publisher to say its check is off")
    assert sum("unchained check is off" in line for line in log.read_text().splitlines()) == 1
    assert "names none yet" in unchained_check(sock)["off_reason"]

    net_d = root / "etc" / "cni" / "net.d"
    net_d.mkdir(parents=True)
    for name in ("10-podnet", "20-storage"):
        (net_d / f"{name}.conflist").write_text(json.dumps(
            {"cniVersion": "1.0.0", "name": name, "plugins": [{"type": "bridge", "bridge": f"br-{name[3:]}"}]}))
    on_node = ("--host-root", str(root), "--cni-bin-dir", "/opt/cni/bin")
    run_install(*on_node, "--conflist", "/etc/cni/net.d/10-podnet.conflist", "--driver-name", DRIVER)
    run_install(*on_node, "--conflist", "/etc/cni/net.d/20-storage.conflist", "--driver-name", "storage.example.com",
                "--request", "storage")

    wait_until(lambda: looked_for(sock) == [DRIVER, "storage.example.com"], "both networks' drivers", timeout=60)
    shown = subprocess.run([str(netclaim_publisher_bin()), "status", "--socket", sock], env=python_env(), check=False,
                           capture_output=True, text=True, timeout=60)
    assert f"unchained check: {DRIVER}, storage.example.com" in shown.stdout.splitlines(), shown.stdout

    run_install(*on_node, "--conflist", "/etc/cni/net.d/10-podnet.conflist", "--uninstall")
    wait_until(lambda: looked_for(sock) == ["storage.example.com"], "only the remaining network's driver",
               timeout=60)
    run_install(*on_node, "--conflist", "/etc/cni/net.d/20-storage.conflist", "--uninstall")
    wait_until(lambda: looked_for(sock) == [], "no driver once every network is uninstalled", timeout=60)


def test_unit_file_paths_match_the_plugin_defaults() -> None:
    """The unit serves the socket and spool the plugin uses when the conflist says nothing."""
    from cni_plugin.wire import frame as wire_frame
    from cni_plugin.wire import spool as wire_spool

    command = parse_unit(UNIT)["Service"]["ExecStart"][0]
    assert f"--socket {wire_frame.DEFAULT_SOCKET}" in command
    assert f"--spool-dir {wire_spool.DEFAULT_SPOOL_DIR}" in command
    assert shutil.which("systemd-analyze"), "systemd-analyze is needed by these tests"
    assert REPO.joinpath("docs", "install.md").exists()
