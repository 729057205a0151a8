"""The soak's rules on made-up observations: when a bad condition becomes a violation, what counts as growth,
which ADDs spooled outside a fault, which entries' data breaks the shipped schema. Cheap; they keep the soak's
verdicts honest."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts" / "harness"))

from benchlib.soak_checks import (  # noqa: E402
    CLAIMED,
    Counters,
    FaultWindow,
    Look,
    NetnsView,
    Persistence,
    Sample,
    Sandbox,
    SchemaRecord,
    flatness,
    own_sandbox_problems,
    readiness_verdict,
    spool_share,
)
from benchlib.soak_faults import FaultRecord  # noqa: E402
from benchlib.soak_report import INVARIANTS, build, summary  # noqa: E402

from cni_plugin.wire.event import Event, PodRef  # noqa: E402
from publisher.reconcile.mapper import build_data  # noqa: E402


def test_a_bad_condition_is_a_violation_only_after_its_grace_past_the_last_fault() -> None:
    rule = Persistence("x", grace=10)
    window = FaultWindow(active=True)
    rule.observe(100, {"k": "bad"}, window)
    rule.observe(120, {"k": "bad"}, window)  # 20 s bad, but a fault is going on
    assert rule.violations == []
    window.active, window.last_end = False, 125
    rule.observe(130, {"k": "bad"}, window)  # 5 s after the fault ended
    assert rule.violations == []
    rule.observe(136, {"k": "still bad"}, window)  # 11 s after the fault ended
    (v,) = rule.violations
    assert (v.first_seen, v.counted_at, v.detail, v.open) == (100, 136, "still bad", True)
    rule.observe(140, {}, window)
    assert not v.open and v.last_seen == 136


def test_a_condition_that_heals_within_its_grace_is_not_a_violation() -> None:
    rule = Persistence("x", grace=10)
    window = FaultWindow()
    rule.observe(100, {"k": "bad"}, window)
    rule.observe(108, {}, window)
    rule.observe(112, {"k": "bad"}, window)  # a new stretch: its grace starts again
    rule.observe(121, {"k": "bad"}, window)
    assert rule.violations == []
    rule.observe(123, {"k": "bad"}, window)
    assert len(rule.violations) == 1


def samples(pid: int, start: float, n: int, rss: float, growth: float) -> list[Sample]:
    return [Sample(start + 2 * i, pid, "ready", int(rss + growth * i / n), 12, 20) for i in range(n)]


def test_flatness_judges_the_last_publisher_process_only() -> None:
    old = samples(1, 0, 100, 90_000, 0)  # an earlier process with more RSS does not count
    flat = samples(2, 200, 150, 40_000, 1000)
    verdict = flatness(old + flat, 0, 500)
    assert verdict["judged"] and verdict["ok"] and verdict["pid"] == 2
    leaking = samples(2, 200, 150, 40_000, 6000)
    verdict = flatness(old + leaking, 0, 500)
    assert verdict["judged"] and not verdict["ok"] and not verdict["rss_kib"]["ok"]


def test_flatness_is_not_judged_on_a_short_window() -> None:
    verdict = flatness(samples(2, 0, 30, 40_000, 0), 0, 60)
    assert verdict["judged"] is False


def test_spooled_adds_are_counted_outside_fault_windows_only() -> None:
    adds = [{"after": 10, "read": 12, "handoff": "acked"},
            {"after": 20, "read": 22, "handoff": "spooled"},  # inside the fault 19..25
            {"after": 27, "read": 29, "handoff": "spooled"},  # within the slack after it
            {"after": 60, "read": 62, "handoff": "spooled"}]  # outside
    share = spool_share(adds, [(19, 25)], slack=5)
    assert (share["adds"], share["adds_not_acked"], share["not_acked_outside_faults"]) == (4, 3, 1)
    assert share["outside_detail"][0]["read"] == 62


def test_counters_add_up_across_publisher_restarts() -> None:
    c = Counters()
    c.update(1, {"n": 5})
    c.update(1, {"n": 8})
    c.update(2, {"n": 2})  # restarted: counts from zero again
    c.update(2, {"n": 4})
    assert c.total["n"] == 12


def test_readiness_after_a_fault_needs_a_ready_sample_within_the_grace() -> None:
    fault = {"start": 100, "end": 110}
    seen = [Sample(104, 1, "not-ready: journal not writable"), Sample(112, 1, "not-ready: x"), Sample(118, 1, "ready")]
    verdict = readiness_verdict(fault, seen, 2, blocked=True)
    assert verdict["ok_during"] and verdict["ok_after"] and verdict["ready_after_s"] == 8
    late = [Sample(104, 1, "ready"), Sample(125, 1, "ready")]
    verdict = readiness_verdict(fault, late, 2, blocked=True)
    assert not verdict["ok_during"] and not verdict["ok_after"]


def test_a_sandbox_created_while_the_runtime_ran_no_netclaim_is_not_judged_but_one_after_is() -> None:
    pod = {"metadata": {"namespace": "soak", "name": "net-1", "uid": "u1", "labels": {"soak": CLAIMED}},
           "status": {"phase": "Running", "resourceClaimStatuses": [{"resourceClaimName": "net-1-net"}]}}
    claim = {"metadata": {"namespace": "soak", "name": "net-1-net", "uid": "c1"}, "status": {}}
    views = {"sb1": NetnsView(["10.0.0.5/24"], "aa:bb:cc:dd:ee:ff")}

    def look(created: float) -> Look:
        return Look(at=200.0, pods=[pod], claims=[claim],
                    sandboxes={"sb1": Sandbox("sb1", "u1", "soak/net-1", CLAIMED, True, created)})

    unchained = [(100.0, 104.5)]  # a conflist rewrite until containerd loaded the re-chained file
    assert own_sandbox_problems(look(103.0), "drv", views, unchained) == {}
    assert list(own_sandbox_problems(look(104.6), "drv", views, unchained)) == [("u1", "sb1")]
    assert list(own_sandbox_problems(look(103.0), "drv", views)) == [("u1", "sb1")]


def test_the_clock_shim_shifts_only_the_wall_clock_of_its_process(tmp_path: Path) -> None:
    offset = tmp_path / "offset"
    offset.write_text("-3600\n")
    code = ("import sys, time; sys.path.insert(0, sys.argv[1]); import soak_clockshim; real = time.time(); "
            "soak_clockshim.install(sys.argv[2]); print(round(real - time.time()), round(real * 1e9 - time.time_ns()))")
    out = subprocess.run([sys.executable, "-c", code, str(REPO / "scripts" / "harness" / "benchlib"), str(offset)],
                         capture_output=True, text=True, check=True).stdout.split()
    assert [round(int(v) / s) for v, s in zip(out, (1, 1e9))] == [3600, 3600]


def test_a_rotation_holds_when_the_publisher_reloaded_and_a_later_claimed_pod_was_shown() -> None:
    from benchlib.soak_tokens import CredScrape, KeeperLine, Rotation, rotation_verdict

    rotation = Rotation(2, written=100.0, refused=108.0, publisher_pid=7)
    scrapes = [CredScrape(95, 7, 0, 0), CredScrape(125, 7, 1, 0), CredScrape(135, 7, 1, 0)]
    shown = {"old": (50.0, 60.0), "new": (112.0, 118.0)}
    keeper = [KeeperLine(140.0, "reloaded", "")]
    verdict = rotation_verdict([rotation], scrapes, shown, keeper, apiserver_restarts=[139.0], end=300.0)
    assert verdict["ok"], verdict
    (row,) = verdict["rotations"]
    assert (row["claimed_shown_after_s"], row["publisher_reloads"], row["keeper_reloaded_after_s"]) == (18.0, [0, 1], 40.0)


def test_a_rotation_fails_when_the_agents_keep_the_revoked_token() -> None:
    from benchlib.soak_tokens import CredScrape, KeeperLine, Rotation, rotation_verdict

    rotation = Rotation(2, written=100.0, refused=108.0, publisher_pid=7)
    # The publisher re-read the same file after each 401 (a reload) but stayed refused; no claimed pod shown.
    scrapes = [CredScrape(95, 7, 0, 0)] + [CredScrape(110 + 10 * i, 7, 1 + i, 3 + i) for i in range(10)]
    keeper = [KeeperLine(140.0, "reloaded", "")] + [KeeperLine(141.0 + 20 * i, "refused", "401") for i in range(5)]
    verdict = rotation_verdict([rotation], scrapes, {"old": (50.0, 60.0)}, keeper, [139.0], end=240.0)
    assert not verdict["ok"]
    said = " ".join(verdict["problems"])
    assert "no claimed pod" in said and "publisher's API requests were refused" in said and "keeper was refused" in said


def test_a_short_refusal_healed_within_the_reread_interval_is_no_violation() -> None:
    from benchlib.soak_tokens import refused_spans

    assert refused_spans([10.0, 30.0, 50.0], end=500.0) == [(10.0, 50.0)]
    assert refused_spans([10.0, 200.0], end=500.0) == [(10.0, 10.0), (200.0, 200.0)]
    assert refused_spans([450.0], end=500.0) == [(450.0, 500.0)]  # still refused at the end


# ---------------------------------------------------------------- entries' data against the shipped schema

SCHEMA_INVARIANT = "every entry's data matches the netclaim.dev/v1 schema"


def netclaim_data() -> dict[str, Any]:
    """An entry's data as the publisher writes it: a bridge + host-local result, the pod's eth0 (index 2)."""
    result = {"cniVersion": "1.1.0",
              "interfaces": [{"name": "cni0", "mac": "aa:bb:cc:00:00:01"},
                             {"name": "veth1", "mac": "aa:bb:cc:00:00:02"},
                             {"name": "eth0", "mac": "0a:58:0a:01:00:05", "sandbox": "/var/run/netns/x"}],
              "ips": [{"address": "10.1.0.5/16", "gateway": "10.1.0.1", "interface": 2}],
              "routes": [{"dst": "0.0.0.0/0", "gw": "10.1.0.1"}], "dns": {}}
    event = Event(op="ADD", container_id="c" + "0" * 63, ifname="eth0", driver="drv", network="podnet",
                  pod=PodRef("soak", "net-1", "u1"), result=result)
    return build_data(event, 2)


def claim_of(*entries: dict[str, Any], name: str = "net-1-net") -> dict[str, Any]:
    return {"metadata": {"namespace": "soak", "name": name, "uid": f"uid-{name}"}, "status": {"devices": list(entries)}}


def entry_of(data: dict[str, Any], driver: str = "drv", device: str = "nic0") -> dict[str, Any]:
    return {"driver": driver, "pool": "node-1", "device": device, "data": data}


FAULT = FaultRecord("publisher-sigkill", start=125.0, end=128.0)
READY_AFTER_IT = [Sample(129.0, 7, "ready")]  # /readyz true 1 s after the fault: only the data can fail it


def report_of(record: SchemaRecord, records: list[FaultRecord] = (), samples: list[Sample] = ()) -> dict[str, Any]:
    """The soak's report (soak_report.build) of a run whose observer recorded `record`; nothing else seen."""
    obs = SimpleNamespace(schema=record, own=Persistence("own"), stale=Persistence("stale"), samples=list(samples),
                          plugin_log=SimpleNamespace(adds=[]), warnings={}, failed={}, sandboxes={},
                          counters=Counters(), creds=[], shown={}, looks=3, incomplete=0, last_errors=[])
    soak = SimpleNamespace(args=SimpleNamespace(minutes=5.0, interval=2.0, dir="cluster"), t0=100.0, node=None,
                           observer=obs, workload=SimpleNamespace(started={}, steps=0), records=list(records),
                           teardown_notes=[], keeper_log=[])
    return build(soak, "")


