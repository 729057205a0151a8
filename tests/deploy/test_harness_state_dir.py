"""The harness never runs code or kills processes on the word of a state dir another local user planted.

scripts/control-plane.sh and scripts/cluster.sh run as root, default to fixed
names in the world-writable /tmp, `source` env files from their state dir and
kill the pids its pid files name. Real parts: a throwaway unprivileged user
made with `useradd` (removed afterwards) plants the dir first, in /tmp, the
way it would for the default path; the scripts run as root through their
cheapest sourcing subcommand (`env`, `down`), which builds and starts
nothing. The positive controls plant the same file in a dir root owns and
see it sourced (the marker appears) or the pid killed, so the refusal is what
keeps the marker away.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from deploylib import REPO
from runtime.statedir import UnsafeStateDir, read_state_file, secure_state_dir

CONTROL_PLANE = REPO / "scripts" / "control-plane.sh"
CLUSTER = REPO / "scripts" / "cluster.sh"


@dataclass(frozen=True)
class Intruder:
    """An unprivileged local user of the machine."""

    name: str
    uid: int
    gid: int

    def run(self, *argv: str) -> None:
        subprocess.run(list(argv), check=True, user=self.uid, group=self.gid, extra_groups=[], cwd="/",
                       capture_output=True, timeout=30)

    def plant(self, directory: Path, name: str, text: str) -> None:
        """The dir made by this user in /tmp, holding a file of theirs."""
        self.run("mkdir", "-m", "0755", str(directory))
        self.run("sh", "-c", 'printf "%s" "$1" > "$2"', "plant", text, str(directory / name))


@pytest.fixture()
def intruder() -> Iterator[Intruder]:
    if os.geteuid() != 0:
        pytest.fail("the attack needs root to make a throwaway user", pytrace=False)
    name = f"ncsd{secrets.token_hex(3)}"
    subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name],
                   check=True, capture_output=True)
    try:
        pw = subprocess.run(["id", "-u", name], check=True, capture_output=True, text=True).stdout.strip()
        gr = subprocess.run(["id", "-g", name], check=True, capture_output=True, text=True).stdout.strip()
        yield Intruder(name, int(pw), int(gr))
    finally:
        subprocess.run(["userdel", name], capture_output=True)


@pytest.fixture()
def public_dir() -> Iterator[Path]:
    """A fresh name in /tmp (sticky, world-writable): where the defaults live. Removed afterwards."""
    path = Path("/tmp") / f"nc-statedir-{secrets.token_hex(4)}"
    try:
        yield path
    finally:
        if path.is_symlink():
            path.unlink()
        else:
            shutil.rmtree(path, ignore_errors=True)


def payload(marker: Path) -> str:
    """An env file that, when sourced, proves it by creating the marker."""
    return f"APISERVER_PORT=1\ntouch {marker}\nNODE=x\n"


def script(path: Path, env_var: str, state_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, env_var: str(state_dir)}
    return subprocess.run([str(path), *args], env=env, capture_output=True, text=True, timeout=60)


def bystander() -> int:
    """A root process that is not our child (so no zombie of ours stays `kill -0`-alive): its pid."""
    out = subprocess.run(["sh", "-c", "sleep 300 </dev/null >/dev/null 2>&1 & echo $!"], check=True,
                         capture_output=True, text=True).stdout
    return int(out.strip())


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"


def stop(pid: int) -> None:
    try:
        os.kill(pid, 9)
    except ProcessLookupError:
        pass


def own_dir(root: Path, name: str) -> Path:
    """A state dir of root's own (mode 0700), as `up` makes it."""
    directory = root / name
    directory.mkdir(mode=0o700)
    return directory


# ---------------------------------------------------------------- the attacks


def test_control_plane_refuses_a_state_dir_another_user_created(intruder: Intruder, public_dir: Path,
                                                                 tmp_root: Path) -> None:
    marker = tmp_root / "sourced"
    intruder.plant(public_dir, "ports.env", payload(marker))
    proc = script(CONTROL_PLANE, "NETCLAIM_CP_DIR", public_dir, "env")
    assert not marker.exists(), "root sourced a ports.env another user planted"
    assert proc.returncode != 0
    assert f"refusing state dir {public_dir}" in proc.stderr and "owned by uid" in proc.stderr, proc.stderr


def test_cluster_refuses_a_state_dir_another_user_created(intruder: Intruder, public_dir: Path,
                                                          tmp_root: Path) -> None:
    marker = tmp_root / "sourced"
    intruder.plant(public_dir, "cluster.env", payload(marker))
    proc = script(CLUSTER, "NETCLAIM_CLUSTER_DIR", public_dir, "env")
    assert not marker.exists(), "root sourced a cluster.env another user planted"
    assert proc.returncode != 0
    assert f"refusing state dir {public_dir}" in proc.stderr, proc.stderr


def test_control_plane_down_kills_no_pid_another_user_named(intruder: Intruder, public_dir: Path) -> None:
    """`down` stops the pids of its pid files: a planted etcd.pid must not make root kill a process."""
    victim = bystander()
    try:
        intruder.plant(public_dir, "etcd.pid", f"{victim}\n")
        proc = script(CONTROL_PLANE, "NETCLAIM_CP_DIR", public_dir, "down")
        assert alive(victim), "root killed the process a planted pid file named"
        assert proc.returncode != 0 and "refusing state dir" in proc.stderr, proc.stderr
    finally:
        stop(victim)


