#!/usr/bin/env python3
"""Add, update or remove the netclaim entry of a CNI conflist (stdlib only).

scripts/install.sh calls this; the editing itself is publisher/keeper/conflist.py,
shared with the DaemonSet's chain keeper (atomic writes, a backup of the
original, refusal of what it cannot parse: see that module).

    conflist_edit.py install   --conflist FILE --set driverName=NAME [--set KEY=VALUE ...]
    conflist_edit.py uninstall --conflist FILE
    conflist_edit.py entry     --set driverName=NAME [--set KEY=VALUE ...]   (print only)
    conflist_edit.py chained   --dir DIR   (print the network files in DIR that chain netclaim, one a line)

Each --set value is written with the type the plugin reads it as (spoolMaxFiles=500 becomes the
integer 500) and checked by the plugin's own config rules first: a key the plugin does not read, or
a value it would refuse, is refused before the conflist is touched. An empty value is a setting
not given: a value the entry already holds for that key stays.

`chained` is how uninstall knows whether the plugin executable is still in use: with
containerd's own multi-network (several conflists, one netclaim entry each) it is
removed only with the last entry.

A single-plugin FILE.conf is converted to FILE.conflist (outcome "converted");
uninstall with the same --conflist FILE.conf restores it byte for byte.

Exit codes: 0 done (or nothing to do), 2 refused (message on stderr).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from publisher.keeper.conflist import (  # noqa: E402
    Refused,
    build_entry,
    has_entry,
    install,
    network_files,
    uninstall,
    written,
)


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="action", required=True)
    add = sub.add_parser("install", help="add or update the netclaim entry (last in the chain)")
    add.add_argument("--conflist", required=True, type=Path)
    add.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                     help="a setting of the entry (driverName, spoolMaxFiles, ...), typed as the plugin reads it")
    show = sub.add_parser("entry", help="print the entry that install would write")
    show.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    rm = sub.add_parser("uninstall", help="remove the netclaim entry, restoring the original")
    rm.add_argument("--conflist", required=True, type=Path)
    chained = sub.add_parser("chained", help="the network files of a conf dir that chain netclaim")
    chained.add_argument("--dir", required=True, type=Path)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        if args.action == "chained":
            for path in network_files(args.dir):
                if has_entry(path):
                    print(path)
            return 0
        if args.action == "entry":
            print(json.dumps(written(build_entry(args.set)), indent=2))
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
