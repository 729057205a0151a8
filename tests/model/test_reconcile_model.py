"""Model-based test: the right claim status under every ordering a node produces.

A hypothesis RuleBasedStateMachine drives the real node parts (see modelkit.py):
ADD, DEL, CHECK and GC through the real plugin for 3 pods and 2 claims, each
delivered over the socket or through the spool (or lost, for a DEL whose
spool is unwritable), publisher SIGKILL and restart, a node reboot (every sandbox dies,
publisher and plugin come back in a new boot, nothing sends a DEL), API cut at a TCP proxy,
the real API server stopped and started, token rotation with 401s, claim
deallocation and reallocation (to another pod, another device, another node), a
claim shared by a second pod (reservedFor with two pods: one entry, the latest attachment),
pod deletion and re-creation, the interface changing under the publisher in the real netns
(an address removed, the carrier lost and regained: the live watch shows them), and a supervised
thread's journal write failing (lock_journal): another process holds the journal's SQLite write
lock past the busy timeout while a watched interface changes (an address removed, else its carrier),
so the live watch cannot
record it (a watch that let the error out crashed and was restarted by the supervisor); the
entries it watched before must follow their interface again. A netns removed without a DEL is
not a rule: whether the live watch had it open decides the outcome, and the publisher's
quiet moments are timing (a rule whose effect depends on them makes generation flaky); the
replayed test_regressions.py removes one after the journal fault (Scenario.remove_netns).
After each sequence the node is made healthy
again and, once quiet, every claim's netclaim entries must be exactly what the
model says (Model.expected_devices). Expensive steps (API server restart, token
rotation) are only enabled in "heavy" sequences (about 1 in 20), at most
once each, and planned at a drawn CNI step when the rules did not pick them;
the publisher is killed at most once per sequence (twice when heavy); the journal
lock (held about 5 s) only happens in "fault" sequences (about 1 in 4), at most
once; the other non-CNI steps are capped per sequence so that most steps are CNI verbs.

CI runs NETCLAIM_MODEL_EXAMPLES (default 60) sequences, derandomized (same
sequences every run, no example database). It ran 200 until the safety net replaced the 300 s
resync: a sequence now takes several times longer (30 sequences took 11 minutes), so 200 no
longer fit CI's hour; run NETCLAIM_MODEL_EXAMPLES=200 or more by hand. A failure prints the step list
(and a @reproduce_failure blob); paste it into test_regressions.py. Shrinking
is off by default (each run of a sequence costs seconds on the real stack);
NETCLAIM_MODEL_SHRINK=1 turns it on when minimising a failure by hand.
"""

from __future__ import annotations

import os
import time

import pytest
from hypothesis import HealthCheck, Phase, Verbosity, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, precondition, rule, run_state_machine_as_test

from modelkit import NODE, OTHER_NODE
from scenario import Harness, Scenario

pytestmark = [pytest.mark.controlplane, pytest.mark.netns]

EXAMPLES = int(os.environ.get("NETCLAIM_MODEL_EXAMPLES", "60"))
STEPS = int(os.environ.get("NETCLAIM_MODEL_STEPS", "16"))
MAX_SANDBOXES = 5

# One rule for the four verbs, weighted towards ADD (a node ADDs before it can DEL, CHECK or GC).
verbs = st.sampled_from(["ADD", "ADD", "ADD", "DEL", "DEL", "CHECK", "GC"])
del_channels = st.sampled_from(["socket", "socket", "spool", "lost"])  # "lost" is for DEL only
picks = st.integers(0, 7)
# Everything that is not a CNI verb, in one rule so that CNI verbs stay most of the steps;
# a kind that does not apply at that point (see Scenario.disturb) is a no-op.
kinds = st.sampled_from(["kill_publisher", "start_publisher", "reboot", "cut_api", "restore_api", "stop_apiserver",
                         "start_apiserver", "rotate_token", "allocate", "allocate", "delete_pod", "recreate_pod",
                         "share"])


