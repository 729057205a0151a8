"""The spool: events kept in files while the publisher cannot take them.

The spool is bounded (count and bytes): a publisher gone for good must not
fill the node's disk. An event over the cap is not written; the drop is
counted in the marker file `overflow` (no `.json` suffix, so no listing
mistakes it for an event), which the publisher reports and takes away.
The marker is updated (in place) under flock(2) on the spool directory
itself, not on the marker: the publisher takes it away by rename, so a lock
on it would guard an inode that the next writer no longer opens, and counts
would be lost.
The directory is opened component by component without following links
(cni_plugin/lean/safefs.py) and chmod-ed through that fd only. Temp files count
against the caps while their writer lives; those of dead writers are removed.

An event file is written completely to a temp file and renamed into place, so
a reader never sees half an event, but nothing is fsynced (not the file, not
the directory): only an OS crash or power loss can lose or tear it, and that
crash destroyed the sandbox the event is about. The publisher drops the torn
files of earlier boots without alarm (publisher/intake/spool.py).
"""

from __future__ import annotations

import time

from ..lean import posixos as os
from ..lean.jsonio import JSONError, dumps, loads
from ..lean.safefs import (
    DIR_FLAGS as _DIR_FLAGS,
    NEW_FILE,
    TMP_SUFFIX,
    open_private_dir,
    pid_gone,
    read_at,
    stale_temp,
    temp_name,
    write_all,
    write_file_at,
)
from .event import MAX_EVENT_BYTES, Event, EventTooLarge, decode_body, encode_event

DEFAULT_SPOOL_DIR = "/var/lib/netclaim/spool"
SPOOL_SUFFIX = ".event.json"
DEFAULT_SPOOL_MAX_FILES = 1024
DEFAULT_SPOOL_MAX_BYTES = 64 << 20
OVERFLOW_NAME = "overflow"
_ENOSPC = 28
_EFBIG = 27
_EDQUOT = 122


class SpoolFull(OSError):
    """The spool is at its cap: the event was counted in the overflow marker, not written."""


def spool_name(event: Event) -> str:
    """Spool files sort by time, so a replay keeps the plugin's order."""
    return f"{time.time_ns():020d}-{event.event_id}{SPOOL_SUFFIX}"


def spool_usage(dir_fd: int, max_files: int | None = None) -> tuple[int, int]:
    """(files, bytes) the spool holds: events plus temp files of live writers.

    Temp files of dead writers (a plugin killed mid-write) are removed here,
    so nothing leaks; those of live ones count, so concurrent writers cannot
    hide bytes from the caps. With `max_files`, a spool already holding that
    many files is not stat-ed: the file cap alone refuses the event, and on a
    node whose publisher is gone every hand-off finds the spool so (a stat per
    file is most of the cost of a hand-off then); its bytes are returned as -1.
    """
    names = []
    for name in os.listdir(dir_fd):
        if name.endswith(TMP_SUFFIX) and stale_temp(name):
            try:
                os.unlink(name, dir_fd=dir_fd)
            except FileNotFoundError:
                pass
        elif name.endswith(SPOOL_SUFFIX) or name.endswith(TMP_SUFFIX):
            names.append(name)
    if max_files is not None and len(names) >= max_files:
        return len(names), -1
    count = size = 0
    for name in names:
        try:
            st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            continue
        size += st.st_size
        count += 1
    return count, size


def _full(count: int, size: int, max_files: int, max_bytes: int) -> str:
    held = f"{count} files" if size < 0 else f"{count} files, {size} bytes"
    return f"spool is full ({held}; caps {max_files}, {max_bytes})"


def write_spool(spool_dir: str, event: Event, max_files: int = DEFAULT_SPOOL_MAX_FILES,
                max_bytes: int = DEFAULT_SPOOL_MAX_BYTES, data: bytes | None = None) -> str:
    """Write one event whole (0600 file in a 0700 dir, temp file + rename, no fsync); returns its path.

    `data` is the event as encode_event made it (encoded here when None).
    Raises EventTooLarge over MAX_EVENT_BYTES, SpoolFull (after counting the
    drop in the overflow marker) when the event would take the spool over
    `max_files` or `max_bytes`, OSError when it cannot be written completely
    (nothing is left behind then). The check and the write are not one atomic
    step, so concurrent plugin runs can overshoot the cap by at most their number.
    """
    if data is None:
        data = encode_event(event)
    dfd = open_private_dir(spool_dir)
    try:
        count, size = spool_usage(dfd, max_files)
        if count + 1 > max_files or size + len(data) > max_bytes:
            record_overflow(dfd, event.op)
            raise SpoolFull(_ENOSPC, _full(count, size, max_files, max_bytes))
        name = spool_name(event)
        write_file_at(dfd, name, data, sync=False)  # no fsync: see the comment above DEFAULT_SPOOL_MAX_FILES
    finally:
        os.close(dfd)
    return os.path.join(spool_dir, name)


