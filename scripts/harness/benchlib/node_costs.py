"""Two costs a node sees that the quiet publisher bench does not: ordinary pods, and a busy disk.

1. Ordinary pods (no network claim; most pods of a cluster): the real plugin
   runs ADD and DEL for each, as it would in the primary chain. Figures: API
   requests the publisher made per ordinary pod (its own request counter) and
   Warning Events it posted about them (read back from the API). Target 0.
2. Latency under IO pressure: a writer process rewrites large files with
   fsync on the same disk as the journal, the spool and etcd while sandboxes
   are handed over at a steady rate. The reference is a bare apply loop at
   the same rate under the same pressure (the API server's and etcd's share);
   the figure is netclaim's hand-off-to-visible p99 over the bare apply p99.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any, Callable

from .stats import paced, percentile

# The IO pressure: each file this size is written in 1 MiB chunks, fsynced, removed.
PRESSURE_FILE_MIB = 512
PRESSURE_WRITER = """
import os, sys, time
path, mib, until = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
chunk = os.urandom(1 << 20)
while time.time() < until:
    with open(path, "wb") as fh:
        for _ in range(mib):
            fh.write(chunk)
            if time.time() >= until:
                break
        fh.flush()
        os.fsync(fh.fileno())
    os.unlink(path)
"""


def ordinary_pods(bench: Any, count: int, api_total: Callable[[dict[str, float]], float]) -> dict[str, Any]:
    """ADD and DEL through the real plugin for `count` pods without claims."""
    pods = []
    for i in range(count):
        name = f"ordinary{i}"
        resp = bench.core.create_namespaced_pod(bench.ns, {
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"nodeName": "node-a", "containers": [{"name": "c", "image": "local/pause:1"}]}},
            _preload_content=False)
        pods.append((name, json.loads(resp.data)["metadata"]["uid"]))
    time.sleep(2.0)  # the publisher's pod watch has them, as it would before a kubelet starts a sandbox
    before = bench.metrics()
    for i, (name, uid) in enumerate(pods):
        cid = f"ord{i}-{uuid.uuid4().hex[:8]}"
        bench.plugin_run("ADD", cid, name, uid, i)
        bench.plugin_run("DEL", cid, name, uid, i)
    bench.wait_drained()
    after = bench.metrics()
    status = bench.status()
    warnings = _warnings(bench)
    return {"ordinary_pods": count, "api_requests": int(api_total(after) - api_total(before)),
            "api_requests_per_ordinary_pod": round((api_total(after) - api_total(before)) / max(1, count), 3),
            "warning_events": warnings, "warning_events_per_ordinary_pod": round(warnings / max(1, count), 3),
            "failed_events": len(status.get("failed_events") or []), "tombstones": status.get("tombstones")}


def _warnings(bench: Any) -> int:
    from kubernetes import client

    resp = client.EventsV1Api(bench.api).list_namespaced_event(bench.ns, _preload_content=False)
    items = json.loads(resp.data).get("items") or []
    return sum(1 for e in items if e.get("reportingController") == "netclaim.dev/publisher")


class IOPressure:
    """A separate process that keeps the disk under the bench dir busy with fsynced writes."""

    def __init__(self, directory: Path, seconds: float) -> None:
        self.path = directory / "io-pressure.bin"
        self.proc = subprocess.Popen([sys.executable, "-c", PRESSURE_WRITER, str(self.path), str(PRESSURE_FILE_MIB),
                                      str(time.time() + seconds)])

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait(30)
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass


def bare_apply_latency(bench: Any, bodies: list[tuple[str, list[dict[str, Any]]]], rate: float,
                       apply: Callable[[str, list[dict[str, Any]]], None]) -> list[float]:
    """Per-request milliseconds of the same applies sent at `rate`/s (a plain client, no journal)."""
    out: list[float] = []

    def one(item: tuple[str, list[dict[str, Any]]]) -> None:
        t0 = time.time()
        apply(*item)
        out.append((time.time() - t0) * 1000)

    paced(bodies, rate, one)
    return out


def summary(values: list[float]) -> dict[str, float]:
    return {"p50": round(percentile(values, .5), 1), "p99": round(percentile(values, .99), 1),
            "max": round(max(values), 1)}


def contended(bench: Any, pods: list[tuple[str, str, str]], rate: float,
              latency: Callable[[Any, list[tuple[str, str, str]], float], dict[str, Any]],
              apply: Callable[[str, list[dict[str, Any]]], None]) -> dict[str, Any]:
    """netclaim's hand-off-to-visible and a bare apply loop, each under the same IO pressure."""
    seconds = 2 * len(pods) / rate + 120
    pressure = IOPressure(bench.dir, seconds)
    try:
        time.sleep(3.0)  # let the writer fill the page cache and start its fsyncs
        netclaim = latency(bench, pods, rate)
        bodies = []
        for _, claim, _ in pods:
            resp = bench.res.read_namespaced_resource_claim(claim, bench.ns, _preload_content=False)
            devs = [d for d in json.loads(resp.data)["status"].get("devices", []) if d["driver"] == "net.example.com"]
            bodies.append((claim, devs))
        bare = bare_apply_latency(bench, bodies, rate, apply)
    finally:
        pressure.stop()
    handoff = netclaim["handoff_to_visible_ms"]
    bare_s = summary(bare)
    return {"sandboxes": len(pods), "rate": rate, "pressure_file_mib": PRESSURE_FILE_MIB,
            "handoff_to_visible_ms": handoff, "plugin_add_ms": netclaim["plugin_add_ms"],
            "bare_apply_ms": bare_s, "p99_ratio_vs_bare": round(handoff["p99"] / max(0.1, bare_s["p99"]), 2)}
