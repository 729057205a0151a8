"""Find and detach mounts left under a directory before it is removed.

containerd mounts each sandbox's rootfs and (with netns_mounts_under_state_dir)
its network namespace under its state dir. If a test dies halfway these stay
mounted; removing the directory tree while they are mounted would fail or,
worse, reach through a bind mount. So: detach them, deepest first, and refuse
to delete while any remains.
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

from .jsonlog import log

_MNT_DETACH = 2
_libc = ctypes.CDLL(None, use_errno=True)


def _unescape(field: str) -> str:
    """mountinfo escapes space, tab, newline and backslash as octal (\\040)."""
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and i + 3 < len(field) and field[i + 1 : i + 4].isdigit():
            out.append(chr(int(field[i + 1 : i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def mounts_under(base: Path) -> list[str]:
    """Mount points at or below `base`, deepest first."""
    prefix = str(base.resolve()).rstrip("/") + "/"
    found = []
    with open("/proc/self/mountinfo") as fh:
        for line in fh:
            point = _unescape(line.split()[4])
            if (point + "/").startswith(prefix):
                found.append(point)
    return sorted(set(found), key=lambda p: p.count("/"), reverse=True)


def detach_all(base: Path) -> list[str]:
    """Lazily unmount everything under `base`; returns what is still mounted."""
    for _ in range(3):
        points = mounts_under(base)
        if not points:
            return []
        for point in points:
            if _libc.umount2(os.fsencode(point), _MNT_DETACH) != 0:
                err = ctypes.get_errno()
                log("mount.detach_failed", mount=point, error=os.strerror(err))
            else:
                log("mount.detached", mount=point)
    return mounts_under(base)
