"""Which pods a claim's reservedFor admits: by UID, or by the PodGroup they name (KEP-5729).

The rule every part of the publisher asks (publisher/reconcile/reservation.py), on claims of the
shape the API server stores; the same rule as the kubelet's before it starts a pod
(k8s.io/dynamic-resource-allocation resourceclaim.IsReservedForPod): a PodGroup entry is matched
by API group, resource and name, in the claim's namespace.
"""

from __future__ import annotations

from publisher.reconcile.reservation import admits, pod_group_name, reservations


def claim(*reserved: dict, namespace: str = "team") -> dict:
    return {"metadata": {"namespace": namespace, "name": "shared"}, "status": {"reservedFor": list(reserved)}}


POD = {"resource": "pods", "name": "solo", "uid": "u-solo"}
GROUP = {"apiGroup": "scheduling.k8s.io", "resource": "podgroups", "name": "train", "uid": "u-group"}


def test_a_pod_is_admitted_by_its_uid_and_a_group_member_by_its_groups_name():
    assert admits(claim(POD), "team", "u-solo", "")
    assert not admits(claim(POD), "team", "u-other", "")
    assert admits(claim(GROUP), "team", "u-member", "train")
    assert admits(claim(POD, GROUP), "team", "u-member", "train") and admits(claim(POD, GROUP), "team", "u-solo", "")


def test_a_podgroup_entry_admits_no_pod_of_another_group_namespace_or_none():
    assert not admits(claim(GROUP), "team", "u-member", "")  # in no group
    assert not admits(claim(GROUP), "team", "u-member", "eval")  # another group
    assert not admits(claim(GROUP), "other-team", "u-member", "train")  # a group of that name elsewhere
    # the group's UID is not a pod's: a pod whose UID happened to equal it is not admitted by it
    assert not admits(claim(GROUP), "team", "u-group", "")


def test_only_the_two_known_shapes_admit():
    elsewhere = {**GROUP, "apiGroup": "example.com"}  # a podgroups resource of another API group
    workload = {**GROUP, "resource": "workloads"}
    not_core = {**POD, "apiGroup": "example.com"}
    for ref in (elsewhere, workload):
        assert not admits(claim(ref), "team", "u-member", "train"), ref
    assert not admits(claim(not_core), "team", "u-solo", "")


def test_the_group_is_asked_only_when_a_group_could_admit_the_pod():
    asked: list[str] = []

    def group() -> str:
        asked.append("asked")
        return "train"

    assert reservations(claim(POD)).admits("team", "u-solo", group) and not asked
    assert not reservations(claim(POD)).admits("team", "u-other", group) and not asked
    assert reservations(claim(POD, GROUP)).admits("team", "u-member", group) and asked == ["asked"]


def test_a_claim_reserved_for_a_group_is_nobodys_alone():
    assert reservations(claim(POD)).sole_pod == "u-solo"
    assert reservations(claim(POD, GROUP)).sole_pod == ""
    assert reservations(claim(GROUP)).sole_pod == ""


def test_the_pods_group_is_its_scheduling_groups_podgroup_name():
    assert pod_group_name({"spec": {"schedulingGroup": {"podGroupName": "train"}}}) == "train"
    assert pod_group_name({"spec": {}}) == "" and pod_group_name({}) == ""
