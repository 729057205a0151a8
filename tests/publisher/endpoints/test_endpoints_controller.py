"""`netclaim-publisher endpoints` on the real API server: an annotated Service without a selector gets
EndpointSlices of its pods' addresses on the secondary network, as the claims' status entries say,
and follows every change of them.

The entries are written by the test as netclaim's publisher would (its field manager); the pods are
bound to a Node no kubelet runs, so a deletion with a grace period leaves them terminating until
the test deletes them for good.
"""

from __future__ import annotations

import json

from endpoints_kit import (
    annotated_service,
    endpoint_slices,
    endpoints_by_pod,
    entry,
    server_pod,
    write_entries,
)
from kubernetes import client
from publisher_testkit import wait_until


def conditions(eps: dict, pod: str) -> dict:
    return (eps.get(pod) or {}).get("conditions") or {}


def test_a_services_slices_carry_the_pods_secondary_addresses(cluster, endpoints_controller):
    uid_a = server_pod(cluster, "a", ["192.168.50.10/24", "fd50::a/64"])
    server_pod(cluster, "b", ["192.168.50.11/24"], ready=False)
    server_pod(cluster, "c", ["192.168.50.12/24"], labels={"app": "db"})
    svc = annotated_service(cluster, family="IPv4,IPv6")
    endpoints_controller()

    def both() -> dict | None:
        found = endpoint_slices(cluster)
        return found if set(found) == {"web-netclaim-ipv4-0", "web-netclaim-ipv6-0"} and \
            len(found["web-netclaim-ipv4-0"].get("endpoints") or []) == 2 else None

    found = wait_until("an IPv4 and an IPv6 slice of the Service", both, timeout=60)
    v4, v6 = found["web-netclaim-ipv4-0"], found["web-netclaim-ipv6-0"]
    assert v4["addressType"] == "IPv4" and v6["addressType"] == "IPv6"
    by_pod = {ep["targetRef"]["name"]: ep for ep in v4["endpoints"]}
    assert sorted(by_pod) == ["a", "b"], "pod c has another label; eth0's address is on no slice"
    assert by_pod["a"]["addresses"] == ["192.168.50.10"]
    assert by_pod["a"]["conditions"] == {"ready": True, "serving": True, "terminating": False}
    assert by_pod["a"]["nodeName"] == "node-a"
    assert by_pod["a"]["targetRef"] == {"kind": "Pod", "namespace": cluster.namespace, "name": "a", "uid": uid_a}
    assert by_pod["b"]["addresses"] == ["192.168.50.11"]
    assert by_pod["b"]["conditions"]["ready"] is False, "b's entry says Ready=False"
    assert [ep["addresses"] for ep in v6["endpoints"]] == [["fd50::a"]]
    assert v4["ports"] == [{"name": "http", "port": 8080, "protocol": "TCP"}]
    assert v4["metadata"]["labels"] == {"kubernetes.io/service-name": "web",
                                        "endpointslice.kubernetes.io/managed-by": "netclaim"}
    (owner,) = v4["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["uid"]) == ("Service", "web", svc["metadata"]["uid"])
    assert {m["manager"] for m in v4["metadata"]["managedFields"]} == {"netclaim-endpoints"}


def test_a_ready_flip_an_address_change_and_a_pod_deletion_are_followed(cluster, endpoints_controller):
    server_pod(cluster, "a", ["192.168.50.10/24"])
    server_pod(cluster, "b", ["192.168.50.11/24"])
    annotated_service(cluster)
    endpoints_controller()
    wait_until("both pods ready on the slice",
               lambda: all(conditions(endpoints_by_pod(cluster), p).get("ready") for p in "ab"), timeout=60)

    write_entries(cluster, "a-net", [entry("eth-a", ["10.244.0.9/24"]),
                                     entry("mv-a", ["192.168.50.10/24"], ready=False)])
    wait_until("a's endpoint not ready after its entry's Ready=False",
               lambda: conditions(endpoints_by_pod(cluster), "a").get("ready") is False, timeout=30)
    assert conditions(endpoints_by_pod(cluster), "b")["ready"] is True

    write_entries(cluster, "a-net", [entry("eth-a", ["10.244.0.9/24"]), entry("mv-a", ["192.168.50.20/24"])])
    wait_until("a's endpoint ready at its new address",
               lambda: (endpoints_by_pod(cluster).get("a") or {}).get("addresses") == ["192.168.50.20"]
               and conditions(endpoints_by_pod(cluster), "a").get("ready") is True, timeout=30)

    core = client.CoreV1Api(cluster.api)
    core.delete_namespaced_pod("b", cluster.namespace)  # graceful: terminating until the kubelet would end it
    wait_until("b's endpoint terminating", lambda: conditions(endpoints_by_pod(cluster), "b") ==
               {"ready": False, "serving": True, "terminating": True}, timeout=30)
    core.delete_namespaced_pod("b", cluster.namespace, grace_period_seconds=0)
    wait_until("b's endpoint gone", lambda: sorted(endpoints_by_pod(cluster)) == ["a"], timeout=30)


def test_more_than_a_hundred_pods_are_cut_into_slices_and_a_slice_no_longer_needed_is_deleted(
        cluster, endpoints_controller):
    for i in range(101):
        server_pod(cluster, f"p{i:03d}", [f"192.168.{50 + i // 200}.{i % 200 + 1}/16"])
    annotated_service(cluster)
    endpoints_controller()

    def counts() -> dict[str, int]:
        return {n: len(s.get("endpoints") or []) for n, s in endpoint_slices(cluster).items()}

    # A headless Service without a selector is dual-stack by default: its IPv6 slice stays empty.
    wait_until("101 endpoints in two slices",
               lambda: counts() == {"web-netclaim-ipv4-0": 100, "web-netclaim-ipv4-1": 1, "web-netclaim-ipv6-0": 0},
               timeout=90)
    core = client.CoreV1Api(cluster.api)
    for name in ("p000", "p050"):
        core.delete_namespaced_pod(name, cluster.namespace, grace_period_seconds=0)
    wait_until("99 endpoints in one slice, the second slice deleted",
               lambda: counts() == {"web-netclaim-ipv4-0": 99, "web-netclaim-ipv6-0": 0}, timeout=60)


def lease(cluster) -> dict:
    resp = client.CoordinationV1Api(cluster.api).read_namespaced_lease("netclaim-endpoints", cluster.namespace,
                                                                        _preload_content=False)
    return json.loads(resp.data)["spec"]


def test_only_the_leader_writes_and_a_standby_takes_over_when_it_stops(cluster, endpoints_controller):
    fast = ["--lease-duration", "3", "--lease-renew-deadline", "2", "--lease-retry", "0.5", "--log-level", "debug"]
    server_pod(cluster, "a", ["192.168.50.10/24"])
    annotated_service(cluster)
    first = endpoints_controller("first", fast)
    wait_until("the first controller's slice", lambda: "a" in endpoints_by_pod(cluster), timeout=60)
    second = endpoints_controller("second", fast)
    wait_until("the second controller to find the Lease held, twice",
               lambda: second.messages().count("lease held by another candidate") >= 2, timeout=30)
    assert lease(cluster)["holderIdentity"] == "first"
    assert "became the leader" not in second.messages() and "caches synced" not in second.messages()

    first.kill()  # no release: the standby waits for the lease to expire
    write_entries(cluster, "a-net", [entry("eth-a", ["10.244.0.9/24"]),
                                     entry("mv-a", ["192.168.50.10/24"], ready=False)])
    wait_until("the standby, now leading, to follow the Ready flip",
               lambda: conditions(endpoints_by_pod(cluster), "a").get("ready") is False, timeout=60)
    assert "became the leader" in second.messages()
    spec = lease(cluster)
    assert spec["holderIdentity"] == "second" and spec["leaseTransitions"] >= 1

    second.signal(15)  # SIGTERM: the leader gives the Lease up for the next one
    assert second.proc is not None and second.proc.returncode == 0
    assert "released the lease" in second.messages()
    assert not lease(cluster).get("holderIdentity")
