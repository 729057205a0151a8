"""The harness's state dirs: made mode 0700, or refused when someone else could have planted them.

The harness runs as root and hands these dirs to scripts/control-plane.sh and
scripts/cluster.sh, which source files from them, kill the pids their pid
files name and remove them on `down`. Their defaults are fixed names in a
world-writable /tmp, so a dir some other local user created first must never
be taken for ours. The rule is the one scripts/harness/statedir.sh applies:
a real directory (not a symlink), owned by the current uid, writable by
nobody else, below directories owned by root or us that others can write only
with the sticky bit; a file read from it is a regular file of ours that
group and others cannot write.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path


# The scripts' own defaults (scripts/control-plane.sh, scripts/cluster.sh), for callers that leave
# NETCLAIM_CP_DIR / NETCLAIM_CLUSTER_DIR unset.
DEFAULT_CP_DIR = "/tmp/netclaim-cp"
DEFAULT_CLUSTER_DIR = "/tmp/netclaim-cluster"


class UnsafeStateDir(RuntimeError):
    """A state dir or file that another user could have planted or could still change."""


def _problem(st: os.stat_result, what: str, uid: int) -> str | None:
    if st.st_uid != uid:
        return f"{what} is owned by uid {st.st_uid}, not by uid {uid}"
    if st.st_mode & 0o022:
        return f"{what} is writable by group or others (mode {stat.S_IMODE(st.st_mode):o})"
    return None


def _ancestor_problem(path: Path, uid: int) -> str | None:
    for parent in path.resolve().parents:
        st = parent.stat()
        if st.st_uid not in (0, uid):
            return f"{parent} (above {path}) is owned by uid {st.st_uid}"
        if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
            return (f"{parent} (above {path}) is writable by group or others without the sticky bit "
                    f"(mode {stat.S_IMODE(st.st_mode):o})")
    return None


def secure_state_dir(path: str | os.PathLike[str], create: bool = True) -> Path:
    """`path` as a state dir that only we control; made (mode 0700) when absent and `create`.

    Raises UnsafeStateDir with the reason for a symlink, a non-directory, or a dir that another
    user owns or could write (or rename away: see the ancestors' rule)."""
    directory = Path(path)
    uid = os.geteuid()
    if create and not os.path.lexists(directory):
        old = os.umask(0o077)
        try:
            directory.mkdir(parents=True, exist_ok=True)
        finally:
            os.umask(old)
    if not os.path.lexists(directory):
        return directory
    st = os.lstat(directory)
    if stat.S_ISLNK(st.st_mode):
        raise UnsafeStateDir(f"refusing state dir {directory}: it is a symlink (remove it or choose another dir)")
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafeStateDir(f"refusing state dir {directory}: it is not a directory")
    problem = _problem(st, str(directory), uid) or _ancestor_problem(directory, uid)
    if problem:
        raise UnsafeStateDir(f"refusing state dir {directory}: {problem} (remove it or choose another dir)")
    return directory


def read_state_file(path: str | os.PathLike[str]) -> str:
    """The text of a file of a state dir, when it is a regular file only we can write."""
    file = Path(path)
    try:
        fd = os.open(file, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UnsafeStateDir(f"refusing to read {file}: it is a symlink") from None
        raise
    with os.fdopen(fd, "r") as fh:
        st = os.fstat(fh.fileno())
        problem = "it is not a regular file" if not stat.S_ISREG(st.st_mode) else _problem(st, "it", os.geteuid())
        if problem:
            raise UnsafeStateDir(f"refusing to read {file}: {problem}")
        return fh.read()
