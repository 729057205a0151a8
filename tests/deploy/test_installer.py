"""scripts/install.sh against a temp CNI bin dir and conflist, as an operator runs it.

What an operator notices: the plugin is chained last exactly once, re-running
changes nothing twice, uninstall gives the original file back, a broken
conflist is refused without being touched, and what lands in the bin dir is
the self-contained executable (scripts/build-plugin.sh), written atomically,
that names no source checkout and needs no Python.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from deploylib import CONF, DRIVER, REPO, run_install
from publisher.repair.drivers import DriverNames


@pytest.fixture(autouse=True)
def drivers_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Where the installer records each conflist's driver for the publisher: a temp file, not this
    machine's /etc/netclaim/drivers (scripts/install.sh takes its default from NETCLAIM_DRIVERS_FILE)."""
    path = tmp_path / "etc" / "netclaim" / "drivers"
    monkeypatch.setenv("NETCLAIM_DRIVERS_FILE", str(path))
    return path


@pytest.fixture(scope="module")
def bundle() -> Path:
    """The static plugin this checkout builds (cached by the build script)."""
    proc = subprocess.run(["bash", str(REPO / "scripts" / "build-plugin.sh")], capture_output=True, text=True,
                          timeout=1800)
    assert proc.returncode == 0, f"scripts/build-plugin.sh failed:\n{proc.stderr[-3000:]}"
    return Path(proc.stdout.strip().splitlines()[-1])


def assert_is_the_bundle(installed: Path, bundle: Path) -> None:
    assert stat.S_IMODE(installed.stat().st_mode) == 0o755
    data = installed.read_bytes()
    assert data == bundle.read_bytes()
    assert data[:4] == b"\x7fELF", "not an executable: a script would need an interpreter on the node"
    assert str(REPO).encode() not in data, "the installed plugin names the source checkout"

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


def test_install_chains_netclaim_last_and_installs_the_bundle(tmp_root: Path, bundle: Path) -> None:
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

    assert_is_the_bundle(tmp_root / "bin" / "netclaim", bundle)
    assert [p.name for p in (tmp_root / "bin").iterdir()] == ["netclaim"], "temp files left in the bin dir"

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


def test_uninstall_restores_the_original_bytes_and_removes_the_plugin(tmp_root: Path) -> None:
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


def test_uninstall_removes_the_plugin_log_and_its_rotation(tmp_root: Path) -> None:
    conflist = write_base(tmp_root)
    log = tmp_root / "log" / "netclaim" / "plugin.log"
    log.parent.mkdir(parents=True)
    log.write_text('{"msg": "ADD"}\n')
    Path(f"{log}.1").write_text('{"msg": "older"}\n')
    keep = log.parent / "someone-elses.log"
    keep.write_text("not ours\n")

    run_install("--cni-bin-dir", str(tmp_root / "bin"), "--conflist", str(conflist), "--uninstall",
                "--log-file", str(log))

    assert sorted(p.name for p in log.parent.iterdir()) == ["someone-elses.log"]


def test_one_entry_per_network_each_with_its_own_driver_and_request(tmp_root: Path) -> None:
    """containerd's own multi-network (max_conf_num 2: eth0 from the first conflist, eth1 from the
    second): one install per conflist, each entry with its own driverName and request; uninstalling
    one network keeps the plugin (and its log) the other still runs; the last one takes them away."""
    first = write_base(tmp_root)
    second = first.parent / "20-storage.conflist"
    second.write_text(json.dumps({**BASE, "name": "storage", "plugins": BASE["plugins"][:1]}, indent=2) + "\n")
    originals = {first: first.read_bytes(), second: second.read_bytes()}
    log = tmp_root / "plugin.log"
    run_install(*install_args(tmp_root, first, "--request", "nic", "--log-file", str(log)))
    second_args = install_args(tmp_root, second, "--request", "storage-nic", "--log-file", str(log))
    second_args[second_args.index("--driver-name") + 1] = "storage.example.com"
    run_install(*second_args)

    assert [(e["driverName"], e["request"]) for e in netclaim_entries(first)] == [(DRIVER, "nic")]
    assert [(e["driverName"], e["request"]) for e in netclaim_entries(second)] == [("storage.example.com",
                                                                                     "storage-nic")]
    plugin = tmp_root / "bin" / "netclaim"
    log.write_text('{"msg": "ADD"}\n')

    uninstall = ("--cni-bin-dir", str(tmp_root / "bin"), "--uninstall", "--log-file", str(log))
    proc = run_install(*uninstall, "--conflist", str(first))
    assert first.read_bytes() == originals[first]
    assert netclaim_entries(second), "uninstalling one network touched the other"
    assert plugin.is_file() and log.is_file(), "the plugin the second network still chains was removed"
    assert "other conflist" in proc.stderr

    run_install(*uninstall, "--conflist", str(second))
    assert second.read_bytes() == originals[second]
    assert not plugin.exists() and not log.exists()


