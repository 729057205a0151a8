"""Structured logs: one JSON object per line, to `logFile` or stderr, never stdout.

Each line starts with `ts` (ISO 8601, UTC, milliseconds), `level` and `msg`
(the message), like the publisher's (publisher/logs.py), then `component`
and the line's fields; a field can never replace the message.

stdout belongs to the CNI protocol (libcni parses it), so a stray log line
there would break the runtime. The file is opened lazily with O_APPEND and
each record is one write(2), so concurrent plugin runs do not interleave.

No `logFile` (absent or ""): no file at all; warnings and errors go to stderr,
which the runtime records with the plugin's failure, and info lines are
dropped (a node's runtime log is not the place for one line per pod start).

The file is root's: pod names, container ids and errors go into it, so a file
someone else could read or made for us is refused. A user who may add names to
the log's directory (a sticky directory such as /tmp) can plant the name before
root creates it: a file of theirs, a hard link to another file, a FIFO (an open
for writing would block every ADD until someone reads) or a symlink. So the
file is opened O_NOFOLLOW|O_NONBLOCK (a FIFO nobody reads fails at once instead
of blocking) and kept only if fstat shows a regular file owned by the plugin's
euid with one link and no group or other write bit. Anything else is closed
unwritten; one short line on stderr says the log file was refused and why (no
event, no pod), and the run carries on as without `logFile`.

The file is bounded: a run that opens it at MAX_LOG_BYTES or more renames it to
`<logFile>.1` (replacing the previous one) and starts a new file, so the log
never takes more than about twice the cap. Rotation is safe under concurrent
runs: a run still holding the old file appends to `.1` (nothing is lost), and
a run renames only the file it opened (same inode), so two runs that both see
an oversized file do not rotate twice.
"""

from __future__ import annotations

import time

from .lean import posixos as os
from .lean.jsonio import dumps

MAX_LOG_BYTES = 1 << 20  # one MiB per file: plugin.log plus plugin.log.1
ROTATED_SUFFIX = ".1"


