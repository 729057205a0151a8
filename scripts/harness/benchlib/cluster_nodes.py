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
import os
import re
import statistics
import subprocess
import time
from typing import Any

from kubernetes import client

from runtime.controlplane import api_client
from runtime.nodechart import install_everywhere
from runtime.observe import ClaimWatcher
from runtime.realcluster import RealCluster, pod_manifest, wait_until

from .stats import percentile

TARGET_S = 1.5
REST_S = 120.0  # the at-rest window after the pods: what each node's netclaim costs while nothing changes
CLK_TCK = os.sysconf("SC_CLK_TCK")


def _publishers(nodes: set[str]) -> dict[int, str]:
    """pid -> node name of every `netclaim-publisher run` on this host (one per node's DaemonSet pod;
    the kubelet expands the chart's `--node-name=$(NETCLAIM_NODE_NAME)`)."""
    out = subprocess.run(["pgrep", "-af", "netclaim-publisher run"], capture_output=True, text=True).stdout
    found = {}
    for line in out.splitlines():
        pid, _, cmd = line.partition(" ")
        node = re.search(r"--node-name[ =](\S+)", cmd)
        if node and node.group(1) in nodes:  # this cluster's, not another cluster's on the same host
            found[int(pid)] = node.group(1)
    return found


def _usage(pid: int) -> tuple[float, float]:
    """(CPU seconds, RSS MiB) of one process."""
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    with open(f"/proc/{pid}/status") as fh:
        rss = next(int(line.split()[1]) for line in fh if line.startswith("VmRSS:"))
    return (int(fields[11]) + int(fields[12])) / CLK_TCK, rss / 1024


def _apiserver_requests(api: client.ApiClient) -> float:
    """kube-apiserver's own count of every request it answered (its /metrics)."""
    resp = api.call_api(*api.param_serialize(method="GET", resource_path="/metrics", auth_settings=["BearerToken"]))
    resp.read()
    text = resp.data.decode()
    return sum(float(line.rpartition(" ")[2]) for line in text.splitlines() if line.startswith("apiserver_request_total{"))


def at_rest(api: client.ApiClient, nodes: set[str], seconds: float, progress: Any) -> dict[str, Any]:
    """Each node's publisher at rest (its pods running, nothing changing): CPU, RSS, and the API
    server's request rate over the window, every node's kubelet and controller included."""
    pubs = _publishers(nodes)
    progress(f"at rest for {seconds:.0f}s: {len(pubs)} publishers")
    before = {pid: _usage(pid) for pid in pubs}
    requests_before = _apiserver_requests(api)
    time.sleep(seconds)
    requests_after = _apiserver_requests(api)
    per_node = {}
    for pid, node in pubs.items():
        cpu, rss = _usage(pid)
        per_node[node] = {"cpu_pct": round((cpu - before[pid][0]) / seconds * 100, 3), "rss_mib": round(rss, 1)}
    return {"seconds": seconds, "publishers": per_node,
            "apiserver_requests_per_s_all_clients": round((requests_after - requests_before) / seconds, 2)}


def summary(values: list[float]) -> dict[str, float]:
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
        rest = at_rest(api, {n.name for n in nodes}, getattr(args, "rest", REST_S), progress)
    finally:
        for watcher in watchers:
            watcher.stop()
        cluster.down()
    return {
        "nodes": args.nodes,
        "cluster_up_s": round(up_s, 1),
        "pod_create_to_status_visible_s": summary(visible),
        "pod_create_to_ready_s": summary(ready_s),
        "per_node_median_s": {n: round(statistics.median(v), 3) for n, v in per_node.items()},
        "target_median_s": TARGET_S,
        "samples_s": [round(v, 3) for v in visible],
        "at_rest": rest,
    }