def spool_problem(spool_dir: str, max_files: int = DEFAULT_SPOOL_MAX_FILES,
                  max_bytes: int = DEFAULT_SPOOL_MAX_BYTES) -> str:
    """Why an event could not be spooled now ("" when it could). STATUS uses it.

    It does what write_spool does short of writing an event: opens (creates)
    the directory the same way, checks the caps, checks that the file system
    has room for the largest event and a free inode, and creates and removes
    a probe file (which catches a read-only mount).
    """
    try:
        dfd = open_private_dir(spool_dir)
    except OSError as exc:
        return f"spool dir: {type(exc).__name__}: {exc}"
    try:
        count, size = spool_usage(dfd, max_files)
        if count + 1 > max_files or size >= max_bytes:
            return _full(count, size, max_files, max_bytes)
        fs = os.fstatvfs(dfd)
        if fs.f_bavail * fs.f_frsize < MAX_EVENT_BYTES or fs.f_favail == 0:
            return (f"spool file system is full ({fs.f_bavail * fs.f_frsize} bytes, {fs.f_favail} inodes free; "
                    f"an event needs up to {MAX_EVENT_BYTES} bytes)")
        _probe(dfd)
    except OSError as exc:
        return f"spool: {type(exc).__name__}: {exc}"
    finally:
        os.close(dfd)
    return ""


def _probe(dir_fd: int) -> None:
    """Create, write and remove a temp file (a dead prober's is cleaned like any temp file)."""
    name = temp_name(".probe")
    fd = os.open(name, NEW_FILE, 0o600, dir_fd=dir_fd)
    try:
        write_all(fd, b"{}")
    finally:
        os.close(fd)
        os.unlink(name, dir_fd=dir_fd)


def read_spool(path: str) -> Event:
    """One spooled event; WireError (the publisher quarantines the file) when it is not one.

    The size is checked with fstat before anything is read, so a huge file
    costs no memory; the depth is checked by Event.from_dict.
    """
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if st.st_size > MAX_EVENT_BYTES:
            raise EventTooLarge(f"spool file of {st.st_size} bytes exceeds the {MAX_EVENT_BYTES}-byte event cap")
        chunks = []
        left = MAX_EVENT_BYTES + 1
        while left > 0:
            chunk = os.read(fd, min(left, 65536))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
    finally:
        os.close(fd)
    if left <= 0:
        raise EventTooLarge(f"spool file grew past the {MAX_EVENT_BYTES}-byte event cap while read")
    return Event.from_dict(decode_body(b"".join(chunks)))


def list_spool(spool_dir: str) -> list[str]:
    """Complete spool files in write order (temp files and the overflow marker are skipped)."""
    try:
        names = os.listdir(spool_dir)
    except FileNotFoundError:
        return []
    return [os.path.join(spool_dir, n) for n in sorted(names) if n.endswith(SPOOL_SUFFIX)]


def record_overflow(dir_fd: int, command: str) -> dict:
    """Count one dropped event in the marker, under the directory's lock; returns the marker.

    The marker is rewritten in place (one pwrite of a fixed-width record at
    offset 0), not replaced by rename: on a node whose publisher is gone every
    pod start and stop lands here, and ext4 writes a file renamed over another
    out to disk before the rename (auto_da_alloc), a flush per pod start. In
    place it is a page-cache write, and on a full file system it still counts
    (the block is already there). No fsync, like an event file: an OS crash
    that loses the count destroyed the sandboxes whose events it counted.
    Anything but a plain file of ours at the name is replaced as before.
    """
    import fcntl

    fcntl.flock(dir_fd, fcntl.LOCK_EX)
    try:
        fd = _open_marker(dir_fd)
        if fd is None:
            marker = _next_marker({}, command)
            write_file_at(dir_fd, OVERFLOW_NAME, _marker_record(marker), sync=False)
            return marker
        try:
            current = os.pread(fd, _MARKER_LIMIT + 1, 0)
            marker = _next_marker((_parse_overflow(current) if len(current) <= _MARKER_LIMIT else None) or {},
                                  command)
            record = _marker_record(marker)
            if os.pwrite(fd, record, 0) != len(record):
                raise OSError(_ENOSPC, "overflow marker: short write")
            if len(current) > len(record):
                os.ftruncate(fd, len(record))
        finally:
            os.close(fd)
    finally:
        fcntl.flock(dir_fd, fcntl.LOCK_UN)
    return marker