def test_a_symlink_in_place_of_the_state_dir_is_refused(intruder: Intruder, public_dir: Path,
                                                        tmp_root: Path) -> None:
    """A link (made by another user) to a dir root owns is not root's state dir: nothing in it is sourced."""
    marker = tmp_root / "sourced"
    target = own_dir(tmp_root, "target")
    (target / "ports.env").write_text(payload(marker))
    intruder.run("ln", "-s", str(target), str(public_dir))
    proc = script(CONTROL_PLANE, "NETCLAIM_CP_DIR", public_dir, "env")
    assert not marker.exists(), "root sourced a ports.env through a symlink another user made"
    assert proc.returncode != 0 and "is a symlink" in proc.stderr, proc.stderr


def test_an_env_file_another_user_owns_is_not_sourced(intruder: Intruder, tmp_root: Path) -> None:
    marker = tmp_root / "sourced"
    directory = own_dir(tmp_root, "cp")
    env_file = directory / "ports.env"
    env_file.write_text(payload(marker))
    os.chown(env_file, intruder.uid, intruder.gid)
    proc = script(CONTROL_PLANE, "NETCLAIM_CP_DIR", directory, "env")
    assert not marker.exists(), "root sourced a ports.env another user owns"
    assert proc.returncode != 0 and f"refusing to read {env_file}" in proc.stderr, proc.stderr


def test_an_env_file_others_can_write_is_not_sourced(tmp_root: Path) -> None:
    marker = tmp_root / "sourced"
    directory = own_dir(tmp_root, "cluster")
    env_file = directory / "cluster.env"
    env_file.write_text(payload(marker))
    os.chmod(env_file, 0o666)
    proc = script(CLUSTER, "NETCLAIM_CLUSTER_DIR", directory, "env")
    assert not marker.exists()
    assert proc.returncode != 0 and "writable by group or others" in proc.stderr, proc.stderr


# ---------------------------------------------------------------- positive controls: the owner's dirs work


def test_the_owners_state_dir_is_sourced(tmp_root: Path) -> None:
    """The same planted text in a dir root owns IS sourced: the attacks above would have shown execution."""
    marker = tmp_root / "sourced"
    directory = own_dir(tmp_root, "cp")
    (directory / "ports.env").write_text(payload(marker))
    os.chmod(directory / "ports.env", 0o600)
    proc = script(CONTROL_PLANE, "NETCLAIM_CP_DIR", directory, "env")
    assert proc.returncode == 0, proc.stderr
    assert marker.exists()
    assert f"export NETCLAIM_CP_DIR={directory}" in proc.stdout

    cluster = own_dir(tmp_root, "cluster")
    (cluster / "cluster.env").write_text(payload(tmp_root / "sourced-by-cluster"))
    proc = script(CLUSTER, "NETCLAIM_CLUSTER_DIR", cluster, "env")
    assert (tmp_root / "sourced-by-cluster").exists(), proc.stderr  # (env then misses the real variables)


def test_the_owners_down_stops_the_pid_it_names(tmp_root: Path) -> None:
    """Positive control of the pid attack: in root's own dir, `down` does stop the named process."""
    victim = bystander()
    try:
        directory = own_dir(tmp_root, "cp")
        (directory / "etcd.pid").write_text(f"{victim}\n")
        proc = script(CONTROL_PLANE, "NETCLAIM_CP_DIR", directory, "down")
        assert proc.returncode == 0, proc.stderr
        assert not alive(victim)  # `down` returns only once the process is gone
        assert not directory.exists()
    finally:
        stop(victim)


# ---------------------------------------------------------------- the Python side: one rule


def test_python_harness_refuses_what_the_scripts_refuse(intruder: Intruder, public_dir: Path,
                                                        tmp_root: Path) -> None:
    intruder.plant(public_dir, "ports.env", "APISERVER_PORT=1\n")
    with pytest.raises(UnsafeStateDir, match="owned by uid"):
        secure_state_dir(public_dir)
    with pytest.raises(UnsafeStateDir, match="owned by uid"):
        read_state_file(public_dir / "ports.env")
    link = tmp_root / "link"
    link.symlink_to(own_dir(tmp_root, "real"))
    with pytest.raises(UnsafeStateDir, match="symlink"):
        secure_state_dir(link)
    loose = own_dir(tmp_root, "loose")
    os.chmod(loose, 0o777)
    with pytest.raises(UnsafeStateDir, match="writable by group or others"):
        secure_state_dir(loose)


def test_python_harness_makes_a_fresh_state_dir_private_and_keeps_its_own(tmp_root: Path) -> None:
    fresh = secure_state_dir(tmp_root / "a" / "cp")
    assert fresh.is_dir() and (fresh.stat().st_mode & 0o777) == 0o700
    assert secure_state_dir(fresh) == fresh  # the owner's existing dir: used again
    (fresh / "ports.env").write_text("APISERVER_PORT=1\n")
    os.chmod(fresh / "ports.env", 0o600)
    assert read_state_file(fresh / "ports.env") == "APISERVER_PORT=1\n"
    assert secure_state_dir(tmp_root / "absent", create=False) == tmp_root / "absent"
    assert not (tmp_root / "absent").exists()