def _timestamp(now: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + f".{int(now % 1 * 1000):03d}Z"


LOG_FLAGS = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
LOG_MODE = 0o600
_S_IFMT = 0o170000
_FILE_KINDS = {0o100000: "a regular file", 0o010000: "a FIFO", 0o140000: "a socket", 0o020000: "a character device",
               0o060000: "a block device", 0o040000: "a directory", 0o120000: "a symbolic link"}
_EPERM = 1
_ENXIO = 6  # open(O_WRONLY|O_NONBLOCK) of a FIFO with no reader
_ELOOP = 40  # open(O_NOFOLLOW) of a symlink


class RefusedLogFile(OSError):
    """The name `logFile` points at is not a file root may append pod details to."""


def _refusal(st: os.stat_result) -> str:
    """Why this opened file must not receive the log ("" when it may): module docstring."""
    kind = st.st_mode & _S_IFMT
    if kind != 0o100000:
        return f"it is {_FILE_KINDS.get(kind, 'not a regular file')}, not a regular file"
    euid = os.geteuid()
    if st.st_uid != euid:
        return f"it is owned by uid {st.st_uid}, not {euid}"
    if st.st_nlink != 1:
        return f"it has {st.st_nlink} hard links, not 1"
    if st.st_mode & 0o022:
        return f"it is writable by group or others (mode {st.st_mode & 0o7777:o})"
    return ""


def _open_file(dfd: int, name: str, path: str) -> int:
    """Open NAME in the log's directory and keep it only if _refusal finds nothing wrong."""
    try:
        fd = os.open(name, LOG_FLAGS, LOG_MODE, dir_fd=dfd)
    except OSError as exc:
        if exc.errno == _ELOOP:
            raise RefusedLogFile(_ELOOP, f"refusing {path}: it is a symbolic link") from None
        if exc.errno == _ENXIO:
            raise RefusedLogFile(_ENXIO, f"refusing {path}: it is a FIFO or socket, not a regular file") from None
        raise
    try:
        why = _refusal(os.fstat(fd))
    except BaseException:
        os.close(fd)
        raise
    if why:
        os.close(fd)
        raise RefusedLogFile(_EPERM, f"refusing {path}: {why}")
    return fd


def _open_log(path: str) -> int:
    """Open the log for appending without following a link anywhere on its path.

    The directory is opened like the spool's (safefs.open_dir: component by
    component, root-owned, created 0750 when missing, never chmod-ed if it
    exists); the file is created 0600 with O_NOFOLLOW relative to it and
    checked after the open (module docstring), the new file after a rotation too.
    """
    from .lean.safefs import open_dir

    dfd = open_dir(os.path.dirname(path), 0o750)
    try:
        name = os.path.basename(path)
        fd = _open_file(dfd, name, path)
        if os.fstat(fd).st_size < MAX_LOG_BYTES:
            return fd
        if _rotate(dfd, name, fd):
            os.close(fd)
            fd = _open_file(dfd, name, path)
        return fd
    finally:
        os.close(dfd)


def _rotate(dfd: int, name: str, fd: int) -> bool:
    """Rename the oversized file to NAME.1 if NAME is still the file we opened.

    Another run may have rotated it already (NAME is then a new, small file):
    renaming that one would throw away the log just rotated. A lost race
    leaves the file as it is; a failed rename keeps appending to the old file.
    """
    try:
        current = os.stat(name, dir_fd=dfd, follow_symlinks=False)
        mine = os.fstat(fd)
        if (current.st_dev, current.st_ino) != (mine.st_dev, mine.st_ino):
            return True
        os.rename(name, name + ROTATED_SUFFIX, src_dir_fd=dfd, dst_dir_fd=dfd)
    except OSError:
        return False
    return True


class Log:
    def __init__(self, path: str | None = None) -> None:
        self.path = path
        self.fields: dict[str, object] = {}
        self._fd: int | None = None
        self.unusable = ""  # why logFile could not be opened or was refused (said once on stderr)

    def configure(self, path: str) -> None:
        self.path = path

    def bind(self, **fields: object) -> None:
        """Fields repeated on every later line (containerID, pod, ifname, ...)."""
        self.fields.update((k, v) for k, v in fields.items() if v not in (None, ""))

    def _open(self) -> int:
        if self._fd is None:
            self._fd = 2
            if self.path:
                try:
                    self._fd = _open_log(self.path)
                except OSError as exc:
                    self._fd = 2
                    refused = isinstance(exc, RefusedLogFile)
                    said = exc.strerror if refused else None  # a RefusedLogFile always has its reason there
                    self.unusable = said if said is not None else f"{type(exc).__name__}: {exc}"
                    self._say_refused()
        return self._fd

    def _say_refused(self) -> None:
        """The one stderr line about an unusable logFile: why, and nothing of the pod or the event."""
        record = {"ts": _timestamp(time.time()), "level": "warning", "msg": "logFile refused; logging as without it",
                  "component": "netclaim-cni", "logFileError": self.unusable}
        try:
            os.write(2, dumps(record).encode() + b"\n")
        except OSError:
            pass

    def write(self, level: str, message: str, **fields: object) -> None:
        if level == "info" and (not self.path or self._open() == 2):
            return  # no (usable) logFile: only what the runtime should show (module docstring)
        now = time.time()
        record: dict[str, object] = {"ts": _timestamp(now), "level": level, "msg": message, "component": "netclaim-cni"}
        record.update(self.fields)
        record.update(fields)
        record["ts"], record["level"], record["msg"] = _timestamp(now), level, message  # never a field's
        if self._open() == 2 and self.unusable:
            record["logFileError"] = self.unusable
        try:
            line = dumps(record)
        except (TypeError, ValueError):
            line = dumps({"ts": record["ts"], "level": level, "msg": message, "note": "unserializable fields"})
        try:
            os.write(self._open(), line.encode() + b"\n")
        except OSError:
            if self._fd != 2:
                try:
                    os.write(2, line.encode() + b"\n")
                except OSError:
                    pass

    def info(self, message: str, **fields: object) -> None:
        self.write("info", message, **fields)

    def warning(self, message: str, **fields: object) -> None:
        self.write("warning", message, **fields)

    def error(self, message: str, **fields: object) -> None:
        self.write("error", message, **fields)

    def close(self) -> None:
        if self._fd is not None and self._fd != 2:
            os.close(self._fd)
        self._fd = None

