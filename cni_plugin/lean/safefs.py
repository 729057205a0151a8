"""Files the root plugin writes, never where an unprivileged user can redirect them.

The plugin runs as root on every pod start. A path such as `spoolDir` or
`logFile` is only as safe as its least trusted directory: whoever can write to
an ancestor can swap a component for a symlink and make root create, chmod or
append to files elsewhere. So a directory is opened component by component
from "/" with openat(O_NOFOLLOW|O_DIRECTORY) (a symlink anywhere is refused,
never followed), missing components are created by root (0755, the last one
with the caller's mode), and every directory on the way must be *trusted*:

    owned by root (or by the plugin's own uid), and not writable by group or
    others unless the sticky bit is set (like /tmp: others may add entries
    there but cannot rename or remove root's, and a name they plant first is
    caught by the owner and no-symlink rules).

Anything else raises UnsafePath (an OSError), which the callers treat like any
other unusable directory. Files are created O_EXCL|O_NOFOLLOW relative to the
opened directory, written completely (a short write is retried, never
ignored), fsynced (unless the caller says a crash may lose the file: spooled
events, docs/plugin.md) and renamed into place; a failed write removes its
temp file.

This module is on the plugin's hot path: standard library only, nothing at import.
"""

from __future__ import annotations

from . import posixos as os

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
TMP_SUFFIX = ".tmp"
_ENOSPC = 28
_EPERM = 1
_EINVAL = 22
_STICKY = 0o1000


class UnsafePath(OSError):
    """A directory on the path is not trusted (see the module docstring)."""


def _trusted_uids() -> tuple[int, int]:
    return (0, os.geteuid())


def _check_trusted(st: os.stat_result, where: str, path: str) -> None:
    if st.st_uid not in _trusted_uids():
        raise UnsafePath(_EPERM, f"{where} is owned by uid {st.st_uid}, not root: refusing to use {path}")
    if st.st_mode & 0o022 and not st.st_mode & _STICKY:
        raise UnsafePath(_EPERM, f"{where} is writable by group or others (mode {st.st_mode & 0o7777:o}) "
                                 f"without the sticky bit: refusing to use {path}")


def _components(path: str) -> list[str]:
    if not path.startswith("/"):
        raise UnsafePath(_EINVAL, f"{path!r} is not an absolute path")
    parts = [p for p in path.split("/") if p and p != "."]
    if ".." in parts:
        raise UnsafePath(_EINVAL, f"{path!r} contains '..'")
    return parts


def open_dir(path: str, mode: int = 0o700, *, create: bool = True, fix_mode: bool = False) -> int:
    """Open directory `path` safely (module docstring); returns an fd the caller closes.

    `create`: make missing components (0755; the last one `mode`). `fix_mode`:
    the last directory is the plugin's own and is set to exactly `mode` with
    fchmod on the opened fd (its owner must still be trusted: a directory of
    another user is refused, never chmod-ed); without it, the last directory
    must be trusted like its ancestors.
    """
    parts = _components(path)
    fd = os.open("/", DIR_FLAGS)
    try:
        _check_trusted(os.fstat(fd), "/", path)
        for i, name in enumerate(parts):
            last = i == len(parts) - 1
            child = _step(fd, name, mode if last else 0o755, create)
            os.close(fd)
            fd = child
            where = "/" + "/".join(parts[:i + 1])
            st = os.fstat(fd)
            if last and fix_mode:
                if st.st_uid not in _trusted_uids():
                    _check_trusted(st, where, path)
                if st.st_mode & 0o7777 != mode:
                    os.fchmod(fd, mode)
            else:
                _check_trusted(st, where, path)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _step(parent: int, name: str, mode: int, create: bool) -> int:
    """Open directory `name` under `parent` without following a link, creating it if asked."""
    try:
        return os.open(name, DIR_FLAGS, dir_fd=parent)
    except FileNotFoundError:
        if not create:
            raise
    try:
        os.mkdir(name, mode, dir_fd=parent)
    except FileExistsError:
        pass
    return os.open(name, DIR_FLAGS, dir_fd=parent)


def open_private_dir(path: str) -> int:
    """A directory of the plugin's own (spool, state): created or fixed to 0700; returns an fd."""
    return open_dir(path, 0o700, fix_mode=True)


def write_all(fd: int, data: bytes) -> None:
    """write(2) until every byte is written; a short write is retried, a write of 0 is ENOSPC."""
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        if written <= 0:
            raise OSError(_ENOSPC, "write() wrote nothing")
        view = view[written:]


def temp_name(name: str) -> str:
    """`<name>.<pid>.tmp`: the pid tells whether the writer is still alive."""
    return f"{name}.{os.getpid()}{TMP_SUFFIX}"


def write_file_at(dir_fd: int, name: str, data: bytes, *, sync: bool = True) -> None:
    """Replace `name` in the directory: temp file, full write, fsync, rename, fsync the dir.

    On any failure the temp file is removed: nothing half-written is ever
    renamed into place or left behind. `sync=False` leaves out both fsyncs:
    readers still see the old file or the whole new one, and only an OS crash
    (not a crash of this process) can lose or tear the file.
    """
    tmp = temp_name(name)
    try:
        os.unlink(tmp, dir_fd=dir_fd)  # left by a crashed run with our pid
    except FileNotFoundError:
        pass
    fd = os.open(tmp, NEW_FILE, 0o600, dir_fd=dir_fd)
    try:
        try:
            write_all(fd, data)
            if sync:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        try:
            os.unlink(tmp, dir_fd=dir_fd)
        except OSError:
            pass
        raise
    if sync:
        os.fsync(dir_fd)


def stale_temp(name: str) -> bool:
    """Is `name` a temp file (temp_name) whose writer is gone (or is this very process)?"""
    if not name.endswith(TMP_SUFFIX):
        return False
    pid = name[:-len(TMP_SUFFIX)].rpartition(".")[2]
    if not pid.isdigit():
        return False
    if int(pid) == os.getpid():
        return True  # ours from an earlier run of a reused pid: this run has not made one yet
    return pid_gone(int(pid))


def pid_gone(pid: int) -> bool:
    """No process has this pid (kill(pid, 0) says ESRCH); a process we may not signal is alive."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:
        return False
    return False


def read_at(dir_fd: int, name: str, limit: int) -> bytes:
    """Read a regular file `name` (no symlink) of at most `limit` bytes; OSError otherwise."""
    fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    try:
        size = os.fstat(fd).st_size
        if size > limit:
            raise OSError(_EINVAL, f"{name} is {size} bytes, over the {limit}-byte limit")
        chunks: list[bytes] = []
        while True:
            chunk = os.read(fd, 65536)
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)
    finally:
        os.close(fd)
