"""Whether the journal may skip the fsync of each commit: only where it shares the sandboxes' fate.

An ack after a commit without fsync loses nothing a user can see because an
OS crash that could lose the commit also destroys every sandbox it describes,
and the boot rule (publisher/journal/store.py) retires those at the next start. That
holds while the journal lives in the page cache of the kernel that runs the
sandboxes: a local filesystem, a hostPath under runc, a systemd unit. It does
not hold for a state directory on a network or FUSE filesystem (its server or
daemon can lose writes the kernel never had), nor for a publisher inside a
VM-isolated runtime (its guest kernel can die while the host's sandboxes
live); the second cannot be seen from inside, so `--durable-commits always` is
documented for it (docs/publisher.md "What an ack means").
"""

from __future__ import annotations

import os

# Filesystems whose writes a crash of this kernel alone does not decide.
REMOTE_TYPES = frozenset({
    "nfs", "nfs4", "cifs", "smb3", "smbfs", "9p", "virtiofs", "ceph", "glusterfs", "lustre", "gpfs",
    "afs", "ncpfs", "fuse", "fuseblk",
})


def _unescape(field: str) -> str:
    """Mount points in mountinfo escape space, tab, newline and backslash as octal."""
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and i + 3 < len(field) and field[i + 1:i + 4].isdigit():
            out.append(chr(int(field[i + 1:i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def filesystem_type(path: str, mountinfo: str | None = None) -> str:
    """The filesystem type of the mount holding `path` ('' when it cannot be told)."""
    if mountinfo is None:
        try:
            with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as fh:
                mountinfo = fh.read()
        except OSError:
            return ""
    target = os.path.realpath(path)
    best, best_type = "", ""
    for line in mountinfo.splitlines():
        left, sep, right = line.partition(" - ")
        fields = left.split()
        if not sep or len(fields) < 5 or not right.split():
            continue
        point = _unescape(fields[4])
        inside = target == point or target.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best):  # the last of equal mount points is the one on top
            best, best_type = point, right.split()[0]
    return best_type


def remote(fstype: str) -> bool:
    return fstype in REMOTE_TYPES or fstype.startswith("fuse.")


def durable_commits(mode: str, state_dir: str, mountinfo: str | None = None) -> tuple[bool, str]:
    """(fsync every commit?, why) for the `--durable-commits` mode: auto, always or never."""
    if mode == "always":
        return True, "--durable-commits always"
    if mode == "never":
        return False, "--durable-commits never"
    fstype = filesystem_type(state_dir, mountinfo)
    if remote(fstype):
        return True, f"state directory is on {fstype}, which can outlive this kernel's sandboxes"
    return False, f"state directory is on {fstype or 'an unknown filesystem'}, local to the sandboxes' kernel"
