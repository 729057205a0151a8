"""cluster: pod start-up on a real node (create -> Ready), netclaim in the chain vs. the same chain without it.

One real single-node cluster (scripts/cluster.sh: kubelet, containerd 2.x,
scheduler, controller-manager, DRA test driver). Every sample is one Pod with
a ResourceClaimTemplate - claim generation, scheduling, allocation, DRA
prepare, RunPodSandbox with the CNI chain, container start - measured two
ways: from the client's create to a watch seeing the pod Ready, and the
kubelet's own pod start duration (kubelet_pod_start_duration_seconds: from the
kubelet first seeing the pod to it running; each pod adds exactly one
observation, so the histogram's sum delta is that pod's value). The kubelet's
pod start SLI histogram (kubelet_pod_start_sli_duration_seconds) is recorded
only when the kubelet's watch sees the Running status come back, measured from
the one-second creationTimestamp, so it cannot be attributed per sample; its
observation count is reported. The node's conflist is switched between the primary chain and
the same chain with netclaim appended (as scripts/install.sh wrote it) before
each sample, in ABBA order, so noise hits both alike. The figure is the ratio
of the medians (target <= 1.02: a single-network pod pays for one netclaim ADD;
the several-network and burst figures allow 1.05). The median of the per-round differences
(netclaim minus plain within one ABBA round) is reported beside it. The netclaim samples also give ADD-to-visible
in the real cluster: netclaim's first log line for the sandbox to a watch on
the claim seeing the Ready entry.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from runtime.controlplane import api_client  # noqa: E402
from runtime.observe import ClaimWatcher, plugin_add_time  # noqa: E402
from runtime.realcluster import RealCluster, pod_manifest, wait_until  # noqa: E402

from . import cluster_burst, cluster_multi
from .cluster_common import NAMESPACE, SLI_PROPER, Chains, ReadyWatch, progress, sli_sum, summary

# One netclaim ADD in a single-network pod's start; bursts and several networks allow 1.05.
TARGET_RATIO_SINGLE = 1.02


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rounds", type=int, default=12, help="measured rounds (one pod per chain each)")
    parser.add_argument("--warmup", type=int, default=2, help="unmeasured rounds first")
    parser.add_argument("--dir", default=os.environ.get("NETCLAIM_BENCH_CLUSTER_DIR", "/tmp/nc-clbench"),
                        help="the cluster's directory (scripts/cluster.sh)")
    parser.add_argument("--nodes", type=int, default=1,
                        help="> 1: pod create -> claim status visible on that many nodes (benchlib/cluster_nodes.py; "
                             "--rounds pods, round robin over the nodes)")
    parser.add_argument("--multi-network", action="store_true",
                        help="Multus as the primary CNI, three-network pods, netclaim in every chain vs none "
                             "(benchlib/cluster_multi.py; written to cluster-multi-network.json)")
    parser.add_argument("--burst", type=int, default=0,
                        help="> 0: that many claimed pods created at once, bursts with netclaim vs without, ABBA; "
                             "figure: ratio of the bursts' create -> Ready p99 (benchlib/cluster_burst.py; "
                             "written to cluster-burst.json)")
    parser.add_argument("--burst-rounds", type=int, default=2,
                        help="with --burst: measured bursts per chain (after one warm-up burst)")


class Rounds:
    def __init__(self, cluster: RealCluster, ready: ReadyWatch, claims: ClaimWatcher, chains: Chains) -> None:
        self.cluster, self.ready, self.claims, self.chains = cluster, ready, claims, chains
        self.ms: dict[str, list[float]] = {"plain": [], "netclaim": []}
        self.sli_ms: dict[str, list[float]] = {"plain": [], "netclaim": []}
        self.add_to_visible_ms: list[float] = []
        self.n = 0

    def one(self, variant: str, measured: bool) -> None:
        self.n += 1
        name = f"p{self.n}-{variant}"
        self.chains.use(variant == "netclaim")
        before = sli_sum(self.cluster.kubelet_metrics())
        t0 = time.time()
        self.cluster.apply(pod_manifest(NAMESPACE, name, template="net"))
        t_ready = self.ready.wait(name)
        after = wait_until(lambda: (lambda s: s if s[1] > before[1] else None)(sli_sum(self.cluster.kubelet_metrics())),
                           "the kubelet's pod start observation", 30)
        if variant == "netclaim":
            claim = self.cluster.pod_claim(NAMESPACE, name)
            eth0 = self.cluster.interface(NAMESPACE, name)
            visible = self.claims.wait(claim, eth0.cidrs)
            t_add = plugin_add_time(self.cluster.values["NETCLAIM_PLUGIN_LOG"], self.cluster.sandbox(NAMESPACE, name)["id"])
            if measured and t_add:
                self.add_to_visible_ms.append((visible - t_add) * 1000)
        if measured:
            self.ms[variant].append((t_ready - t0) * 1000)
            self.sli_ms[variant].append((after[0] - before[0]) * 1000 / (after[1] - before[1]))
        self.cluster.delete_pod(NAMESPACE, name)


def run(args: argparse.Namespace) -> dict[str, Any]:
    if args.nodes > 1:
        from .cluster_nodes import run_nodes

        return run_nodes(args, NAMESPACE, ReadyWatch, progress)
    if args.multi_network:
        return cluster_multi.run(args)
    if args.burst > 0:
        return cluster_burst.run(args)
    progress(f"bringing up the real cluster in {args.dir}")
    t0 = time.time()
    cluster = RealCluster.up(args.dir)
    up_s = time.time() - t0
    ready = claims = None
    try:
        cluster.sh("install-netclaim")
        cluster.namespace(NAMESPACE)
        cluster.claim_template(NAMESPACE, "net")
        api = api_client(cluster.kubeconfig)
        ready = ReadyWatch(api)
        claims = ClaimWatcher(api, NAMESPACE, cluster.driver).start()
        rounds = Rounds(cluster, ready, claims, Chains(cluster))
        order = ("plain", "netclaim")
        for i in range(args.warmup + args.rounds):
            measured = i >= args.warmup
            pair = order if i % 2 == 0 else order[::-1]  # ABBA
            for variant in pair:
                rounds.one(variant, measured)
            if measured:
                progress(f"round {i - args.warmup + 1}/{args.rounds}: plain {rounds.ms['plain'][-1]:.0f} ms, "
                          f"netclaim {rounds.ms['netclaim'][-1]:.0f} ms")
        rounds.chains.use(True)
        sli_count = sli_sum(cluster.kubelet_metrics(), SLI_PROPER)[1]
    finally:
        for watcher in (ready, claims):
            if watcher is not None:
                watcher.stop()
        cluster.down()
    plain, nc = rounds.ms["plain"], rounds.ms["netclaim"]
    sli_plain, sli_nc = rounds.sli_ms["plain"], rounds.sli_ms["netclaim"]
    ratio = statistics.median(nc) / statistics.median(plain)
    round_diff = statistics.median(b - a for a, b in zip(plain, nc))
    sli_ratio = statistics.median(sli_nc) / statistics.median(sli_plain)
    figures = {
        "cluster_up_s": round(up_s, 1),
        "pod_create_to_ready_ms": {"plain": summary(plain), "netclaim": summary(nc)},
        "kubelet_pod_start_duration_ms": {"plain": summary(sli_plain), "netclaim": summary(sli_nc)},
        "kubelet_pod_start_sli_observations": sli_count,
        "ratio_create_to_ready_median": round(ratio, 3),
        "ratio_kubelet_start_median": round(sli_ratio, 3),
        "median_round_difference_ms": round(round_diff, 1),
        "target_ratio": TARGET_RATIO_SINGLE,
        "add_to_visible_ms": summary(rounds.add_to_visible_ms) if rounds.add_to_visible_ms else {},
        "samples": {"plain_ms": [round(v, 1) for v in plain], "netclaim_ms": [round(v, 1) for v in nc],
                    "sli_plain_ms": [round(v, 1) for v in sli_plain], "sli_netclaim_ms": [round(v, 1) for v in sli_nc],
                    "add_to_visible_ms": [round(v, 1) for v in rounds.add_to_visible_ms]},
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    progress(f"plot: {plot(figures, out / 'cluster.png')}")
    return figures


def plot(figures: dict[str, Any], path: Path) -> Path:
    """Side by side per sample: create->Ready and the kubelet's start duration, plain vs netclaim; ADD-to-visible."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s = figures["samples"]
    fig, axes = plt.subplots(1, 3, figsize=(13, 4))
    for ax, (title, plain, nc) in zip(axes[:2], (
        ("pod create -> Ready (client watch)", s["plain_ms"], s["netclaim_ms"]),
        ("kubelet pod start duration", s["sli_plain_ms"], s["sli_netclaim_ms"]),
    )):
        ax.boxplot([plain, nc], showfliers=True)
        ax.set_xticks([1, 2], ["bridge + host-local", "+ netclaim"])
        for i, values in enumerate((plain, nc), start=1):
            ax.plot([i] * len(values), values, "o", alpha=0.4, color="#3b75af")
        ax.set_ylabel("ms")
        ax.set_title(title)
        ax.grid(alpha=0.3)
    ordered = sorted(s["add_to_visible_ms"])
    axes[2].plot(ordered, [(i + 1) / len(ordered) for i in range(len(ordered))], drawstyle="steps-post")
    axes[2].set_xlabel("ADD-to-visible (ms)")
    axes[2].set_ylabel("share of pods")
    axes[2].set_title("netclaim ADD -> claim status visible")
    axes[2].grid(alpha=0.3)
    fig.suptitle(f"real node: kubelet 1.37 + containerd 2.4 + DRA test driver, {len(s['plain_ms'])} pods per chain, "
                 f"ABBA (median ratio {figures['ratio_create_to_ready_median']})")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
