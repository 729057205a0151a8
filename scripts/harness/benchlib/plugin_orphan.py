"""plugin --orphaned-node: pod start and stop on a node left chained without its publisher, spool at its cap.

A node whose publisher is gone for good while netclaim stays in its chain (the
node was down during `helm uninstall`, a crash-looping publisher, a disabled
unit) soon has its spool at `spoolMaxFiles`: every hand-off then finds neither
channel. The chain is what a runtime runs: the Go reference `bridge` +
`host-local` and, last, netclaim, each plugin started as a runtime starts it,
ADD in chain order with each result passed on as prevResult, DEL in reverse
order with the ADD's result (libcni's cached result). Three chains are timed
side by side, their rounds interleaved in a rotating order:

- `without netclaim`: bridge + host-local alone (the reference);
- `netclaim, live publisher`: netclaim last, a trivial acking server on its socket;
- `netclaim, no publisher, full spool`: netclaim last, no socket, the spool
  holding `spoolMaxFiles` (default 1024) events, `handoffWaitMs` at its default.

The first hand-off of the orphaned chain waits `handoffWaitMs` for the
publisher and is not timed (`first_add_ms` reports it); every timed run's log
record says whether it waited (`timed_runs_that_waited`). The figures: the
orphaned chain's ADD and DEL median against the chain without netclaim, and
against netclaim with a live publisher (the plugin's start-up, which netclaim
costs with or without a publisher, is in both netclaim chains), with the range
over per-block ratios. `--orphan-exe launcher` times the plugin from the
source tree (`#!python3 -IS`) instead of the installed static bundle (which
scripts/build-plugin.sh builds).

    scripts/bench.py plugin --orphaned-node [--runs N] [--orphan-exe bundle|launcher] [--doc docs/benchmarks.md]
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

from benchlib.plugin_runs import REPO, ROUNDS, AckServer, install_bundle, run_timed, span

TARGET = 1.05  # the orphaned chain against netclaim with a live publisher: the wait is gone
WITHOUT = "without netclaim"
LIVE = "netclaim, live publisher"
ORPHAN = "netclaim, no publisher, full spool"
CHAINS = (WITHOUT, LIVE, ORPHAN)
SPOOL_MAX_FILES = 1024  # the plugin's default cap
SECTION = "## Suite `plugin --orphaned-node`"


def _exe(args, tmp: Path) -> str:
    if args.orphan_exe == "launcher":
        sys.path.insert(0, str(REPO))
        from cni_plugin.launcher import install

        return install(str(tmp / "launcher-netclaim"), python=args.python, root=args.root)
    return install_bundle(tmp)[0]


class _Chain:
    """One conflist: bridge + host-local, and netclaim last unless `netclaim` is None."""

    def __init__(self, name: str, cni_bin: str, netns: str, bridge: dict, netclaim: dict | None, exe: str) -> None:
        self.name, self.netns, self.bridge, self.netclaim, self.exe = name, netns, bridge, netclaim, exe
        self.bridge_exe = os.path.join(cni_bin, "bridge")
        self.container_id = f"bench{secrets.token_hex(4)}"
        self.cpu = 0.0  # the children's user + system seconds since the caller last reset it
        self.env = {"CNI_CONTAINERID": self.container_id, "CNI_NETNS": netns, "CNI_IFNAME": "eth0",
                    "CNI_PATH": cni_bin, "PATH": "/usr/bin:/bin",
                    "CNI_ARGS": "IgnoreUnknown=1;K8S_POD_NAMESPACE=bench;K8S_POD_NAME=p;K8S_POD_UID=u"}

    def _run(self, command: str, exe: str, conf: dict) -> bytes:
        _wall, code, out, cpu = run_timed([exe], dict(self.env, CNI_COMMAND=command), json.dumps(conf).encode())
        self.cpu += cpu
        if code != 0:
            raise RuntimeError(f"{self.name}: {os.path.basename(exe)} {command} failed ({code}): {out.decode()[:300]}")
        return out

    def add(self) -> tuple[float, dict]:
        """Seconds for the whole chain's ADD, and the result the runtime caches."""
        start = time.perf_counter()
        result = json.loads(self._run("ADD", self.bridge_exe, self.bridge))
        if self.netclaim is not None:
            result = json.loads(self._run("ADD", self.exe, dict(self.netclaim, prevResult=result)))
        return time.perf_counter() - start, result

    def delete(self, cached: dict) -> float:
        """Seconds for the whole chain's DEL (reverse order, the cached result as prevResult)."""
        start = time.perf_counter()
        if self.netclaim is not None:
            self._run("DEL", self.exe, dict(self.netclaim, prevResult=cached))
        self._run("DEL", self.bridge_exe, dict(self.bridge, prevResult=cached))
        return time.perf_counter() - start


