"""Nothing is lost: a publisher SIGKILLed in the middle of a burst, an API server outage,
a publisher that is not running at all. Events come from the real plugin binary."""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from cni_plugin.wire.event import PodRef
from publisher_testkit import DRIVER, NO_NETNS, Cluster, Plugin, cni_result, suffix

pytestmark = pytest.mark.controlplane


def make_pods(cluster: Cluster, n: int) -> list[tuple[str, PodRef]]:
    def one(i: int) -> tuple[str, PodRef]:
        claim, uid = cluster.pod_with_claim(f"pod-{i}", [("nic", "nic0")])
        return claim, PodRef(cluster.namespace, f"pod-{i}", uid)
    with ThreadPoolExecutor(8) as pool:
        return list(pool.map(one, range(n)))


def published(cluster: Cluster) -> set[str]:
    resp = cluster.resource.list_namespaced_resource_claim(cluster.namespace, _preload_content=False)
    items = json.loads(resp.data)["items"]
    return {c["metadata"]["name"] for c in items
            if any(d.get("driver") == DRIVER for d in (c.get("status") or {}).get("devices") or [])}


def wait_published(cluster: Cluster, names: set[str], timeout: float) -> None:
    deadline = time.time() + timeout
    seen: set[str] = set()
    while time.time() < deadline:
        seen = published(cluster)
        if names <= seen:
            return
        time.sleep(0.5)
    raise AssertionError(f"{len(names & seen)} of {len(names)} published; missing e.g. {sorted(names - seen)[:5]}")


def plugin_add(plugin: Plugin, i: int, pod: PodRef) -> tuple[int, float]:
    out = plugin.run("ADD", f"cid{i}-{suffix()}", pod, cni_result(ipv4=f"10.80.{i // 250}.{i % 250 + 2}/16"),
                     netns=NO_NETNS)
    return out.returncode, time.time()


def test_sigkill_in_the_middle_of_200_adds_loses_nothing(cluster: Cluster, publisher, plugin):
    pods = make_pods(cluster, 200)
    done = []
    killed = threading.Event()

    def run(i: int) -> int:
        rc, _ = plugin_add(plugin, i, pods[i][1])
        done.append(i)
        if len(done) == 100 and not killed.is_set():
            killed.set()
            publisher.kill()  # SIGKILL: no chance to flush anything
        return rc

    with ThreadPoolExecutor(6) as pool:
        codes = list(pool.map(run, range(200)))
    assert killed.is_set()
    assert codes == [0] * 200, "an ADD failed while the publisher was killed"
    publisher.start()  # same state and spool dirs
    wait_published(cluster, {c for c, _ in pods}, timeout=180)
    assert publisher.status()["journal_depth"] == 0


def test_api_server_outage_during_a_burst(cluster: Cluster, publisher, plugin, control_plane):
    pods = make_pods(cluster, 60)
    results: list[tuple[int, float]] = []

    def burst() -> None:
        for i, (_, pod) in enumerate(pods):
            results.append(plugin_add(plugin, i, pod))
            time.sleep(0.3)

    thread = threading.Thread(target=burst)
    thread.start()
    outage_start = outage_end = 0.0
    try:
        while len(results) < 10:
            time.sleep(0.05)
        control_plane.stop_apiserver()
        outage_start = time.time()
        time.sleep(10.5)
    finally:
        control_plane.start_apiserver()
        outage_end = time.time()
        thread.join()
    assert outage_end - outage_start >= 10
    during = [t for _, t in results if outage_start <= t <= outage_end]
    assert len(during) >= 10, "the burst did not overlap the outage"
    assert [rc for rc, _ in results] == [0] * len(pods), "an ADD failed during the API outage"
    wait_published(cluster, {c for c, _ in pods}, timeout=120)
    errors = publisher.metric('netclaim_api_requests_total{code="error"')
    assert errors > 0, "the publisher never noticed the outage"
