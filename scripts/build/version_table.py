#!/usr/bin/env python3
"""docs/install.md's table of Kubernetes versions, rendered from what the version matrix ran.

    scripts/build/version_table.py --record DIR   merge a matrix run's records (DIR/<minor>.json, written by
                                                  tests/deploy/test_kubernetes_versions.py) into
                                                  docs/kubernetes-versions.json, then render the table
    scripts/build/version_table.py                render the table from docs/kubernetes-versions.json
    scripts/build/version_table.py --check        exit 1 (and show the diff) when docs/install.md's table differs

docs/kubernetes-versions.json holds one row per minor: what that minor lacks (from Kubernetes' own
feature gates, written by hand) and, from the last matrix run that passed on it, the release that
ran, the date and the cases that passed. The chart's `kubeVersion` floor is the oldest minor with a
row; tests/deploy/test_docs.py holds the chart to the rows. The table sits in docs/install.md
between the two marker comments below; nothing else of the file is touched.
"""

from __future__ import annotations

import argparse
import difflib
import json
import re
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
MATRIX_FILE = ROOT / "docs" / "kubernetes-versions.json"
INSTALL_MD = ROOT / "docs" / "install.md"
GOMOD = ROOT / "scripts" / "build" / "gomod"
BEGIN = "<!-- kubernetes-versions: rendered by scripts/build/version_table.py from docs/kubernetes-versions.json -->"
END = "<!-- /kubernetes-versions -->"


def minor_of(version: str) -> str:
    """'v1.34.4' or '1.34.4' -> '1.34'."""
    return ".".join(version.lstrip("v").split(".")[:2])


def wrapper_version(directory: Path) -> str:
    """The k8s.io/kubernetes version a wrapper module of scripts/build/gomod requires."""
    found = re.search(r"^require k8s\.io/kubernetes (v[0-9.]+)$", (directory / "go.mod").read_text(), re.MULTILINE)
    if not found:
        raise SystemExit(f"{directory}/go.mod requires no k8s.io/kubernetes")
    return found.group(1)


def newest_minor() -> str:
    return minor_of(wrapper_version(GOMOD / "kubernetes"))


def matrix_minors() -> list[str]:
    """Every minor a wrapper module builds (gomod/kubernetes is the newest, gomod/kubernetes-1.3x the older)."""
    dirs = [GOMOD / "kubernetes", *sorted(GOMOD.glob("kubernetes-1.*"))]
    return sorted({minor_of(wrapper_version(d)) for d in dirs}, key=lambda m: tuple(int(x) for x in m.split(".")))


def load() -> dict[str, Any]:
    return json.loads(MATRIX_FILE.read_text())


def record(directory: Path) -> None:
    """Each DIR/<minor>.json of a run replaces its row's release, date and passed cases."""
    data = load()
    rows = {row["minor"]: row for row in data["versions"]}
    for path in sorted(directory.glob("*.json")):
        run = json.loads(path.read_text())
        row = rows.setdefault(run["minor"], {"minor": run["minor"], "lacks": ""})
        row.update(release=run["release"], date=run["date"], passed=sorted(run["passed"]))
    data["versions"] = sorted(rows.values(), key=lambda r: tuple(int(x) for x in r["minor"].split(".")))
    MATRIX_FILE.write_text(json.dumps(data, indent=2) + "\n")


def table(data: dict[str, Any]) -> str:
    lines = [BEGIN, "",
             ("| Kubernetes | release run | last run | cases passed (`tests/deploy/test_kubernetes_versions.py`) "
              "| what this version lacks |"),
             "|---|---|---|---|---|"]
    for row in data["versions"]:
        passed = len(row.get("passed", []))
        ran = f"**{row['release']}**" if passed else "not run"
        lines.append(f"| {row['minor']} | {ran} | {row.get('date', '')} | {f'all {passed}' if passed else 'none'} "
                     f"| {row['lacks']} |")
    return "\n".join([*lines, "", END])


def rendered(text: str, data: dict[str, Any]) -> str:
    if BEGIN not in text or END not in text:
        raise SystemExit(f"{INSTALL_MD} lacks the table's markers")
    head, rest = text.split(BEGIN, 1)
    return head + table(data) + rest.split(END, 1)[1]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--record", type=Path, help="a matrix run's records to merge first")
    parser.add_argument("--check", action="store_true", help="compare, write nothing")
    args = parser.parse_args(argv)
    if args.record:
        record(args.record)
    text = INSTALL_MD.read_text()
    want = rendered(text, load())
    if args.check:
        if want != text:
            sys.stdout.writelines(difflib.unified_diff(text.splitlines(True), want.splitlines(True),
                                                       "docs/install.md", "rendered"))
            return 1
        return 0
    INSTALL_MD.write_text(want)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
