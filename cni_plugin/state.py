"""Per-attachment plugin state: the original interface values setup changed.

DEL must restore what ADD changed even though the two run in different
processes, maybe after a node reboot of the plugin (not of the netns). The
state lives in `stateDir` (0700), one small JSON file per network +
containerID + ifname, written atomically (temp file, fsync, rename) so a crash
never leaves half a file. ':' separates the key parts because none of them may
contain it (CNI names are [a-zA-Z0-9_.-], interface names exclude ':').
"""

from __future__ import annotations

from .lean import posixos as os
from .lean.jsonio import JSONError, dumps, loads
from .lean.safefs import open_dir, open_private_dir, write_file_at

SUFFIX = ".state.json"


def state_path(state_dir: str, network: str, container_id: str, ifname: str) -> str:
    return os.path.join(state_dir, f"{network}:{container_id}:{ifname}{SUFFIX}")


def save(path: str, data: dict) -> None:
    """Atomic write into the 0700 state dir, never through a symlink anywhere on its path (safefs)."""
    dfd = open_private_dir(os.path.dirname(path))
    try:
        write_file_at(dfd, os.path.basename(path), dumps(data).encode())
    finally:
        os.close(dfd)


def _open_existing_dir(path: str) -> int:
    """The state dir, opened like save() does but never created (OSError when missing or unsafe)."""
    return open_dir(path, 0o700, create=False)


def load(path: str) -> dict | None:
    """The saved state, or None when there is none (or it is unreadable, a symlink, or under an unsafe path)."""
    try:
        dfd = _open_existing_dir(os.path.dirname(path))
    except OSError:
        return None
    try:
        fd = os.open(os.path.basename(path), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dfd)
    except OSError:
        return None
    finally:
        os.close(dfd)
    try:
        data = loads(os.read(fd, 1 << 20).decode("utf-8", "replace"))
    except (OSError, JSONError):
        return None
    finally:
        os.close(fd)
    return data if isinstance(data, dict) else None


def remove(path: str) -> None:
    try:
        dfd = _open_existing_dir(os.path.dirname(path))
    except FileNotFoundError:
        return
    try:
        os.unlink(os.path.basename(path), dir_fd=dfd)
    except FileNotFoundError:
        pass
    finally:
        os.close(dfd)


def list_attachments(state_dir: str, network: str) -> list[tuple[str, str, str]]:
    """(containerID, ifname, path) of every state file of `network`."""
    try:
        fd = _open_existing_dir(state_dir)
    except OSError:  # missing, not a directory, a symlink, or unsafe: nothing of ours
        return []
    try:
        names = os.listdir(fd)
    finally:
        os.close(fd)
    out = []
    prefix = f"{network}:"
    for name in sorted(names):
        if not name.startswith(prefix) or not name.endswith(SUFFIX):
            continue
        container_id, sep, ifname = name[len(prefix):-len(SUFFIX)].partition(":")
        if sep:
            out.append((container_id, ifname, os.path.join(state_dir, name)))
    return out
