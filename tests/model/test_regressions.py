"""Explicit step lists replayed on the real stack, checked against the same model.

Two kinds:
- one named test per ordering defect the model covers (and the
  outage/restart paths the invariant depends on);
- every sequence the model test ever failed on (FOUND), pasted from hypothesis's
  printed steps (`state.add(pick=0, channel='spool')` -> ("add", {"pick": 0, ...})).
  They stay here once fixed.

Steps are Scenario methods (tests/model/scenario.py); indexes are taken modulo
the choices that exist at that step, exactly as in the state machine.
"""

from __future__ import annotations

import ast
from typing import Any

import pytest

from modelkit import NODE
from scenario import Harness, replay

pytestmark = [pytest.mark.controlplane, pytest.mark.netns]

Steps = list[tuple[str, dict[str, Any]]]


def begin(heavy: bool = False) -> tuple[str, dict[str, Any]]:
    return ("begin", {"heavy": heavy})


# ---------------------------------------------------------------- one test per ordering defect


def test_a_gc_spares_sandboxes_added_after_it(harness: Harness) -> None:
    """A GC spooled (socket unreachable) before a later ADD must not remove that ADD."""
    replay(harness, [begin(), ("gc", {"network": 0, "channel": "spool"}),
                     ("add", {"pick": 0, "channel": "socket"})])


def test_a_gc_during_publisher_restart_spares_new_pods(harness: Harness) -> None:
    """Node reboot: the runtime GCs while the publisher is down, then kubelet starts pods."""
    replay(harness, [begin(), ("kill_publisher", {}),
                     ("gc", {"network": 0, "channel": "socket"}), ("start_publisher", {}),
                     ("add", {"pick": 0, "channel": "socket"})])


def test_a_spooled_add_does_not_outlive_its_del(harness: Harness) -> None:
    replay(harness, [begin(), ("add", {"pick": 0, "channel": "spool"}),
                     ("delete", {"pick": 0, "channel": "socket"})])


def test_a_lost_del_does_not_block_the_next_pod(harness: Harness) -> None:
    """p0's DEL is lost; the claim moves to p2, whose sandbox must be published (not p0's)."""
    replay(harness, [begin(), ("add", {"pick": 0, "channel": "socket"}),
                     ("delete", {"pick": 0, "channel": "lost"}),
                     ("allocate", {"claim": "ca", "slot": 2, "device": "dev0", "node": NODE}),
                     ("new_sandbox", {"slot": 2}), ("add", {"pick": 3, "channel": "socket"})])


def test_a_lost_del_is_dropped_when_the_pod_is_deleted(harness: Harness) -> None:
    replay(harness, [begin(), ("add", {"pick": 0, "channel": "socket"}),
                     ("delete", {"pick": 0, "channel": "lost"}), ("delete_pod", {"slot": 0})])


def test_deallocation_removes_the_entry(harness: Harness) -> None:
    replay(harness, [begin(), ("add", {"pick": 0, "channel": "socket"}),
                     ("allocate", {"claim": "ca", "slot": None, "device": "dev0", "node": NODE})])


def test_a_rotated_token_is_reread_after_401(harness: Harness) -> None:
    """The old token is refused by the server before the ADD: the publisher must re-read its tokenFile."""
    replay(harness, [begin(True), ("rotate_token", {}),
                     ("add", {"pick": 0, "channel": "socket"})])


def test_planned_rotation_and_api_server_restart_between_cni_verbs(harness: Harness) -> None:
    """A heavy sequence's plan: token rotated after CNI step 1, API server down for steps 2-3."""
    replay(harness, steps_from_hypothesis("""
        state.begin(heavy=True, first='spool', plan=1)
        state.cni(channel='socket', pick=0, verb='ADD')
        state.cni(channel='spool', pick=0, verb='DEL')
        state.cni(channel='socket', pick=1, verb='ADD')
        state.cni(channel='socket', pick=0, verb='CHECK')
        state.cni(channel='spool', pick=1, verb='GC')
    """))


