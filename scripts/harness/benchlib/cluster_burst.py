"""cluster --burst N: N claimed pods created at once on one real node, netclaim chained vs the same chain without it.

The node of `scripts/cluster.sh up` (its DRA driver publishing enough devices
for a whole burst). A burst is N pods, each with a ResourceClaimTemplate like
the single-pod samples, created at the same moment from N threads; each pod's
figure is from its own create call to a watch seeing it Ready. Bursts run in
ABBA order after one unmeasured warm-up burst, the node's conflist switched
before each (benchlib/cluster.py's Chains), and every pod and generated claim
is deleted and gone before the next burst, so each burst starts from an empty
node. The figure is the ratio of the bursts' p99s (mean over the bursts of a
chain; target <= 1.05). What a burst stresses that single pods do not: the
plugin's hand-off and the publisher's applies queue behind each other while
the kubelet, containerd and the API server are busy with the other pods.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from kubernetes import client, config

from runtime.observe import ClaimWatcher, plugin_add_time
from runtime.realcluster import RealCluster, pod_manifest, wait_until

from .cluster_common import NAMESPACE, SLI, TARGET_RATIO, Chains, ReadyWatch, progress, summary, sli_sum
from .stats import percentile


def _api(kubeconfig: str, pool: int) -> client.ApiClient:
    """An API client whose connection pool holds a whole burst (the default pool would drop connections)."""
    configuration = client.Configuration()
    config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
    configuration.connection_pool_maxsize = pool
    return client.ApiClient(configuration)


def _create_at_once(core: client.CoreV1Api, names: list[str]) -> dict[str, float]:
    """Create every pod from its own thread, released together; name -> wall time of its create call."""
    start = threading.Barrier(len(names))
    t0: dict[str, float] = {}

    def create(name: str) -> None:
        start.wait()
        t0[name] = time.time()
        core.create_namespaced_pod(NAMESPACE, pod_manifest(NAMESPACE, name, template="net"))

    with ThreadPoolExecutor(len(names)) as pool:
        for f in [pool.submit(create, n) for n in names]:
            f.result()
    return t0


def _sandboxes(cluster: RealCluster) -> dict[str, str]:
    """Pod name -> its ready sandbox id, from one crictl call."""
    out = json.loads(cluster.crictl("pods", "--namespace", NAMESPACE, "--state", "ready", "-o", "json"))
    return {p["metadata"]["name"]: p["id"] for p in out.get("items") or []}


def _add_to_visible(cluster: RealCluster, core: client.CoreV1Api, claims: ClaimWatcher, names: list[str]) -> list[float]:
    """Per netclaim pod of a burst: its ADD log line to a watch first seeing its claim's Ready entry (ms)."""
    sandboxes = _sandboxes(cluster)
    out = []
    for name in names:
        statuses = core.read_namespaced_pod(name, NAMESPACE).status.resource_claim_statuses or []
        claim = statuses[0].resource_claim_name if statuses else ""
        seen = wait_until(lambda: min((t for (c, _), t in list(claims.seen.items()) if c == claim), default=0),
                          f"the status of {claim}", timeout=60, interval=0.05)
        t_add = plugin_add_time(cluster.values["NETCLAIM_PLUGIN_LOG"], sandboxes.get(name, ""))
        if t_add:
            out.append((seen - t_add) * 1000)
    return out


def _empty(cluster: RealCluster, core: client.CoreV1Api) -> None:
    """Delete the burst and wait until its pods and their generated claims are gone (the devices free again)."""
    cluster.kubectl("delete", "pods", "--all", "-n", NAMESPACE, "--wait=true", timeout=300)
    resource = client.ResourceV1Api(core.api_client)
    wait_until(lambda: not core.list_namespaced_pod(NAMESPACE).items
               and not resource.list_namespaced_resource_claim(NAMESPACE).items,
               "the burst's pods and claims to be gone", timeout=300, interval=0.5)