def publishers_drivers(drivers_file: Path) -> set[str]:
    """The driver names a publisher started with --drivers-file FILE looks for, read by its own reader."""
    return set(DriverNames(path=str(drivers_file)).current())


def test_the_publisher_gets_the_driver_of_every_network_and_an_uninstall_takes_only_its_own(
        tmp_root: Path, drivers_file: Path) -> None:
    """One install per network, each with its driver: the drivers file the publisher reads names them all
    (its unchained check reports a claimed pod of any of them whose chain never reached it). Uninstalling a
    network drops that network's driver only, and a driver two networks share stays until both are gone;
    a re-install with another driver replaces the conflist's line; the last uninstall removes the file."""
    first = write_base(tmp_root)
    second = first.parent / "20-storage.conflist"
    third = first.parent / "30-data.conflist"
    for path, name in ((second, "storage"), (third, "data")):
        path.write_text(json.dumps({**BASE, "name": name, "plugins": BASE["plugins"][:1]}, indent=2) + "\n")
    storage_args = install_args(tmp_root, second, "--request", "storage-nic")
    storage_args[storage_args.index("--driver-name") + 1] = "storage.example.com"
    run_install(*install_args(tmp_root, first, "--request", "nic"))
    run_install(*storage_args)
    run_install(*install_args(tmp_root, third, "--request", "data"))  # the first network's driver again

    assert publishers_drivers(drivers_file) == {DRIVER, "storage.example.com"}
    assert sorted(line for line in drivers_file.read_text().splitlines() if not line.startswith("#")) == [
        f"{DRIVER} {first}", f"{DRIVER} {third}", f"storage.example.com {second}"]  # what an operator reads
    run_install(*storage_args)  # again: still one line for that conflist
    assert drivers_file.read_text().count(str(second)) == 1

    uninstall = ("--cni-bin-dir", str(tmp_root / "bin"), "--uninstall")
    run_install(*uninstall, "--conflist", str(second))
    assert publishers_drivers(drivers_file) == {DRIVER}
    run_install(*uninstall, "--conflist", str(first))
    assert publishers_drivers(drivers_file) == {DRIVER}, "the third network's driver went with the first's"

    moved = install_args(tmp_root, third, "--request", "data")
    moved[moved.index("--driver-name") + 1] = "data.example.com"
    run_install(*moved)
    assert publishers_drivers(drivers_file) == {"data.example.com"}

    run_install(*uninstall, "--conflist", str(third))
    assert not drivers_file.exists() and publishers_drivers(drivers_file) == set()
    run_install(*uninstall, "--conflist", str(third))  # again: harmless, no file made
    assert not drivers_file.exists()