_MARKER_LIMIT = 4096  # the marker is ~120 bytes; anything bigger is not ours
_MARKER_WIDTH = 256  # every write of the marker is this long (JSON, then spaces): it never leaves a tail
_S_IFMT, _S_IFREG = 0o170000, 0o100000


def _open_marker(dir_fd: int) -> int | None:
    """The marker opened for update (created when missing), or None when the name is not a plain file of ours."""
    try:
        fd = os.open(OVERFLOW_NAME, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o600,
                     dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in (_ENOSPC, _EDQUOT):
            raise
        return None  # a symlink (ELOOP), a directory (EISDIR), ...: replaced by write_file_at
    st = os.fstat(fd)
    if st.st_mode & _S_IFMT != _S_IFREG or st.st_nlink != 1 or st.st_uid != os.geteuid():
        os.close(fd)
        return None
    return fd


def _next_marker(current: dict, command: str) -> dict:
    now = time.time()
    return {"dropped": current.get("dropped", 0) + 1, "firstDroppedAt": current.get("firstDroppedAt", now),
            "lastDroppedAt": now, "lastCommand": command}


def _marker_record(marker: dict) -> bytes:
    return dumps(marker).encode().ljust(_MARKER_WIDTH)


def _parse_overflow(data: bytes) -> dict | None:
    """The marker as a dict with the documented types, or None when it is not one."""
    try:
        marker = loads(data.decode())
    except (UnicodeDecodeError, JSONError):
        return None
    if not isinstance(marker, dict):
        return None
    dropped = marker.get("dropped")
    first, last = _seconds(marker.get("firstDroppedAt")), _seconds(marker.get("lastDroppedAt"))
    if isinstance(dropped, bool) or not isinstance(dropped, int) or dropped < 0:
        return None
    if first is None or last is None:
        return None
    return {"dropped": dropped, "firstDroppedAt": first, "lastDroppedAt": last,
            "lastCommand": str(marker.get("lastCommand", ""))}


def _seconds(value: object) -> float | None:
    """A marker's time as a float, or None when it is not a JSON number (a bool is not one)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def read_overflow(spool_dir: str) -> dict | None:
    """The overflow marker ({dropped, firstDroppedAt, lastDroppedAt, lastCommand}) or None."""
    try:
        fd = os.open(spool_dir, _DIR_FLAGS)
    except OSError:
        return None
    try:
        import fcntl

        fcntl.flock(fd, fcntl.LOCK_SH)  # an update in place is never read half-written
        return _parse_overflow(read_at(fd, OVERFLOW_NAME, _MARKER_LIMIT))
    except OSError:
        return None
    finally:
        os.close(fd)


_TAKEN_PREFIX = f"{OVERFLOW_NAME}.taken."


def take_overflow(spool_dir: str) -> dict | None:
    """Atomically take the marker away (rename under the lock) and return it, or None.

    Drops counted after this call start a new marker, so none is lost or
    counted twice between the publisher's report and the plugins' updates.
    The taken copy (`overflow.taken.<pid>`) is read and removed under the same
    lock, so one found there was left by a taker that died between its rename
    and its unlink: when that pid is gone its count is added to this take.
    """
    import fcntl

    try:
        fd = os.open(spool_dir, _DIR_FLAGS)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            markers = [_take_at(fd, name) for name in sorted(os.listdir(fd))
                       if name.startswith(_TAKEN_PREFIX) and _taker_gone(name)]
            taken = f"{_TAKEN_PREFIX}{os.getpid()}"
            try:
                os.rename(OVERFLOW_NAME, taken, src_dir_fd=fd, dst_dir_fd=fd)
            except FileNotFoundError:
                pass
            else:
                markers.append(_take_at(fd, taken))
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
    return _merge_markers([m for m in markers if m])


def _taker_gone(name: str) -> bool:
    """Is the publisher that took `overflow.taken.<pid>` gone (or this very process)?"""
    pid = name[len(_TAKEN_PREFIX):]
    return pid.isdigit() and (int(pid) == os.getpid() or pid_gone(int(pid)))


def _take_at(dir_fd: int, name: str) -> dict | None:
    """Read a taken marker and remove it (a corrupt one too: there is no count to save)."""
    try:
        return _parse_overflow(read_at(dir_fd, name, _MARKER_LIMIT))
    finally:
        os.unlink(name, dir_fd=dir_fd)


def _merge_markers(markers: list[dict]) -> dict | None:
    """One marker for several takes: drops added, the first and last drop of them all."""
    if not markers:
        return None
    last = max(markers, key=lambda m: m["lastDroppedAt"])
    return {"dropped": sum(m["dropped"] for m in markers),
            "firstDroppedAt": min(m["firstDroppedAt"] for m in markers),
            "lastDroppedAt": last["lastDroppedAt"], "lastCommand": last["lastCommand"]}
