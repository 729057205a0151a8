"""cluster --nodes N: pod create -> claim status visible on N real nodes, netclaim as the chart's DaemonSet.

`scripts/cluster.sh up --nodes N` (one control plane, N kubelets each with
its own containerd and DRA driver), the image imported into every node and
the chart installed (runtime/nodechart.py). Pods with a ResourceClaimTemplate
are created one at a time through the API, round robin over the nodes
(nodeSelector on the hostname, the scheduler still allocates the device):
the figure is from the create call to a watch seeing the claim's Ready entry
(claim generation, scheduling, allocation, DRA prepare, sandbox and CNI with
netclaim, the node's publisher applying the status), and to the pod Ready.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

from kubernetes import client

from runtime.controlplane import api_client
from runtime.nodechart import install_everywhere
from runtime.observe import ClaimWatcher
from runtime.realcluster import RealCluster, pod_manifest, wait_until

from .stats import percentile

TARGET_S = 1.5


def _summary(values: list[float]) -> dict[str, float]:
    return {"median": round(statistics.median(values), 3), "p90": round(percentile(values, 0.9), 3),
            "min": round(min(values), 3), "max": round(max(values), 3), "n": len(values)}


def _claim_of(api: client.ApiClient, core: client.CoreV1Api, ns: str, name: str) -> str:
    pod = api.sanitize_for_serialization(core.read_namespaced_pod(name, ns))
    statuses = (pod.get("status") or {}).get("resourceClaimStatuses") or []
    return statuses[0].get("resourceClaimName", "") if statuses else ""


def run_nodes(args: argparse.Namespace, namespace: str, ready_watch: Any, progress: Any) -> dict[str, Any]:
    progress(f"bringing up a {args.nodes}-node cluster in {args.dir}")
    t0 = time.time()
    cluster = RealCluster.up(args.dir, nodes=args.nodes)
    up_s = time.time() - t0
    visible: list[float] = []
    ready_s: list[float] = []
    per_node: dict[str, list[float]] = {}
    watchers: list[Any] = []
    try:
        install_everywhere(cluster)
        ns = cluster.namespace(namespace)
        cluster.claim_template(ns, "net")
        api = api_client(cluster.kubeconfig)
        core = client.CoreV1Api(api)
        ready = ready_watch(api)
        claims = ClaimWatcher(api, ns, cluster.driver).start()
        watchers = [ready, claims]
        nodes = cluster.nodes
        for i in range(args.warmup + args.rounds):
            node = nodes[i % len(nodes)]
            name = f"p{i}"
            manifest = pod_manifest(ns, name, template="net")
            manifest["spec"]["nodeSelector"] = {"kubernetes.io/hostname": node.name}
            start = time.time()
            core.create_namespaced_pod(ns, manifest)
            claim = wait_until(lambda: _claim_of(api, core, ns, name), f"{name}'s claim", timeout=60, interval=0.05)
            seen = wait_until(lambda: min((t for (c, _), t in list(claims.seen.items()) if c == claim), default=0),
                              f"the status of {claim}", timeout=60, interval=0.02)
            t_ready = ready.wait(name)
            if i >= args.warmup:
                visible.append(seen - start)
                ready_s.append(t_ready - start)
                per_node.setdefault(node.name, []).append(seen - start)
                progress(f"pod {i - args.warmup + 1}/{args.rounds} on {node.name}: status visible "
                         f"{seen - start:.3f}s, Ready {t_ready - start:.3f}s")
    finally:
        for watcher in watchers:
            watcher.stop()
        cluster.down()
    return {
        "nodes": args.nodes,
        "cluster_up_s": round(up_s, 1),
        "pod_create_to_status_visible_s": _summary(visible),
        "pod_create_to_ready_s": _summary(ready_s),
        "per_node_median_s": {n: round(statistics.median(v), 3) for n, v in per_node.items()},
        "target_median_s": TARGET_S,
        "samples_s": [round(v, 3) for v in visible],
    }