def test_installs_of_several_networks_at_once_each_keep_their_driver(tmp_root: Path, drivers_file: Path) -> None:
    """A configuration tool installs every network of the node at the same moment: no install's line is lost."""
    base = write_base(tmp_root)
    drivers = [f"net{i}.example.com" for i in range(4)]
    conflists = [base] + [base.parent / f"{20 + i}-net{i}.conflist" for i in range(1, 4)]
    for path in conflists[1:]:
        path.write_text(json.dumps({**BASE, "name": path.stem, "plugins": BASE["plugins"][:1]}, indent=2) + "\n")
    commands = []
    for conflist, driver in zip(conflists, drivers):
        args = install_args(tmp_root, conflist, "--request", driver.split(".")[0])
        args[args.index("--driver-name") + 1] = driver
        commands.append(["bash", str(REPO / "scripts" / "install.sh"), *args])
    for _ in range(3):  # a lost line needs two rewrites to overlap: several rounds make that likely without a lock
        drivers_file.unlink(missing_ok=True)
        procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for cmd in commands]
        for proc in procs:
            _, err = proc.communicate(timeout=120)
            assert proc.returncode == 0, err
        assert publishers_drivers(drivers_file) == set(drivers), drivers_file.read_text()


def test_a_converted_conf_keeps_its_driver_until_its_uninstall(tmp_root: Path, drivers_file: Path) -> None:
    """NAME.conf is installed as NAME.conflist; --uninstall with either name takes its driver away."""
    conf = tmp_root / "10-single.conf"
    conf.write_text(SINGLE)
    run_install(*install_args(tmp_root, conf))
    assert f"{DRIVER} {tmp_root / '10-single.conflist'}" in drivers_file.read_text().splitlines()

    run_install("--cni-bin-dir", str(tmp_root / "bin"), "--conflist", str(conf), "--uninstall")

    assert publishers_drivers(drivers_file) == set() and not drivers_file.exists()


def test_uninstall_keeps_changes_made_after_install(tmp_root: Path) -> None:
    conflist = write_base(tmp_root)
    run_install(*install_args(tmp_root, conflist))
    doc = json.loads(conflist.read_text())
    doc["plugins"].insert(0, {"type": "tuning", "mtu": 1450})  # the operator edits later
    conflist.write_text(json.dumps(doc))

    run_install("--cni-bin-dir", str(tmp_root / "bin"), "--conflist", str(conflist), "--uninstall")

    after = json.loads(conflist.read_text())
    assert [p["type"] for p in after["plugins"]] == ["tuning", "bridge", "portmap"]


def test_the_installer_writes_the_extended_resource_and_refuses_a_malformed_one(tmp_root: Path) -> None:
    """`--extended-resource-name`: the DRA extended resource pods ask for in their containers' resources
    instead of a claim. A re-run without it keeps it (as every setting); a name the plugin would refuse
    leaves the conflist and the bin dir as they were."""
    conflist = write_base(tmp_root)
    run_install(*install_args(tmp_root, conflist, "--request", "nic", "--extended-resource-name", "example.com/nic"))
    [entry] = netclaim_entries(conflist)
    assert (entry["request"], entry["extendedResourceName"]) == ("nic", "example.com/nic")
    run_install(*install_args(tmp_root, conflist, "--request", "nic"))
    assert netclaim_entries(conflist)[0]["extendedResourceName"] == "example.com/nic"

    before = conflist.read_bytes()
    (tmp_root / "bin" / "netclaim").unlink()
    proc = run_install(*install_args(tmp_root, conflist, "--extended-resource-name", "example.com/nic/0"), check=False)
    assert proc.returncode != 0 and "extendedResourceName=example.com/nic/0" in proc.stderr, proc.stderr
    assert conflist.read_bytes() == before
    assert not (tmp_root / "bin" / "netclaim").exists(), "plugin written although the entry was refused"


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
    assert not (tmp_root / "bin" / "netclaim").exists(), "plugin written although the conflist was refused"
    assert sorted(p.name for p in tmp_root.iterdir()) == ["10-broken.conflist"]


SINGLE = '{\n  "cniVersion": "0.4.0",\n  "name": "x",\n  "type": "bridge",\n  "bridge": "cni0"\n}\n'


