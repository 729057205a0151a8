#!/usr/bin/env python3
"""Generate the chart's README (conf/helm/netclaim/README.md, what `helm show readme` prints).

    scripts/build/chart_readme.py            write the README
    scripts/build/chart_readme.py --check    exit 1 (and show the diff) when the committed one differs

The README is the hand-written INTRO below plus a table of every value, built
from values.yaml: the key (dotted path), its default and the comment block
right above the key (a blank line between them detaches a comment). A mapping
whose key has a comment gets a row of its own (no default), then its keys.
The output depends on nothing but values.yaml and Chart.yaml: no date, no
version, the keys in file order. Needs PyYAML (the project's virtualenv has it;
scripts/build/manifests.sh runs this with it).
"""

from __future__ import annotations

import argparse
import difflib
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "conf" / "helm" / "netclaim"
OUT = CHART / "README.md"
REGENERATE = "scripts/build/chart_readme.py"

INTRO = """\
# netclaim

A chained CNI plugin and a node publisher that write each pod's network attachment (interface
name, IP addresses, MAC, a `Ready` condition and the CNI result) into the
`ResourceClaim.status.devices` entry of the DRA device the pod was allocated (Kubernetes 1.34+,
`resource.k8s.io/v1`; the node-scoped write check needs 1.36+).

Per node, a DaemonSet installs the self-contained plugin into the CNI bin dir and chains it last
into the primary conflist (a chain keeper puts it back when the primary CNI rewrites the file),
runs the publisher beside it, and on `helm uninstall` puts every node back as it was.

## Install

```sh
helm install netclaim conf/helm/netclaim --namespace netclaim-system --create-namespace \\
    --set driverName=net.example.com --set request=nic
```

`driverName` is required and has no default: the DRA driver of your network devices, the
`driver` their DeviceClass selects (a list for several drivers). A render without it fails
and says so. The namespace needs Pod Security level `privileged` (hostNetwork, hostPath).
Offline (`helm template`, `helm lint`), give the cluster's version: `--kube-version 1.34.0`.

After the install, `helm status` prints the per-node commands: finding a node's netclaim pod,
`netclaim-publisher status` and `resync` in its publisher container.

Documentation, in {home}/tree/main/docs: install.md (values, upgrade and
uninstall), troubleshooting.md (symptoms and alerts), publisher.md (every publisher option, for
`publisher.extraArgs`).
"""

TABLE_HEAD = """\
## Values

Generated from values.yaml by `{regenerate}`; edit values.yaml (its comments) and run it again.

| key | default | description |
|---|---|---|
"""

KEY_LINE = re.compile(r"^(?P<indent> *)(?P<key>[A-Za-z0-9_.-]+):(?P<rest>.*)$")


@dataclass
class Row:
    key: str
    default: str  # empty for a mapping's own row
    description: str


def comment_text(lines: list[str]) -> str:
    return " ".join(line.strip().removeprefix("#").strip() for line in lines).strip()


def rows(text: str) -> list[Row]:
    """Every key of values.yaml in file order: leaves with their default, commented mappings too."""
    values = yaml.safe_load(text) or {}
    lines = text.splitlines()
    out: list[Row] = []
    stack: list[tuple[int, str]] = []  # (indent, key) of the mappings around the current line
    comment: list[str] = []
    skip_deeper_than: int | None = None  # inside a leaf's block (a list, a block string)
    for i, line in enumerate(lines):
        stripped = line.strip()
        indent = len(line) - len(line.lstrip(" "))
        if skip_deeper_than is not None:
            if stripped and (indent > skip_deeper_than or (indent == skip_deeper_than and stripped.startswith("- "))):
                continue
            if not stripped:
                continue
            skip_deeper_than = None
        if not stripped:
            comment = []
            continue
        if stripped.startswith("#"):
            comment.append(stripped)
            continue
        m = KEY_LINE.match(line)
        if m is None:
            raise SystemExit(f"values.yaml line {i + 1}: not a key this generator understands: {line!r}")
        while stack and stack[-1][0] >= indent:
            stack.pop()
        path = [k for _, k in stack] + [m["key"]]
        rest = m["rest"].strip()
        description = comment_text(comment)
        comment = []
        if not rest and _opens_mapping(lines, i, indent):
            if description:
                out.append(Row(".".join(path), "", description))
            stack.append((indent, m["key"]))
            continue
        out.append(Row(".".join(path), _default(values, path), description))
        skip_deeper_than = indent
    return out


def _opens_mapping(lines: list[str], i: int, indent: int) -> bool:
    """The key on line i has nested keys (the next line with content is a deeper key, not a list item)."""
    for line in lines[i + 1:]:
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        deeper = len(line) - len(line.lstrip(" ")) > indent
        return deeper and not stripped.startswith("- ") and KEY_LINE.match(line) is not None
    return False


def _default(values: Any, path: list[str]) -> str:
    value = values
    for key in path:
        value = value[key]
    return json.dumps(value, separators=(", ", ": "), ensure_ascii=False)


def cell(text: str) -> str:
    """Table-cell text: a "|" would end the cell, a "<" start an HTML tag (`<release>` would vanish)."""
    return text.replace("|", "\\|").replace("<", "\\<")


def readme(chart: Path = CHART) -> str:
    meta = yaml.safe_load((chart / "Chart.yaml").read_text())
    table = "".join(
        f"| `{cell(r.key)}` | {'`' + cell(r.default) + '`' if r.default else ''} | {cell(r.description)} |\n"
        for r in rows((chart / "values.yaml").read_text()))
    return (INTRO.format(home=meta.get("home", "").rstrip("/")) + "\n"
            + TABLE_HEAD.format(regenerate=REGENERATE) + table)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Generate conf/helm/netclaim/README.md from values.yaml.")
    parser.add_argument("--check", action="store_true", help="exit 1 and show the diff when the README is stale")
    args = parser.parse_args(argv)
    want = readme()
    if args.check:
        have = OUT.read_text() if OUT.exists() else ""
        if have == want:
            return 0
        sys.stderr.writelines(difflib.unified_diff(have.splitlines(True), want.splitlines(True),
                                                   str(OUT.relative_to(ROOT)), "generated"))
        print(f"chart README: {OUT.relative_to(ROOT)} is stale; run {REGENERATE}", file=sys.stderr)
        return 1
    OUT.write_text(want)
    print(OUT)
    return 0


if __name__ == "__main__":
    sys.exit(main())
