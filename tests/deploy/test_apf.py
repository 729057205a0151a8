"""The shipped API Priority and Fairness objects, against the real kube-apiserver.

conf/kubernetes ships a FlowSchema that sends every request of the
netclaim-publisher ServiceAccount to a PriorityLevelConfiguration of its own
(Limited, a small fixed share, queuing). What a user would notice, checked here:

- the API server accepts both objects (server-side apply) and reports the
  FlowSchema as not dangling;
- a request made with a publisher's Node-bound token is classified into the
  netclaim level (the X-Kubernetes-PF-* response headers name its UIDs);
- under a flood of publisher writes, kubelet-like requests (the static
  system:node:node-a identity: GET its Node, LIST its pods, GET a claim of its
  pod) are never rejected and stay in their own levels, while the flood is
  queued (or rejected with 429) at the netclaim level.

The test runs its OWN control plane ($NETCLAIM_CP_DIR-apf) with the API
server's concurrency lowered (NETCLAIM_CP_APISERVER_ARGS), so that on two
cores a bounded flood really exceeds the netclaim level's seats; latencies are
reported by `scripts/bench.py scale --apf`, not asserted.
"""

from __future__ import annotations

import os
import shlex
import ssl
import subprocess
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from deploylib import REPO

from benchlib.scale_apf import APF_KINDS, Endpoint, apf_documents, apply_apf, claim_status_apply, flood, kubelet_probe
from benchlib.scale_metrics import scrape, total
from benchlib.scale_objects import PodSpec, ensure_device_class, scheduled_pod
from runtime.identity import apply_shipped_rbac, ensure_node, node_token
from runtime.statedir import DEFAULT_CP_DIR

CONTROL_PLANE = REPO / "scripts" / "control-plane.sh"
# 30 seats in all: the netclaim level's 10 shares of ~255 give it 2 (node-high gets 5, system 4).
APISERVER_ARGS = "--max-requests-inflight=20 --max-mutating-requests-inflight=10"
NODE = "node-a"
DRIVER = "net.example.com"
FLOOD_CLAIMS = 8
FLOOD_REQUESTS = 480
FLOOD_THREADS = 24
APF_METRICS = ("apiserver_flowcontrol_rejected_requests_total",
               "apiserver_flowcontrol_request_queue_length_after_enqueue_count",
               "apiserver_flowcontrol_dispatched_requests_total")


@dataclass
class Plane:
    dir: Path
    kubeconfig: str
    server: str
    ca_file: str
    api: Any

    def static_token(self, user: str) -> str:
        for line in (self.dir / "tokens.csv").read_text().splitlines():
            parts = line.split(",")
            if len(parts) >= 2 and parts[1] == user:
                return parts[0]
        raise KeyError(user)

    def metrics(self) -> dict:
        ctx = ssl.create_default_context(cafile=self.ca_file)
        return scrape(f"{self.server}/metrics", APF_METRICS,
                      {"Authorization": f"Bearer {self.static_token('admin')}"}, ctx)


def _cp(env: dict[str, str], *args: str) -> str:
    done = subprocess.run([str(CONTROL_PLANE), *args], env=env, capture_output=True, text=True, timeout=3600)
    if done.returncode != 0:
        pytest.fail(f"scripts/control-plane.sh {' '.join(args)} failed ({done.returncode}):\n{done.stderr[-3000:]}",
                    pytrace=False)
    return done.stdout


@pytest.fixture(scope="module")
def plane() -> Iterator[Plane]:
    """A control plane of this module's own, with lowered concurrency limits; stopped at the end."""
    env = dict(os.environ)
    env["NETCLAIM_CP_DIR"] = (env.get("NETCLAIM_CP_DIR") or DEFAULT_CP_DIR) + "-apf"
    env["NETCLAIM_CP_APISERVER_ARGS"] = APISERVER_ARGS
    _cp(env, "down")  # a leftover of an interrupted run had other flags
    try:
        _cp(env, "up")
        values = {}
        for line in _cp(env, "env").splitlines():
            key, _, value = line.removeprefix("export ").partition("=")
            values[key] = shlex.split(value)[0] if value else ""
        from runtime.controlplane import api_client

        api = api_client(values["KUBECONFIG"])
        yield Plane(Path(values["NETCLAIM_CP_DIR"]), values["KUBECONFIG"], values["NETCLAIM_APISERVER"],
                    values["NETCLAIM_APISERVER_CA"], api)
        api.close()
    finally:
        _cp(env, "down")


@dataclass
class Setup:
    uids: dict[str, str]          # kind -> uid of the shipped APF objects
    publisher: str                # a Node-bound token of the shipped ServiceAccount
    kubelet: str                  # the static system:node:node-a token
    ns: str
    claims: list[str]