def test_single_plugin_conf_is_converted_and_uninstall_restores_it(tmp_root: Path) -> None:
    """A single-plugin .conf primary becomes NAME.conflist the way libcni reads it (it used to be
    refused while the install step exited 0 elsewhere); uninstall gives NAME.conf back byte for byte."""
    conf = tmp_root / "10-single.conf"
    conf.write_text(SINGLE)
    os.chmod(conf, 0o640)
    before = conf.read_bytes()

    proc = run_install(*install_args(tmp_root, conf))

    conflist = tmp_root / "10-single.conflist"
    assert "converted" in proc.stderr, proc.stderr
    doc = json.loads(conflist.read_text())
    assert doc["name"] == "x" and doc["cniVersion"] == "0.4.0"
    assert doc["plugins"][0] == json.loads(SINGLE) and doc["plugins"][1]["type"] == "netclaim"
    assert stat.S_IMODE(conflist.stat().st_mode) == 0o640
    assert sorted(p.name for p in tmp_root.iterdir() if p.is_file()) == ["10-single.conf.netclaim.bak",
                                                                        "10-single.conflist"]
    run_install(*install_args(tmp_root, conf))  # again: nothing changes
    assert json.loads(conflist.read_text()) == doc

    run_install("--cni-bin-dir", str(tmp_root / "bin"), "--conflist", str(conf), "--uninstall")

    assert conf.read_bytes() == before
    assert sorted(p.name for p in tmp_root.iterdir() if p.is_file()) == ["10-single.conf"]


def test_missing_required_arguments_are_errors(tmp_root: Path) -> None:
    conflist = write_base(tmp_root)
    no_driver = run_install("--conflist", str(conflist), "--cni-bin-dir", str(tmp_root / "bin"), check=False)
    assert no_driver.returncode != 0 and "--driver-name is required" in no_driver.stderr
    bad_policy = run_install(*install_args(tmp_root, conflist, "--failure-policy", "Maybe"), check=False)
    assert bad_policy.returncode != 0 and "Ignore or Fail" in bad_policy.stderr
    missing_python = run_install(*install_args(tmp_root, conflist, "--python", str(tmp_root / "nope")), check=False)
    assert missing_python.returncode != 0 and "not found" in missing_python.stderr
    missing_bundle = run_install(*install_args(tmp_root, conflist, "--bundle", str(tmp_root / "nope")), check=False)
    assert missing_bundle.returncode != 0 and "not found" in missing_bundle.stderr
    not_a_plugin = run_install(*install_args(tmp_root, conflist, "--bundle", shutil.which("true")), check=False)
    assert not_a_plugin.returncode != 0 and "does not answer VERSION" in not_a_plugin.stderr
    # A plugin that would need the node's Python (the source-tree launcher) is refused.
    from cni_plugin.launcher import install as write_launcher

    launcher = write_launcher(str(tmp_root / "launcher"), python="/usr/bin/python3", root=str(REPO))
    script = run_install(*install_args(tmp_root, conflist, "--bundle", launcher), check=False)
    assert script.returncode != 0 and "not a static executable" in script.stderr, script.stderr
    assert json.loads(conflist.read_text()) == BASE
    assert not (tmp_root / "bin").exists()


def test_reinstall_replaces_the_plugin_atomically(tmp_root: Path, bundle: Path) -> None:
    """A runtime may exec the plugin at any moment: the new file is renamed over
    the old one (new inode), never rewritten in place."""
    conflist = write_base(tmp_root)
    run_install(*install_args(tmp_root, conflist, "--bundle", str(bundle)))
    target = tmp_root / "bin" / "netclaim"
    before = target.stat().st_ino
    held = os.open(target, os.O_RDONLY)  # like a running plugin's text
    try:
        run_install(*install_args(tmp_root, conflist, "--bundle", str(bundle)))
        assert target.stat().st_ino != before
        assert os.fstat(held).st_size == bundle.stat().st_size, "the old file was truncated in place"
    finally:
        os.close(held)
    assert_is_the_bundle(target, bundle)
    assert [p.name for p in (tmp_root / "bin").iterdir()] == ["netclaim"]


