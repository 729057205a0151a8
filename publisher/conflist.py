"""Add, update or remove the netclaim entry of a CNI conflist (stdlib only).

Used by scripts/conflist_edit.py (scripts/install.sh, systemd installs) and by
the chain keeper of the DaemonSet (publisher/chainkeeper.py), so both edit a
node's network config the same way.

Why it is careful:
- The container runtime watches /etc/cni/net.d and may read the file at any
  moment, so every write goes to a temp file in the same directory, is fsynced
  and renamed over the original (a reader sees the old or the new file, never
  half of one). A file whose content would not change is not rewritten, so a
  re-install does not make the runtime reload its networks.
- Installing into a file without a netclaim entry keeps its bytes in
  FILE.netclaim.bak, so an uninstall can give back exactly what was there,
  also after the primary CNI rewrote the file (Calico's install-cni does on
  every restart).
- A conflist that is not valid JSON, or not a conflist, is refused untouched:
  guessing at a broken network config on a node is how nodes lose networking
  (and a file read while a careless writer is halfway through looks like that).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

PLUGIN_TYPE = "netclaim"
BACKUP_SUFFIX = ".netclaim.bak"
NETWORK_EXTENSIONS = (".conf", ".conflist", ".json")


class Refused(Exception):
    """The conflist cannot be edited safely; nothing was changed."""


def load_conflist(path: Path) -> tuple[bytes, dict[str, Any]]:
    """Read and parse a conflist; refuse anything that is not one."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise Refused(f"{path}: no such conflist") from None
    try:
        doc = json.loads(raw)
    except (UnicodeDecodeError, ValueError) as exc:
        raise Refused(f"{path}: not valid JSON ({exc}); left untouched") from None
    if not isinstance(doc, dict):
        raise Refused(f"{path}: a conflist must be a JSON object; left untouched")
    plugins = doc.get("plugins")
    if not isinstance(plugins, list) or not plugins or not all(isinstance(p, dict) for p in plugins):
        raise Refused(
            f"{path}: not a conflist (needs a non-empty \"plugins\" list of objects; a single-plugin "
            ".conf cannot chain netclaim); left untouched"
        )
    return raw, doc


def is_netclaim(plugin: dict[str, Any]) -> bool:
    return plugin.get("type") == PLUGIN_TYPE


def with_entry(doc: dict[str, Any], entry: dict[str, Any]) -> dict[str, Any]:
    """The conflist with exactly one netclaim entry, last in the chain.

    Keys of an existing entry that this install does not set (say an
    `interface` block the operator added by hand) are kept; keys it sets win.
    """
    plugins = doc["plugins"]
    merged: dict[str, Any] = {}
    for old in (p for p in plugins if is_netclaim(p)):
        merged.update(old)
    merged.update(entry)
    merged["type"] = PLUGIN_TYPE
    out = dict(doc)
    out["plugins"] = [p for p in plugins if not is_netclaim(p)] + [merged]
    return out


def without_entry(doc: dict[str, Any]) -> dict[str, Any]:
    out = dict(doc)
    out["plugins"] = [p for p in doc["plugins"] if not is_netclaim(p)]
    return out


def render(doc: dict[str, Any]) -> bytes:
    return (json.dumps(doc, indent=2) + "\n").encode()


def write_atomic(path: Path, data: bytes, mode: int) -> None:
    """Temp file in the same directory, fsync, rename, fsync the directory."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fchmod(fh.fileno(), mode)
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    dfd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def file_mode(path: Path) -> int:
    return path.stat().st_mode & 0o7777


def install(path: Path, entry: dict[str, Any]) -> str:
    raw, doc = load_conflist(path)
    backup = path.with_name(path.name + BACKUP_SUFFIX)
    mode = file_mode(path)
    new = render(with_entry(doc, entry))
    chained = any(is_netclaim(p) for p in doc["plugins"])
    if not chained:
        # No netclaim entry: these bytes are what the operator (or the primary
        # CNI, which may have just rewritten the file) wants back on uninstall.
        write_atomic(backup, raw, mode)
    elif not backup.exists():
        # Chained already but no backup (a file moved back into place): the
        # best original there is, the file without the entry. Never a backup
        # that still chains netclaim.
        write_atomic(backup, render(without_entry(doc)), mode)
    if new == raw:
        return "unchanged"
    write_atomic(path, new, mode)
    return "updated"


def uninstall(path: Path) -> str:
    backup = path.with_name(path.name + BACKUP_SUFFIX)
    if not path.exists():
        backup.unlink(missing_ok=True)
        return "absent"
    raw, doc = load_conflist(path)
    stripped = without_entry(doc)
    restored = None
    if backup.exists():
        try:
            original = backup.read_bytes()
            if json.loads(original) == stripped:
                # Nothing else changed since the install: give back the exact bytes.
                restored = original
        except (OSError, UnicodeDecodeError, ValueError):
            restored = None
    if restored is not None:
        if restored != raw:
            write_atomic(path, restored, file_mode(path))
        outcome = "restored"
    elif stripped != doc:
        write_atomic(path, render(stripped), file_mode(path))
        outcome = "removed"
    else:
        outcome = "unchanged"  # no netclaim entry: leave the operator's bytes alone
    backup.unlink(missing_ok=True)
    return outcome


def build_entry(pairs: list[str]) -> dict[str, Any]:
    """The plugin's config from KEY=VALUE pairs; empty values are left out."""
    entry: dict[str, Any] = {"type": PLUGIN_TYPE}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise Refused(f"--set {pair!r} is not KEY=VALUE")
        if value:
            entry[key] = value
    if not entry.get("driverName"):
        raise Refused("the entry needs driverName")
    return entry


def network_files(conf_dir: Path) -> list[Path]:
    """The network config files a runtime loads, in the order it loads them.

    libcni (containerd, CRI-O) takes *.conf, *.conflist and *.json, sorted by
    name, and uses the first: that is the primary network netclaim chains into.
    """
    try:
        names = sorted(os.listdir(conf_dir))
    except FileNotFoundError:
        return []
    return [conf_dir / n for n in names
            if not n.startswith(".") and n.endswith(NETWORK_EXTENSIONS) and (conf_dir / n).is_file()]


def has_entry(path: Path) -> bool:
    """True when the file is a conflist with a netclaim entry (unreadable files: False)."""
    try:
        _raw, doc = load_conflist(path)
    except Refused:
        return False
    return any(is_netclaim(p) for p in doc["plugins"])
