"""endpoints: the EndpointSlice controller (`netclaim-publisher endpoints`) with 1,000 pods behind one Service.

Against the real local API server (scripts/control-plane.sh up, NETCLAIM_CP_DIR). The
bench writes --pods pods, each with a claim allocated and reserved for it and a status entry
of its secondary network (as netclaim's publisher writes it), and one annotated Service; then
runs the real controller (publisher/endpoints/controller.py, in this process, its requests
counted by the client's own record hook) and measures:

1. start: seconds from the controller's start to every pod on the slices, and the requests
   it took (lists, watches, applies: a handful, not one per pod);
2. Ready flip: --flips times, one pod's entry turns Ready=False (or back); the time from the
   status write's answer to the pod's slice showing it (a GET of that one slice every
   --poll s), and the controller's requests per flip (target: 1, the apply of that slice);
3. pod deletion: --deletions pods deleted one at a time, the time to leave the slice;
4. the reference, side by side: the same run's bare server-side apply of one 100-endpoint
   slice by a plain client (what a flip must cost at least: one such write). Figures are
   quoted as ratios to its median.
"""

from __future__ import annotations

import argparse
import json
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from .stats import percentile

DRIVER = "net.example.com"
NODE = "node-a"
APPLY = "application/apply-patch+yaml"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--pods", type=int, default=1000, help="pods behind the Service")
    parser.add_argument("--flips", type=int, default=40, help="Ready flips, one at a time")
    parser.add_argument("--deletions", type=int, default=10, help="pods deleted, one at a time")
    parser.add_argument("--poll", type=float, default=0.02, help="seconds between reads of the slice")


def _entry(i: int, ready: bool) -> dict[str, Any]:
    return {"driver": DRIVER, "pool": NODE, "device": f"mv-{i}",
            "networkData": {"interfaceName": "net1", "ips": [f"10.{50 + i // 60000}.{i // 250 % 240}.{i % 250 + 1}/8"]},
            "conditions": [{"type": "Ready", "status": "True" if ready else "False",
                            "reason": "Configured" if ready else "LinkDown", "message": "",
                            "lastTransitionTime": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}]}


