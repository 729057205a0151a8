"""A slice the controller deleted, made again later and then no longer needed, is deleted again, however the
deletion's DELETED event and the delete call's answer interleave (the real API server, the controller in this
process). The interleaving forced here: the watch delivers the DELETED event before the delete call returns,
as a fast API server and a loaded controller do. A deletion remembered after that event would be remembered
forever, and the slice's second deletion skipped: its endpoints would stay on the Service.
"""

from __future__ import annotations

import threading
from typing import Any

from endpoints_kit import annotated_service, endpoint_slices, server_pod
from kubernetes import client
from publisher_testkit import wait_until
from test_endpoints_leader_fence import program

SECOND = "web-netclaim-ipv4-1"


def test_a_slice_deleted_made_again_and_unneeded_again_is_deleted_again(control_plane, cluster) -> None:
    leader = program(control_plane.kubeconfig, cluster.namespace, "a")
    run = threading.Thread(target=leader.run, daemon=True)
    run.start()
    try:
        wait_until("the controller leads", lambda: leader.controller is not None and leader.election.leading.is_set(),
                   timeout=60)
        controller = leader.controller
        assert controller is not None
        real_delete = controller.kube.delete_slice

        def delete_then_see_it_gone(namespace: str, name: str) -> Any:
            """The real delete, returning only once the controller's slice watch has handled the DELETED."""
            answer = real_delete(namespace, name)
            wait_until(f"the DELETED event of {name} handled", lambda: name not in {
                (s.get("metadata") or {}).get("name") for s in controller.slices.in_namespace(namespace)},
                timeout=60)
            return answer

        controller.kube.delete_slice = delete_then_see_it_gone  # type: ignore[method-assign]
        for i in range(101):
            server_pod(cluster, f"p{i:03d}", [f"192.168.{50 + i // 200}.{i % 200 + 1}/16"])
        annotated_service(cluster, family="IPv4")

        def counts() -> dict[str, int]:
            return {n: len(s.get("endpoints") or []) for n, s in endpoint_slices(cluster).items()}

        wait_until("101 endpoints in two slices", lambda: counts() == {"web-netclaim-ipv4-0": 100, SECOND: 1},
                   timeout=120)
        core = client.CoreV1Api(cluster.api)
        core.delete_namespaced_pod("p000", cluster.namespace, grace_period_seconds=0)
        wait_until("the second slice deleted", lambda: counts() == {"web-netclaim-ipv4-0": 100}, timeout=60)
        server_pod(cluster, "q000", ["192.168.51.1/16"])
        wait_until("the second slice made again", lambda: counts() == {"web-netclaim-ipv4-0": 100, SECOND: 1},
                   timeout=60)
        core.delete_namespaced_pod("p001", cluster.namespace, grace_period_seconds=0)
        wait_until("the second slice deleted again", lambda: counts() == {"web-netclaim-ipv4-0": 100}, timeout=60)
    finally:
        leader.stopping.set()
        run.join(40)
