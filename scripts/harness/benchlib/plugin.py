"""plugin: the installed netclaim plugin (static bundle) vs the source launcher, Go tuning and the Python floor.

Every figure is a median of interleaved runs in one process, against references
measured side by side: `/usr/bin/python3 -I -S -c pass` (the floor any Python
plugin pays; the host's Debian interpreter, the one the bundle's static
libpython comes from), the same plugin started from the source tree by the
`#!python3 -IS` launcher, and the Go reference `tuning` plugin on the same
prevResult. "bundle" is what scripts/install.sh puts into the CNI bin dir: the
fully static executable built by scripts/build-plugin.sh. The sandbox is a
real netns with a veth eth0 (IPv4 + IPv6). The publisher is absent by default,
so each ADD/DEL spools its event to a temp dir (the hand-off a node without a
running publisher takes); `ack` rows use a trivial acking test server instead.

The headline, report-only ADD against the floor, is measured once more on its
own, strictly alternating (floor, ADD, floor, ADD, ...: `--pairs` of them), so
both see the same load from second to second. Then `--trace-runs` ADDs run
with NETCLAIM_TRACE_START=1 (scripts/build/bundle/netclaim.c): the stamps they
print split the ADD into phases (exec, interpreter init, each import group,
config, read-back, hand-off, output, exit), reported as medians.

    scripts/bench.py plugin [--runs N] [--pairs N] [--trace-runs N] [--doc docs/benchmarks.md]

`--orphaned-node` times a node left chained without its publisher instead
(benchlib/plugin_orphan.py).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchlib.plugin_runs import REPO, ROUNDS, AckServer, install_bundle, run_timed, sh, span

TARGETS = {"report_only_add_x_floor": 1.0, "setup_add_x_floor": 3.0, "report_only_peak_rss_mib": 30.0}
HEADLINE = "bundle ADD report-only (read-back, spool)"
FLOOR = "floor python3 -I -S -c pass"


def add_arguments(parser) -> None:
    parser.add_argument("--runs", type=int, default=40, help="runs per case (interleaved)")
    parser.add_argument("--pairs", type=int, default=200, help="floor/ADD pairs of the headline (alternating)")
    parser.add_argument("--trace-runs", type=int, default=40, help="traced ADDs for the phase breakdown")
    parser.add_argument("--cni-bin", default="/usr/lib/cni", help="directory with the Go reference plugins")
    parser.add_argument("--python", default="/usr/bin/python3", help="interpreter for the source launcher and the floor")
    parser.add_argument("--root", default=str(REPO), help="directory containing the cni_plugin package to time")
    parser.add_argument("--baseline", default="", metavar="TREE",
                        help="another checkout (e.g. `git worktree add` of the commit before a change): its static "
                             "plugin and launcher are timed in the same rounds, and the headline ADD is measured "
                             "alternating with the baseline's (after/before ratios)")
    parser.add_argument("--doc", default="", help="rewrite this file's `plugin` section with the figures")
    parser.add_argument("--orphaned-node", action="store_true",
                        help="instead: pod ADD/DEL on a chain with netclaim last, no publisher and a full spool, "
                             "against the chain without netclaim and with a live publisher "
                             "(benchlib/plugin_orphan.py; written to plugin-orphaned-node.json)")
    parser.add_argument("--orphan-exe", choices=("bundle", "launcher"), default="bundle",
                        help="with --orphaned-node: the installed static plugin, or the source tree's launcher")


def _run_traced(argv: list[str], env: dict[str, str], stdin: bytes) -> tuple[int, int, str]:
    """(CLOCK_MONOTONIC ns at spawn, ns when reaped, stderr) of one run with NETCLAIM_TRACE_START=1."""
    r, w = os.pipe()
    e_r, e_w = os.pipe()
    devnull = os.open(os.devnull, os.O_WRONLY)
    actions = [(os.POSIX_SPAWN_DUP2, r, 0), (os.POSIX_SPAWN_DUP2, devnull, 1), (os.POSIX_SPAWN_DUP2, e_w, 2)]
    start = time.monotonic_ns()
    pid = os.posix_spawn(argv[0], argv, dict(env, NETCLAIM_TRACE_START="1"), file_actions=actions)
    for fd in (r, e_w, devnull):
        os.close(fd)
    os.write(w, stdin)
    os.close(w)
    chunks = []
    while chunk := os.read(e_r, 65536):
        chunks.append(chunk)
    os.close(e_r)
    _pid, status, _usage = os.wait4(pid, 0)
    end = time.monotonic_ns()
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"traced run failed: {b''.join(chunks).decode(errors='replace')[-300:]}")
    return start, end, b"".join(chunks).decode(errors="replace")


# The phases of a report-only ADD (read-back, publisher absent), each ending at
# the first trace line that matches (what, detail; "" matches any detail); see
# netclaim.c. socket.__new__'s detail is the address family: 1 is AF_UNIX.
PHASES = (
    ("exec to main()", ("main", "")),
    ("interpreter init: core (types, builtins, importlib)", ("initialized", "core")),
    ("interpreter init: encodings, sys streams, path importers", ("initialized", "main")),
    ("import cni_plugin.main (config, errors, jsonio, log)", ("imported", "cni_plugin.main")),
    ("CNI_* environment, stdin, JSON, config", ("import", "cni_plugin.commands")),
    ("import commands, handoff, wire, safefs, results", ("import", "cni_plugin.interface")),
    ("read-back: import interface, netlink, netns; setns; RTM_GETLINK", ("socket.__new__", "1")),
    ("hand-off: socket (absent publisher), spool file", ("os.rename", "")),
    ("log lines, result", ("returned", "main()")),
    ("flush stdout/stderr", ("flushed", "")),
)


def _phase_split(start: int, end: int, trace: str) -> dict[str, float]:
    """Milliseconds per phase of one traced run (PHASES, then process exit as seen by the parent)."""
    stamps = []
    for line in trace.splitlines():
        parts = line.split(" ", 3)
        if len(parts) >= 3 and parts[0] == "netclaim-trace":
            stamps.append((int(parts[1]), parts[2], parts[3] if len(parts) > 3 else ""))
    out: dict[str, float] = {}
    previous, index = start, 0
    for name, (what, detail) in PHASES:
        while index < len(stamps) and not (stamps[index][1] == what and detail in ("", stamps[index][2])):
            index += 1
        if index == len(stamps):
            raise RuntimeError(f"trace has no {what} {detail!r} stamp (phase {name!r})")
        out[name] = (stamps[index][0] - previous) / 1e6
        previous = stamps[index][0]
    out["exit (until the parent reaps it)"] = (end - previous) / 1e6
    return out


def _abab(floor: tuple, add: tuple, pairs: int, spool: Path) -> dict:
    """The headline pair measured alone, alternating floor and ADD: wall and CPU medians, ratios."""
    walls: dict[str, list[float]] = {"floor": [], "add": []}
    cpus: dict[str, list[float]] = {"floor": [], "add": []}
    for i in range(pairs):
        for key, call in (("floor", floor), ("add", add)):
            wall, code, out, cpu = run_timed(*call)
            if code != 0:
                raise RuntimeError(f"{key} failed ({code}): {out.decode()[:300]}")
            walls[key].append(wall)
            cpus[key].append(cpu)
        if i % 20 == 19:
            _empty(spool)
    size = max(1, pairs // ROUNDS)
    blocks = [statistics.median(walls["add"][b:b + size]) / statistics.median(walls["floor"][b:b + size])
              for b in range(0, pairs - size + 1, size)]
    med = {k: statistics.median(v) for k, v in walls.items()}
    cpu = {k: statistics.median(v) for k, v in cpus.items()}
    return {"pairs": pairs, "floor_ms": round(med["floor"] * 1000, 2), "add_ms": round(med["add"] * 1000, 2),
            "x_floor": round(med["add"] / med["floor"], 2),
            "x_floor_of_pairs": round(statistics.median(a / f for a, f in zip(walls["add"], walls["floor"])), 2),
            "x_floor_range": span(blocks), "cpu_x_floor": round(cpu["add"] / cpu["floor"], 2)}


def _breakdown(add: tuple, runs: int, spool: Path) -> dict[str, float]:
    """Median milliseconds of each phase over `runs` traced ADDs."""
    samples: dict[str, list[float]] = {}
    for i in range(runs):
        for name, ms in _phase_split(*_run_traced(*add)).items():
            samples.setdefault(name, []).append(ms)
        if i % 20 == 19:
            _empty(spool)
    return {name: round(statistics.median(values), 3) for name, values in samples.items()}


def _peak_rss_kib(argv: list[str], env: dict[str, str], stdin: bytes, out_file: str) -> int:
    """Peak RSS via /usr/bin/time: wait4 from this (large) process would report the
    parent's pre-exec RSS, time(1) is small enough not to distort the figure."""
    subprocess.run(["/usr/bin/time", "-f", "%M", "-o", out_file, *argv], input=stdin, env=env,
                   capture_output=True, check=True)
    return int(Path(out_file).read_text().split()[-1])