def test_api_server_restart_delays_but_does_not_lose(harness: Harness) -> None:
    replay(harness, [begin(True), ("stop_apiserver", {}),
                     ("add", {"pick": 3, "channel": "socket"}), ("start_apiserver", {})])


def test_api_cut_and_publisher_sigkill(harness: Harness) -> None:
    replay(harness, [begin(), ("cut_api", {}),
                     ("add", {"pick": 0, "channel": "socket"}), ("kill_publisher", {}),
                     ("add", {"pick": 2, "channel": "socket"}), ("restore_api", {}), ("start_publisher", {})])


def test_check_drift_then_new_sandbox_of_the_same_pod(harness: Harness) -> None:
    """Ready=False after a drifting CHECK; a new sandbox of the same pod replaces the entry."""
    replay(harness, [begin(), ("add", {"pick": 0, "channel": "socket"}),
                     ("drift", {"pick": 0}), ("check", {"pick": 0, "channel": "spool"}),
                     ("new_sandbox", {"slot": 0}), ("add", {"pick": 3, "channel": "socket"})])


def test_a_lost_carrier_is_shown_and_a_del_while_the_publisher_is_down_is_not_undone(harness: Harness) -> None:
    """The live watch's view against events: the carrier goes, the entry says NoCarrier; the carrier
    comes back while the publisher is down and the attachment is DELeted through the spool: on
    restart the DEL wins (the watch's observation of the old attachment never writes it back),
    and the other attachment shows Ready again; at the end one loses its carrier for good."""
    replay(harness, [begin(), ("add", {"pick": 0, "channel": "socket"}), ("add", {"pick": 1, "channel": "socket"}),
                     ("carrier", {"pick": 0}), ("carrier", {"pick": 1}), ("kill_publisher", {}),
                     ("carrier", {"pick": 0}), ("delete", {"pick": 1, "channel": "spool"}),
                     ("start_publisher", {}), ("new_sandbox", {"slot": 0}), ("add", {"pick": 3, "channel": "socket"}),
                     ("carrier", {"pick": 0})])


def test_an_add_before_its_claim_is_reserved_is_published_once_it_is(harness: Harness) -> None:
    """Informer lag / scheduler order: p2's ADD arrives before ca is reserved for p2."""
    replay(harness, [begin(), ("new_sandbox", {"slot": 2}), ("add", {"pick": 4, "channel": "socket"}),
                     ("allocate", {"claim": "ca", "slot": 2, "device": "dev1", "node": NODE})])


def test_reallocation_to_the_same_pod_on_another_device_republishes(harness: Harness) -> None:
    """F3, minimised from seq2: p1's net1 is live and published on cb/dev0; cb is deallocated and
    (after the publisher has seen that) allocated again to p1 with dev1: the live attachment must
    show on dev1. Reallocated at once (no step between) it passes: the publisher never saw the gap."""
    replay(harness, [("begin", {"first": "socket"}),
                     ("allocate", {"claim": "cb", "slot": None, "device": "dev0", "node": NODE}),
                     ("kill_publisher", {}),  # any step in between: the publisher has seen the deallocation
                     ("allocate", {"claim": "cb", "slot": 1, "device": "dev1", "node": NODE})])


def test_shared_claim_shows_the_latest_attachment_and_falls_back(harness: Harness) -> None:
    """ca shared by p0 and p2: p2's later ADD wins the one entry of dev0; after its DEL, p0's is back."""
    replay(harness, [("begin", {"first": "socket"}), ("share", {"claim": "ca", "slot": 1}),
                     ("new_sandbox", {"slot": 2}), ("add", {"pick": 2, "channel": "spool"})])
    replay(harness, [("begin", {"first": "socket"}), ("share", {"claim": "ca", "slot": 1}),
                     ("new_sandbox", {"slot": 2}), ("add", {"pick": 2, "channel": "socket"}),
                     ("delete", {"pick": 2, "channel": "socket"})])


