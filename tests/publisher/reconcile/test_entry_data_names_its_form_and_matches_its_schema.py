"""Each entry's `data` says what it is (apiVersion netclaim.dev/v1, kind CNIResult) and matches the JSON
Schema netclaim ships (conf/schema/netclaim.dev_v1_CNIResult.schema.json); an entry an older release
wrote without them is rewritten on the claim's next apply.

The direct tests run the mapper on representative CNI results and hold its `data` to the schema, with
broken data as the control that the schema check sees a fault. The last test runs the real publisher on
the real API server, with its journal and the claim's entry left as the previous release wrote them.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import time

import pytest
from publisher_testkit import BIN, DRIVER, Cluster, Plugin, add, apply_as, drained, suffix, wait_until
from runtime.dataschema import DataSchemaError, check_entries, data_errors, planted, schema

from cni_plugin.wire.event import Event, PodRef
from publisher import limits
from publisher.live.status import shown_entry
from publisher.reconcile.mapper import (
    DATA_API_VERSION,
    DATA_KIND,
    TRIM_ORDER,
    build_data,
    map_event,
    versioned_data,
)
from publisher.reconcile.sharing import ATTACHMENTS
from publisher.reconcile.writer import body_hash, sort_entries

POD = PodRef("ns", "pod", "uid-1")


def event(result: dict, op: str = "ADD", **kw) -> Event:
    return Event(op=op, container_id="c" + "0" * 63, ifname="eth0", driver=DRIVER, network="podnet", pod=POD,
                 result=result, **kw)


def dual_stack() -> dict:
    """The bridge + host-local shape: host-side bridge and veth, the pod's eth0, IPv4 and IPv6."""
    return {
        "cniVersion": "1.1.0",
        "interfaces": [{"name": "cni0", "mac": "aa:bb:cc:00:00:01"},
                       {"name": "veth1", "mac": "aa:bb:cc:00:00:02", "mtu": 1500},
                       {"name": "eth0", "mac": "0a:58:0a:01:00:05", "mtu": 1500, "sandbox": "/var/run/netns/x"}],
        "ips": [{"address": "10.1.0.5/16", "gateway": "10.1.0.1", "interface": 2},
                {"address": "fd00:1::5/64", "gateway": "fd00:1::1", "interface": 2}],
        "routes": [{"dst": "0.0.0.0/0", "gw": "10.1.0.1"}, {"dst": "::/0", "priority": 1024, "table": 254}],
        "dns": {"nameservers": ["10.96.0.10"], "domain": "cluster.local", "search": ["ns.svc.cluster.local"],
                "options": ["ndots:5"]},
    }


def many_interfaces() -> dict:
    """A device plugin chain: 16 pod-side interfaces (SR-IOV VFs, a userspace socket), 64 addresses."""
    ifaces = [{"name": f"net{i}", "mac": f"0a:58:0a:02:00:{i:02x}", "sandbox": "/var/run/netns/x",
               "pciID": f"0000:3b:02.{i % 8}"} for i in range(15)]
    ifaces.append({"name": "eth0", "socketPath": "/var/run/vhost/eth0.sock", "sandbox": "/var/run/netns/x"})
    ips = [{"address": f"10.2.{i}.{j}/24", "interface": i} for i in range(16) for j in range(1, 5)]
    return {"cniVersion": "1.0.0", "interfaces": ifaces, "ips": ips, "routes": [{"dst": "10.2.0.0/16"}], "dns": {}}


def over_the_limit() -> dict:
    """Over 10 KiB whichever part is shed: it sheds all the way to the attachment's own interface."""
    res = dual_stack()
    res["dns"] = {"search": [f"zone{i}.{'x' * 50}.example" for i in range(200)]}
    res["routes"] = [{"dst": f"10.{i // 250}.{i % 250}.0/24", "gw": "10.1.0.1"} for i in range(400)]
    res["interfaces"][:0] = [{"name": f"host{i}", "mac": "aa:bb:cc:dd:ee:ff"} for i in range(300)]
    for ip in res["ips"]:
        ip["interface"] += 300
    res["ips"] += [{"address": f"172.16.{i // 250}.{i % 250}/32", "interface": 0} for i in range(400)]
    return res


