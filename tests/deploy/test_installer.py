"""scripts/install.sh against a temp CNI bin dir and conflist, as an operator runs it.

What an operator notices: the plugin is chained last exactly once, re-running
changes nothing twice, uninstall gives the original file back, and a broken
conflist is refused without being touched.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
from pathlib import Path

from deploylib import CONF, DRIVER, REPO, VENV_PYTHON, run_install

BASE = {
    "cniVersion": "1.0.0",
    "name": "podnet",
    "plugins": [
        {"type": "bridge", "bridge": "cni0", "ipam": {"type": "host-local", "subnet": "10.22.0.0/16"}},
        {"type": "portmap", "capabilities": {"portMappings": True}},
    ],
}


def write_base(root: Path) -> Path:
    conflist = root / "net.d" / "10-podnet.conflist"
    conflist.parent.mkdir()
    # Formatting an operator might use (tabs, key order): restored byte for byte.
    conflist.write_text(json.dumps(BASE, indent="\t", sort_keys=True) + "\n")
    return conflist


def install_args(root: Path, conflist: Path, *extra: str) -> list[str]:
    return [
        "--cni-bin-dir", str(root / "bin"),
        "--conflist", str(conflist),
        "--driver-name", DRIVER,
        "--socket", str(root / "run" / "netclaim" / "publisher.sock"),
        "--spool-dir", str(root / "state" / "spool"),
        "--state-dir", str(root / "state"),
        *extra,
    ]


def netclaim_entries(conflist: Path) -> list[dict]:
    return [p for p in json.loads(conflist.read_text())["plugins"] if p["type"] == "netclaim"]


def test_install_chains_netclaim_last_and_writes_an_executable_launcher(tmp_root: Path) -> None:
    conflist = write_base(tmp_root)
    original = conflist.read_bytes()

    run_install(*install_args(tmp_root, conflist, "--request", "nic", "--failure-policy", "Fail",
                              "--log-file", str(tmp_root / "plugin.log")))

    doc = json.loads(conflist.read_text())
    assert [p["type"] for p in doc["plugins"]] == ["bridge", "portmap", "netclaim"]
    assert doc["plugins"][-1] == {
        "type": "netclaim",
        "driverName": DRIVER,
        "request": "nic",
        "socketPath": str(tmp_root / "run" / "netclaim" / "publisher.sock"),
        "spoolDir": str(tmp_root / "state" / "spool"),
        "failurePolicy": "Fail",
        "logFile": str(tmp_root / "plugin.log"),
    }
    assert doc["plugins"][:2] == BASE["plugins"]
    assert (conflist.parent / (conflist.name + ".netclaim.bak")).read_bytes() == original

    launcher = tmp_root / "bin" / "netclaim"
    assert stat.S_IMODE(launcher.stat().st_mode) == 0o755
    text = launcher.read_text()
    assert text.startswith(f"#!{VENV_PYTHON} -IS\n")
    assert f"sys.path.insert(0, {str(REPO)!r})" in text

    # The private directories the plugin and publisher share are root-only.
    for d in (tmp_root / "run" / "netclaim", tmp_root / "state", tmp_root / "state" / "spool"):
        assert stat.S_IMODE(d.stat().st_mode) == 0o700, d


def test_reinstall_updates_in_place_without_duplicates(tmp_root: Path) -> None:
    conflist = write_base(tmp_root)
    original = conflist.read_bytes()
    run_install(*install_args(tmp_root, conflist, "--request", "nic"))
    first = conflist.read_bytes()
    first_mtime = conflist.stat().st_mtime_ns

    run_install(*install_args(tmp_root, conflist, "--request", "nic"))
    assert conflist.read_bytes() == first
    assert conflist.stat().st_mtime_ns == first_mtime, "an identical re-install rewrote the file"

    run_install(*install_args(tmp_root, conflist, "--request", "data"))
    entries = netclaim_entries(conflist)
    assert len(entries) == 1 and entries[0]["request"] == "data"
    assert json.loads(conflist.read_text())["plugins"][-1]["type"] == "netclaim"
    # The backup is still the file as it was before netclaim, not an intermediate state.
    assert (conflist.parent / (conflist.name + ".netclaim.bak")).read_bytes() == original


def test_reinstall_moves_entry_last_and_keeps_operator_settings(tmp_root: Path) -> None:
    conflist = write_base(tmp_root)
    doc = dict(BASE)
    doc["plugins"] = [BASE["plugins"][0],
                      {"type": "netclaim", "driverName": "old.example.com", "interface": {"mtu": 1400}},
                      BASE["plugins"][1]]
    conflist.write_text(json.dumps(doc))

    run_install(*install_args(tmp_root, conflist))

    plugins = json.loads(conflist.read_text())["plugins"]
    assert [p["type"] for p in plugins] == ["bridge", "portmap", "netclaim"]
    assert plugins[-1]["driverName"] == DRIVER
    assert plugins[-1]["interface"] == {"mtu": 1400}


def test_uninstall_restores_the_original_bytes_and_removes_the_launcher(tmp_root: Path) -> None:
    conflist = write_base(tmp_root)
    original = conflist.read_bytes()
    run_install(*install_args(tmp_root, conflist))
    run_install(*install_args(tmp_root, conflist, "--request", "x"))

    run_install("--cni-bin-dir", str(tmp_root / "bin"), "--conflist", str(conflist), "--uninstall")

    assert conflist.read_bytes() == original
    assert not (tmp_root / "bin" / "netclaim").exists()
    assert not (conflist.parent / (conflist.name + ".netclaim.bak")).exists()
    # Uninstalling twice is harmless.
    run_install("--cni-bin-dir", str(tmp_root / "bin"), "--conflist", str(conflist), "--uninstall")
    assert conflist.read_bytes() == original


def test_uninstall_keeps_changes_made_after_install(tmp_root: Path) -> None:
    conflist = write_base(tmp_root)
    run_install(*install_args(tmp_root, conflist))
    doc = json.loads(conflist.read_text())
    doc["plugins"].insert(0, {"type": "tuning", "mtu": 1450})  # the operator edits later
    conflist.write_text(json.dumps(doc))

    run_install("--cni-bin-dir", str(tmp_root / "bin"), "--conflist", str(conflist), "--uninstall")

    after = json.loads(conflist.read_text())
    assert [p["type"] for p in after["plugins"]] == ["tuning", "bridge", "portmap"]


def test_unparsable_conflist_is_refused_and_left_untouched(tmp_root: Path) -> None:
    conflist = tmp_root / "10-broken.conflist"
    broken = b'{"cniVersion": "1.0.0", "name": "x", "plugins": [ {"type": "bridge",, } ]'
    conflist.write_bytes(broken)
    os.chmod(conflist, 0o640)

    proc = run_install(*install_args(tmp_root, conflist), check=False)

    assert proc.returncode != 0
    assert "not valid JSON" in proc.stderr and "untouched" in proc.stderr
    assert conflist.read_bytes() == broken
    assert stat.S_IMODE(conflist.stat().st_mode) == 0o640
    assert not (tmp_root / "10-broken.conflist.netclaim.bak").exists()
    assert not (tmp_root / "bin" / "netclaim").exists(), "launcher written although the conflist was refused"
    assert sorted(p.name for p in tmp_root.iterdir()) == ["10-broken.conflist"]


def test_single_plugin_conf_is_refused(tmp_root: Path) -> None:
    conf = tmp_root / "10-single.conf"
    conf.write_text(json.dumps({"cniVersion": "1.0.0", "name": "x", "type": "bridge"}))
    before = conf.read_bytes()

    proc = run_install(*install_args(tmp_root, conf), check=False)

    assert proc.returncode != 0 and "not a conflist" in proc.stderr
    assert conf.read_bytes() == before


def test_missing_required_arguments_are_errors(tmp_root: Path) -> None:
    conflist = write_base(tmp_root)
    no_driver = run_install("--conflist", str(conflist), "--cni-bin-dir", str(tmp_root / "bin"), check=False)
    assert no_driver.returncode != 0 and "--driver-name is required" in no_driver.stderr
    bad_policy = run_install(*install_args(tmp_root, conflist, "--failure-policy", "Maybe"), check=False)
    assert bad_policy.returncode != 0 and "Ignore or Fail" in bad_policy.stderr
    missing_python = run_install(*install_args(tmp_root, conflist, "--python", str(tmp_root / "nope")), check=False)
    assert missing_python.returncode != 0 and "not found" in missing_python.stderr
    assert json.loads(conflist.read_text()) == BASE


def test_host_root_install_writes_node_paths_under_the_mount(tmp_root: Path) -> None:
    """The DaemonSet's init container: the node's / is mounted at --host-root."""
    host = tmp_root / "host"
    (host / "etc" / "cni" / "net.d").mkdir(parents=True)
    conflist = host / "etc" / "cni" / "net.d" / "10-podnet.conflist"
    conflist.write_text(json.dumps(BASE))
    plugin_dir = host / "opt" / "netclaim" / "0.1.0" / "plugin" / "cni_plugin"
    plugin_dir.mkdir(parents=True)
    for source in (REPO / "cni_plugin").glob("*.py"):  # what the init container copies
        (plugin_dir / source.name).write_bytes(source.read_bytes())
    (host / "usr" / "bin").mkdir(parents=True)
    (host / "usr" / "bin" / "python3").symlink_to(VENV_PYTHON)

    run_install(
        "--host-root", str(host),
        "--cni-bin-dir", "/opt/cni/bin",
        "--conflist", "/etc/cni/net.d/10-podnet.conflist",
        "--driver-name", DRIVER,
        "--socket", "/run/netclaim/publisher.sock",
        "--spool-dir", "/var/lib/netclaim/spool",
        "--python", "/usr/bin/python3",
        "--plugin-path", "/opt/netclaim/0.1.0/plugin",
    )

    entry = netclaim_entries(conflist)[0]
    assert entry["socketPath"] == "/run/netclaim/publisher.sock"  # the node's path, not the mount's
    launcher = (host / "opt" / "cni" / "bin" / "netclaim").read_text()
    assert launcher.startswith("#!/usr/bin/python3 -IS\n")
    assert "sys.path.insert(0, '/opt/netclaim/0.1.0/plugin')" in launcher
    assert str(host) not in launcher
    assert stat.S_IMODE((host / "run" / "netclaim").stat().st_mode) == 0o700


def test_shipped_conflists_accept_a_reinstall_unchanged(tmp_root: Path) -> None:
    """Running the installer on a shipped example (already chained) changes nothing."""
    for example in sorted((CONF / "cni").glob("*.conflist")):
        copy = tmp_root / example.name
        copy.write_bytes(example.read_bytes())
        entry = netclaim_entries(copy)[0]
        args = ["--cni-bin-dir", str(tmp_root / "bin"), "--conflist", str(copy), "--driver-name", entry["driverName"]]
        run_install(*args)
        after = json.loads(copy.read_text())
        assert after == json.loads(example.read_text()), example.name


def run_launcher(launcher: Path, command: str, stdin: dict) -> subprocess.CompletedProcess[str]:
    env = {"CNI_COMMAND": command, "CNI_PATH": str(launcher.parent), "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
           "PYTHONPATH": "/nonexistent-hostile-path"}  # -I: must not matter
    return subprocess.run([str(launcher)], input=json.dumps(stdin), capture_output=True, text=True,
                          env=env, timeout=60)


def test_installed_launcher_runs_the_plugin(tmp_root: Path) -> None:
    """The runtime executes DIR/netclaim by name: it must answer as a CNI plugin."""
    conflist = write_base(tmp_root)
    run_install(*install_args(tmp_root, conflist))

    proc = run_launcher(tmp_root / "bin" / "netclaim", "VERSION", {"cniVersion": "1.1.0"})

    assert proc.returncode == 0, proc.stderr
    answer = json.loads(proc.stdout)
    assert "1.1.0" in answer["supportedVersions"] and "0.4.0" in answer["supportedVersions"]


def test_host_root_launcher_runs_with_the_copied_plugin_code(tmp_root: Path) -> None:
    """The DaemonSet layout: node python3 + the plugin code copied to a versioned node path."""
    host = tmp_root / "host"
    (host / "etc" / "cni" / "net.d").mkdir(parents=True)
    (host / "etc" / "cni" / "net.d" / "10-podnet.conflist").write_text(json.dumps(BASE))
    plugin_dir = tmp_root / "node-plugin" / "cni_plugin"
    plugin_dir.mkdir(parents=True)
    for source in (REPO / "cni_plugin").glob("*.py"):
        (plugin_dir / source.name).write_bytes(source.read_bytes())
    # The host path the launcher names must exist on "the node" (here: this machine).
    (host / str(plugin_dir.parent).lstrip("/")).mkdir(parents=True)
    (host / str(plugin_dir.parent).lstrip("/") / "cni_plugin").symlink_to(plugin_dir)
    (host / "usr" / "bin").mkdir(parents=True)
    (host / "usr" / "bin" / "python3").symlink_to("/usr/bin/python3")

    run_install("--host-root", str(host), "--cni-bin-dir", "/opt/cni/bin",
                "--conflist", "/etc/cni/net.d/10-podnet.conflist", "--driver-name", DRIVER,
                "--python", "/usr/bin/python3", "--plugin-path", str(plugin_dir.parent))

    proc = run_launcher(host / "opt" / "cni" / "bin" / "netclaim", "VERSION", {"cniVersion": "1.0.0"})
    assert proc.returncode == 0, proc.stderr
    assert "1.0.0" in json.loads(proc.stdout)["supportedVersions"]