def _burst(ctx: dict[str, Any], k: int, variant: str) -> dict[str, Any]:
    """One burst: every pod's create -> Ready, the kubelet's mean start duration, netclaim's ADD-to-visible."""
    cluster, core, ready = ctx["cluster"], ctx["core"], ctx["ready"]
    ctx["chains"].use(variant == "netclaim")
    names = [f"b{k}-{variant}-{i}" for i in range(ctx["n"])]
    before = sli_sum(cluster.kubelet_metrics(), SLI)
    t0 = _create_at_once(core, names)
    ms = [(ready.wait(n, timeout=300) - t0[n]) * 1000 for n in names]
    after = wait_until(lambda: (lambda s: s if s[1] >= before[1] + len(names) else None)(
        sli_sum(cluster.kubelet_metrics(), SLI)), "the kubelet's pod start observations", 60)
    a2v = _add_to_visible(cluster, core, ctx["claims"], names) if variant == "netclaim" else []
    _empty(cluster, core)
    return {"variant": variant, "ms": ms, "p50": percentile(ms, 0.5), "p99": percentile(ms, 0.99),
            "span_ms": (max(ready.seen[n] for n in names) - min(t0.values())) * 1000,
            "kubelet_mean_start_ms": (after[0] - before[0]) * 1000 / (after[1] - before[1]),
            "add_to_visible_ms": a2v}


def run(args: argparse.Namespace) -> dict[str, Any]:
    directory = args.dir + "b"
    env = {**os.environ, "NETCLAIM_DRA_DEVICES": str(args.burst + 4)}  # a device per pod of a burst, and spare
    progress(f"bringing up the real cluster in {directory} ({env['NETCLAIM_DRA_DEVICES']} devices)")
    t0 = time.time()
    cluster = RealCluster.up(directory, base_env=env)
    up_s = time.time() - t0
    ready = claims = None
    bursts: list[dict[str, Any]] = []
    try:
        cluster.sh("install-netclaim")
        cluster.namespace(NAMESPACE)
        cluster.claim_template(NAMESPACE, "net")
        api = _api(cluster.kubeconfig, args.burst + 4)
        ready, claims = ReadyWatch(api), ClaimWatcher(api, NAMESPACE, cluster.driver).start()
        ctx = {"cluster": cluster, "core": client.CoreV1Api(api), "ready": ready, "claims": claims,
               "chains": Chains(cluster), "n": args.burst}
        warm = _burst(ctx, 0, "netclaim")
        progress(f"warm-up burst: p99 {warm['p99']:.0f} ms")
        order = [v for i in range(args.burst_rounds) for v in (("plain", "netclaim") if i % 2 == 0
                                                               else ("netclaim", "plain"))]  # ABBA
        for k, variant in enumerate(order, start=1):
            bursts.append(_burst(ctx, k, variant))
            b = bursts[-1]
            progress(f"burst {k}/{len(order)} {variant}: p50 {b['p50']:.0f} ms, p99 {b['p99']:.0f} ms, "
                      f"span {b['span_ms']:.0f} ms, kubelet mean start {b['kubelet_mean_start_ms']:.0f} ms")
        ctx["chains"].use(True)
    finally:
        for watcher in (ready, claims):
            if watcher is not None:
                watcher.stop()
        cluster.down()
    return _figures(args, up_s, bursts)


def _figures(args: argparse.Namespace, up_s: float, bursts: list[dict[str, Any]]) -> dict[str, Any]:
    by = {v: [b for b in bursts if b["variant"] == v] for v in ("plain", "netclaim")}
    p99 = {v: statistics.mean(b["p99"] for b in bs) for v, bs in by.items()}
    p50 = {v: statistics.mean(b["p50"] for b in bs) for v, bs in by.items()}
    pooled = {v: [x for b in bs for x in b["ms"]] for v, bs in by.items()}
    a2v = [x for b in by["netclaim"] for x in b["add_to_visible_ms"]]
    return {
        "result_name": "cluster-burst",
        "burst": args.burst,
        "bursts_per_chain": args.burst_rounds,
        "cluster_up_s": round(up_s, 1),
        "p99_ms": {v: round(x, 1) for v, x in p99.items()},
        "p50_ms": {v: round(x, 1) for v, x in p50.items()},
        "ratio_p99": round(p99["netclaim"] / p99["plain"], 3),
        "ratio_p50": round(p50["netclaim"] / p50["plain"], 3),
        "target_ratio": TARGET_RATIO,
        "pooled_create_to_ready_ms": {v: summary(x) for v, x in pooled.items()},
        "add_to_visible_ms": summary(a2v) if a2v else {},
        "bursts": [{"variant": b["variant"], "p50_ms": round(b["p50"], 1), "p99_ms": round(b["p99"], 1),
                    "span_ms": round(b["span_ms"], 1), "kubelet_mean_start_ms": round(b["kubelet_mean_start_ms"], 1),
                    "samples_ms": [round(x, 1) for x in b["ms"]],
                    "add_to_visible_ms": [round(x, 1) for x in b["add_to_visible_ms"]]} for b in bursts],
    }
