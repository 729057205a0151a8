"""Per-attachment plugin state: the original interface values setup changed.

DEL must restore what ADD changed even though the two run in different
processes, maybe after a node reboot of the plugin (not of the netns). The
state lives in `stateDir` (0700), one small JSON file per network +
containerID + ifname, written atomically (temp file, fsync, rename) so a crash
never leaves half a file. ':' separates the key parts because none of them may
contain it (CNI names are [a-zA-Z0-9_.-], interface names exclude ':').
"""

from __future__ import annotations

import os

from .jsonio import JSONError, dumps, loads

SUFFIX = ".state.json"


def state_path(state_dir: str, network: str, container_id: str, ifname: str) -> str:
    return os.path.join(state_dir, f"{network}:{container_id}:{ifname}{SUFFIX}")


def save(path: str, data: dict) -> None:
    directory = os.path.dirname(path)
    os.makedirs(directory, mode=0o700, exist_ok=True)
    os.chmod(directory, 0o700)
    tmp = f"{path}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, dumps(data).encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.rename(tmp, path)


def load(path: str) -> dict | None:
    """The saved state, or None when there is none (or it is unreadable)."""
    try:
        with open(path, "rb") as fh:
            data = loads(fh.read().decode("utf-8", "replace"))
    except FileNotFoundError:
        return None
    except (OSError, JSONError):
        return None
    return data if isinstance(data, dict) else None


def remove(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def list_attachments(state_dir: str, network: str) -> list[tuple[str, str, str]]:
    """(containerID, ifname, path) of every state file of `network`."""
    try:
        names = os.listdir(state_dir)
    except (FileNotFoundError, NotADirectoryError):
        return []
    out = []
    prefix = f"{network}:"
    for name in sorted(names):
        if not name.startswith(prefix) or not name.endswith(SUFFIX):
            continue
        container_id, sep, ifname = name[len(prefix):-len(SUFFIX)].partition(":")
        if sep:
            out.append((container_id, ifname, os.path.join(state_dir, name)))
    return out