class World:
    """The bench's namespace: pods with claims and entries, and the annotated Service."""

    def __init__(self, api: Any, pods: int) -> None:
        from kubernetes import client

        self.core, self.res = client.CoreV1Api(api), client.ResourceV1Api(api)
        self.disc = client.DiscoveryV1Api(api)
        self.ns = f"bench-ep-{uuid.uuid4().hex[:6]}"
        self.pods = pods
        self.uids: dict[int, str] = {}

    def name(self, i: int) -> str:
        return f"p{i:05d}"

    def setup(self) -> None:
        from kubernetes.client.exceptions import ApiException

        self.core.create_namespace({"metadata": {"name": self.ns}})
        try:
            self.core.create_node({"metadata": {"name": NODE}})
        except ApiException as exc:
            if exc.status != 409:
                raise
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(self._pod, range(self.pods)))
        self.core.create_namespaced_service(self.ns, {"metadata": {"name": "web", "annotations": {
            "netclaim.dev/endpoints-selector": "app=web", "netclaim.dev/endpoints-driver": DRIVER,
            "netclaim.dev/endpoints-request": "macvlan"}},
            "spec": {"clusterIP": "None", "ports": [{"name": "x", "port": 80, "protocol": "TCP"}]}})

    def _pod(self, i: int) -> None:
        name = self.name(i)
        self.res.create_namespaced_resource_claim(self.ns, {"metadata": {"name": name}, "spec": {"devices": {
            "requests": [{"name": "macvlan", "exactly": {"deviceClassName": "bench"}}]}}})
        uid = self.core.create_namespaced_pod(self.ns, {"metadata": {"name": name, "labels": {"app": "web"}}, "spec": {
            "nodeName": NODE, "containers": [{"name": "c", "image": "pause", "resources": {"claims": [{"name": "n"}]}}],
            "resourceClaims": [{"name": "n", "resourceClaimName": name}]}}).metadata.uid
        self.uids[i] = uid
        self.res.patch_namespaced_resource_claim_status(name, self.ns, {"status": {
            "allocation": {"devices": {"results": [{"request": "macvlan", "driver": DRIVER, "pool": NODE,
                                                    "device": f"mv-{i}"}]},
                           "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                               {"key": "metadata.name", "operator": "In", "values": [NODE]}]}]}},
            "reservedFor": [{"resource": "pods", "name": name, "uid": uid}]}},
            _content_type="application/merge-patch+json")
        self.write(i, True)

    def write(self, i: int, ready: bool) -> None:
        name = self.name(i)
        self.res.patch_namespaced_resource_claim_status(name, self.ns, {
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": self.ns}, "status": {"devices": [_entry(i, ready)]}},
            field_manager="netclaim/node-a", _content_type=APPLY)

    def slice_of(self, i: int) -> dict[str, Any]:
        resp = self.disc.read_namespaced_endpoint_slice(f"web-netclaim-ipv4-{i // 100}", self.ns,
                                                        _preload_content=False)
        return json.loads(resp.data)

    def all_endpoints(self) -> dict[str, dict[str, Any]]:
        resp = self.disc.list_namespaced_endpoint_slice(
            self.ns, label_selector="endpointslice.kubernetes.io/managed-by=netclaim", _preload_content=False)
        return {ep["targetRef"]["name"]: ep for s in json.loads(resp.data)["items"] for ep in s.get("endpoints") or []}

    def teardown(self) -> None:
        for fn in (self.core.delete_collection_namespaced_pod, self.res.delete_collection_namespaced_resource_claim):
            try:
                fn(self.ns, grace_period_seconds=0)
            except Exception:  # noqa: BLE001 - best effort at the end of a bench
                pass


def _wait(probe: Any, poll: float, timeout: float, what: str) -> float:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if probe():
            return time.monotonic()
        time.sleep(poll)
    raise RuntimeError(f"{what}: not within {timeout}s")


def _summary(values: list[float]) -> dict[str, float]:
    return {"p50": round(percentile(values, .5), 1), "p99": round(percentile(values, .99), 1),
            "max": round(max(values), 1)}


def bare_apply_ms(world: World, body: dict[str, Any], times: int = 20) -> list[float]:
    """A plain client's server-side apply of one 100-endpoint slice under another name: the reference."""
    body = json.loads(json.dumps(body))
    body["metadata"] = {"name": "bare-reference", "namespace": world.ns, "labels": {"bench": "reference"}}
    out = []
    for n in range(times):
        body["endpoints"][0]["conditions"]["ready"] = bool(n % 2)
        t0 = time.monotonic()
        world.disc.patch_namespaced_endpoint_slice("bare-reference", world.ns, body, field_manager="bench",
                                                   _content_type=APPLY)
        out.append((time.monotonic() - t0) * 1000)
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    from runtime import controlplane

    from publisher.endpoints.api import EndpointsKube
    from publisher.endpoints.controller import Controller
    from publisher.kube.calls import load_client

    handle = controlplane.up()
    api = controlplane.api_client(handle.kubeconfig)
    world = World(api, args.pods)
    stopping = threading.Event()
    counts: dict[str, int] = {}
    lock = threading.Lock()

    def record(verb: str, code: str) -> None:
        with lock:
            counts[verb] = counts.get(verb, 0) + 1

    def total() -> int:
        with lock:
            return sum(counts.values())

    try:
        t_setup = time.monotonic()
        world.setup()
        setup_s = time.monotonic() - t_setup
        kube = EndpointsKube(load_client(handle.kubeconfig), record=record)
        controller = Controller(kube, world.ns)
        t0 = time.monotonic()
        controller.start(stopping)
        _wait(lambda: len(world.all_endpoints()) == args.pods, 0.2, 300, "every pod on the slices")
        start_s = time.monotonic() - t0
        start_requests = dict(counts)

        flips, flip_requests = [], []
        for k in range(args.flips):
            i = (k * 37) % args.pods
            ready = bool(k // args.pods % 2)  # every pod flipped once goes unready; a second round back
            before = total()
            world.write(i, ready)
            t = time.monotonic()
            name = world.name(i)
            done = _wait(lambda: any(ep["targetRef"]["name"] == name and ep["conditions"]["ready"] is ready
                                     for ep in world.slice_of(i)["endpoints"]), args.poll, 60, f"flip of {name}")
            flips.append((done - t) * 1000)
            time.sleep(0.2)  # let the controller finish (a second write would show as two requests)
            flip_requests.append(total() - before)

        deletions = []
        for k in range(args.deletions):
            i = args.pods - 1 - k * 3
            name = world.name(i)
            world.core.delete_namespaced_pod(name, world.ns, grace_period_seconds=0)
            t = time.monotonic()
            done = _wait(lambda: all(ep["targetRef"]["name"] != name for ep in world.slice_of(i)["endpoints"]),
                         args.poll, 60, f"deletion of {name}")
            deletions.append((done - t) * 1000)

        bare = bare_apply_ms(world, world.slice_of(0))
        bare_p50 = percentile(bare, .5)
        flip_s, del_s = _summary(flips), _summary(deletions)
        return {
            "pods": args.pods, "slices": -(-args.pods // 100), "setup_s": round(setup_s, 1),
            "start": {"seconds": round(start_s, 2), "requests": start_requests},
            "ready_flip_to_slice_ms": flip_s, "requests_per_flip": _summary([float(r) for r in flip_requests]),
            "pod_deletion_to_slice_ms": del_s, "bare_slice_apply_ms": _summary(bare),
            "flip_p50_ratio_vs_bare_apply": round(flip_s["p50"] / max(0.1, bare_p50), 2),
            "deletion_p50_ratio_vs_bare_apply": round(del_s["p50"] / max(0.1, bare_p50), 2),
            "controller_stats": vars(controller.stats),
        }
    finally:
        stopping.set()
        world.teardown()
        handle.down()
