"""The scale bench's report: growth with N, the markdown table, the plot, and the extrapolation to a large cluster."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

GROWTH_KEYS = (("per_add", "api_requests"), ("per_add", "apiserver_cpu_ms"), ("per_add", "etcd_writes"),
               ("handoff_to_visible_ms", "p50"), ("handoff_to_visible_ms", "p99"), ("publisher_rss_mib", "mean"))


def growth(points: list[dict[str, Any]]) -> dict[str, float]:
    """Largest N's figure over the smallest N's: 1.0 = flat per-node cost."""
    if len(points) < 2:
        return {}
    first, last = points[0], points[-1]
    out = {}
    for a, b in GROWTH_KEYS:
        if first[a][b]:
            out[f"{a}.{b}"] = round(last[a][b] / first[a][b], 2)
    out["watches_added_per_node"] = round((last["watches_added"] / last["nodes"]) /
                                          max(first["watches_added"] / first["nodes"], 1e-9), 2)
    return out


def markdown(f: dict[str, Any]) -> str:
    pts = f["points"]
    rows: list[tuple[str, Any]] = [
        ("publishers (N)", lambda p: p["nodes"]),
        ("ADDs (pod sandboxes) at this point", lambda p: p["adds"]),
        ("API requests per ADD (server count, net of idle)", lambda p: p["per_add"]["api_requests"]),
        ("  of which from the publishers (their counters)", lambda p: p["per_add"]["publisher_api_requests"]),
        ("API requests per DEL", lambda p: p["per_del"]["api_requests"]),
        ("kube-apiserver CPU ms per ADD", lambda p: p["per_add"]["apiserver_cpu_ms"]),
        ("kube-apiserver CPU ms per DEL", lambda p: p["per_del"]["apiserver_cpu_ms"]),
        ("reference: kube-apiserver CPU ms to create the pod+claim+allocation",
         lambda p: p["reference_create_per_pod"]["apiserver_cpu_ms"]),
        ("etcd writes per ADD / per DEL",
         lambda p: f"{p['per_add']['etcd_writes']} / {p['per_del']['etcd_writes']}"),
        ("reference: etcd writes to create the pod+claim+allocation",
         lambda p: p["reference_create_per_pod"]["etcd_writes"]),
        ("watches open: all / added since no publisher ran", lambda p: f"{p['watches_total']} / {p['watches_added']}"),
        ("idle: kube-apiserver CPU %", lambda p: p["idle"]["apiserver_cpu_pct"]),
        ("idle: API requests/s", lambda p: p["idle"]["api_requests_per_s"]),
        ("hand-off-to-visible p50 / p99 (ms)",
         lambda p: f"{p['handoff_to_visible_ms']['p50']} / {p['handoff_to_visible_ms']['p99']}"),
        ("publisher CPU ms per ADD", lambda p: p["per_add"]["publisher_cpu_ms"]),
        ("publisher idle CPU % (each)", lambda p: p["idle"]["publisher_cpu_pct_each"]),
        ("publisher RSS MiB mean / max", lambda p: f"{p['publisher_rss_mib']['mean']} / {p['publisher_rss_mib']['max']}"),
        ("host load average (1 min, 2 cores shared)", lambda p: p.get("host_load_1m", "")),
    ]
    lines = ["| figure | " + " | ".join(f"N={p['nodes']}" for p in pts) + " |",
             "|---|" + "---:|" * len(pts)]
    for name, get in rows:
        lines.append(f"| {name} | " + " | ".join(str(get(p)) for p in pts) + " |")
    if f.get("error"):
        lines.append(f"\nstopped early: {f['error']}")
    rest = next((p["tracked_idle"] for p in reversed(pts) if p.get("tracked_idle")), None)
    if rest:
        lines += ["", f"At rest at N={pts[-1]['nodes']}, {rest['claims']} claims tracked, for {rest['seconds']:.0f} s:", "",
                  "| figure | value |", "|---|---:|",
                  f"| requests about claims | {rest['claim_requests']} |",
                  f"| requests about claims per second per 1,000 tracked claims | "
                  f"{rest['claim_requests_per_s_per_1000_claims']} |",
                  f"| all requests per second (every publisher, and the API server's own) | {rest['all_requests_per_s']} |",
                  f"| requests counted by the publishers themselves | {rest['publisher_requests']} |"]
        lines += [f"| {k} | {v} |" for k, v in rest["requests"].items()]
    if f.get("extrapolation", {}).get("figures"):
        lines.append("")
        lines.append("| extrapolated (largest N's per-event costs) | value |")
        lines.append("|---|---:|")
        lines.extend(f"| {k} | {v} |" for k, v in f["extrapolation"]["figures"].items())
    if f.get("apf"):
        lines.append("")
        lines.extend(apf_markdown(f["apf"]))
    return "\n".join(lines)


def apf_markdown(a: dict[str, Any]) -> list[str]:
    cases = [("alone", a["alone"]), ("publisher flood, no netclaim APF objects", a["flood_without_apf_objects"]),
             ("publisher flood, shipped APF objects", a["flood_with_apf_objects"])]
    seats = ", ".join(f"{k} {v:g}" for k, v in sorted(a.get("nominal_seats", {}).items()))
    lines = [f"kube-apiserver {a['apiserver_args']}; flood: {a['flood_requests']} publisher applies from "
             f"{a['flood_threads']} connections; nominal seats per level: {seats}", "",
             "| case | kubelet p50 / p99 ms (429s) | other workload p50 / p99 ms (429s) | flood applies/s (429s) |",
             "|---|---:|---:|---:|"]
    for name, c in cases:
        k, o, fl = c["kubelet"], c["other_workload"], c.get("flood")
        lines.append(f"| {name} | {k['p50_ms']} / {k['p99_ms']} ({k['rejected_429']}) | "
                     f"{o['p50_ms']} / {o['p99_ms']} ({o['rejected_429']}) | "
                     + (f"{fl['applied_per_s']} ({fl['rejected_429']})" if fl else "-") + " |")
    return lines


def plot(f: dict[str, Any], path: str) -> None:
    """Per-ADD cost and latency against N (matplotlib Agg: no display)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pts = f["points"]
    ns = [p["nodes"] for p in pts]
    fig, axes = plt.subplots(1, 4, figsize=(17, 3.8))
    series = [
        (axes[0], "per ADD", [("API requests", [p["per_add"]["api_requests"] for p in pts]),
                              ("etcd writes", [p["per_add"]["etcd_writes"] for p in pts])]),
        (axes[1], "kube-apiserver CPU ms", [("per ADD", [p["per_add"]["apiserver_cpu_ms"] for p in pts]),
                                           ("per pod create (reference)",
                                            [p["reference_create_per_pod"]["apiserver_cpu_ms"] for p in pts])]),
        (axes[2], "hand-off-to-visible ms", [("p50", [p["handoff_to_visible_ms"]["p50"] for p in pts]),
                                             ("p99", [p["handoff_to_visible_ms"]["p99"] for p in pts])]),
        (axes[3], "per node, idle", [("watches added / node", [p["watches_added"] / p["nodes"] for p in pts]),
                                     ("publisher RSS / 50 MiB", [p["publisher_rss_mib"]["mean"] / 50 for p in pts]),
                                     ("publisher CPU % x10", [p["idle"]["publisher_cpu_pct_each"] * 10 for p in pts])]),
    ]
    for ax, title, lines in series:
        for label, ys in lines:
            ax.plot(ns, ys, marker="o", label=label)
        ax.set_title(title)
        ax.set_xlabel("publishers (nodes)")
        ax.set_ylim(bottom=0)
        ax.legend()
        ax.grid(alpha=.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ------------------------------------------------------------------ extrapolation on paper


@dataclass
class Cluster:
    """The assumptions of the extrapolation (docs/scale.md names and argues each)."""

    nodes: int = 5000
    churn_per_s: float = 100.0          # pod starts per second, cluster-wide; as many deletions (steady state)
    netclaim_share: float = 1.0         # share of pods with a netclaim claim: 1 = every pod (upper bound)
    claims_per_node: int = 30           # claims a publisher tracks at any time (the safety net reads each)
    resync_s: float = 108000.0          # safety net: mean of --verify-after + uniform[0, --verify-spread] (24 h + 6 h)
    claim_window_s: float = 0.0         # an ADD's claim watch stays open this long after the apply (--claim-window; off by default)
    watch_timeout_s: float = 2700.0     # long-lived watches renewed after uniform[1800, 3600] s (limits.WATCH_RENEW)
    watches_per_node: int = 2           # the publisher's pod watch and the chain keeper's DaemonSet watch
    apiserver_seats: int = 600          # --max-requests-inflight 400 + --max-mutating-requests-inflight 200
    other_shares: int = 245             # nominal shares of the default priority levels (exempt excluded)
    netclaim_shares: int = 10           # the shipped PriorityLevelConfiguration


def extrapolate(point: dict[str, Any], c: Cluster | None = None) -> dict[str, float]:
    """Cluster-wide figures from one measured point's per-event costs."""
    c = c or Cluster()
    add, dele = point["per_add"], point["per_del"]
    pods = c.churn_per_s * c.netclaim_share
    event_qps = pods * (add["api_requests"] + dele["api_requests"])
    resync_qps = c.nodes * c.claims_per_node / c.resync_s
    rewatch_qps = c.nodes * c.watches_per_node / c.watch_timeout_s
    cpu = pods * (add["apiserver_cpu_ms"] + dele["apiserver_cpu_ms"]) / 1000
    return {
        "api_qps_events": round(event_qps, 1),
        "api_qps_resync_gets": round(resync_qps, 1),
        "api_qps_rewatch": round(rewatch_qps, 1),
        "api_qps_total": round(event_qps + resync_qps + rewatch_qps, 1),
        "etcd_writes_per_s": round(pods * (add["etcd_writes"] + dele["etcd_writes"]), 1),
        "etcd_writes_per_s_pod_create_reference": round(c.churn_per_s * point["reference_create_per_pod"]["etcd_writes"], 1),
        "watches_added": c.nodes * point["watches_added"] / point["nodes"],
        "claim_watches_open": round(pods * c.claim_window_s),  # windows opened per second x how long each stays
        "apiserver_cpu_cores_events": round(cpu, 2),
        "netclaim_seats": -(-c.apiserver_seats * c.netclaim_shares // (c.other_shares + c.netclaim_shares)),
        "publisher_memory_gib_cluster": round(c.nodes * point["publisher_rss_mib"]["mean"] / 1024, 1),
    }
