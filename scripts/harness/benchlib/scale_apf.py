"""API Priority and Fairness for the scale bench's `--apf` phase and tests/deploy/test_apf.py."""

from __future__ import annotations

import json
import os
import subprocess
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .publisher import DRIVER
from .scale_metrics import scrape
from .scale_objects import PodSpec, ensure_device_class, scheduled_pod
from .stats import percentile

REPO = Path(__file__).resolve().parents[3]

# ------------------------------------------------------------------ API Priority and Fairness
#
# Shared by tests/deploy/test_apf.py (which asserts on classification and
# rejections) and the `--apf` phase of this bench (which reports latencies).

APF_KINDS = ("PriorityLevelConfiguration", "FlowSchema")
PF_FLOW_SCHEMA = "X-Kubernetes-PF-FlowSchema-UID"
PF_PRIORITY_LEVEL = "X-Kubernetes-PF-PriorityLevel-UID"
APPLY = "application/apply-patch+yaml"


@dataclass
class Reply:
    """One answered request: status, the APF classification headers, and how long it took."""

    status: int
    flow_schema: str
    priority_level: str
    seconds: float


class Endpoint:
    """Raw HTTPS requests with one bearer token over one kept-alive connection (one per thread)."""

    def __init__(self, server: str, ca_file: str, token: str) -> None:
        import ssl
        from urllib.parse import urlsplit

        url = urlsplit(server)
        self.host, self.port = url.hostname or "127.0.0.1", url.port or 443
        self.context = ssl.create_default_context(cafile=ca_file)
        self.token = token
        self.conn: Any = None

    def request(self, method: str, path: str, body: Any = None, content_type: str = "application/json") -> Reply:
        import http.client

        headers = {"Authorization": f"Bearer {self.token}", "Accept": "application/json"}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = content_type
        for attempt in (0, 1):  # one reconnect: the server may close an idle kept-alive connection
            if self.conn is None:
                self.conn = http.client.HTTPSConnection(self.host, self.port, context=self.context, timeout=60)
            t0 = time.perf_counter()
            try:
                self.conn.request(method, path, body=data, headers=headers)
                resp = self.conn.getresponse()
                resp.read()
            except (http.client.HTTPException, OSError):
                self.close()
                if attempt:
                    raise
                continue
            return Reply(resp.status, resp.getheader(PF_FLOW_SCHEMA, ""), resp.getheader(PF_PRIORITY_LEVEL, ""),
                         time.perf_counter() - t0)
        raise AssertionError("unreachable")

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None


def apf_documents() -> list[dict[str, Any]]:
    """The shipped FlowSchema and PriorityLevelConfiguration, from conf/kubernetes (whatever file holds them)."""
    import yaml

    docs = []
    for path in sorted((REPO / "conf" / "kubernetes").glob("*.yaml")):
        with path.open() as fh:
            docs.extend(d for d in yaml.safe_load_all(fh) if d and d.get("kind") in APF_KINDS)
    return docs


def apply_apf(api: Any) -> dict[str, str]:
    """Server-side apply the shipped APF objects; returns {kind: uid}."""
    from kubernetes import dynamic

    dyn = dynamic.DynamicClient(api)
    uids = {}
    for doc in apf_documents():
        resource = dyn.resources.get(api_version=doc["apiVersion"], kind=doc["kind"])
        obj = resource.server_side_apply(body=doc, name=doc["metadata"]["name"], field_manager="netclaim-bench",
                                         force_conflicts=True)
        uids[doc["kind"]] = obj.metadata.uid
    return uids


def claim_status_apply(ns: str, claim: str, node: str, seq: int) -> tuple[str, dict[str, Any]]:
    """(path, body) of the publisher's server-side apply of one claim's status.devices entry."""
    path = (f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims/{claim}/status"
            f"?fieldManager=netclaim%2F{node}&force=true")
    body = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": claim, "namespace": ns},
            "status": {"devices": [{"driver": DRIVER, "pool": node, "device": "nic0", "data": {"seq": seq}}]}}
    return path, body


