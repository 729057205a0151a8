"""report: run the plugin, publisher and e2e benchmarks and write docs/benchmarks.md with a plot.

Each suite runs with its own default options (the same as `bench.py <suite>`);
a suite that is missing or fails is reported as such in the document, never
silently left out. The plot shows the ADD-to-visible latency distribution
measured end to end (histogram and cumulative share) and is written next to
the document as a PNG with matplotlib's Agg backend (no display needed).
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib
import json
import os
import platform
import subprocess
import sys
import traceback
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[3]
DOC = REPO / "docs" / "benchmarks.md"
PLOT = REPO / "docs" / "benchmarks-add-to-visible.png"
SUITES = ("plugin", "publisher", "e2e")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--doc", default=str(DOC), help="markdown file to write")
    parser.add_argument("--plot", default=str(PLOT), help="PNG plot to write")
    parser.add_argument("--suites", default=",".join(SUITES), help="comma-separated suites to run")


def _run_suite(name: str, out: str) -> dict[str, Any]:
    try:
        module = importlib.import_module(f"benchlib.{name}")
    except ModuleNotFoundError as exc:
        if exc.name == f"benchlib.{name}":
            return {"error": f"suite scripts/harness/benchlib/{name}.py is not present"}
        raise
    parser = argparse.ArgumentParser()
    module.add_arguments(parser)
    args = parser.parse_args([])
    args.out = out
    print(f"[bench report] running {name}", file=sys.stderr, flush=True)
    try:
        figures = module.run(args)
    except Exception as exc:
        traceback.print_exc()
        return {"error": f"{type(exc).__name__}: {exc}"}
    Path(out, f"{name}.json").write_text(json.dumps(figures, indent=2, sort_keys=True) + "\n")
    return figures


def machine() -> dict[str, str]:
    mem_kb = 0
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            mem_kb = int(line.split()[1])
    cpu = next(
        (l.split(":", 1)[1].strip() for l in Path("/proc/cpuinfo").read_text().splitlines() if l.startswith("model name")),
        platform.processor() or "unknown",
    )
    osname = "unknown"
    try:
        for line in Path("/etc/os-release").read_text().splitlines():
            if line.startswith("PRETTY_NAME="):
                osname = line.split("=", 1)[1].strip('"')
    except OSError:
        pass
    containerd = subprocess.run(["containerd", "--version"], capture_output=True, text=True).stdout.split()
    return {
        "cpus": str(os.cpu_count()),
        "cpu model": cpu,
        "memory": f"{mem_kb / 1024 / 1024:.1f} GiB",
        "kernel": platform.release(),
        "os": osname,
        "python": platform.python_version(),
        "containerd": containerd[2] if len(containerd) > 2 else "unknown",
    }


def _flatten(prefix: str, value: Any, rows: list[tuple[str, str]]) -> None:
    if isinstance(value, dict):
        for key in sorted(value):
            _flatten(f"{prefix}.{key}" if prefix else str(key), value[key], rows)
    elif isinstance(value, list):
        if value and all(isinstance(v, (int, float)) for v in value):
            rows.append((prefix, f"{len(value)} samples (see JSON)"))
        else:
            rows.append((prefix, json.dumps(value)[:200]))
    else:
        rows.append((prefix, str(value)))


def _latency_samples(results: dict[str, dict[str, Any]]) -> list[float]:
    return list(results.get("e2e", {}).get("add_to_visible_samples_ms") or [])


def plot(samples: list[float], path: Path) -> bool:
    if not samples:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ordered = sorted(samples)
    fig, (hist, cdf) = plt.subplots(1, 2, figsize=(10, 4))
    hist.hist(ordered, bins=min(30, max(5, len(ordered) // 2)), color="#3b75af")
    hist.set_xlabel("ADD-to-visible latency (ms)")
    hist.set_ylabel("pods")
    hist.set_title("distribution")
    cdf.plot(ordered, [(i + 1) / len(ordered) for i in range(len(ordered))], drawstyle="steps-post", color="#3b75af")
    cdf.set_xlabel("ADD-to-visible latency (ms)")
    cdf.set_ylabel("share of pods")
    cdf.set_title("cumulative")
    cdf.grid(alpha=0.3)
    fig.suptitle(f"netclaim ADD-to-visible, real containerd + publisher + kube-apiserver ({len(ordered)} pods)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


def _cases_table(cases: dict[str, dict[str, Any]]) -> list[str]:
    """One row per timed command, so the side-by-side references read as a table."""
    lines = ["| case | median ms | x floor | peak RSS MiB |", "|---|---|---|---|"]
    for name, c in cases.items():
        lines.append(f"| {name} | {c.get('median_ms', '')} | {c.get('x_floor', '')} | {c.get('peak_rss_mib', '')} |")
    return lines + [""]


def _headline(results: dict[str, dict[str, Any]]) -> list[str]:
    e2e = results.get("e2e", {})
    if "error" in e2e or not e2e:
        return []
    rp = e2e["run_pod_sandbox_ms"]
    lines = [
        "| figure | value |",
        "|---|---|",
        f"| containerd RunPodSandbox, chain without netclaim (median) | {rp['without_netclaim']['median']} ms |",
        f"| containerd RunPodSandbox, same chain + netclaim (median) | {rp['with_netclaim']['median']} ms |",
        f"| ratio (target <= {e2e['target_ratio']}) | **{e2e['ratio_median']}** ({'meets' if e2e['meets_target'] else 'misses'} the target) |",
    ]
    atv = e2e.get("add_to_visible_ms") or {}
    if atv:
        lines.append(f"| ADD-to-visible latency, median / p90 / max | {atv['median']} / {atv['p90']} / {atv['max']} ms |")
    return lines


def render(results: dict[str, dict[str, Any]], info: dict[str, str], plot_name: str | None, when: str) -> str:
    out = [
        "# netclaim benchmarks",
        "",
        f"Generated by `scripts/bench.py report` on {when}. Every figure comes from one run on the",
        "machine below; ratios compare against a reference measured side by side in the same run.",
        "",
        "## Machine",
        "",
        "| | |",
        "|---|---|",
        *[f"| {k} | {v} |" for k, v in info.items()],
        "",
        "## Headline",
        "",
        *(_headline(results) or ["The e2e suite did not produce figures (see below)."]),
        "",
        "ADD-to-visible is measured from netclaim's ADD for a sandbox (its first log line, written",
        "while containerd runs the CNI chain in RunPodSandbox) to the moment a watch on the",
        "ResourceClaim sees the Ready entry with the sandbox's IPs.",
        "",
    ]
    if plot_name:
        out += [f"![ADD-to-visible latency distribution]({plot_name})", ""]
    for name in SUITES:
        figures = results.get(name)
        if figures is None:
            continue
        out += [f"## Suite `{name}`", ""]
        doc = (figures.get("description") if isinstance(figures, dict) else None)
        if doc:
            out += [str(doc), ""]
        cases = figures.get("cases") if isinstance(figures, dict) else None
        if isinstance(cases, dict):
            out += _cases_table(cases)
            figures = {k: v for k, v in figures.items() if k != "cases"}
        rows: list[tuple[str, str]] = []
        _flatten("", figures, rows)
        out += ["| figure | value |", "|---|---|", *[f"| {k} | {v} |" for k, v in rows], ""]
    out += ["Raw JSON of each suite: `bench-results/<suite>.json` after a run.", ""]
    return "\n".join(out)


def run(args: argparse.Namespace) -> dict[str, Any]:
    when = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    results = {name: _run_suite(name, args.out) for name in args.suites.split(",") if name}
    info = machine()
    plot_path = Path(args.plot)
    plotted = plot(_latency_samples(results), plot_path)
    doc = Path(args.doc)
    rel = os.path.relpath(plot_path, doc.parent) if plotted else None
    doc.parent.mkdir(parents=True, exist_ok=True)
    doc.write_text(render(results, info, rel, when))
    print(f"wrote {doc}" + (f" and {plot_path}" if plotted else " (no latency samples, no plot)"))
    for line in _headline(results):
        print(line)
    return {"date": when, "machine": info, "suites": results, "doc": str(doc.relative_to(REPO)) if doc.is_relative_to(REPO) else str(doc)}