def without(key: str) -> Callable[[dict[str, Any]], None]:
    return lambda d: d.pop(key)


BREAKAGES = [
    pytest.param(without("kind"), "'kind' is a required property", id="kind-missing"),
    pytest.param(lambda d: d["ips"][0].update(address="10.1.0.5"), "ips/0/address: '10.1.0.5' does not match",
                 id="ip-not-a-cidr"),
    pytest.param(lambda d: d["interfaces"][0].update(mtu="1500"), "interfaces/0/mtu: '1500' is not of type 'integer'",
                 id="mtu-a-string"),
    pytest.param(lambda d: d.update(podIPs=[]), "podIPs: not documented", id="undocumented-field"),
    pytest.param(lambda d: [d.pop("apiVersion"), d.pop("kind")], "'apiVersion' is a required property",
                 id="unversioned-as-before"),
]


def test_entries_whose_data_matches_the_schema_record_nothing_and_the_invariant_holds() -> None:
    record = SchemaRecord()
    look = Look(at=110.0, claims=[claim_of(entry_of(netclaim_data()), entry_of(netclaim_data(), device="nic1"))])
    record.observe(look, "drv")
    record.observe(Look(at=112.0, claims=look.claims), "drv")
    assert (record.count, record.first) == (0, [])
    fig = report_of(record, [FAULT], READY_AFTER_IT)
    assert SCHEMA_INVARIANT in INVARIANTS
    verdict = fig["invariants"][SCHEMA_INVARIANT]
    assert verdict["ok"] and verdict["detail"]["distinct_errors"] == 0 and fig["schema_errors"] == 0
    (row,) = fig["faults"]
    assert row["survived"] and row["schema_errors"] == 0, row