def test_host_root_install_writes_node_paths_under_the_mount(tmp_root: Path, bundle: Path) -> None:
    """The DaemonSet's init container: the node's / is mounted at --host-root; the
    node needs no Python (there is none under the mount)."""
    host = tmp_root / "host"
    (host / "etc" / "cni" / "net.d").mkdir(parents=True)
    conflist = host / "etc" / "cni" / "net.d" / "10-podnet.conflist"
    conflist.write_text(json.dumps(BASE))

    run_install(
        "--host-root", str(host),
        "--cni-bin-dir", "/opt/cni/bin",
        "--conflist", "/etc/cni/net.d/10-podnet.conflist",
        "--driver-name", DRIVER,
        "--socket", "/run/netclaim/publisher.sock",
        "--spool-dir", "/var/lib/netclaim/spool",
    )

    entry = netclaim_entries(conflist)[0]
    assert entry["socketPath"] == "/run/netclaim/publisher.sock"  # the node's path, not the mount's
    assert_is_the_bundle(host / "opt" / "cni" / "bin" / "netclaim", bundle)
    assert str(host).encode() not in (host / "opt" / "cni" / "bin" / "netclaim").read_bytes()
    assert stat.S_IMODE((host / "run" / "netclaim").stat().st_mode) == 0o700
    assert not (host / "usr").exists()


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


def run_plugin(exe: Path, command: str, stdin: dict) -> subprocess.CompletedProcess[str]:
    env = {"CNI_COMMAND": command, "CNI_PATH": str(exe.parent), "PATH": "/nonexistent",
           "PYTHONPATH": "/nonexistent-hostile-path", "PYTHONHOME": "/nonexistent",
           "PYTHONSTARTUP": "/nonexistent"}  # isolated: none of this may matter
    return subprocess.run([str(exe)], input=json.dumps(stdin), capture_output=True, text=True,
                          env=env, timeout=60)


def test_installed_plugin_runs(tmp_root: Path) -> None:
    """The runtime executes DIR/netclaim by name: it must answer as a CNI plugin."""
    conflist = write_base(tmp_root)
    run_install(*install_args(tmp_root, conflist))

    proc = run_plugin(tmp_root / "bin" / "netclaim", "VERSION", {"cniVersion": "1.1.0"})

    assert proc.returncode == 0, proc.stderr
    answer = json.loads(proc.stdout)
    assert "1.1.0" in answer["supportedVersions"] and "0.4.0" in answer["supportedVersions"]
    assert proc.stderr == ""


def test_install_kit_uses_the_plugin_beside_the_script(tmp_root: Path, bundle: Path) -> None:
    """The image's layout: /opt/netclaim/scripts/{install.sh,conflist_edit.py} and
    /opt/netclaim/bin/netclaim, no source tree and no build script: that executable is installed."""
    kit = tmp_root / "opt" / "netclaim" / "scripts"
    kit.mkdir(parents=True)
    shutil.copy2(REPO / "scripts" / "install.sh", kit / "install.sh")
    shutil.copy2(REPO / "scripts" / "operator" / "conflist_edit.py", kit / "conflist_edit.py")
    (kit.parent / "bin").mkdir()
    shutil.copy2(bundle, kit.parent / "bin" / "netclaim")
    # The image's venv (the publisher package, which the conflist editor shares) beside the kit.
    (kit.parent / "venv").symlink_to(REPO / ".venv")
    host = tmp_root / "host"
    (host / "etc" / "cni" / "net.d").mkdir(parents=True)
    (host / "etc" / "cni" / "net.d" / "10-podnet.conflist").write_text(json.dumps(BASE))

    proc = subprocess.run(["bash", str(kit / "install.sh"), "--host-root", str(host), "--cni-bin-dir", "/opt/cni/bin",
                           "--conflist", "/etc/cni/net.d/10-podnet.conflist", "--driver-name", DRIVER],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr

    installed = host / "opt" / "cni" / "bin" / "netclaim"
    assert_is_the_bundle(installed, kit.parent / "bin" / "netclaim")
    answer = run_plugin(installed, "VERSION", {"cniVersion": "1.0.0"})
    assert answer.returncode == 0 and "1.0.0" in json.loads(answer.stdout)["supportedVersions"]
