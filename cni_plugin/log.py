"""Structured logs: one JSON object per line, to `logFile` or stderr, never stdout.

stdout belongs to the CNI protocol (libcni parses it), so a stray log line
there would break the runtime. The file is opened lazily with O_APPEND and
each record is one write(2), so concurrent plugin runs do not interleave.
"""

from __future__ import annotations

import os
import time

from .jsonio import dumps


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
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
        return os.open(os.path.basename(path), flags, 0o640, dir_fd=dfd)
    finally:
        os.close(dfd)


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