@pytest.mark.parametrize("make", [dual_stack, many_interfaces, over_the_limit])
def test_data_of_representative_results_names_its_form_and_matches_the_schema(make):
    res = make()
    entry = map_event(event(res), "pool", "nic0")  # validates the entry as the API server would
    data = entry["data"]
    assert list(data)[:2] == ["apiVersion", "kind"]
    assert (data["apiVersion"], data["kind"]) == (DATA_API_VERSION, DATA_KIND)
    assert data_errors(data) == []
    assert limits.data_size(data) <= limits.MAX_DATA_BYTES
    assert all("sandbox" not in i for i in data.get("interfaces", []))
    if make is over_the_limit:
        assert data["trimmed"] == ["dns", "routes", "other_interfaces", "other_ips"], data["trimmed"]
        assert [i["name"] for i in data["interfaces"]] == ["eth0"]
        assert {ip["interface"] for ip in data["ips"]} == {302}  # still the index in the result as it was


def test_every_trim_step_keeps_apiversion_and_kind_within_the_limit():
    res = over_the_limit()
    res["interfaces"][302]["mac"] = "0a:58:" + "x" * 11000  # the attachment's own interface alone is too big
    data = build_data(event(res), 302)
    assert data["trimmed"] == list(TRIM_ORDER)
    assert (data["apiVersion"], data["kind"]) == (DATA_API_VERSION, DATA_KIND)
    assert data_errors(data) == [] and limits.data_size(data) <= limits.MAX_DATA_BYTES


def test_the_schema_says_what_the_mapper_writes():
    props = schema()["properties"]
    assert (props["apiVersion"]["const"], props["kind"]["const"]) == (DATA_API_VERSION, DATA_KIND)
    assert props["trimmed"]["items"]["enum"] == [*TRIM_ORDER, ATTACHMENTS]  # the list of pods is cut last
    assert {"apiVersion", "kind"} <= set(schema()["required"])


@pytest.mark.parametrize("breakage, complaint", [
    (lambda d: d.pop("apiVersion"), "'apiVersion' is a required property"),
    (lambda d: d.update(apiVersion="netclaim.dev/v2"), "apiVersion: 'netclaim.dev/v1' was expected"),
    (lambda d: d.update(containerID=5), "containerID: 5 is not of type 'string'"),
    (lambda d: d["interfaces"][0].update(mtu="1500"), "interfaces/0/mtu: '1500' is not of type 'integer'"),
    (lambda d: d["interfaces"][2].update(sandbox="/var/run/netns/x"), "interfaces/2"),
    (lambda d: d.update(trimmed=["everything"]), "trimmed/0"),
    (lambda d: d.update(podIPs=[]), "podIPs: not documented"),
])
def test_broken_data_does_not_match_the_schema(breakage, complaint):
    """The control: the check that holds every entry the suite reads sees each kind of fault."""
    data = build_data(event(dual_stack()), 2)
    assert data_errors(data) == []
    breakage(data)
    errors = data_errors(data)
    assert any(complaint in e for e in errors), errors


def test_the_suites_entry_check_fails_on_netclaim_data_without_apiversion_only():
    good = {"driver": DRIVER, "pool": "p", "device": "nic0", "data": build_data(event(dual_stack()), 2)}
    old = {**good, "device": "nic1", "data": {k: v for k, v in good["data"].items() if k not in ("apiVersion", "kind")}}
    other_writer = {"driver": "gpu.example.com", "pool": "p", "device": "gpu0", "data": {"slot": 3}}
    assert check_entries([good, other_writer]) == [good, other_writer]
    with pytest.raises(DataSchemaError, match="p/nic1: its data does not match"):
        check_entries([good, old])
    planted(old["data"])  # a test that writes the old form itself, as an older release
    assert check_entries([old]) == [old]


def old_form(data: dict) -> dict:
    """`data` as the previous release wrote it: the same fields, without apiVersion and kind."""
    return {k: v for k, v in data.items() if k not in ("apiVersion", "kind")}


