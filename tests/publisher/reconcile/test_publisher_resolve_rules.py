"""Choosing the device of an attachment among a claim's allocation results (no guessing)."""

from __future__ import annotations

import pytest

from cni_plugin.wire.event import Event, PodRef
from publisher.reconcile.resolver import Unresolvable, allocated_node, choose_device
from publisher.reconcile.slices import (
    DEFAULT_DEVICE_ID_ATTRIBUTES,
    DeviceFacts,
    SliceFacts,
    SlicesUnsettled,
    device_facts,
)

DRIVER = "net.example.com"


def claim(results, config=None, node="node-a"):
    alloc = {"devices": {"results": results, "config": config or []},
             "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                 {"key": "metadata.name", "operator": "In", "values": [node]}]}]}}
    return {"status": {"allocation": alloc}}


R = [{"request": "a", "driver": DRIVER, "pool": "p", "device": "nic0"},
     {"request": "b", "driver": DRIVER, "pool": "p", "device": "nic1"},
     {"request": "a", "driver": "other.example.com", "pool": "p", "device": "gpu0"}]


def ev(ifname="eth0", request=""):
    return Event(op="ADD", container_id="c", ifname=ifname, driver=DRIVER, request=request,
                 pod=PodRef("ns", "p", "u"))


def test_by_request_name():
    assert choose_device(claim(R), ev(request="b"), [])["device"] == "nic1"


def test_by_opaque_config_naming_the_interface():
    cfg = [{"source": "FromClaim", "requests": ["b"],
            "opaque": {"driver": DRIVER, "parameters": {"interfaceName": "net1"}}}]
    assert choose_device(claim(R, cfg), ev("net1"), [])["device"] == "nic1"


def test_only_unbound_device():
    assert choose_device(claim(R), ev(), [(DRIVER, "p", "nic0", "")])["device"] == "nic1"


def test_ambiguous_is_an_error_not_a_guess():
    with pytest.raises(Unresolvable, match="ambiguous"):
        choose_device(claim(R), ev(), [])


def test_allocated_node_needs_exactly_one_matchfields_term():
    assert allocated_node(claim(R)) == "node-a"
    c = claim(R)
    c["status"]["allocation"]["nodeSelector"]["nodeSelectorTerms"].append({"matchFields": []})
    assert allocated_node(c) is None


def test_subrequest_result_matches_its_request():
    results = [{"request": "nic/fast", "driver": DRIVER, "pool": "p", "device": "nic7"}]
    assert choose_device(claim(results), ev(request="nic"), [])["device"] == "nic7"


def test_one_candidate_held_by_another_pod_is_a_shared_device():
    assert choose_device(claim(R[:1]), ev(request="a"), [(DRIVER, "p", "nic0", "")])["device"] == "nic0"


TWO = [{"request": "a", "driver": DRIVER, "pool": "p", "device": "nic0"},
       {"request": "a", "driver": DRIVER, "pool": "p", "device": "nic1"}]


def slices(facts):
    """What SliceFacts.facts answers, whatever devices are asked for."""
    return lambda keys: facts


def test_several_devices_for_one_request_by_slice_attribute_then_by_the_free_one():
    names = slices({("p", "nic0"): DeviceFacts(interface="net1"), ("p", "nic1"): DeviceFacts(interface="eth0")})
    assert choose_device(claim(TWO), ev("eth0", "a"), [], names)["device"] == "nic1"
    assert choose_device(claim(TWO), ev("eth9", "a"), [(DRIVER, "p", "nic1", "")], slices({}))["device"] == "nic0"
    with pytest.raises(Unresolvable, match="ambiguous"):
        choose_device(claim(TWO), ev("eth9", "a"), [], names)


def with_id(ifname, device_id):
    event = ev(ifname, "a")
    event.device_id = device_id
    return event


def test_the_device_carrying_the_interfaces_id_is_chosen_whatever_the_other_rules_say():
    ids = slices({("p", "nic0"): DeviceFacts(interface="net2", device_id="0000:00:05.3"),
                  ("p", "nic1"): DeviceFacts(device_id="0000:00:05.0")})
    assert choose_device(claim(TWO), with_id("net2", "0000:00:05.0"), [], ids)["device"] == "nic1"
    # bound or not: the ID decides, not the free one
    assert choose_device(claim(TWO), with_id("net1", "0000:00:05.3"), [(DRIVER, "p", "nic1", "")], ids)["device"] \
        == "nic0"


def test_a_device_with_another_id_is_never_chosen_and_one_without_an_id_is_left_to_the_other_rules():
    half = slices({("p", "nic0"): DeviceFacts(device_id="0000:00:05.3")})
    assert choose_device(claim(TWO), with_id("net1", "0000:00:05.0"), [], half)["device"] == "nic1"
    # No slice knows an ID: the older rules decide (here: two free devices, ambiguous).
    with pytest.raises(Unresolvable, match="ambiguous"):
        choose_device(claim(TWO), with_id("net1", "0000:00:05.0"), [], slices({}))


def test_an_id_no_candidate_carries_is_refused_naming_each_candidates_id():
    ids = slices({("p", "nic0"): DeviceFacts(device_id="0000:00:05.3"),
                  ("p", "nic1"): DeviceFacts(device_id="0000:00:05.2")})
    with pytest.raises(Unresolvable) as info:
        choose_device(claim(TWO), with_id("net1", "0000:00:05.0"), [], ids)
    assert info.value.reason == "DeviceIDNotAllocated"
    assert "p/nic0=0000:00:05.3" in str(info.value) and "p/nic1=0000:00:05.2" in str(info.value)
    # one candidate only: its ID is still checked
    with pytest.raises(Unresolvable, match="DeviceIDNotAllocated|no device allocated"):
        choose_device(claim(TWO[:1]), with_id("net1", "0000:00:05.0"), [], ids)


def test_two_candidates_with_the_same_id_are_ambiguous():
    same = slices({("p", "nic0"): DeviceFacts(device_id="0000:00:05.0"),
                   ("p", "nic1"): DeviceFacts(device_id="0000:00:05.0")})
    with pytest.raises(Unresolvable, match="several devices"):
        choose_device(claim(TWO), with_id("net1", "0000:00:05.0"), [], same)


def vf_slice(name, generation, devices, count=1):
    """A ResourceSlice of pool `p` as a driver publishes it: device name -> its PCI address."""
    return {"metadata": {"name": name},
            "spec": {"driver": DRIVER, "nodeName": "node-a",
                     "pool": {"name": "p", "generation": generation, "resourceSliceCount": count},
                     "devices": [{"name": n, "attributes": {"k8s.cni.cncf.io/deviceID": {"string": pci}}}
                                 for n, pci in devices.items()]}}


OLD = vf_slice("p-old", 1, {"nic0": "0000:3b:02.0", "nic1": "0000:3b:02.1"})
NEW = vf_slice("p-new", 2, {"nic0": "0000:3b:02.1", "nic1": "0000:3b:02.0"})  # the driver renumbered


def ids(slices):
    facts = device_facts(slices, DRIVER, DEFAULT_DEVICE_ID_ATTRIBUTES)
    return {device: f.device_id for (_, device), f in facts.items()}


def test_a_republished_pool_is_read_from_its_newest_generation_whatever_the_listing_order():
    assert ids([NEW, OLD]) == ids([OLD, NEW]) == {"nic0": "0000:3b:02.1", "nic1": "0000:3b:02.0"}


def test_a_newest_generation_missing_slices_leaves_the_pools_devices_unknown():
    half = vf_slice("p-new-a", 2, {"nic0": "0000:3b:02.1"}, count=2)
    assert ids([OLD, half]) == {}
    assert ids([OLD, half, vf_slice("p-new-b", 2, {"nic1": "0000:3b:02.0"}, count=2)]) == \
        {"nic0": "0000:3b:02.1", "nic1": "0000:3b:02.0"}


class Listing:
    """The API server's answer to the slice list, as the test sets it; counts the lists."""

    def __init__(self, items):
        self.items, self.lists = items, 0

    def list_resource_slices(self, node, driver):
        self.lists += 1
        return {"items": list(self.items)}


def test_a_choice_waits_while_a_pool_is_republished_and_such_a_listing_is_never_kept():
    half = vf_slice("p-new-a", 2, {"nic0": "0000:3b:02.1"}, count=2)
    api = Listing([OLD, half])
    facts = SliceFacts(api, "node-a", clock=lambda: 100.0)  # no time passes: only a kept copy saves a list
    with pytest.raises(SlicesUnsettled, match="generation 2 has 1 of its 2 ResourceSlices"):
        facts.facts(DRIVER, [("p", "nic0")])
    api.items.append(vf_slice("p-new-b", 2, {"nic1": "0000:3b:02.0"}, count=2))
    assert facts.facts(DRIVER, [("p", "nic0")])[("p", "nic0")].device_id == "0000:3b:02.1"
    assert api.lists == 2
    facts.facts(DRIVER, [("p", "nic0")])  # two generations listed: not kept either
    assert api.lists == 3
    api.items = [NEW]
    facts.facts(DRIVER, [("p", "nic0")])
    facts.facts(DRIVER, [("p", "nic0")])  # a pool at rest: kept
    assert api.lists == 4


def test_extended_resource_claim_is_one_of_the_pods_claims():
    from publisher.reconcile.resolver import pod_claim_names

    pod = {"spec": {"resourceClaims": [{"name": "x", "resourceClaimName": "a"}]},
           "status": {"extendedResourceClaimStatus": {"resourceClaimName": "ext"}}}
    assert pod_claim_names(pod) == ["a", "ext"]


def test_pod_without_any_claim_is_claimless_and_a_pending_template_is_not():
    from publisher.reconcile.resolver import pod_info

    assert pod_info({"metadata": {"uid": "u"}, "spec": {}}).claimless
    assert pod_info({"spec": {"resourceClaims": []}, "status": {}}).claimless
    template = {"spec": {"resourceClaims": [{"name": "n", "resourceClaimTemplateName": "t"}]}}
    assert not pod_info(template).claimless and not pod_info(template).names_complete
    template["status"] = {"resourceClaimStatuses": [{"name": "n", "resourceClaimName": "pod-n-x"}]}
    assert pod_info(template).claims == ("pod-n-x",) and pod_info(template).names_complete
    extended = {"status": {"extendedResourceClaimStatus": {"resourceClaimName": "ext"}}}
    assert not pod_info(extended).claimless


def extended_event(ifname: str, request: str, resource: str) -> Event:
    return Event(op="ADD", container_id="c", ifname=ifname, driver=DRIVER, request=request,
                 extended_resource=resource, pod=PodRef("ns", "p", "u"))


GENERATED = [{"request": "container-0-request-0", "driver": DRIVER, "pool": "p", "device": "nic0"},
             {"request": "container-1-request-0", "driver": DRIVER, "pool": "p", "device": "nic1"}]


def test_the_schedulers_claim_is_matched_by_the_extended_resource_not_the_request_name():
    from publisher.reconcile.resolver import pod_info

    pod = {"metadata": {"uid": "u"}, "status": {"extendedResourceClaimStatus": {
        "resourceClaimName": "ext", "requestMappings": [
            {"containerName": "a", "resourceName": "example.com/fast", "requestName": "container-0-request-0"},
            {"containerName": "b", "resourceName": "example.com/nic", "requestName": "container-1-request-0"}]}}}
    info = pod_info(pod)
    nic = info.extended_requests("ext", "example.com/nic")
    assert nic == {"container-1-request-0"}
    assert choose_device(claim(GENERATED), extended_event("eth0", "nic", "example.com/nic"), [],
                         extended=nic)["device"] == "nic1"
    # Another claim of the pod, or an entry naming no resource: the ordinary rules (no request name matches).
    assert info.extended_requests("other", "example.com/nic") is None
    assert info.extended_requests("ext", "") is None
    assert choose_device(claim(GENERATED), extended_event("eth0", "nic", ""), [], extended=None) is None
    # A resource the pod did not ask for takes none of the claim's devices, even with no request configured.
    none = info.extended_requests("ext", "example.com/other")
    assert none == frozenset()
    assert choose_device(claim(GENERATED), extended_event("eth0", "", "example.com/other"), [], extended=none) is None