@pytest.mark.parametrize("breakage, complaint", BREAKAGES)
def test_an_entry_whose_data_breaks_the_schema_fails_the_invariant_naming_claim_device_and_error(
        breakage: Callable[[dict[str, Any]], None], complaint: str) -> None:
    data = netclaim_data()
    breakage(data)
    record = SchemaRecord()
    good = entry_of(netclaim_data(), device="nic0")
    record.observe(Look(at=130.0, claims=[claim_of(good, entry_of(data, device="nic1"))]), "drv")
    fig = report_of(record, [FAULT], READY_AFTER_IT)
    verdict = fig["invariants"][SCHEMA_INVARIANT]
    assert not verdict["ok"] and not fig["ok"]
    said = verdict["detail"]["first"]
    assert any(line.startswith("claim soak/net-1-net device nic1 sandbox c00000000000 at 30.0s: ") and complaint in line
               for line in said), said
    assert not any("device nic0" in line for line in said), said
    assert verdict["detail"]["distinct_errors"] == len(said) >= 1
    (row,) = fig["faults"]
    assert row["schema_errors"] == len(said) and not row["survived"]  # first seen after the fault began
    assert f"FAIL {SCHEMA_INVARIANT}" in summary(fig) and complaint in summary(fig)


def test_a_broken_entry_counts_once_while_it_stays_and_the_record_keeps_the_first_20() -> None:
    data = netclaim_data()
    data.pop("kind")
    record = SchemaRecord()
    broken = Look(at=10.0, claims=[claim_of(entry_of(data))])
    for at in (10.0, 12.0, 14.0):  # the same entry on the claim at each look
        record.observe(Look(at=at, claims=broken.claims), "drv")
    assert record.count == 1 and [e.first_seen for e in record.first] == [10.0]
    record.observe(Look(at=16.0, claims=[claim_of(entry_of(netclaim_data()))]), "drv")  # rewritten right
    record.observe(Look(at=18.0, claims=broken.claims), "drv")  # and written wrong again: a new error
    assert record.count == 2
    many = Look(at=20.0, claims=[claim_of(entry_of(data), name=f"other-{i}") for i in range(30)])
    record.observe(many, "drv")
    assert record.count == 32 and len(record.first) == 20
    assert record.verdict()["detail"]["distinct_errors"] == 32