def test_old_data_gets_apiversion_and_kind_first_and_still_fits():
    res = dual_stack()
    old = old_form(build_data(event(res), 2))
    new = versioned_data(old)
    assert list(new)[:2] == ["apiVersion", "kind"] and old_form(new) == old and data_errors(new) == []
    # An older release measured without the two fields: data at its limit sheds more to fit with them.
    full = {**old, "dns": {"search": [""]}}
    full["dns"]["search"][0] = "x" * (limits.MAX_DATA_BYTES - 20 - limits.data_size(full))
    assert limits.data_size(full) == limits.MAX_DATA_BYTES - 20
    fitted = versioned_data(full)
    assert limits.data_size(fitted) <= limits.MAX_DATA_BYTES and fitted["trimmed"] == ["dns"], fitted.get("trimmed")
    assert data_errors(fitted) == []


def test_a_check_without_a_result_on_an_old_entry_gives_it_apiversion_and_kind():
    first = map_event(event(dual_stack()), "pool", "nic0")
    previous = {**first, "data": old_form(first["data"])}
    drift = map_event(event({}, op="CHECK", check_error="mtu 1400 != 1500"), "pool", "nic0", previous=previous)
    assert drift["conditions"][0]["reason"] == "NetworkDrift"
    assert drift["data"] == first["data"] and list(drift["data"])[:2] == ["apiVersion", "kind"]


# ---------------------------------------------------------------- through the real publisher


def test_an_entry_an_older_release_wrote_gets_apiversion_and_kind_on_the_next_apply(
        cluster: Cluster, publisher_factory, workdir):
    """The previous release's journal row, applied hash and entry on the claim, all without apiVersion:
    the claim's next apply (here the resync's) writes the entry in this release's form, where the
    old publisher found the entry unchanged and left it so for good."""
    claim, uid = cluster.pod_with_claim("old", [("nic", "nic0")])
    pub = publisher_factory()
    cid = "c" + suffix()
    add(Plugin(pub.socket, pub.spool, workdir), cid, PodRef(cluster.namespace, "old", uid))
    [published] = cluster.wait_devices(claim, lambda d: len(d) == 1)
    drained(pub)
    pub.stop()

    # What the previous release left: its row's entry, the hash of the body it applied, and that body.
    db = sqlite3.connect(f"{pub.state}/journal.db")
    try:
        (text, live), = db.execute("SELECT entry, live FROM attachments WHERE container_id=?", (cid,)).fetchall()
        row = json.loads(text)
        row["data"] = old_form(row["data"])
        shown = shown_entry(row, json.loads(live) if live else {})
        db.execute("UPDATE attachments SET entry=? WHERE container_id=?",
                   (json.dumps(row, separators=(",", ":"), sort_keys=True), cid))
        db.execute("UPDATE applied SET body_hash=? WHERE claim=?",
                   (body_hash(sort_entries([shown])), f"{cluster.namespace}/{claim}"))
        assert db.total_changes == 2
        db.commit()
    finally:
        db.close()
    apply_as(cluster, claim, f"netclaim/{pub.node}", [shown])
    [old] = cluster.wait_devices(claim, lambda d: len(d) == 1 and "apiVersion" not in d[0]["data"])
    assert old["data"] == old_form(published["data"])

    pub.start()
    since = time.time()  # resync's pass ends after this: `last_resync` is wall time
    out = subprocess.run([str(BIN / "netclaim-publisher"), "resync", "--socket", pub.socket],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stdout + out.stderr
    wait_until("a whole resync pass after the request",
               lambda: (st := pub.status())["quiescent"] and (st["last_resync"] or 0) > since)
    [entry] = wait_until("the entry read back", lambda: cluster.devices(claim))  # schema-checked as it is read
    assert entry["data"] == published["data"], entry["data"]
    assert (entry["data"]["apiVersion"], entry["data"]["kind"]) == (DATA_API_VERSION, DATA_KIND)
    assert entry["networkData"] == published["networkData"]
