"""publisher burst: API requests per ADD when many ADDs arrive at once and every apply is slow.

A rollout, or nodes coming back, hands a publisher a burst of ADDs exactly when the
API server is busy. The publisher here talks to the real API server through a local
TLS proxy (tests/publisher/lossy_proxy.py) that holds every status PATCH (the apply)
for `apply_delay` seconds before forwarding it; every other request (the claim GET,
the pod watch) goes through at once. N pods with allocated claims exist before the
publisher starts (its pod watch has them, as on a node); then N ADDs run through the
real plugin at the same moment and a watch records when each entry is visible.

The figure is API requests per ADD from the publisher's own request counter, counted
from the quiet publisher before the burst until the dirty marks' lease
(publisher/limits.py DIRTY_LEASE) has run out after the last ADD, so a claim that
housekeeping reconciles late still counts. Each ADD needs one claim GET and one
apply; a housekeeping pass that reconciles a claim while its worker is still in the
apply costs one more GET (before the lease: about 3 requests per ADD).
"""

from __future__ import annotations

import os
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable

from .stats import percentile

REPO = Path(__file__).resolve().parents[3]
LEASE_FALLBACK_S = 30.0  # publisher/limits.py DIRTY_LEASE, for a publisher tree that predates it
TARGET_REQUESTS_PER_ADD = 2.05
SPOOLED = "netclaim_events_spooled_total"
UPSTREAM_TIMEOUT_S = 3600.0

Metrics = dict[str, float]


def _dirty_lease() -> float:
    from publisher import limits

    return float(getattr(limits, "DIRTY_LEASE", LEASE_FALLBACK_S))


def slow_proxy(server: str, ca_file: str, workdir: Path, apply_delay: float) -> Any:
    """The TLS proxy of the publisher tests, holding each status PATCH `apply_delay` seconds."""
    sys.path.insert(0, str(REPO / "tests" / "publisher"))
    try:
        from lossy_proxy import LossyApiProxy
    finally:
        sys.path.pop(0)
    # Upstream reads may wait longer than the whole run: the publisher's pod watch, silent
    # after the pods are listed, must not be cut (and relisted) by the proxy's own timeout.
    return LossyApiProxy(server, ca_file, workdir, apply_delay=apply_delay, upstream_timeout=UPSTREAM_TIMEOUT_S).start()


def proxy_kubeconfig(admin_kubeconfig: str, proxy: Any, path: Path) -> str:
    """The admin kubeconfig with its server and CA replaced by the proxy's; returns its path."""
    import yaml

    cfg = yaml.safe_load(Path(admin_kubeconfig).read_text())
    for cluster in cfg["clusters"]:
        cluster["cluster"]["server"] = proxy.url
        cluster["cluster"].pop("certificate-authority-data", None)
        cluster["cluster"]["certificate-authority"] = proxy.cert
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        yaml.safe_dump(cfg, fh)
    return str(path)


def _fire_at_once(bench: Any, pods: list[tuple[str, str, str]]) -> tuple[dict[str, str], dict[str, tuple[float, float]]]:
    """Run every pod's ADD through the real plugin, all released by one barrier."""
    barrier = threading.Barrier(len(pods))
    cids = {claim: f"burst{i}-{uuid.uuid4().hex[:8]}" for i, (_, claim, _) in enumerate(pods)}
    times: dict[str, tuple[float, float]] = {}

    def one(i: int) -> None:
        pod, claim, uid = pods[i]
        barrier.wait()
        times[claim] = bench.plugin_add(cids[claim], pod, uid, i)

    with ThreadPoolExecutor(len(pods)) as pool:
        for f in [pool.submit(one, i) for i in range(len(pods))]:
            f.result()
    return cids, times


def _delta(after: Metrics, before: Metrics, prefix: str) -> dict[str, int]:
    """Per-label increase of the counters named `prefix` (label set -> count), zeros left out."""
    out = {}
    for key, value in after.items():
        if key.startswith(prefix + "{"):
            grew = int(value - before.get(key, 0.0))
            if grew:
                out[key[len(prefix):]] = grew
    return out


def _ms(values: list[float]) -> dict[str, float]:
    return {"p50": round(percentile(values, .5), 1), "p99": round(percentile(values, .99), 1),
            "max": round(max(values), 1)}


def _warnings(log: Path, keep: int = 5) -> dict[str, int]:
    """The publisher's warning and error lines, counted by event and error (what made a request fail)."""
    import json

    out: dict[str, int] = {}
    for line in log.read_text(errors="replace").splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if rec.get("level") in ("warning", "error"):
            key = f"{rec.get('msg')}: {str(rec.get('error', ''))[:120]}"
            out[key] = out.get(key, 0) + 1
    return dict(sorted(out.items(), key=lambda kv: -kv[1])[:keep])


def burst(bench: Any, pods: list[tuple[str, str, str]], proxy: Any, watcher_factory: Callable[[Any], Any],
          api_total: Callable[[Metrics], float], received: Callable[[Any], dict[str, float]]) -> dict[str, Any]:
    """The burst against a publisher already started through `proxy` and quiet."""
    time.sleep(1.0)  # as the latency run: the publisher's pod watch has listed the pods
    bench.wait_drained()
    before, patches_before = bench.metrics(), proxy.patches
    watcher = watcher_factory(bench)
    try:
        cids, times = _fire_at_once(bench, pods)
        seen = watcher.collect(cids, timeout=600)
    finally:
        watcher.stop()
    bench.wait_drained()
    drained = bench.metrics()
    lease = _dirty_lease()
    last_ack = max(t[1] for t in times.values())
    time.sleep(max(0.0, last_ack + lease + 5.0 - time.time()))  # a mark housekeeping takes after its lease counts
    after = bench.metrics()
    start = min(t[0] for t in times.values())
    got = received(bench)
    n = len(pods)
    requests = api_total(after) - api_total(before)
    return {
        "adds": n, "visible": len(seen), "apply_delay_s": proxy.apply_delay,
        "api_requests": int(requests), "api_requests_per_add": round(requests / n, 3),
        "api_requests_per_add_when_drained": round((api_total(drained) - api_total(before)) / n, 3),
        "api_requests_after_drained": int(api_total(after) - api_total(drained)),
        "counted_until_s_after_last_ack": round(time.time() - last_ack, 1), "dirty_lease_s": lease,
        "requests_by_verb": _delta(after, before, "netclaim_api_requests_total"),
        "requests_by_purpose": _delta(after, before, "netclaim_api_requests_by_purpose_total"),
        "status_patches_at_proxy": proxy.patches - patches_before,
        "events_spooled": int(after.get(SPOOLED, 0.0) - before.get(SPOOLED, 0.0)),  # ADDs the plugin could not hand over
        "plugin_add_ms": _ms([(b - a) * 1000 for a, b in times.values()]),
        "handoff_to_visible_ms": _ms([(seen[c] - got[cids[c]]) * 1000 for c in seen if cids[c] in got]),
        "first_add_to_last_visible_s": round(max(seen.values()) - start, 2) if seen else None,
        "target_api_requests_per_add": TARGET_REQUESTS_PER_ADD,
        "publisher_warnings": _warnings(bench.dir / "publisher.log"),
    }