def flood(make: Any, requests: list[tuple[str, dict[str, Any]]], threads: int) -> list[Reply]:
    """Send `requests` (server-side applies) from `threads` concurrent connections made by `make()`."""
    from queue import Empty, SimpleQueue

    todo: SimpleQueue = SimpleQueue()
    for item in requests:
        todo.put(item)
    replies: list[Reply] = []

    def worker() -> None:
        ep = make()
        try:
            while True:
                try:
                    path, body = todo.get_nowait()
                except Empty:
                    return
                replies.append(ep.request("PATCH", path, body, APPLY))
        finally:
            ep.close()

    with ThreadPoolExecutor(threads) as pool:
        for f in [pool.submit(worker) for _ in range(threads)]:
            f.result()
    return replies


def kubelet_probe(ep: Endpoint, node: str, ns: str, claim: str, rounds: int, stop: Any = None) -> list[Reply]:
    """What a kubelet does all the time: GET its Node, LIST its pods, GET a claim of one of its pods."""
    out = []
    for _ in range(rounds):
        if stop is not None and stop.is_set():
            break
        out.append(ep.request("GET", f"/api/v1/nodes/{node}"))
        out.append(ep.request("GET", f"/api/v1/pods?fieldSelector=spec.nodeName%3D{node}"))
        out.append(ep.request("GET", f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims/{claim}"))
    return out


# ------------------------------------------------------------------ the --apf phase

APF_APISERVER_ARGS = "--max-requests-inflight=20 --max-mutating-requests-inflight=10"
APF_NODE = "node-a"  # a static node identity of scripts/control-plane.sh


def apf_phase(flood_requests: int = 480, threads: int = 24, rounds: int = 40) -> dict[str, Any]:
    """Latency of kubelet-like requests and of another workload's requests: alone, under a flood
    of publisher writes without the shipped APF objects, and with them.

    Its own control plane (NETCLAIM_CP_DIR + "-apf", concurrency lowered to 30 seats) so the
    flood exceeds the levels' seats on a 2-core machine; stopped at the end."""
    from kubernetes import client
    from runtime import controlplane
    from runtime.identity import apply_shipped_rbac, bound_token, ensure_node, node_token
    from runtime.statedir import DEFAULT_CP_DIR

    saved = dict(os.environ)
    os.environ["NETCLAIM_CP_DIR"] = (os.environ.get("NETCLAIM_CP_DIR") or DEFAULT_CP_DIR) + "-apf"
    os.environ["NETCLAIM_CP_APISERVER_ARGS"] = APF_APISERVER_ARGS
    try:
        subprocess.run([str(REPO / "scripts" / "control-plane.sh"), "down"], check=True, capture_output=True)
        handle = controlplane.up()
    finally:
        os.environ.clear()
        os.environ.update(saved)
    try:
        api = controlplane.api_client(handle.kubeconfig)
        apply_shipped_rbac(api, DRIVER)
        ns = f"apf-{uuid.uuid4().hex[:6]}"
        core = client.CoreV1Api(api)
        core.create_namespace({"metadata": {"name": ns}})
        ensure_device_class(api)
        specs = [PodSpec(APF_NODE, f"p{i}", f"p{i}-net", index=i) for i in range(8)]
        for spec in specs:
            scheduled_pod(api, ns, spec)
        publisher = node_token(api, ensure_node(api, APF_NODE))
        # another workload: a ServiceAccount of its own namespace (an operator, say), allowed to read nodes
        _other_workload(api, ns)
        other = bound_token(api, "Node", ensure_node(api, APF_NODE), namespace=ns, service_account="operator")
        kubelet = next(line.split(",")[0] for line in
                       Path(handle.env["NETCLAIM_CP_DIR"], "tokens.csv").read_text().splitlines()
                       if line.split(",")[1] == f"system:node:{APF_NODE}")
        ep = lambda token: Endpoint(handle.server, handle.ca_file, token)  # noqa: E731
        out: dict[str, Any] = {"apiserver_args": APF_APISERVER_ARGS, "flood_requests": flood_requests,
                               "flood_threads": threads}
        out["alone"] = _probe_latency(ep(kubelet), ep(other), ns, specs[0].claim, rounds)
        seq = iter(range(1, 10 ** 9))
        for label, with_apf in (("flood_without_apf_objects", False), ("flood_with_apf_objects", True)):
            if with_apf:
                apply_apf(api)
                time.sleep(2)  # the API server's APF config controller picks the objects up
            requests = [claim_status_apply(ns, specs[i % len(specs)].claim, APF_NODE, next(seq))
                        for i in range(flood_requests)]
            out[label] = _flood_with_probes(ep, publisher, kubelet, other, ns, specs[0].claim, requests, threads)
        out["nominal_seats"] = _nominal_seats(handle)
        return out
    finally:
        subprocess.run([str(REPO / "scripts" / "control-plane.sh"), "down"], capture_output=True, env=handle.env)


def _nominal_seats(handle: Any) -> dict[str, float]:
    """Seats the API server gives each priority level now (apiserver_flowcontrol_nominal_limit_seats)."""
    import ssl

    from runtime.identity import kubeconfig_token

    ctx = ssl.create_default_context(cafile=handle.ca_file)
    samples = scrape(f"{handle.server}/metrics", ("apiserver_flowcontrol_nominal_limit_seats",),
                     {"Authorization": f"Bearer {kubeconfig_token(handle.kubeconfig)}"}, ctx)
    return {dict(labels).get("priority_level", ""): v for (_, labels), v in samples.items()}


def _other_workload(api: Any, ns: str) -> None:
    from kubernetes import client

    client.CoreV1Api(api).create_namespaced_service_account(ns, {"metadata": {"name": "operator"}})
    rbac = client.RbacAuthorizationV1Api(api)
    name = f"{ns}-operator"
    rbac.create_cluster_role({"metadata": {"name": name},
                              "rules": [{"apiGroups": [""], "resources": ["nodes", "pods"], "verbs": ["get", "list"]},
                                        {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims"],
                                         "verbs": ["get"]}]})
    rbac.create_cluster_role_binding({"metadata": {"name": name},
                                      "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                                                  "name": name},
                                      "subjects": [{"kind": "ServiceAccount", "name": "operator", "namespace": ns}]})


def _latency_summary(replies: list[Reply]) -> dict[str, Any]:
    ms = [r.seconds * 1000 for r in replies]
    return {"requests": len(replies), "p50_ms": round(percentile(ms, .5), 1), "p99_ms": round(percentile(ms, .99), 1),
            "rejected_429": sum(1 for r in replies if r.status == 429),
            "errors": sum(1 for r in replies if r.status not in (200, 429))}


def _probe_latency(kubelet: Endpoint, other: Endpoint, ns: str, claim: str, rounds: int,
                   stop: Any = None) -> dict[str, Any]:
    """Kubelet-like and other-workload probes, interleaved, until `stop` or `rounds`."""
    k, o = [], []
    try:
        for _ in range(rounds):
            if stop is not None and stop.is_set():
                break
            k.extend(kubelet_probe(kubelet, APF_NODE, ns, claim, 1))
            o.extend(kubelet_probe(other, APF_NODE, ns, claim, 1))
    finally:
        kubelet.close()
        other.close()
    return {"kubelet": _latency_summary(k), "other_workload": _latency_summary(o)}


def _flood_with_probes(ep: Any, publisher: str, kubelet: str, other: str, ns: str, claim: str,
                       requests: list[tuple[str, dict[str, Any]]], threads: int) -> dict[str, Any]:
    import threading

    stop = threading.Event()
    result: dict[str, Any] = {}

    def probe() -> None:
        result.update(_probe_latency(ep(kubelet), ep(other), ns, claim, 10 ** 6, stop))

    t = threading.Thread(target=probe)
    t.start()
    t0 = time.time()
    try:
        replies = flood(lambda: ep(publisher), requests, threads)
    finally:
        stop.set()
        t.join(300)
    seconds = time.time() - t0
    result["flood"] = {**_latency_summary(replies), "seconds": round(seconds, 2),
                       "applied_per_s": round(sum(1 for r in replies if r.status == 200) / seconds, 1)}
    return result
