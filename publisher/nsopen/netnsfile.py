"""Open a netns by its path, bound to the runtime's netns directories, and make sockets in it.

A netns path comes from the runtime (CNI_NETNS, recorded at ADD). Only a
name directly in one of the configured directories is opened: a
`/proc/<pid>/ns/net` path would resolve in the opener's or publisher's own
PID namespace (pid 1 there is not the pod's, and a pid is reused), so it is
refused, as is a symlink (O_NOFOLLOW). The open never blocks (O_NONBLOCK: a
FIFO at that name returns at once) and the file must be on nsfs before
setns(2) is asked to enter it.
"""

from __future__ import annotations

import errno
import os
import socket
import threading
from collections.abc import Sequence
from typing import Any

from cni_plugin.lean.netns import CLONE_NEWNET, setns

NSFS_MAGIC = 0x6E736673
OPEN_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC
DEFAULT_NETNS_DIRS = ("/var/run/netns",)  # containerd's and CRI-O's default (/run/netns)
AF_NETLINK = 16
NETLINK_ROUTE = 0


class NotWatchable(OSError):
    """The path names no netns this watch may open (outside the netns directories, not nsfs)."""


class NotANetns(NotWatchable):
    """The path exists but is no network namespace (not nsfs, or setns refused it)."""


def allowed_dir(path: str, dirs: Sequence[str]) -> str:
    """The configured directory `path` names a file directly in; NotWatchable otherwise.

    Compared by real path, so /var/run/netns and /run/netns are one directory; the file itself is
    then opened relative to the configured directory, so no link on the way can lead elsewhere."""
    name = os.path.basename(path)
    if not os.path.isabs(path) or name in ("", ".", ".."):
        raise NotWatchable(errno.EACCES, "not a file name in a netns directory", path)
    parent = os.path.realpath(os.path.dirname(path))
    for directory in dirs:
        if os.path.realpath(directory) == parent:
            return directory
    raise NotWatchable(errno.EACCES, f"not in a netns directory of the live watch ({' '.join(dirs)})", path)


def fs_magic(fd: int) -> int:
    """fstatfs(2)'s f_type (Python has no fstatfs: os.fstatvfs does not report the type)."""
    import ctypes

    buf = ctypes.create_string_buffer(256)  # struct statfs: 120 bytes on 64-bit Linux, f_type first
    if _libc().fstatfs(fd, buf) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return ctypes.c_long.from_buffer(buf).value & 0xFFFFFFFF


_LIBC: Any = None  # libc through ctypes, imported when first needed (not on the CLI's path)


def _libc() -> Any:
    global _LIBC
    if _LIBC is None:
        import ctypes

        _LIBC = ctypes.CDLL(None, use_errno=True)
    return _LIBC


def open_netns(path: str, dirs: Sequence[str]) -> int:
    """An O_RDONLY fd on the nsfs inode at `path` (the caller closes it).

    Errors name `path` (a missing netns: ENOENT with filename == path), except a missing
    directory, which names the directory (not mounted here: nothing is said of the sandbox)."""
    directory = allowed_dir(path, dirs)
    dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fd = os.open(os.path.basename(path), OPEN_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        raise OSError(exc.errno, exc.strerror, path) from None
    finally:
        os.close(dir_fd)
    try:
        if fs_magic(fd) != NSFS_MAGIC:
            raise NotANetns(errno.EINVAL, "not a namespace file (not on nsfs)", path)
    except BaseException:
        os.close(fd)
        raise
    return fd


def identity_of(fd: int) -> tuple[int, int]:
    st = os.fstat(fd)
    return (st.st_dev, st.st_ino)


def netlink_socket() -> socket.socket:
    """An unbound NETLINK_ROUTE socket; whoever holds it binds it (groups need no capability)."""
    return socket.socket(AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, NETLINK_ROUTE)


def sockets_in(netns_fd: int, path: str) -> tuple[socket.socket, socket.socket]:
    """Two unbound rtnetlink sockets (events, reader) created inside the netns of `netns_fd`.

    Created by a thread of its own that enters the netns and ends there: the calling thread
    never changes namespace, so there is no way back to get wrong."""
    made: list[socket.socket] = []
    failed: list[BaseException] = []

    def enter() -> None:
        try:
            setns(netns_fd, CLONE_NEWNET)
            made.append(netlink_socket())
            made.append(netlink_socket())
        except BaseException as exc:  # noqa: BLE001 (handed to the calling thread, raised there)
            failed.append(exc)

    thread = threading.Thread(target=enter, name="netns-enter", daemon=True)
    thread.start()
    thread.join()
    if failed or len(made) != 2:
        for sock in made:
            sock.close()
        exc = failed[0] if failed else OSError(errno.EIO, "no sockets made")
        if isinstance(exc, OSError) and exc.errno == errno.EINVAL:
            raise NotANetns(errno.EINVAL, "not a network namespace", path) from None
        if isinstance(exc, OSError):
            raise OSError(exc.errno, exc.strerror or str(exc), path) from None
        raise exc
    return made[0], made[1]
