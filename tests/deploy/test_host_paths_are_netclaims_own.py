"""Uninstall empties hostPaths.run and hostPaths.state: they can only ever be netclaim's own directories.

Two layers, both real: the chart's values.schema.json as the real `helm
template` and `helm lint --strict` apply it (every hostile value refused,
naming the field; the defaults and a custom netclaim dir rendered), and the
real `netclaim-publisher chain-keeper --uninstall` process, which refuses to
empty a cleanup dir whose name on the node lacks "netclaim" also when the
chart was bypassed. The keeper sees its hostPath volumes as mount points
(/host/netclaim/state); here they are real bind mounts made in a private
mount namespace (`unshare`), so the keeper reads the node's name of the dir
from /proc/self/mountinfo exactly as in the pod.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from chartlib import CHART, driver_set, helm, kube_version, one, render
from deploylib import DRIVER, netclaim_publisher_bin, python_env

SHARED = ["/", "/run", "/var/run", "/var/lib", "/var", "/etc", "/usr", "/opt", "/tmp", "/home", "/root",
          "/proc", "/sys", "/dev", "/boot", "/opt/cni/bin", "/etc/cni/net.d", "/var/lib/kubelet",
          "/var/lib/containerd", "/var/lib/cni"]
NOT_NORMALISED = ["/var/lib/netclaim/", "/var//lib/netclaim", "/var/lib/../netclaim", "/var/lib/./netclaim",
                  "var/lib/netclaim", "/var/lib/netclaim/.."]


@pytest.mark.parametrize("field", ["run", "state"])
@pytest.mark.parametrize("value", SHARED + NOT_NORMALISED)
def test_a_shared_or_unnormalised_host_path_is_refused_naming_the_field(field: str, value: str) -> None:
    for verb in ("template", "lint"):
        args = [verb, *(["x"] if verb == "template" else ["--strict"]), str(CHART), "--kube-version",
                kube_version(), "--set-string", f"hostPaths.{field}={value}"]
        proc = helm(*args, check=False)
        out = proc.stdout + proc.stderr
        assert proc.returncode != 0, f"helm {verb} accepted hostPaths.{field}={value}"
        assert f"/hostPaths/{field}" in out and "does not match pattern" in out, out


def test_the_defaults_and_a_custom_netclaim_dir_render() -> None:
    paths = {v["name"]: v["hostPath"]["path"] for v in one(render(), "DaemonSet")["spec"]["template"]["spec"]["volumes"]
             if "hostPath" in v}
    assert (paths["run"], paths["state"]) == ("/run/netclaim", "/var/lib/netclaim")
    docs = render("hostPaths.state=/var/lib/netclaim-b", "hostPaths.run=/run/netclaim-b")
    paths = {v["name"]: v["hostPath"]["path"] for v in one(docs, "DaemonSet")["spec"]["template"]["spec"]["volumes"]
             if "hostPath" in v}
    assert (paths["run"], paths["state"]) == ("/run/netclaim-b", "/var/lib/netclaim-b")
    helm("lint", "--strict", str(CHART), "--kube-version", kube_version(), *driver_set(),
         "--set", "hostPaths.state=/var/lib/netclaim-b")


# ---------------------------------------------------------------- the keeper's own refusal


def uninstall_with(root: Path, source: Path, *, mounted: bool) -> subprocess.CompletedProcess[str]:
    """`chain-keeper --uninstall` whose cleanup dir is `source`, or (mounted) `source` bind-mounted on
    ROOT/host/state the way the DaemonSet mounts a hostPath, in a mount namespace of its own."""
    net_d, bin_d = root / "net.d", root / "bin"
    net_d.mkdir(exist_ok=True)
    bin_d.mkdir(exist_ok=True)
    target = root / "host" / "state"
    target.mkdir(parents=True, exist_ok=True)
    keeper = [str(netclaim_publisher_bin()), "chain-keeper", "--uninstall", f"--cni-conf-dir={net_d}",
              f"--cni-bin-dir={bin_d}", f"--driver-name={DRIVER}", "--cni-cache-dir=", "--log-format=text",
              f"--cleanup-dir={target if mounted else source}"]
    argv = keeper
    if mounted:
        argv = ["unshare", "--mount", "--propagation", "private", "sh", "-c",
                'mount --bind "$1" "$2" && shift 2 && exec "$@"', "bind", str(source), str(target), *keeper]
    proc = subprocess.run(argv, capture_output=True, text=True, env=python_env(), timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc


def shared_looking_dir(root: Path, name: str) -> Path:
    """A stand-in for a shared host dir: another program's file in it."""
    directory = root / "node" / name
    directory.mkdir(parents=True)
    (directory / "kubelet.sock-or-whatever").write_text("not netclaim's")
    return directory


def test_the_keeper_does_not_empty_a_hostpath_volume_of_a_shared_dir(tmp_root: Path) -> None:
    lib = shared_looking_dir(tmp_root, "lib")
    proc = uninstall_with(tmp_root, lib, mounted=True)
    assert (lib / "kubelet.sock-or-whatever").exists(), "uninstall emptied a shared dir mounted as its state dir"
    assert "not a directory of netclaim's own" in proc.stderr, proc.stderr


def test_the_keeper_does_not_empty_a_whole_filesystem_mounted_as_its_state_dir(tmp_root: Path) -> None:
    """A hostPath that is a filesystem's root (say `/`) shows as root "/" in mountinfo: refused."""
    fs = tmp_root / "fs"
    fs.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(fs)], check=True)
    try:
        (fs / "etc").mkdir()
        proc = uninstall_with(tmp_root, fs, mounted=True)
        assert (fs / "etc").exists(), "uninstall emptied a whole filesystem"
        assert "is / on the node" in proc.stderr, proc.stderr
    finally:
        subprocess.run(["umount", str(fs)], check=True)


def test_the_keeper_does_not_empty_a_plain_dir_that_is_not_netclaims(tmp_root: Path) -> None:
    var_lib = shared_looking_dir(tmp_root, "var-lib")
    uninstall_with(tmp_root, var_lib, mounted=False)
    assert (var_lib / "kubelet.sock-or-whatever").exists()


def test_the_keeper_empties_its_own_dir_mounted_or_not(tmp_root: Path) -> None:
    """Positive control: the same uninstall empties a dir named netclaim-b (bind-mounted, and plain)."""
    for mounted in (True, False):
        own = tmp_root / "node" / f"netclaim-b-{int(mounted)}"
        (own / "publisher").mkdir(parents=True)
        (own / "publisher" / "journal.sqlite").write_text("x")
        (own / "spool-file").write_text("x")
        uninstall_with(tmp_root, own, mounted=mounted)
        assert own.is_dir() and list(own.iterdir()) == [], f"mounted={mounted}"
    assert not os.path.ismount(tmp_root / "host" / "state")  # the bind mounts died with their namespaces
