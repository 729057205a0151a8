"""The device a meta plugin chose for a network reaches the publisher, spelled one way.

Multus hands each delegate the ID of the allocated device it picked for that network (the
`deviceID` capability's runtimeConfig, and a top-level `deviceID` in every plugin of the
delegate); SR-IOV setups name it `pciBusID`. The publisher maps the interface to the allocated
device carrying that ID, so the plugin must send the one that describes the interface, in the
spelling the publisher compares. Real plugin, real bridge chain and netns; the events are read
from the spool as the publisher reads them.
"""

from __future__ import annotations

import json

import pytest

from cni_plugin.wire import deviceid
from cni_plugin.wire import spool as wire_spool

from .conftest import Chain


def _spooled_add(chain: Chain, prev: dict | None = None, **extra: object):
    prev = prev if prev is not None else chain.bridge_add()
    rc, out, err = chain.netclaim("ADD", prev, **extra)
    assert rc == 0, out + err
    events = [e for e in chain.dirs.spooled() if e.op == "ADD"]
    assert len(events) == 1, events
    return events[0], json.loads(out)


def test_the_capability_argument_is_believed_before_the_injected_fields(chain: Chain) -> None:
    event, _ = _spooled_add(chain, runtimeConfig={"deviceID": "03:00.1"}, deviceID="0000:09:00.0",
                            pciBusID="0000:0a:00.0")
    assert event.device_id == "0000:03:00.1"


@pytest.mark.parametrize("extra, expected", [
    ({"deviceID": "0000:3B:02.7"}, "0000:3b:02.7"),
    ({"pciBusID": "3b:02.7"}, "0000:3b:02.7"),
    ({"deviceID": "vdpa:vdpa0"}, "vdpa:vdpa0"),  # not a PCI address: compared as it is
])
def test_the_injected_device_id_is_sent_in_one_spelling(chain: Chain, extra: dict, expected: str) -> None:
    event, _ = _spooled_add(chain, **extra)
    assert event.device_id == expected


def test_an_attachment_without_a_device_id_sends_no_such_field(chain: Chain) -> None:
    event, _ = _spooled_add(chain)
    assert event.device_id == ""
    raw = [json.loads(open(p, "rb").read()) for p in wire_spool.list_spool(chain.dirs.spool)]
    assert all("device_id" not in r for r in raw), raw


def test_the_results_pci_id_wins_over_the_requested_device_and_the_log_says_so(chain: Chain) -> None:
    prev = chain.bridge_add()
    sandbox = next(i for i in prev["interfaces"] if i.get("sandbox"))
    sandbox["pciID"] = "0000:05:00.2"
    event, printed = _spooled_add(chain, prev, runtimeConfig={"deviceID": "0000:05:00.3"})
    assert event.device_id == "0000:05:00.2"
    assert next(i for i in printed["interfaces"] if i.get("sandbox"))["pciID"] == "0000:05:00.2"
    warned = [r for r in chain.dirs.log_records() if "another device" in r.get("msg", "")]
    assert warned and warned[0]["requested"] == "0000:05:00.3" and warned[0]["pciID"] == "0000:05:00.2", \
        chain.dirs.log_records()


@pytest.mark.parametrize("extra, field", [
    ({"runtimeConfig": {"deviceID": 7}}, "runtimeConfig.deviceID"),
    ({"deviceID": "x" * (deviceid.MAX_DEVICE_ID + 1)}, "deviceID"),
    ({"pciBusID": "0000:03:00.1\n"}, "pciBusID"),
])
def test_a_malformed_device_id_is_a_config_error_naming_the_field(chain: Chain, extra: dict, field: str) -> None:
    rc, out, _ = chain.netclaim("ADD", chain.bridge_add(), **extra)
    error = json.loads(out)
    assert rc != 0 and error["code"] == 7 and field in error["msg"], out
    assert chain.dirs.spooled() == []


@pytest.mark.parametrize("raw, expected", [
    ("0000:03:00.1", "0000:03:00.1"), ("03:00.1", "0000:03:00.1"), ("3:0.1", "0000:03:00.1"),
    ("ABCD:EF:1f.7", "abcd:ef:1f.7"), (" 0000:03:00.1 ", "0000:03:00.1"),
    ("0000:03:20.1", "0000:03:20.1"),  # device 0x20 is out of PCI's range: not an address, kept
    ("0000:03:00.8", "0000:03:00.8"), ("mlx5_core.sf.4", "mlx5_core.sf.4"), ("", ""),
])
def test_pci_addresses_are_normalised_and_other_ids_kept(raw: str, expected: str) -> None:
    assert deviceid.normalize(raw) == expected