def test_a_check_of_an_older_sandbox_does_not_replace_the_latest_sandbox(harness: Harness) -> None:
    """F4, minimised from seq3: p0 has an older sandbox (its DEL never came) and a newer one, both
    ADDed; a CHECK of the OLDER one (drift) must not make its data the claim's entry: the entry
    stays the latest sandbox's (newer containerID, IPs, MAC, Ready=True)."""
    replay(harness, steps_from_hypothesis("""
        state.begin(first='socket')
        state.new_sandbox(slot=0)
        state.add(pick=2, channel='socket')
        state.drift(pick=0)
        state.check(pick=0, channel='socket')
    """))


def test_interfaces_are_followed_again_after_the_journal_refused_a_live_watch_write(harness: Harness) -> None:
    """Another process holds the journal's write lock past SQLite's busy timeout while p0's IPv4
    address is removed: the live watch cannot record it (the thread crashed on that error and was
    restarted by the supervisor). Once the lock is released that change must land, a later one of
    the same attachment too (its carrier goes: ca shows Ready=False without the address), and p1's
    netns, removed without a DEL afterwards, is retired (cb has no entry left)."""
    replay(harness, [("begin", {"first": "socket"}), ("lock_journal", {"pick": 0}),
                     ("carrier", {"pick": 0}), ("remove_netns", {"pick": 1})])


# ---------------------------------------------------------------- sequences the model test failed on

def steps_from_hypothesis(text: str) -> Steps:
    """`state.add(pick=0, channel='spool')` lines as hypothesis prints them -> a step list."""
    steps: Steps = []
    for line in text.strip().splitlines():
        line = line.strip()
        if not line.startswith("state.") or line.startswith("state.teardown"):
            continue
        call = ast.parse(line.removeprefix("state."), mode="eval").body
        assert isinstance(call, ast.Call) and isinstance(call.func, ast.Name), line
        steps.append((call.func.id, {kw.arg: ast.literal_eval(kw.value) for kw in call.keywords if kw.arg}))
    return steps


