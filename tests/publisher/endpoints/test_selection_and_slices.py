"""Which addresses an annotated Service serves, and how they are cut into EndpointSlices (pure functions).

The objects are shaped as the API server returns them; the controller's tests
(test_endpoints_controller.py) show the same rules through the real API server.
"""

from __future__ import annotations

import pytest

from publisher.endpoints import select, slices

DRIVER = "net.example.com"


def service(annotations: dict[str, str] | None = None, **spec: object) -> dict:
    ann = {select.SELECTOR: "app=web", select.DRIVER: DRIVER, select.REQUEST: "macvlan"}
    ann.update(annotations or {})
    return {"metadata": {"name": "web", "namespace": "ns", "uid": "svc-uid", "annotations": ann},
            "spec": {"ipFamilies": ["IPv4"], "ports": [{"name": "http", "port": 80, "targetPort": 8080,
                                                        "protocol": "TCP"}], **spec}}


def pod(name: str, claim: str, labels: dict[str, str] | None = None, uid: str = "", **meta: object) -> dict:
    return {"metadata": {"name": name, "namespace": "ns", "uid": uid or f"uid-{name}",
                         "labels": {"app": "web"} if labels is None else labels, **meta},
            "spec": {"nodeName": "node-a", "resourceClaims": [{"name": "net", "resourceClaimName": claim}]}}


def claim(name: str, pod_uid: str, results: list[tuple[str, str]], entries: list[dict]) -> dict:
    return {"metadata": {"name": name, "namespace": "ns"},
            "status": {"allocation": {"devices": {"results": [
                {"request": r, "driver": DRIVER, "pool": "node-a", "device": d} for r, d in results]}},
                "reservedFor": [{"resource": "pods", "name": "x", "uid": pod_uid}], "devices": entries}}


def entry(device: str, ips: list[str], ready: str = "True", driver: str = DRIVER) -> dict:
    return {"driver": driver, "pool": "node-a", "device": device,
            "networkData": {"interfaceName": "net1", "ips": ips},
            "conditions": [{"type": "Ready", "status": ready, "reason": "Configured",
                            "lastTransitionTime": "2026-12-06T07:00:00Z", "message": ""}]}


def test_only_the_entry_of_the_named_driver_and_request_gives_addresses():
    c = claim("c", "uid-p", [("nic", "eth"), ("macvlan", "mv")],
              [entry("eth", ["10.0.0.5/24"]), entry("mv", ["192.168.50.7/24", "fd50::7/64"]),
               entry("mv", ["172.16.0.1/16"], driver="other.example.com")])
    sel = select.selection_of(service())
    got = select.addresses(pod("p", "c"), {"c": c}, sel)
    assert got == [select.Address("192.168.50.7", "IPv4", True), select.Address("fd50::7", "IPv6", True)]


def test_a_claim_reserved_for_another_pod_lends_no_address():
    c = claim("c", "uid-of-a-deleted-pod", [("macvlan", "mv")], [entry("mv", ["192.168.50.7/24"])])
    assert select.addresses(pod("p", "c"), {"c": c}, select.selection_of(service())) == []
    # the control: reserved for this pod, the same claim gives its address
    c["status"]["reservedFor"][0]["uid"] = "uid-p"
    assert [a.ip for a in select.addresses(pod("p", "c"), {"c": c}, select.selection_of(service()))] == ["192.168.50.7"]


def test_a_claim_reserved_for_the_pods_podgroup_gives_its_address():
    c = claim("c", "", [("macvlan", "mv")], [entry("mv", ["192.168.50.7/24"])])
    c["status"]["reservedFor"] = [{"apiGroup": "scheduling.k8s.io", "resource": "podgroups", "name": "g",
                                   "uid": "group-uid"}]
    member, other = pod("p", "c"), pod("q", "c")
    member["spec"]["schedulingGroup"] = {"podGroupName": "g"}
    other["spec"]["schedulingGroup"] = {"podGroupName": "h"}
    sel = select.selection_of(service())
    assert [a.ip for a in select.addresses(member, {"c": c}, sel)] == ["192.168.50.7"]
    assert select.addresses(other, {"c": c}, sel) == [], "another group's pod is not admitted"
    assert select.shared_claims([member, other], {"c": c}) == set(), "only one of them may use it"


def test_a_subrequest_matches_its_request():
    c = claim("c", "uid-p", [("macvlan/fast", "mv")], [entry("mv", ["192.168.50.7/24"], ready="False")])
    assert select.addresses(pod("p", "c"), {"c": c}, select.selection_of(service())) == [
        select.Address("192.168.50.7", "IPv4", False)]


