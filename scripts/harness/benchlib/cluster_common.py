"""What the cluster benchmarks share: the targets, the namespace, the kubelet's start histogram, a
watch for Ready pods, and the conflist switch between the chain with and without netclaim.

Its own module so the single-network run (cluster.py), the burst (cluster_burst.py) and the
multi-network run (cluster_multi.py) all build on it without importing each other.
"""

from __future__ import annotations

import json
import os
import re
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kubernetes import client, watch  # noqa: E402

from runtime.realcluster import RealCluster, wait_until  # noqa: E402

from .stats import percentile

TARGET_RATIO = 1.05
SLI = "kubelet_pod_start_duration_seconds"
SLI_PROPER = "kubelet_pod_start_sli_duration_seconds"
NAMESPACE = "bench"


def progress(text: str) -> None:
    print(f"[bench cluster] {text}", file=sys.stderr, flush=True)


def summary(values: list[float]) -> dict[str, float]:
    return {"median": round(statistics.median(values), 1), "p90": round(percentile(values, 0.9), 1),
            "min": round(min(values), 1), "max": round(max(values), 1), "n": len(values)}


def sli_sum(metrics: str, name: str = SLI) -> tuple[float, float]:
    """(sum, count) of one of the kubelet's pod start histograms."""
    total = count = 0.0
    for line in metrics.splitlines():
        m = re.match(rf"^{name}_(sum|count)(?:{{[^}}]*}})? ([0-9.eE+-]+)$", line)
        if m:
            if m.group(1) == "sum":
                total += float(m.group(2))
            else:
                count += float(m.group(2))
    return total, count


class ReadyWatch:
    """Wall time at which a watch first sees each pod of the namespace Ready."""

    def __init__(self, api: client.ApiClient) -> None:
        self.core = client.CoreV1Api(api)
        self.seen: dict[str, float] = {}
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._watch = watch.Watch()
        threading.Thread(target=self._loop, daemon=True).start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                for event in self._watch.stream(self.core.list_namespaced_pod, NAMESPACE, timeout_seconds=60):
                    pod = event["object"]
                    conds = pod.status.conditions or [] if pod.status else []
                    if any(c.type == "Ready" and c.status == "True" for c in conds):
                        with self._cond:
                            self.seen.setdefault(pod.metadata.name, time.time())
                            self._cond.notify_all()
            except Exception:  # noqa: BLE001 - re-watch; waits time out if it never recovers
                time.sleep(0.2)

    def wait(self, name: str, timeout: float = 120) -> float:
        with self._cond:
            if not self._cond.wait_for(lambda: name in self.seen, timeout):
                raise TimeoutError(f"pod {name} not Ready within {timeout}s")
            return self.seen[name]

    def stop(self) -> None:
        self._stop.set()
        self._watch.stop()


class Chains:
    """The node's conflist, switched between the two variants; waits until containerd loaded the new one."""

    def __init__(self, cluster: RealCluster) -> None:
        self.cluster = cluster
        self.path = Path(cluster.values["NETCLAIM_CONFLIST"])
        self.with_netclaim = self.path.read_text()
        plain = json.loads(self.with_netclaim)
        plain["plugins"] = [p for p in plain["plugins"] if p.get("type") != "netclaim"]
        self.plain = json.dumps(plain, indent=2) + "\n"

    def use(self, netclaim: bool) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(self.with_netclaim if netclaim else self.plain)
        os.replace(tmp, self.path)
        wait_until(lambda: ("netclaim" in self.cluster.loaded_cni_types()) == netclaim,
                   "containerd to load the conflist", 30, 0.05)