def _fill_spool(spool: Path, count: int) -> None:
    """The spool at its cap, as the plugin leaves it (the publisher would have drained it)."""
    from cni_plugin.wire import event as wire_event
    from cni_plugin.wire import spool as wire_spool

    spool.mkdir(mode=0o700)
    for i in range(count):
        event = wire_event.Event(op="ADD", container_id=f"old{i}", ifname="eth0", driver="net.example.com")
        (spool / wire_spool.spool_name(event)).write_bytes(wire_event.encode_event(event))


def _waits(log_file: Path) -> list[int]:
    """waitedMs of every hand-off the orphaned chain's plugin logged as not handed off."""
    try:
        lines = log_file.read_text().splitlines()
    except FileNotFoundError:
        return []
    records = [json.loads(line) for line in lines]
    return [r.get("waitedMs", 0) for r in records if r.get("msg") == "event not handed off"]


def run(args) -> dict:
    sys.path.insert(0, str(REPO))
    tmp = Path(tempfile.mkdtemp(prefix="ncorphan-"))
    ns = f"ncorphan-{secrets.token_hex(3)}"
    bridge_if = f"ncob{secrets.token_hex(3)}"
    server = None
    try:
        exe = _exe(args, tmp)
        subprocess.run(["ip", "netns", "add", ns], check=True)
        netns = f"/run/netns/{ns}"
        bridge = {"cniVersion": "1.0.0", "name": "bench", "type": "bridge", "bridge": bridge_if, "isGateway": False,
                  "ipMasq": False, "ipam": {"type": "host-local", "dataDir": str(tmp / "ipam"),
                                            "ranges": [[{"subnet": "10.78.0.0/24"}]]}}
        base = {"cniVersion": "1.0.0", "name": "bench", "type": "netclaim", "driverName": "net.example.com"}
        live = dict(base, socketPath=str(tmp / "ack.sock"), spoolDir=str(tmp / "live-spool"),
                    stateDir=str(tmp / "live-state"), logFile=str(tmp / "live.log"))
        (tmp / "run").mkdir(mode=0o700)  # the socket's own directory, as /run/netclaim on a node
        orphan = dict(base, socketPath=str(tmp / "run" / "publisher.sock"), spoolDir=str(tmp / "orphan-spool"),
                      stateDir=str(tmp / "orphan-state"), logFile=str(tmp / "orphan.log"))
        server = AckServer(live["socketPath"])
        _fill_spool(tmp / "orphan-spool", SPOOL_MAX_FILES)
        chains = {WITHOUT: _Chain(WITHOUT, args.cni_bin, netns, bridge, None, exe),
                  LIVE: _Chain(LIVE, args.cni_bin, netns, bridge, live, exe),
                  ORPHAN: _Chain(ORPHAN, args.cni_bin, netns, bridge, orphan, exe)}
        first_add, cached = chains[ORPHAN].add()  # the one hand-off that waits for the publisher
        chains[ORPHAN].delete(cached)
        for warm in (WITHOUT, LIVE):  # warm-up, untimed
            chains[warm].delete(chains[warm].add()[1])
        untimed = len(_waits(tmp / "orphan.log"))
        series: dict[str, dict[str, list[float]]] = {k: {c: [] for c in CHAINS}
                                                     for k in ("add", "del", "add_cpu", "del_cpu")}
        started = time.monotonic()
        for i in range(args.runs):
            for name in CHAINS[i % 3:] + CHAINS[:i % 3]:
                chain = chains[name]
                chain.cpu = 0.0
                seconds, cached = chain.add()
                series["add"][name].append(seconds)
                series["add_cpu"][name].append(chain.cpu)
                chain.cpu = 0.0
                series["del"][name].append(chain.delete(cached))
                series["del_cpu"][name].append(chain.cpu)
        seconds_timed = time.monotonic() - started
        waits = _waits(tmp / "orphan.log")
        figures = _figures(args, series, first_add, waits[:untimed], waits[untimed:], seconds_timed)
        figures["result_name"] = "plugin-orphaned-node"
        _print(figures)
        if args.doc:
            write_section(Path(args.doc), figures)
        return figures
    finally:
        if server:
            server.close()
        subprocess.run(["ip", "netns", "del", ns], check=False, capture_output=True)
        subprocess.run(["ip", "link", "del", bridge_if], check=False, capture_output=True)
        shutil.rmtree(tmp, ignore_errors=True)