def _netns(ns: str) -> tuple[str, dict]:
    """A netns with a veth eth0 (IPv4 + IPv6); returns its path and a bridge-like prevResult."""
    sh("ip", "netns", "add", ns)
    # No dummy driver on these kernels: a veth pair with both ends in the netns.
    sh("ip", "-n", ns, "link", "add", "eth0", "type", "veth", "peer", "name", "peer0")
    sh("ip", "-n", ns, "link", "set", "peer0", "up")
    sh("ip", "-n", ns, "addr", "add", "10.77.0.5/24", "dev", "eth0")
    sh("ip", "-n", ns, "addr", "add", "fd00:77::5/64", "dev", "eth0")
    sh("ip", "-n", ns, "link", "set", "eth0", "up")
    mac = json.loads(sh("ip", "-j", "-n", ns, "link", "show", "eth0"))[0]["address"]
    netns = f"/run/netns/{ns}"
    # The shape Debian's bridge plugin prints: mac but no mtu, so read-back runs.
    prev = {"cniVersion": "1.0.0",
            "interfaces": [{"name": "eth0", "mac": mac, "sandbox": netns}],
            "ips": [{"address": "10.77.0.5/24", "interface": 0}, {"address": "fd00:77::5/64", "interface": 0}]}
    return netns, prev


