"""What the chain keeper reads and writes on the node besides the conflists' content.

The conf dir's change snapshot, which network file holds whose netclaim entry, the plugin
executable (its platform, its atomic install), the runtimes' libcni cache, and emptying the
directories that are netclaim's own on uninstall. Kept apart from keeper.py, which decides when
to do each of these, so each side can be read and tested alone.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
from pathlib import Path
from typing import Any

from cni_plugin.retire import cached_attachments
from publisher import logs
from publisher.keeper.conflist import (
    NETWORK_EXTENSIONS,
    Refused,
    converted_name,
    has_entry,
    in_place,
    load_conflist,
    read_bounded,
    write_atomic,
)

Snapshot = tuple[tuple[str, int, int, int, str], ...]


def snapshot(conf_dir: Path) -> Snapshot:
    """What changes when anyone writes, renames or removes a file in the directory.

    Network files also contribute a digest of their bytes: an in-place rewrite
    of the same size within one mtime tick (the kernel's timestamps are coarser
    than their nanoseconds) changes nothing else. A symlink counts as its target
    (a rewrite of the target is a change the keeper must look at). Only regular
    files within limits.NETWORK_FILE_MAX are read (read_bounded): a FIFO named
    like a network file is never opened for a digest, so it cannot block the pass.
    """
    out = []
    try:
        names = sorted(os.listdir(conf_dir))
    except FileNotFoundError:
        return ()
    for name in names:
        try:
            st = os.stat(conf_dir / name)
        except FileNotFoundError:
            try:
                st = os.lstat(conf_dir / name)  # a link whose target this process cannot see: still a file
            except FileNotFoundError:
                continue
        digest = ""
        if name.endswith(NETWORK_EXTENSIONS) and stat.S_ISREG(st.st_mode):
            try:
                digest = hashlib.blake2b(read_bounded(conf_dir / name)[1], digest_size=16).hexdigest()
            except (OSError, Refused):
                digest = "unread"  # gone, replaced or too large meanwhile: its stat says the rest
        out.append((name, st.st_ino, st.st_mtime_ns, st.st_size, digest))
    return tuple(out)


def holds_entry_of(path: Path, entry: dict[str, Any]) -> bool:
    """The file chains netclaim for the same driver and request as `entry` (the keeper's own).

    An entry of another driver or request belongs to another network: containerd's own
    multi-network (max_conf_num > 1) attaches every pod to several conflists, each chaining
    netclaim with its own request (docs/multi-network.md); the operator put it there.
    """
    try:
        _raw, doc = load_conflist(path)
    except (Refused, OSError):
        return False
    mine = (entry.get("driverName"), entry.get("request") or "")
    return any(p.get("type") == "netclaim" and (p.get("driverName"), p.get("request") or "") == mine
               for p in doc["plugins"])


def another_networks_file(path: Path, entry: dict[str, Any]) -> bool:
    """The file (or the conflist it was converted to) chains netclaim, but never the keeper's entry:
    another network's, which the operator wrote and the running keeper never touches."""
    held = path if path.exists() or path.suffix == ".conflist" else converted_name(path)
    return has_entry(held) and not holds_entry_of(held, entry)


def chained_in_place(path: Path) -> bool:
    """Read the file again: netclaim is in it, after the primary plugin."""
    try:
        _raw, doc = load_conflist(path)
    except (Refused, OSError):
        return False
    return in_place(doc["plugins"])

# The node machines (`uname -m`) the plugin is built for, and their ELF e_machine.
PLUGIN_MACHINES = {"x86_64": 62, "aarch64": 183}


def plugin_platform_problem(plugin: Path, machine: str | None = None) -> str | None:
    """Why `plugin` cannot run on this node (one line), or None: a node that is neither
    x86_64 nor aarch64, or an ELF executable built for the other one."""
    machine = machine or os.uname().machine
    if machine not in PLUGIN_MACHINES:
        return f"this node is {machine}; the netclaim plugin is built for x86_64 and aarch64 nodes only"
    with open(plugin, "rb") as fh:
        header = fh.read(20)
    built = int.from_bytes(header[18:20], "little") if header[:4] == b"\x7fELF" else None
    if built is not None and built != PLUGIN_MACHINES[machine]:
        names = {v: k for k, v in PLUGIN_MACHINES.items()}
        return (f"{plugin} is built for {names.get(built, f'ELF machine {built}')}, but this node is {machine}: "
                f"install the {machine} build (the image's linux/{'arm64' if machine == 'aarch64' else 'amd64'})")
    return None


def copy_atomic(src: Path, dst: Path, mode: int = 0o755) -> bool:
    """Install `src` as `dst` unless it is already identical; True when written.

    The bin dir is shared with every CNI installer: the temp file gets a random name, created
    O_EXCL|O_NOFOLLOW and 0600 until it is complete (conflist.write_atomic), so a name planted
    there (a link to a file elsewhere) is never written through; `dst` itself is replaced,
    never written through either, and a runtime never executes half a file."""
    data = src.read_bytes()
    if holds(dst, data, mode):
        return False
    write_atomic(dst, data, mode)
    return True


def holds(path: Path, data: bytes, mode: int) -> bool:
    """`path` is a regular file (not a link) with exactly `data` and `mode`: read only when the size matches."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    if not stat.S_ISREG(st.st_mode) or st.st_size != len(data) or st.st_mode & 0o7777 != mode:
        return False
    try:
        return read_bounded(path, follow=False, cap=len(data))[1] == data
    except (OSError, Refused):
        return False

def cached_users(cache_dir: Path | None, socket_path: str) -> list[str]:
    """ContainerIDs whose runtime-cached config (libcni's results cache) runs netclaim on DEL."""
    if cache_dir is None:
        return []
    return [cid for cid, _ifname in cached_attachments(str(cache_dir), socket_path)]


OWN_DIR_WORD = "netclaim"  # the last segment of a directory uninstall may empty contains it (the chart's rule)


def _unescape_mountinfo(field: str) -> str:
    """/proc/self/mountinfo writes space, tab, newline and backslash as octal escapes."""
    for code in ("\\040", "\\011", "\\012", "\\134"):
        field = field.replace(code, chr(int(code[1:], 8)))
    return field


def node_path_of(directory: Path, mountinfo: str = "/proc/self/mountinfo") -> str:
    """The directory as the node names it: for a mount point (the DaemonSet's hostPath volume, which
    the container sees as /host/netclaim/state), the mounted dir's path within its filesystem
    (`root` of the topmost mount there, "/" for a whole filesystem); else its real path."""
    real = os.path.realpath(directory)
    node = real
    try:
        with open(mountinfo, encoding="utf-8", errors="replace") as fh:
            for line in fh:
                fields = line.split()
                if len(fields) > 4 and _unescape_mountinfo(fields[4]) == real:
                    node = _unescape_mountinfo(fields[3])  # later lines are mounted on top
    except OSError:
        pass
    return node


def not_netclaims_own(directory: Path) -> str | None:
    """Why uninstall must not empty `directory` (one line), or None when it is netclaim's own.

    Defence in depth behind the chart's schema: a hostPath set to a shared dir (/run, /var/lib,
    a filesystem's root) by an older chart or a hand-written manifest is refused here too."""
    node = node_path_of(directory)
    last = node.rstrip("/").rsplit("/", 1)[-1]
    if OWN_DIR_WORD in last:
        return None
    return (f"{directory} is {node or '/'} on the node, not a directory of netclaim's own (its last segment "
            f"must contain {OWN_DIR_WORD!r}): left as it is")


def empty_dir(directory: Path, keep: frozenset[str] = frozenset()) -> bool:
    """Remove what is inside (the directory itself may be a mount point), when it is netclaim's own;
    True when it was emptied (or is absent). Names in `keep` (the held lock's files) stay."""
    problem = not_netclaims_own(directory)
    if problem is not None:
        logs.get().warning("cleanup dir not emptied", extra={"dir": str(directory), "reason": problem})
        return False
    try:
        entries = list(directory.iterdir())
    except FileNotFoundError:
        return True
    for entry in entries:
        if entry.name in keep:
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)
    return True
