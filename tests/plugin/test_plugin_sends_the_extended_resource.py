"""The entry's `extendedResourceName` reaches the publisher with every event, and a bad one stops the ADD.

A pod that asks for a DRA extended resource in its containers' resources (`limits:
{example.com/nic: 1}`) gets a claim the scheduler makes, whose requests the scheduler names
itself; the publisher finds this interface's device there only by the extended resource the
entry names. So the plugin must hand that name over on every verb, on the socket the publisher
reads, and must refuse at once a name the API could never hold (it would match nothing, silently).
Real plugin executable, real bridge + host-local chain and netns; the publisher is the wire-format
double of tests/plugin/conftest.py, which keeps each event's JSON as sent.
"""

from __future__ import annotations

import json

import pytest

from .conftest import Chain, PublisherDouble

RESOURCE = "example.com/nic"


def test_the_extended_resource_reaches_the_publisher_on_add_check_and_del(chain: Chain,
                                                                          publisher: PublisherDouble) -> None:
    rc, out, err = chain.netclaim("ADD", chain.bridge_add(), extendedResourceName=RESOURCE)
    assert rc == 0, out + err
    result = json.loads(out)
    rc, out, err = chain.netclaim("CHECK", result, extendedResourceName=RESOURCE)
    assert rc == 0, out + err
    rc, out, err = chain.netclaim("DEL", result, extendedResourceName=RESOURCE)
    assert rc == 0, out + err

    assert [e.op for e in publisher.events] == ["ADD", "CHECK", "DEL"]
    assert [s.get("extended_resource") for s in publisher.sent] == [RESOURCE] * 3, publisher.sent
    assert all(e.extended_resource == RESOURCE for e in publisher.events)
    assert chain.dirs.spooled() == [], "handed to the socket, not spooled"


@pytest.mark.parametrize("unset", [{}, {"extendedResourceName": None}, {"extendedResourceName": ""}],
                         ids=["absent", "null", "empty"])
def test_an_entry_without_an_extended_resource_sends_no_such_field(chain: Chain, publisher: PublisherDouble,
                                                                   unset: dict) -> None:
    """What every entry written before the setting existed sends: the event as before (an older publisher
    would count an unknown field). The same chain with the setting is the control that the field is seen."""
    prev = chain.bridge_add()
    rc, out, err = chain.netclaim("ADD", prev, **unset)
    assert rc == 0, out + err
    rc, out, err = chain.netclaim("ADD", prev, extendedResourceName=RESOURCE)
    assert rc == 0, out + err

    without, control = publisher.sent
    assert "extended_resource" not in without, without
    assert control["extended_resource"] == RESOURCE, control
    assert publisher.events[0].extended_resource == ""


@pytest.mark.parametrize("value", [
    "nic",  # no domain: a Kubernetes-native name, never a DRA extended resource
    "Example.com/nic",  # the domain is lower case
    "example.com/nic/0",  # exactly one '/'
    "example.com/",
    "/nic",
    "example..com/nic",
    "-example.com/nic",
    "example.com/-nic",  # the name is alphanumeric at both ends
    "example.com/" + "n" * 64,  # the name is at most 63 characters
    ("a" * 63 + ".") * 4 + "com/nic",  # the domain is at most 253 characters
    "example.com/n ic",
    7,
])
def test_a_malformed_extended_resource_is_error_7_naming_the_field(chain: Chain, publisher: PublisherDouble,
                                                                   value: object) -> None:
    rc, out, _ = chain.netclaim("ADD", chain.bridge_add(), extendedResourceName=value)
    error = json.loads(out)
    assert rc == 1 and error["code"] == 7 and "extendedResourceName" in error["msg"], out
    assert publisher.events == [] and chain.dirs.spooled() == [], "an event of a refused ADD was sent"


@pytest.mark.parametrize("value", [
    "example.com/nic", "deviceclass.resource.kubernetes.io/sriov-nic", "a/b", "nic.acme.io/VF_0.x",
    "example.com/" + "n" * 63, ("a" * 63 + ".") * 3 + "a" * 61 + "/nic",  # 253 characters of domain
])
def test_every_well_formed_extended_resource_is_accepted(chain: Chain, publisher: PublisherDouble,
                                                         value: str) -> None:
    rc, out, err = chain.netclaim("ADD", chain.bridge_add(), extendedResourceName=value)
    assert rc == 0, out + err
    assert [e.extended_resource for e in publisher.events] == [value]


def test_del_of_an_entry_with_a_malformed_extended_resource_still_cleans_up_and_reports(
        chain: Chain, publisher: PublisherDouble) -> None:
    """DEL never blocks the chain over its config (docs/plugin.md's node-safety policy): it goes on with the
    fields that are valid and sends its event without the bad name."""
    rc, out, err = chain.netclaim("ADD", chain.bridge_add())
    assert rc == 0, out + err
    rc, out, err = chain.netclaim("DEL", json.loads(out), extendedResourceName="Example.com/nic")
    assert rc == 0, out + err
    assert [e.op for e in publisher.events] == ["ADD", "DEL"]
    assert "extended_resource" not in publisher.sent[-1], publisher.sent[-1]