# name -> the failing sequence as printed (the first lines: what was observed, and the finding).
FOUND: dict[str, str] = {
    # F2: 403 right after the API server restarted (RBAC cache not synced yet) was taken as permanent:
    # the ADD of p1's eth0... was dropped ("event dropped", reason unresolvable) and never published.
    "seq1_403_after_apiserver_restart_drops_event": """
        state.begin(first='socket', heavy=True)
        state.disturb(claim='cb', device='dev1', kind='start_publisher', node='node-a', slot=None)
        state.cni(channel='socket', pick=2, verb='CHECK')
        state.cni(channel='spool', pick=1, verb='GC')
        state.cni(channel='spool', pick=7, verb='CHECK')
        state.new_sandbox(slot=2)
        state.disturb(claim='cb', device='dev0', kind='stop_apiserver', node='node-a', slot=0)
        state.cni(channel='socket', pick=1, verb='ADD')
        state.disturb(claim='ca', device='dev0', kind='start_publisher', node='node-b', slot=0)
        state.cni(channel='lost', pick=2, verb='DEL')
        state.drift(pick=4)
        state.drift(pick=5)
        state.cni(channel='spool', pick=6, verb='DEL')
        state.new_sandbox(slot=1)
        state.drift(pick=3)
        state.disturb(claim='ca', device='dev0', kind='stop_apiserver', node='node-b', slot=None)
        state.cni(channel='socket', pick=3, verb='ADD')
        state.cni(channel='socket', pick=2, verb='GC')
        state.cni(channel='spool', pick=1, verb='CHECK')
        state.cni(channel='socket', pick=7, verb='DEL')
    """,
    # F3: cb deallocated, later allocated again to the same pod p1 (dev1); p1's net1 (ADDed at begin)
    # is live but never published on dev1: expected {"dev1": p1's net1}, observed {}.
    "seq2_reallocated_claim_not_republished": """
        state.begin(heavy=False, first='socket')
        state.disturb(claim='ca', device='dev1', kind='delete_pod', node='node-a', slot=2)
        state.disturb(claim='cb', device='dev1', kind='allocate', node='node-a', slot=None)
        state.disturb(claim='ca', device='dev0', kind='allocate', node='node-a', slot=2)
        state.disturb(claim='ca', device='dev0', kind='recreate_pod', node='node-b', slot=0)
        state.disturb(claim='ca', device='dev1', kind='delete_pod', node='node-a', slot=None)
        state.disturb(claim='cb', device='dev1', kind='allocate', node='node-a', slot=0)
        state.disturb(claim='ca', device='dev1', kind='rotate_token', node='node-a', slot=1)
        state.disturb(claim='cb', device='dev1', kind='kill_publisher', node='node-a', slot=None)
        state.disturb(claim='ca', device='dev0', kind='cut_api', node='node-b', slot=1)
        state.disturb(claim='ca', device='dev0', kind='delete_pod', node='node-a', slot=None)
        state.disturb(claim='ca', device='dev0', kind='restore_api', node='node-b', slot=0)
        state.disturb(claim='ca', device='dev1', kind='restore_api', node='node-a', slot=2)
        state.disturb(claim='ca', device='dev1', kind='stop_apiserver', node='node-a', slot=None)
        state.disturb(claim='cb', device='dev1', kind='start_publisher', node='node-b', slot=None)
        state.disturb(claim='cb', device='dev0', kind='recreate_pod', node='node-a', slot=1)
        state.disturb(claim='ca', device='dev0', kind='start_publisher', node='node-a', slot=0)
        state.disturb(claim='cb', device='dev1', kind='rotate_token', node='node-a', slot=None)
        state.disturb(claim='ca', device='dev1', kind='allocate', node='node-a', slot=1)
        state.disturb(claim='ca', device='dev0', kind='recreate_pod', node='node-a', slot=None)
    """,
    # F4: a drifting CHECK of p0's OLDER sandbox (s0) after the newer sandbox s2 was ADDed made s0's
    # data (IPs .70, old MAC, Ready False) the entry of ca/dev0; expected s2's (IPs .72, Ready True).
    "seq3_check_of_older_sandbox_replaces_latest": """
        state.begin(plan=4, first='spool', heavy=False)
        state.new_sandbox(slot=0)
        state.drift(pick=6)
        state.cni(channel='spool', pick=5, verb='DEL')
        state.cni(channel='spool', pick=4, verb='ADD')
        state.new_sandbox(slot=2)
        state.drift(pick=7)
        state.cni(channel='spool', pick=6, verb='ADD')
        state.drift(pick=2)
        state.cni(channel='socket', pick=4, verb='DEL')
        state.cni(channel='spool', pick=4, verb='CHECK')
        state.new_sandbox(slot=2)
        state.cni(channel='socket', pick=1, verb='GC')
        state.cni(channel='socket', pick=2, verb='GC')
        state.cni(channel='lost', pick=2, verb='ADD')
        state.cni(channel='socket', pick=4, verb='ADD')
    """,
}


@pytest.mark.parametrize("name", sorted(FOUND))
def test_found_sequence(harness: Harness, name: str) -> None:
    replay(harness, steps_from_hypothesis(FOUND[name]))


def test_a_reboot_retires_every_sandbox_of_the_earlier_boot_and_the_new_ones_publish(harness: Harness) -> None:
    """After a crash nothing sends a DEL; the pods and claims survive with their UIDs. The dead
    sandboxes' entries must leave the claims, late events of the earlier boot (a DEL spooled
    while the publisher was down) must change nothing, and the new boot's sandboxes publish."""
    replay(harness, [("begin", {"heavy": False, "first": "socket"}),
                     ("kill_publisher", {}),
                     ("delete", {"pick": 0, "channel": "spool"}),  # spooled in the earlier boot
                     ("reboot", {}),
                     ("new_sandbox", {"slot": 0}),  # p0 comes back; p1's new sandbox never reaches netclaim
                     ("add", {"pick": 0, "channel": "socket"}),
                     ("add", {"pick": 1, "channel": "spool"})])