def _empty(directory: Path) -> None:
    """Keep the spool small between rounds (untimed): every case measures the same spool."""
    if directory.is_dir():
        for child in directory.iterdir():
            if child.is_file():
                child.unlink()


BASELINE = "baseline bundle ADD report-only (read-back, spool)"
BASELINE_LAUNCHER = "baseline launcher ADD report-only (read-back, spool)"


def _baseline(tmp: Path, args) -> tuple[str, str]:
    """The baseline tree's static plugin (built by its own build script) and its source launcher."""
    tree = Path(args.baseline).resolve()
    built = sh("bash", str(tree / "scripts" / "build-plugin.sh")).strip().splitlines()[-1]
    exe = tmp / "baseline-netclaim"
    shutil.copy2(built, exe)
    launcher = tmp / "baseline-launcher-netclaim"
    sh(args.python, "-I", "-S", "-c", "import sys; sys.path.insert(0, sys.argv[1]); "
       "from cni_plugin.launcher import install; install(sys.argv[2], python=sys.argv[3], root=sys.argv[1])",
       str(tree), str(launcher), args.python)
    return str(exe), str(launcher)


def _versus_baseline(walls: dict[str, list[float]], cases: dict, args, spool: Path) -> dict:
    """This tree against the baseline: interleaved medians, and the headline ADD alternating with the baseline's."""
    def ratio(after: str, before: str) -> float:
        return round(statistics.median(walls[after]) / statistics.median(walls[before]), 3)

    pairs = _abab(cases[BASELINE][0], cases[HEADLINE][0], args.pairs, spool)
    return {"tree": str(Path(args.baseline).name),
            "bundle_ms": {"before": round(statistics.median(walls[BASELINE]) * 1000, 2),
                          "after": round(statistics.median(walls[HEADLINE]) * 1000, 2)},
            "bundle_after_over_before": ratio(HEADLINE, BASELINE),
            "launcher_after_over_before": ratio("launcher ADD report-only (read-back, spool)", BASELINE_LAUNCHER),
            "bundle_alternating": {"pairs": pairs["pairs"], "before_ms": pairs["floor_ms"],
                                   "after_ms": pairs["add_ms"], "after_over_before": pairs["x_floor"],
                                   "after_over_before_of_pairs": pairs["x_floor_of_pairs"],
                                   "block_range": pairs["x_floor_range"]}}