def machine_for(harness: Harness) -> type[RuleBasedStateMachine]:
    class NodeMachine(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.s = Scenario(harness)

        def do(self, step: str, **kwargs: object) -> None:
            if step != "cni":  # Scenario.cni counts per verb and channel
                harness.steps[step] += 1
            self.s.done[step] += 1
            getattr(self.s, step)(**kwargs)

        @initialize(heavy=st.sampled_from([False] * 19 + [True]), first=st.sampled_from(["socket", "spool"]),
                    plan=st.integers(0, 6), faults=st.sampled_from([False] * 3 + [True]))
        def begin(self, heavy: bool, first: str, plan: int, faults: bool) -> None:
            self.s.begin(heavy, first, plan, faults)

        def teardown(self) -> None:
            try:
                if getattr(self.s, "sid", ""):
                    self.s.settle()
            finally:
                self.s.cleanup()

        # -------------------------------------------------- CNI verbs

        @precondition(lambda self: len(self.s.sandboxes) < MAX_SANDBOXES and self.s.alive_slots())
        @rule(slot=st.integers(0, 2))
        def new_sandbox(self, slot: int) -> None:
            self.do("new_sandbox", slot=slot)

        @rule(verb=verbs, pick=picks, channel=del_channels)
        def cni(self, verb: str, pick: int, channel: str) -> None:
            self.do("cni", verb=verb, pick=pick, channel=channel)

        @precondition(lambda self: self.s.driftable())
        @rule(pick=picks)
        def drift(self, pick: int) -> None:
            self.do("drift", pick=pick)

        @precondition(lambda self: self.s.deletable())
        @rule(pick=picks)
        def carrier(self, pick: int) -> None:
            self.do("carrier", pick=pick)

        # heavy sequences: the expensive steps get rules of their own so that they do happen
        @precondition(lambda self: self.s.heavy and harness.apiserver_up and not self.s.apiserver_restarts)
        @rule()
        def stop_apiserver(self) -> None:
            self.do("stop_apiserver")

        @precondition(lambda self: not harness.apiserver_up)
        @rule()
        def start_apiserver(self) -> None:
            self.do("start_apiserver")

        @precondition(lambda self: self.s.heavy and harness.apiserver_up and not self.s.rotations)
        @rule()
        def rotate_token(self) -> None:
            self.do("rotate_token")

        # fault sequences (about 1 in 4), at most once: the lock costs about 6 s
        @precondition(lambda self: self.s.faults and not self.s.count("lock_journal") and harness.publisher.running
                      and self.s.deletable())
        @rule(pick=picks)
        def lock_journal(self, pick: int) -> None:
            self.do("lock_journal", pick=pick)

        @rule(kind=kinds, claim=st.sampled_from(["ca", "cb"]), slot=st.one_of(st.none(), st.integers(0, 2)),
              device=st.sampled_from(["dev0", "dev1"]), node=st.sampled_from([NODE, NODE, OTHER_NODE]))
        def disturb(self, kind: str, claim: str, slot: int | None, device: str, node: str) -> None:
            self.s.disturb(kind, claim, slot, device, node)  # counts the kinds that applied

    return NodeMachine


def test_claim_status_matches_the_model_under_random_interleavings(harness: Harness) -> None:
    phases = [Phase.explicit, Phase.generate]
    if os.environ.get("NETCLAIM_MODEL_SHRINK"):
        phases.append(Phase.shrink)
    started = time.time()
    run_state_machine_as_test(machine_for(harness), settings=settings(
        max_examples=EXAMPLES, stateful_step_count=STEPS, deadline=None, derandomize=True, database=None,
        print_blob=True, phases=phases, suppress_health_check=list(HealthCheck),
        verbosity=Verbosity.verbose if os.environ.get("NETCLAIM_MODEL_VERBOSE") else Verbosity.normal))
    print(f"model: {harness.sequences} sequences, {harness.sandboxes} sandboxes in {time.time() - started:.0f}s; "
          f"steps: {dict(sorted(harness.steps.items()))}")
