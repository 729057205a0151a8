"""netclaim's DRA driver names as the publisher is told them: its flags and the installer's drivers file.

The unchained check (publisher/repair/unchained.py) only asks about claims of these drivers, and
with none it is off. The chart hands them over in NETCLAIM_DRIVER_NAMES. A node installed with
scripts/install.sh has its drivers in the conflists only, and those are what a primary CNI's
installer rewrites without netclaim, exactly when the check is needed: so the installer records
the driver of every conflist it chains netclaim into, one `DRIVER CONFLIST` line each, in a
drivers file (the systemd unit's is /etc/netclaim/drivers, passed with --drivers-file), and
--uninstall of a conflist drops that conflist's line only. Several networks, several lines; two
networks of one driver keep it until both are gone.

The file is read again whenever it changes (one stat per look), so a network installed or
removed after the publisher started counts without a restart. Blank lines and `#` comments are
skipped; the first word of every other line is a driver name (a line of just a name counts too).
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field


def read_drivers(text: str) -> frozenset[str]:
    """The driver names a drivers file's text holds: the first word of each line that is not a comment."""
    names = set()
    for line in text.splitlines():
        words = line.split()
        if words and not words[0].startswith("#"):
            names.add(words[0])
    return frozenset(names)


@dataclass
class DriverNames:
    """The given names (--driver-name) and those of the drivers file, as the file is now."""

    given: tuple[str, ...] = ()
    path: str = ""  # the drivers file; "" when none was named
    problem: str = ""  # why the file could not be read (it is then taken as naming none)
    _stamp: tuple[int, int, int] | None = None
    _from_file: frozenset[str] = frozenset()
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def current(self) -> frozenset[str]:
        """Every driver name now; the file is read again only when its inode, size or mtime changed."""
        if self.path:
            with self._lock:
                self._reread_if_changed()
        return frozenset(n for n in self.given if n) | self._from_file

    def _reread_if_changed(self) -> None:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            self._stamp, self._from_file, self.problem = None, frozenset(), ""
            return
        except OSError as exc:
            self._stamp, self._from_file, self.problem = None, frozenset(), f"{self.path}: {exc.strerror}"
            return
        stamp = (st.st_ino, st.st_size, st.st_mtime_ns)
        if stamp == self._stamp:
            return
        try:
            with open(self.path, encoding="utf-8", errors="replace") as f:
                self._from_file, self.problem = read_drivers(f.read()), ""
        except OSError as exc:
            self._from_file, self.problem = frozenset(), f"{self.path}: {exc.strerror}"
        self._stamp = stamp

    def off_reason(self) -> str:
        """Why no driver is known, for the start line and `status`; "" when one is."""
        if self.current():
            return ""
        where = "no --driver-name or NETCLAIM_DRIVER_NAMES"
        if not self.path:
            return (f"{where}, and no --drivers-file (the file scripts/install.sh records each conflist's "
                    f"driver in)")
        if self.problem:
            return f"{where}, and the drivers file cannot be read ({self.problem}); looked at again when it changes"
        return (f"{where}, and the drivers file {self.path} names none yet (scripts/install.sh records each "
                f"conflist's driver there); looked at again when it changes")