def _ratio(series: dict[str, list[float]], case: str, reference: str) -> tuple[float, str]:
    """Median ratio, and its range over ROUNDS blocks of consecutive rounds."""
    n = len(series[case])
    size = max(1, n // ROUNDS)
    blocks = [statistics.median(series[case][b:b + size]) / statistics.median(series[reference][b:b + size])
              for b in range(0, n - size + 1, size)]
    return round(statistics.median(series[case]) / statistics.median(series[reference]), 3), span(blocks)


def _figures(args, series: dict[str, dict[str, list[float]]], first_add: float,
             first_waits: list[int], timed_waits: list[int], seconds_timed: float) -> dict:
    cases = {name: {f"{key}_median_ms": round(statistics.median(series[key][name]) * 1000, 2) for key in series}
             for name in CHAINS}
    figures: dict = {
        "description": (
            "A node left chained without its publisher, its spool at the cap (1024 events): pod ADD and DEL "
            "through bridge + host-local with netclaim last, against the same chain without netclaim and "
            "against netclaim with a live (trivial acking) publisher, interleaved rounds in one run. "
            f"Plugin: {'the source tree through the launcher' if args.orphan_exe == 'launcher' else 'the static bundle'}. "
            "The first ADD of the orphaned chain waits handoffWaitMs once and is not timed; every timed "
            "run's log record says whether it waited. CPU = the plugins' user + system time (less "
            "sensitive than wall time to other load). The figure is `orphan_*_x_live`: against netclaim "
            "with a live publisher, what the missing publisher costs. Against the chain without netclaim "
            "(`orphan_*_x_without`) the ratio is mostly the plugin's own start-up, which every netclaim "
            "ADD and DEL pays, publisher or not: `live_*_x_without` is about the same."),
        "runs": args.runs,
        "plugin": args.orphan_exe,
        "load_average_1m": round(os.getloadavg()[0], 2),
        "cases": cases,
        "first_add_ms": round(first_add * 1000, 1),
        "first_add_waited_ms": first_waits[0] if first_waits else 0,
        "timed_runs": 2 * args.runs,
        "timed_runs_that_waited": sum(1 for w in timed_waits if w > 0),
        "timed_seconds": round(seconds_timed, 1),
        "target_orphan_x_live": TARGET,
    }
    for op, by_chain in series.items():
        for key, reference in (("x_without", WITHOUT), ("x_live", LIVE)):
            ratio, span = _ratio(by_chain, ORPHAN, reference)
            figures[f"orphan_{op}_{key}"] = ratio
            figures[f"orphan_{op}_{key}_range"] = span
        ratio, span = _ratio(by_chain, LIVE, WITHOUT)
        figures[f"live_{op}_x_without"] = ratio
        figures[f"live_{op}_x_without_range"] = span
    figures["meets_target"] = max(figures["orphan_add_x_live"], figures["orphan_del_x_live"]) <= TARGET
    return figures


def write_section(doc: Path, figures: dict) -> None:
    """Replace only this suite's section of the benchmarks doc (appended after the `plugin` suite when absent)."""
    from benchlib.report import _flatten

    rest = {k: v for k, v in figures.items() if k not in ("cases", "description", "result_name")}
    rows: list[tuple[str, str]] = []
    _flatten("", rest, rows)
    table = ["| chain | ADD median ms | DEL median ms | ADD CPU ms | DEL CPU ms |", "|---|---|---|---|---|",
             *[f"| {name} | {c['add_median_ms']} | {c['del_median_ms']} | {c['add_cpu_median_ms']} "
               f"| {c['del_cpu_median_ms']} |" for name, c in figures["cases"].items()]]
    section = [SECTION, "", figures["description"], "", *table, "",
               "| figure | value |", "|---|---|", *[f"| {k} | {v} |" for k, v in rows], ""]
    text = doc.read_text()
    if SECTION in text:
        start = text.index(SECTION)
        nxt = text.find("\n## ", start + 1)
        end = len(text) if nxt < 0 else nxt + 1
    else:
        start = end = text.index("\n## ", text.index("## Suite `plugin`") + 1) + 1
    doc.write_text(text[:start] + "\n".join(section) + "\n" + text[end:])


def _print(figures: dict) -> None:
    print(f"{'chain':40s} {'ADD ms':>9s} {'DEL ms':>9s} {'ADD CPU':>9s} {'DEL CPU':>9s}")
    for name, c in figures["cases"].items():
        print(f"{name:40s} {c['add_median_ms']:9.2f} {c['del_median_ms']:9.2f} {c['add_cpu_median_ms']:9.2f} "
              f"{c['del_cpu_median_ms']:9.2f}")
    for key in [f"{who}_{op}_{ref}" for who, ref in (("orphan", "x_live"), ("orphan", "x_without"),
                                                      ("live", "x_without"))
                for op in ("add", "del", "add_cpu", "del_cpu")]:
        print(f"{key}: {figures[key]} (blocks {figures[key + '_range']})")
    print(f"first ADD {figures['first_add_ms']} ms (waited {figures['first_add_waited_ms']} ms); "
          f"timed runs that waited: {figures['timed_runs_that_waited']} of {figures['timed_runs']}")
