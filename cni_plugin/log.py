"""Structured logs: one JSON object per line, to `logFile` or stderr, never stdout.

stdout belongs to the CNI protocol (libcni parses it), so a stray log line
there would break the runtime. The file is opened lazily with O_APPEND and
each record is one write(2), so concurrent plugin runs do not interleave.

No `logFile` (absent or ""): no file at all; warnings and errors go to stderr,
which the runtime records with the plugin's failure, and info lines are
dropped (a node's runtime log is not the place for one line per pod start).

The file is bounded: a run that opens it at MAX_LOG_BYTES or more renames it to
`<logFile>.1` (replacing the previous one) and starts a new file, so the log
never takes more than about twice the cap. Rotation is safe under concurrent
runs: a run still holding the old file appends to `.1` (nothing is lost), and
a run renames only the file it opened (same inode), so two runs that both see
an oversized file do not rotate twice.
"""

from __future__ import annotations

import time

from . import posixos as os
from .jsonio import dumps

MAX_LOG_BYTES = 1 << 20  # one MiB per file: plugin.log plus plugin.log.1
ROTATED_SUFFIX = ".1"


def _timestamp(now: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + f".{int(now % 1 * 1000):03d}Z"


def _open_log(path: str) -> int:
    """Open the log for appending without following a link anywhere on its path.

    The directory is opened like the spool's (safefs.open_dir: component by
    component, root-owned, created 0750 when missing, never chmod-ed if it
    exists); the file is created 0640 with O_NOFOLLOW relative to it.
    """
    from .safefs import open_dir

    dfd = open_dir(os.path.dirname(path), 0o750)
    try:
        name = os.path.basename(path)
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(name, flags, 0o640, dir_fd=dfd)
        if os.fstat(fd).st_size < MAX_LOG_BYTES:
            return fd
        if _rotate(dfd, name, fd):
            os.close(fd)
            fd = os.open(name, flags, 0o640, dir_fd=dfd)
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
        self.unusable = ""  # why logFile could not be opened (the log then goes to stderr)

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
                    self.unusable = f"{type(exc).__name__}: {exc}"
        return self._fd

    def write(self, level: str, event: str, **fields: object) -> None:
        if level == "info" and not self.path:
            return  # no logFile: only what the runtime should show (module docstring)
        now = time.time()
        record = {"ts": _timestamp(now), "level": level, "event": event, "component": "netclaim-cni"}
        record.update(self.fields)
        record.update(fields)
        if self._open() == 2 and self.unusable:
            record["logFileError"] = self.unusable
        try:
            line = dumps(record)
        except (TypeError, ValueError):
            line = dumps({"ts": record["ts"], "level": level, "event": event, "note": "unserializable fields"})
        try:
            os.write(self._open(), line.encode() + b"\n")
        except OSError:
            if self._fd != 2:
                try:
                    os.write(2, line.encode() + b"\n")
                except OSError:
                    pass

    def info(self, event: str, **fields: object) -> None:
        self.write("info", event, **fields)

    def warning(self, event: str, **fields: object) -> None:
        self.write("warning", event, **fields)

    def error(self, event: str, **fields: object) -> None:
        self.write("error", event, **fields)

    def close(self) -> None:
        if self._fd is not None and self._fd != 2:
            os.close(self._fd)
        self._fd = None