def test_entries_of_another_driver_or_another_writers_data_are_not_held_to_netclaims_schema() -> None:
    data = netclaim_data()
    data.pop("kind")
    other_driver = entry_of(data, driver="gpu.example.com", device="gpu0")
    other_writer = entry_of({"slot": 3, "kind": "Something"}, device="nic2")
    record = SchemaRecord()
    record.observe(Look(at=10.0, claims=[claim_of(other_driver, other_writer)]), "drv")
    assert (record.count, record.first) == (0, [])
    assert report_of(record)["invariants"][SCHEMA_INVARIANT]["ok"]
    # The control: the same data under netclaim's driver is recorded.
    record.observe(Look(at=12.0, claims=[claim_of(other_driver, other_writer, entry_of(data, device="nic0"))]), "drv")
    assert record.count == 1 and record.first[0].device == "nic0"


def test_each_look_of_the_soak_holds_the_claims_entries_to_the_schema() -> None:
    """soak.Observer.check on a look it did not have to fetch (no cluster here: look, the netns views and the
    node are stand-ins); the rules above judge what it records."""
    from benchlib.soak import Observer

    data = netclaim_data()
    data["ips"][0]["address"] = "10.1.0.5"
    observer = Observer.__new__(Observer)
    observer.driver, observer.node = "drv", SimpleNamespace(unchained=[])
    observer.workload = SimpleNamespace(seen=lambda pods: None)
    observer.window, observer.own, observer.stale = FaultWindow(), Persistence("own"), Persistence("stale")
    observer.schema, observer.shown = SchemaRecord(), {}
    observer.looks = observer.incomplete = 0
    observer.last_errors = []
    observer.look = lambda: Look(at=50.0, claims=[claim_of(entry_of(netclaim_data(), device="nic0"),
                                                           entry_of(data, device="nic1"))])
    observer.views = lambda look: {}
    observer.check(1)
    assert observer.looks == 1
    recorded = [(e.device, e.error) for e in observer.schema.first]
    assert recorded == [("nic1", "ips/0/address: '10.1.0.5' does not match '/'")], recorded
