"""One pod's odd entry never costs the other pods of its Service their endpoints (the real API server).

An EndpointSlice is written whole: an address the API server refuses in it (a link-local, loopback or
unspecified address) would refuse the slice, and with it the
endpoints of every pod that shares it, for as long as that entry stays.
"""

from __future__ import annotations

from endpoints_kit import annotated_service, endpoints_by_pod, server_pod
from publisher_testkit import wait_until


def test_addresses_the_api_refuses_in_a_slice_are_left_out_and_the_other_pods_stay_served(
        cluster, endpoints_controller):
    server_pod(cluster, "a", ["fd50::a/64", "fe80::a/64"])  # its usable address, and a link-local one
    server_pod(cluster, "b", ["::1/128", "fd50::b/64"])  # loopback first
    server_pod(cluster, "c", ["fd50::c/64"])
    annotated_service(cluster, family="IPv6")
    endpoints_controller()
    wait_until("every pod on the IPv6 slice at its usable address",
               lambda: {p: ep["addresses"] for p, ep in endpoints_by_pod(cluster).items()} ==
               {"a": ["fd50::a"], "b": ["fd50::b"], "c": ["fd50::c"]}, timeout=60)