def run(args) -> dict:
    if getattr(args, "orphaned_node", False):
        from . import plugin_orphan

        return plugin_orphan.run(args)
    sys.path.insert(0, str(REPO))
    from cni_plugin.launcher import install

    tmp = Path(tempfile.mkdtemp(prefix="ncbench-"))
    ns = f"ncbench-{secrets.token_hex(3)}"
    server = None
    try:
        bundle, built = install_bundle(tmp)
        launcher = install(str(tmp / "launcher-netclaim"), python=args.python, root=args.root)
        before = _baseline(tmp, args) if args.baseline else None
        netns, prev = _netns(ns)
        prev_full = json.loads(json.dumps(prev))
        prev_full["interfaces"][0]["mtu"] = 1500
        paths = {"spoolDir": str(tmp / "spool"), "stateDir": str(tmp / "state"), "logFile": str(tmp / "plugin.log")}
        base = {"cniVersion": "1.0.0", "name": "bench", "driverName": "net.example.com", **paths}
        nc = dict(base, type="netclaim", socketPath=str(tmp / "absent.sock"), prevResult=prev)
        nc_full = dict(nc, prevResult=prev_full)
        nc_ack = dict(nc, socketPath=str(tmp / "ack.sock"))
        nc_setup = dict(nc, interface={"mtu": 1400, "txQueueLen": 500})
        tuning = {"cniVersion": "1.0.0", "name": "bench", "type": "tuning", "prevResult": prev,
                  "dataDir": str(tmp / "tuning")}
        tuning_setup = dict(tuning, mtu=1400, txQLen=500)
        server = AckServer(nc_ack["socketPath"])
        env = {"CNI_CONTAINERID": "benchctr", "CNI_NETNS": netns, "CNI_IFNAME": "eth0", "CNI_PATH": args.cni_bin,
               "CNI_ARGS": "IgnoreUnknown=1;K8S_POD_NAMESPACE=bench;K8S_POD_NAME=p;K8S_POD_UID=u", "PATH": "/usr/bin:/bin"}
        go_tuning = os.path.join(args.cni_bin, "tuning")

        def cni(cmd: str, exe_: str, conf: dict):
            return ([exe_], dict(env, CNI_COMMAND=cmd), json.dumps(conf).encode())

        # Each case: (argv, env, stdin) and an optional undo run (not timed).
        cases = {
            FLOOR: (([args.python, "-I", "-S", "-c", "pass"], {}, b""), None),
            "tuning ADD (no settings)": (cni("ADD", go_tuning, tuning), cni("DEL", go_tuning, tuning)),
            HEADLINE: (cni("ADD", bundle, nc), None),
            "launcher ADD report-only (read-back, spool)": (cni("ADD", launcher, nc), None),
            "bundle ADD report-only (no read-back, spool)": (cni("ADD", bundle, nc_full), None),
            "bundle ADD report-only (read-back, ack)": (cni("ADD", bundle, nc_ack), None),
            "tuning ADD mtu+txQLen": (cni("ADD", go_tuning, tuning_setup), cni("DEL", go_tuning, tuning_setup)),
            "bundle ADD mtu+txQueueLen (spool)": (cni("ADD", bundle, nc_setup), cni("DEL", bundle, nc_setup)),
            "launcher ADD mtu+txQueueLen (spool)": (cni("ADD", launcher, nc_setup), cni("DEL", launcher, nc_setup)),
            "tuning DEL": (cni("DEL", go_tuning, tuning), None),
            "bundle DEL (spool)": (cni("DEL", bundle, nc), None),
            "launcher DEL (spool)": (cni("DEL", launcher, nc), None),
            "bundle VERSION": (cni("VERSION", bundle, {"cniVersion": "1.0.0"}), None),
        }
        if before:
            cases[BASELINE] = (cni("ADD", before[0], nc), None)
            cases[BASELINE_LAUNCHER] = (cni("ADD", before[1], nc), None)
        walls: dict[str, list[float]] = {k: [] for k in cases}
        cpus: dict[str, list[float]] = {k: [] for k in cases}
        rss: dict[str, list[int]] = {k: [] for k in cases}
        for _ in range(args.runs):
            for name, (call, undo) in cases.items():
                wall, code, out, cpu = run_timed(*call)
                if code != 0:
                    raise RuntimeError(f"{name} failed ({code}): {out.decode()[:300]}")
                walls[name].append(wall)
                cpus[name].append(cpu)
                if undo:
                    run_timed(*undo)
            _empty(tmp / "spool")
        for _ in range(5):
            for name, (call, undo) in cases.items():
                rss[name].append(_peak_rss_kib(*call, out_file=str(tmp / "rss")))
                if undo:
                    run_timed(*undo)
        _empty(tmp / "spool")
        headline = _abab(cases[FLOOR][0], cases[HEADLINE][0], args.pairs, tmp / "spool")
        breakdown = _breakdown(cases[HEADLINE][0], args.trace_runs, tmp / "spool")
        figures = _figures(args.runs, walls, cpus, rss, built, headline, breakdown)
        if before:
            figures["baseline"] = _versus_baseline(walls, cases, args, tmp / "spool")
            print(json.dumps({"baseline": figures["baseline"]}, indent=1), file=sys.stderr)
        _print(figures)
        if args.doc:
            write_section(Path(args.doc), figures)
        return figures
    finally:
        if server:
            server.close()
        subprocess.run(["ip", "netns", "del", ns], check=False, capture_output=True)
        shutil.rmtree(tmp, ignore_errors=True)


