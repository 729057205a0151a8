"""The soak's rules on made-up observations: when a bad condition becomes a violation, what counts as growth,
which ADDs spooled outside a fault. Cheap; they keep the soak's verdicts honest."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts" / "harness"))

from benchlib.soak_checks import (  # noqa: E402
    CLAIMED, Counters, FaultWindow, Look, NetnsView, Persistence, Sample, Sandbox, flatness, own_sandbox_problems,
    readiness_verdict, spool_share)


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