def test_template_claims_are_found_through_the_pod_status():
    p = pod("p", "")
    p["spec"]["resourceClaims"] = [{"name": "net", "resourceClaimTemplateName": "t"}]
    p["status"] = {"resourceClaimStatuses": [{"name": "net", "resourceClaimName": "p-net-x1"}]}
    c = claim("p-net-x1", "uid-p", [("macvlan", "mv")], [entry("mv", ["192.168.50.9/24"])])
    assert [a.ip for a in select.addresses(p, {"p-net-x1": c}, select.selection_of(service()))] == ["192.168.50.9"]


@pytest.mark.parametrize("annotations,spec,words", [
    ({select.SELECTOR: ""}, {}, "missing annotation netclaim.dev/endpoints-selector"),
    ({select.SELECTOR: "app!=web"}, {}, "only key=value"),
    ({select.FAMILY: "IPv5"}, {}, "IPv4, IPv6 or IPv4,IPv6"),
    ({}, {"selector": {"app": "web"}}, "spec.selector"),
])
def test_unusable_annotations_are_refused_with_the_reason(annotations, spec, words):
    with pytest.raises(select.NotSelectable, match=words.replace(".", r"\.")):
        select.selection_of(service(annotations, **spec))


def test_the_selector_and_the_family_annotation():
    sel = select.selection_of(service({select.SELECTOR: "app=web, tier", select.FAMILY: "IPv6,IPv4"}))
    assert sel.families == ("IPv4", "IPv6")
    assert sel.selects(pod("a", "c", {"app": "web", "tier": "x"}))
    assert not sel.selects(pod("b", "c", {"app": "web"}))
    assert not sel.selects(pod("c", "c", {"app": "db", "tier": "x"}))
    # without the annotation, the Service's own families
    assert select.selection_of(service(ipFamilies=["IPv6"])).families == ("IPv6",)


def members(n: int, ready: bool = True) -> list[slices.PodAddresses]:
    return [slices.PodAddresses(pod(f"p{i:03d}", "c"),
                                (select.Address(f"192.168.{i // 250}.{i % 250 + 1}", "IPv4", ready),
                                 select.Address(f"fd50::{i + 1:x}", "IPv6", ready)))
            for i in range(n)]


def test_one_slice_per_family_with_the_endpoint_of_each_pod():
    bodies = slices.desired(service(), ("IPv4", "IPv6"), members(2))
    assert [b["metadata"]["name"] for b in bodies] == ["web-netclaim-ipv4-0", "web-netclaim-ipv6-0"]
    v4 = bodies[0]
    assert v4["addressType"] == "IPv4"
    assert v4["metadata"]["labels"] == {"kubernetes.io/service-name": "web",
                                        "endpointslice.kubernetes.io/managed-by": "netclaim"}
    assert v4["metadata"]["ownerReferences"] == [{"apiVersion": "v1", "kind": "Service", "name": "web",
                                                  "uid": "svc-uid", "controller": True}]
    assert v4["ports"] == [{"port": 8080, "protocol": "TCP", "name": "http"}]
    assert v4["endpoints"][0] == {
        "addresses": ["192.168.0.1"], "nodeName": "node-a",
        "conditions": {"ready": True, "serving": True, "terminating": False},
        "targetRef": {"kind": "Pod", "namespace": "ns", "name": "p000", "uid": "uid-p000"}}
    assert bodies[1]["endpoints"][1]["addresses"] == ["fd50::2"]


def test_more_than_a_hundred_endpoints_are_cut_into_slices_of_a_hundred():
    bodies = slices.desired(service(), ("IPv4",), members(205))
    assert [(b["metadata"]["name"], len(b["endpoints"])) for b in bodies] == [
        ("web-netclaim-ipv4-0", 100), ("web-netclaim-ipv4-1", 100), ("web-netclaim-ipv4-2", 5)]
    # the same input gives the same slices, whatever order the pods came in
    again = slices.desired(service(), ("IPv4",), list(reversed(members(205))))
    assert [slices.fingerprint(b) for b in again] == [slices.fingerprint(b) for b in bodies]


def test_a_terminating_or_unready_pod_is_not_ready():
    unready = slices.desired(service(), ("IPv4",), members(1, ready=False))[0]["endpoints"][0]
    assert unready["conditions"] == {"ready": False, "serving": False, "terminating": False}
    going = members(1)
    going[0].pod["metadata"]["deletionTimestamp"] = "2026-12-06T07:00:00Z"
    ep = slices.desired(service(), ("IPv4",), going)[0]["endpoints"][0]
    assert ep["conditions"] == {"ready": False, "serving": True, "terminating": True}


def test_a_service_without_pods_keeps_one_empty_slice_per_family():
    assert [(b["metadata"]["name"], b["endpoints"]) for b in slices.desired(service(), ("IPv4",), [])] == [
        ("web-netclaim-ipv4-0", [])]
