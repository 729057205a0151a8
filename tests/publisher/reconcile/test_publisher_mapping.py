"""Mapping a CNI result to a device status, and the API limits checked before writing."""

from __future__ import annotations

import pytest

from cni_plugin.wire.event import Event, PodRef
from publisher import limits
from publisher.reconcile.mapper import map_event

POD = PodRef("ns", "pod", "uid-1")


def result(ifname: str = "eth0") -> dict:
    return {
        "cniVersion": "1.1.0",
        "interfaces": [
            {"name": "cni0", "mac": "AA:BB:CC:00:00:01"},
            {"name": "veth1234", "mac": "aa:bb:cc:00:00:02"},
            {"name": ifname, "mac": "0A:58:0A:01:00:05", "sandbox": "/var/run/netns/x"},
        ],
        "ips": [
            {"address": "10.1.0.5/16", "gateway": "10.1.0.1", "interface": 2},
            {"address": "2001:0db8:0:0::5/64", "interface": 2},
            {"address": "10.1.0.5/16", "interface": 2},
            {"address": "192.168.9.9/24", "interface": 0},
        ],
        "routes": [{"dst": "0.0.0.0/0"}],
        "dns": {"nameservers": ["10.0.0.10"]},
    }


def add(res: dict, op: str = "ADD", **kw) -> Event:
    return Event(op=op, container_id="c1", ifname="eth0", driver="net.example.com", network="net1",
                 pod=POD, result=res, **kw)


def test_sandbox_interface_canonical_ips_and_lower_mac():
    entry = map_event(add(result()), "pool-a", "nic0")
    assert entry["networkData"] == {
        "interfaceName": "eth0",
        "ips": ["10.1.0.5/16", "2001:db8::5/64"],
        "hardwareAddress": "0a:58:0a:01:00:05",
    }
    assert entry["data"]["containerID"] == "c1" and entry["data"]["network"] == "net1"
    assert all("sandbox" not in i for i in entry["data"]["interfaces"])
    ready = entry["conditions"][0]
    assert (ready["type"], ready["status"], ready["reason"]) == ("Ready", "True", "NetworkConfigured")
    assert "eth0" in ready["message"] and "net1" in ready["message"]


def test_at_most_16_ips():
    res = result()
    res["ips"] = [{"address": f"10.2.0.{i}/24", "interface": 2} for i in range(1, 30)]
    assert len(map_event(add(res), "p", "d")["networkData"]["ips"]) == 16


def test_data_trimmed_in_order_to_fit():
    res = result()
    res["dns"] = {"search": ["x" * 60 + f".example{i}" for i in range(200)]}
    entry = map_event(add(res), "p", "d")
    assert limits.data_size(entry["data"]) <= limits.MAX_DATA_BYTES
    assert entry["data"]["trimmed"] == ["dns"]
    assert entry["data"]["routes"] == [{"dst": "0.0.0.0/0"}]


def test_ready_transition_time_moves_only_on_status_change():
    first = map_event(add(result()), "p", "d")
    first["conditions"][0]["lastTransitionTime"] = "2020-01-01T00:00:00Z"
    again = map_event(add(result()), "p", "d", previous=first)
    assert again["conditions"][0]["lastTransitionTime"] == "2020-01-01T00:00:00Z"
    drift = map_event(add({}, op="CHECK", check_error="mtu 1400 != 1500"), "p", "d", previous=first)
    cond = drift["conditions"][0]
    assert (cond["status"], cond["reason"]) == ("False", "NetworkDrift")
    assert cond["lastTransitionTime"] != "2020-01-01T00:00:00Z"
    assert drift["networkData"] == first["networkData"]


@pytest.mark.parametrize("value,canonical", [
    ("2001:0db8:0:0::5/64", "2001:db8::5/64"),
    ("10.001.0.5/16", "10.1.0.5/16"),  # the API server's parser reads leading zeros as decimal
    ("10.1.0.5/16", "10.1.0.5/16"),
    ("10.1.0.5", None),
    ("::ffff:10.1.0.5/112", "10.1.0.5/16"),  # IPv4-mapped: printed as IPv4, prefix - 96
    ("::ffff:a01:5/128", "10.1.0.5/32"),
    ("::10.1.0.5/128", "::a01:5/128"),  # IPv4-compatible stays IPv6
    ("::ffff:10.1.0.5/64", None),  # no form the server accepts
    ("FE80::1/64", "fe80::1/64"),
    ("fe80::1%eth0/64", None),
])
def test_canonical_cidr(value, canonical):
    if canonical is None:
        with pytest.raises(ValueError):
            limits.canonical_cidr(value)
    else:
        assert limits.canonical_cidr(value) == canonical


def test_local_validation_names_every_broken_rule():
    bad = {
        "driver": "Not_A_Domain", "pool": "p", "device": "dev.0",
        "conditions": [{"type": "Ready", "status": "Yes", "reason": "bad reason", "lastTransitionTime": ""}],
        "data": {"x": "y" * 11000},
        "networkData": {"interfaceName": "e" * 300, "ips": ["2001:0db8::1/64", "10.0.0.1/8", "10.0.0.1/8"]},
    }
    errors = " | ".join(limits.check_entry(bad))
    for needle in ("driver", "device", "status", "reason", "lastTransitionTime", "data is", "interfaceName",
                   "canonical", "unique"):
        assert needle in errors
    with pytest.raises(limits.InvalidEntry):
        limits.validate_entry(bad)


def test_lone_surrogates_become_replacement_characters_and_leftovers_are_refused():
    res = result()
    res["dns"] = {"search": ["lab\ud800.example"], "opt\udc00": ["x"]}
    res["interfaces"][0]["name"] = "cni\udfff"
    entry = map_event(add(res), "pool-a", "nic0")
    assert entry["data"]["dns"] == {"search": ["lab\ufffd.example"], "opt\ufffd": ["x"]}
    assert entry["data"]["interfaces"][0]["name"] == "cni\ufffd"
    assert res["dns"]["search"] == ["lab\ud800.example"]  # the event's own result is left as received
    entry["data"]["dns"]["search"] = ["late\ud800"]
    with pytest.raises(limits.InvalidEntry, match="surrogate"):
        limits.validate_entry(entry)


def test_data_size_counts_like_the_api_servers_json():
    assert limits.data_size({"s": "<&>"}) == len('{"s":"\\u003c\\u0026\\u003e"}')
    assert limits.data_size({"s": "\u00e9\U0001F600"}) == len('{"s":""}') + 2 + 4
    assert limits.data_size({"s": "\b\\b"}) == len('{"s":"\\u0008\\\\b"}')
