#!/usr/bin/env python3
"""Add, update or remove the netclaim entry of a CNI conflist (stdlib only).

scripts/install.sh calls this; it is kept out of the plugin's import path
because it runs once per install, not once per pod.

    conflist_edit.py install   --conflist FILE --set driverName=NAME [--set KEY=VALUE ...]
    conflist_edit.py uninstall --conflist FILE
    conflist_edit.py entry     --set driverName=NAME [--set KEY=VALUE ...]   (print only)

Why it is careful:
- The container runtime watches /etc/cni/net.d and may read the file at any
  moment, so every write goes to a temp file in the same directory, is fsynced
  and renamed over the original (a reader sees the old or the new file, never
  half of one). A file whose content would not change is not rewritten, so a
  re-install does not make the runtime reload its networks.
- The first install keeps the original bytes in FILE.netclaim.bak, so an
  uninstall can give back exactly what was there.
- A conflist that is not valid JSON, or not a conflist, is refused untouched:
  guessing at a broken network config on a node is how nodes lose networking.

Exit codes: 0 done (or nothing to do), 2 refused (message on stderr).
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
    if not backup.exists():
        write_atomic(backup, raw, mode)
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


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="action", required=True)
    add = sub.add_parser("install", help="add or update the netclaim entry (last in the chain)")
    add.add_argument("--conflist", required=True, type=Path)
    add.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a string field of the entry")
    show = sub.add_parser("entry", help="print the entry that install would write")
    show.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    rm = sub.add_parser("uninstall", help="remove the netclaim entry, restoring the original")
    rm.add_argument("--conflist", required=True, type=Path)
    return parser.parse_args(argv)


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


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        if args.action == "entry":
            print(json.dumps(build_entry(args.set), indent=2))
            return 0
        if args.action == "install":
            outcome = install(args.conflist, build_entry(args.set))
        else:
            outcome = uninstall(args.conflist)
    except Refused as exc:
        print(f"conflist_edit: refused: {exc}", file=sys.stderr)
        return 2
    print(json.dumps({"conflist": str(args.conflist), "action": args.action, "outcome": outcome}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
