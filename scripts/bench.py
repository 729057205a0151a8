#!/usr/bin/env python3
"""netclaim benchmarks: `bench.py plugin|publisher|e2e|scale|cluster|soak|watches|live|endpoints|report [options]`.

Every figure is a ratio against a reference measured side by side in the same
run (Go reference plugins, bare Python start-up, a bare apply loop), because
these machines are noisy. Each suite lives in scripts/harness/benchlib/<suite>.py and
exposes `add_arguments(parser)` and `run(args) -> dict`; results are written
as JSON under --out (default bench-results/).
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
SUITES = ("plugin", "publisher", "e2e", "scale", "cluster", "soak", "watches", "live", "endpoints", "report")


def main(argv: list[str] | None = None) -> int:
    sys.path.insert(0, str(HERE / "harness"))
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=str(HERE.parent / "bench-results"), help="directory for JSON results")
    sub = parser.add_subparsers(dest="suite", required=True)
    modules = {}
    for name in SUITES:
        try:
            module = importlib.import_module(f"benchlib.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"benchlib.{name}":
                raise
            continue
        modules[name] = module
        sp = sub.add_parser(name, help=(module.__doc__ or name).strip().splitlines()[0])
        module.add_arguments(sp)
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    figures = modules[args.suite].run(args)
    path = out / f"{figures.pop('result_name', args.suite)}.json"  # a suite's variant may name its own file
    path.write_text(json.dumps(figures, indent=2, sort_keys=True) + "\n")
    print(f"wrote {path}", file=sys.stderr)
    return 1 if figures.get("ok") is False else 0  # a suite with a verdict (soak) fails the command


if __name__ == "__main__":
    sys.exit(main())