@pytest.fixture(scope="module")
def setup(plane: Plane) -> Setup:
    uids = apply_apf(plane.api)
    apply_shipped_rbac(plane.api, DRIVER)
    token = node_token(plane.api, ensure_node(plane.api, NODE))
    ns = f"apf-{uuid.uuid4().hex[:6]}"
    client.CoreV1Api(plane.api).create_namespace({"metadata": {"name": ns}})
    ensure_device_class(plane.api)
    specs = [PodSpec(NODE, f"p{i}", f"p{i}-net", index=i) for i in range(FLOOD_CLAIMS)]
    for spec in specs:
        scheduled_pod(plane.api, ns, spec)
    return Setup(uids, token, plane.static_token(f"system:node:{NODE}"), ns, [s.claim for s in specs])


def _level_uid(plane: Plane, name: str) -> str:
    return client.FlowcontrolApiserverV1Api(plane.api).read_priority_level_configuration(name).metadata.uid


def test_the_shipped_objects_are_accepted_and_the_flow_schema_is_not_dangling(plane: Plane, setup: Setup) -> None:
    assert {d["kind"] for d in apf_documents()} == set(APF_KINDS)
    assert set(setup.uids) == set(APF_KINDS)
    flow = client.FlowcontrolApiserverV1Api(plane.api)
    doc = next(d for d in apf_documents() if d["kind"] == "FlowSchema")
    schema = flow.read_flow_schema(doc["metadata"]["name"])
    dangling = [c for c in (schema.status.conditions or []) if c.type == "Dangling"]
    assert dangling and dangling[0].status == "False", schema.status
    level = flow.read_priority_level_configuration(schema.spec.priority_level_configuration.name)
    assert level.spec.type == "Limited"
    assert level.spec.limited.limit_response.type == "Queue"


def test_publisher_requests_are_classified_into_the_netclaim_level(plane: Plane, setup: Setup) -> None:
    ep = Endpoint(plane.server, plane.ca_file, setup.publisher)
    try:
        # what a publisher does: list its node's pods, read a claim, apply a claim's status
        path, body = claim_status_apply(setup.ns, setup.claims[0], NODE, 0)
        replies = [ep.request("GET", f"/api/v1/pods?fieldSelector=spec.nodeName%3D{NODE}"),
                   ep.request("GET", f"/apis/resource.k8s.io/v1/namespaces/{setup.ns}/resourceclaims/{setup.claims[0]}"),
                   ep.request("PATCH", path, body, "application/apply-patch+yaml")]
    finally:
        ep.close()
    assert [r.status for r in replies] == [200, 200, 200]
    assert {r.flow_schema for r in replies} == {setup.uids["FlowSchema"]}
    assert {r.priority_level for r in replies} == {setup.uids["PriorityLevelConfiguration"]}


def test_kubelet_requests_are_never_rejected_while_a_publisher_flood_queues_at_its_level(
        plane: Plane, setup: Setup) -> None:
    ours = setup.uids["PriorityLevelConfiguration"]
    kubelet_levels = {_level_uid(plane, "node-high"): "node-high", _level_uid(plane, "system"): "system"}
    ours_name = next(d["metadata"]["name"] for d in apf_documents() if d["kind"] == "PriorityLevelConfiguration")
    requests = [claim_status_apply(setup.ns, setup.claims[i % FLOOD_CLAIMS], NODE, i + 1)
                for i in range(FLOOD_REQUESTS)]
    before = plane.metrics()
    stop = threading.Event()
    kubelet_replies: list = []

    def kubelet() -> None:
        ep = Endpoint(plane.server, plane.ca_file, setup.kubelet)
        try:
            kubelet_replies.extend(kubelet_probe(ep, NODE, setup.ns, setup.claims[0], rounds=200, stop=stop))
        finally:
            ep.close()

    probe = threading.Thread(target=kubelet)
    probe.start()
    try:
        flood_replies = flood(lambda: Endpoint(plane.server, plane.ca_file, setup.publisher), requests,
                              FLOOD_THREADS)
    finally:
        stop.set()
        probe.join(300)
    after = plane.metrics()

    def delta(name: str, level: str) -> float:
        return total(after, name, priority_level=level) - total(before, name, priority_level=level)

    # the kubelet: every request answered, none rejected, all in the system levels
    assert kubelet_replies, "the kubelet-like probe made no request"
    assert {r.status for r in kubelet_replies} == {200}, sorted({r.status for r in kubelet_replies})
    assert {kubelet_levels.get(r.priority_level, r.priority_level) for r in kubelet_replies} <= set(
        kubelet_levels.values())
    for level in kubelet_levels.values():
        assert delta("apiserver_flowcontrol_rejected_requests_total", level) == 0
    # the flood: all in the netclaim level, applied or refused with 429 (the publisher retries those)
    assert len(flood_replies) == FLOOD_REQUESTS
    assert {r.priority_level for r in flood_replies} == {ours}
    assert {r.status for r in flood_replies} <= {200, 429}, sorted({r.status for r in flood_replies})
    queued = delta("apiserver_flowcontrol_request_queue_length_after_enqueue_count", ours_name)
    rejected = delta("apiserver_flowcontrol_rejected_requests_total", ours_name)
    assert queued + rejected > 0, "the flood never waited at the netclaim level: it did not exceed its seats"
    assert rejected == sum(1 for r in flood_replies if r.status == 429)