def _round_ratios(walls: dict[str, list[float]], name: str) -> list[float]:
    """The case/floor ratio of each consecutive block of runs: the spread noise leaves."""
    n = len(walls[FLOOR])
    size = max(1, n // ROUNDS)
    out = []
    for start in range(0, n - size + 1, size):
        block = slice(start, start + size)
        out.append(statistics.median(walls[name][block]) / statistics.median(walls[FLOOR][block]))
    return out


def _figures(runs: int, walls: dict[str, list[float]], cpus: dict[str, list[float]], rss: dict[str, list[int]],
             built: Path, headline: dict, breakdown: dict[str, float]) -> dict:
    floor = statistics.median(walls[FLOOR])
    floor_cpu = statistics.median(cpus[FLOOR])
    rows = {}
    for name in walls:
        med = statistics.median(walls[name])
        cpu = statistics.median(cpus[name])
        rows[name] = {"median_ms": round(med * 1000, 2), "x_floor": round(med / floor, 2),
                      "cpu_ms": round(cpu * 1000, 2), "cpu_x_floor": round(cpu / floor_cpu, 2),
                      "peak_rss_mib": round(max(rss[name]) / 1024, 1)}
    head = _round_ratios(walls, HEADLINE)
    launcher = _round_ratios(walls, "launcher ADD report-only (read-back, spool)")
    figures = {
        "description": (
            "`bundle` = the installed plugin: one fully static executable (scripts/build-plugin.sh; "
            "no Python, no shared library on the node). `launcher` = the same code from the source tree "
            "through `#!/usr/bin/python3 -IS`. Floor = the host's Debian `/usr/bin/python3 -I -S -c pass`. "
            "Runs of all cases are interleaved; the range is over per-block ratios. CPU = the child's "
            "user + system time (wall time also holds waits and other load). The headline "
            "(`report_only_add_x_floor`) is the separate alternating floor/ADD series (`headline.*`); "
            "`breakdown_ms.*` splits a report-only ADD into phases (median of traced runs)."),
        "runs": runs,
        "load_average_1m": round(os.getloadavg()[0], 2),
        "publisher": "absent (events spooled to a temp dir); 'ack' row: trivial acking server",
        "floor": "/usr/bin/python3 -I -S -c pass (Debian python3.11, host)",
        "floor_ms": round(floor * 1000, 2),
        "cases": rows,
        "headline": headline,
        "report_only_add_x_floor": headline["x_floor"],
        "report_only_add_x_floor_range": headline["x_floor_range"],
        "report_only_add_cpu_x_floor": headline["cpu_x_floor"],
        "matrix_report_only_add_x_floor": rows[HEADLINE]["x_floor"],
        "matrix_report_only_add_x_floor_range": span(head),
        "breakdown_ms": breakdown,
        "launcher_report_only_add_x_floor": rows["launcher ADD report-only (read-back, spool)"]["x_floor"],
        "launcher_report_only_add_x_floor_range": span(launcher),
        "setup_add_x_floor": rows["bundle ADD mtu+txQueueLen (spool)"]["x_floor"],
        "report_only_peak_rss_mib": rows[HEADLINE]["peak_rss_mib"],
        "bundle_bytes": built.stat().st_size,
        "targets": TARGETS,
    }
    figures["vs_tuning_add"] = round(rows[HEADLINE]["median_ms"] / rows["tuning ADD (no settings)"]["median_ms"], 2)
    figures["meets_targets"] = {k: figures[k] <= v for k, v in TARGETS.items()}
    return figures


def write_section(doc: Path, figures: dict) -> None:
    """Replace only the "## Suite `plugin`" section of the benchmarks doc (others own the rest)."""
    from benchlib.report import _flatten

    rest = {k: v for k, v in figures.items() if k not in ("cases", "description")}
    rows: list[tuple[str, str]] = []
    _flatten("", rest, rows)
    table = ["| case | median ms | x floor | CPU ms | CPU x floor | peak RSS MiB |", "|---|---|---|---|---|---|"]
    for name, c in figures["cases"].items():
        table.append(f"| {name} | {c['median_ms']} | {c['x_floor']} | {c['cpu_ms']} | {c['cpu_x_floor']} "
                     f"| {c['peak_rss_mib']} |")
    section = ["## Suite `plugin`", "", figures["description"], "", *table, "",
               "| figure | value |", "|---|---|", *[f"| {k} | {v} |" for k, v in rows], ""]
    text = doc.read_text()
    start = text.index("## Suite `plugin`")
    nxt = text.find("\n## ", start + 1)
    end = len(text) if nxt < 0 else nxt + 1
    doc.write_text(text[:start] + "\n".join(section) + "\n" + text[end:])


def _print(figures: dict) -> None:
    print(f"{'case':50s} {'median ms':>10s} {'x floor':>8s} {'CPU x floor':>12s} {'peak RSS MiB':>13s}")
    for name, row in figures["cases"].items():
        print(f"{name:50s} {row['median_ms']:10.2f} {row['x_floor']:8.2f} {row['cpu_x_floor']:12.2f} "
              f"{row['peak_rss_mib']:13.1f}")
    h = figures["headline"]
    print(f"headline, {h['pairs']} alternating pairs: floor {h['floor_ms']} ms, report-only ADD {h['add_ms']} ms "
          f"= {h['x_floor']}x (pairs {h['x_floor_of_pairs']}x, blocks {h['x_floor_range']}, CPU {h['cpu_x_floor']}x)")
    print(f"report-only ADD range over matrix blocks: bundle {figures['matrix_report_only_add_x_floor_range']}, "
          f"launcher {figures['launcher_report_only_add_x_floor_range']}")
    print("where a report-only ADD's time goes (median ms of traced runs):")
    for name, ms in figures["breakdown_ms"].items():
        print(f"  {ms:8.3f}  {name}")
    for key, target in figures["targets"].items():
        mark = "ok" if figures["meets_targets"][key] else "MISS"
        print(f"{key}: {figures[key]} (target <= {target}) {mark}")
