"""e2e: containerd RunPodSandbox with netclaim in the chain vs. the same chain without it.

Both chains run in one containerd, interleaved round by round (the order
alternates), so machine noise hits both alike; the figure is the ratio of the
medians (target <= 1.15). The netclaim rounds use pods with an allocated
ResourceClaim, the real publisher and the real API server, and also give the
ADD-to-visible latency: from netclaim's ADD (its first log line for the
sandbox) to a watch on the claim seeing the Ready entry with the sandbox's IPs.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from runtime.cri import PodMeta  # noqa: E402
from runtime.observe import ClaimWatcher, plugin_add_time  # noqa: E402
from runtime.stack import Stack  # noqa: E402

from .stats import percentile

TARGET_RATIO = 1.15


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rounds", type=int, default=30, help="measured rounds (one sandbox per chain each)")
    parser.add_argument("--warmup", type=int, default=3, help="unmeasured rounds first")


def _progress(text: str) -> None:
    print(f"[bench e2e] {text}", file=sys.stderr, flush=True)



def _summary(values: list[float]) -> dict[str, float]:
    return {
        "median": round(statistics.median(values), 2),
        "p90": round(percentile(values, 0.9), 2),
        "min": round(min(values), 2),
        "max": round(max(values), 2),
    }


class _Rounds:
    """One round = one sandbox per chain, created, measured, and removed again."""

    def __init__(self, stack: Stack, watcher: ClaimWatcher) -> None:
        self.stack = stack
        self.watcher = watcher
        self.plain_ms: list[float] = []
        self.netclaim_ms: list[float] = []
        self.add_to_visible_ms: list[float] = []
        self.missing_add_time = 0

    def plain(self, measured: bool) -> None:
        h = self.stack.harness
        h.activate(self.stack.plain_conflist)
        sandbox = h.run_pod(PodMeta(f"plain-{uuid.uuid4().hex[:6]}", "bench-plain", str(uuid.uuid4())))
        if measured:
            self.plain_ms.append(h.last_run_seconds * 1000)
        h.stop_pod(sandbox.id)
        h.remove_pod(sandbox.id)

    def netclaim(self, index: int, measured: bool) -> None:
        h, cluster = self.stack.harness, self.stack.cluster
        h.activate(self.stack.netclaim_conflist)
        pod = cluster.pod_with_claim(f"bench-{index}")
        sandbox = h.run_pod(PodMeta(pod.name, pod.namespace, pod.uid))
        run_ms = h.last_run_seconds * 1000
        prefix = h.network.subnet.split("/")[1]
        visible = self.watcher.wait(pod.claim, [f"{ip}/{prefix}" for ip in sandbox.ips])
        t_add = plugin_add_time(str(self.stack.install.log_file), sandbox.id)
        if measured:
            self.netclaim_ms.append(run_ms)
            if t_add is None:
                self.missing_add_time += 1
            else:
                self.add_to_visible_ms.append((visible - t_add) * 1000)
        h.stop_pod(sandbox.id)
        h.remove_pod(sandbox.id)


def run(args: argparse.Namespace) -> dict[str, Any]:
    stack = Stack(prefix="ncbench", driver="bench.netclaim.example.com", progress=_progress)
    stack.up()
    try:
        watcher = ClaimWatcher(stack._api, stack.cluster.namespace, stack.driver).start()
        rounds = _Rounds(stack, watcher)
        started = time.time()
        for i in range(args.warmup + args.rounds):
            measured = i >= args.warmup
            first_plain = i % 2 == 0
            if first_plain:
                rounds.plain(measured)
            rounds.netclaim(i, measured)
            if not first_plain:
                rounds.plain(measured)
            if measured and (i - args.warmup + 1) % 10 == 0:
                _progress(f"{i - args.warmup + 1}/{args.rounds} rounds")
        watcher.stop()
    finally:
        stack.down()
    plain, netclaim = _summary(rounds.plain_ms), _summary(rounds.netclaim_ms)
    ratio = round(netclaim["median"] / plain["median"], 3)
    figures: dict[str, Any] = {
        "rounds": args.rounds,
        "run_pod_sandbox_ms": {"without_netclaim": plain, "with_netclaim": netclaim},
        "ratio_median": ratio,
        "target_ratio": TARGET_RATIO,
        "meets_target": ratio <= TARGET_RATIO,
        "add_to_visible_ms": _summary(rounds.add_to_visible_ms) if rounds.add_to_visible_ms else {},
        "add_to_visible_samples_ms": [round(v, 2) for v in rounds.add_to_visible_ms],
        "add_to_visible_missing": rounds.missing_add_time,
        "seconds": round(time.time() - started, 1),
    }
    _print_table(figures)
    return figures


def _print_table(f: dict[str, Any]) -> None:
    rows = [
        ("RunPodSandbox without netclaim (median ms)", f["run_pod_sandbox_ms"]["without_netclaim"]["median"]),
        ("RunPodSandbox with netclaim (median ms)", f["run_pod_sandbox_ms"]["with_netclaim"]["median"]),
        ("ratio (target <= %.2f)" % f["target_ratio"], f["ratio_median"]),
        ("ADD-to-visible (median ms)", f["add_to_visible_ms"].get("median", "n/a")),
        ("ADD-to-visible (p90 ms)", f["add_to_visible_ms"].get("p90", "n/a")),
    ]
    width = max(len(r[0]) for r in rows)
    for name, value in rows:
        print(f"{name:<{width}}  {value}")
