"""Choosing the device of an attachment among a claim's allocation results (no guessing)."""

from __future__ import annotations

import pytest

from cni_plugin.wire import Event, PodRef
from publisher.resolver import Unresolvable, allocated_node, choose_device

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
