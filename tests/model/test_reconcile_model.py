"""Model-based test of issue 9: the right claim status under every ordering a node produces.

A hypothesis RuleBasedStateMachine drives the real node parts (see modelkit.py):
ADD, DEL, CHECK and GC through the real plugin for 3 pods and 2 claims, each
delivered over the socket or through the spool (or lost, for a DEL whose
spool is unwritable), publisher SIGKILL and restart, API cut at a TCP proxy,
the real API server stopped and started, token rotation with 401s, claim
deallocation and reallocation (to another pod, another device, another node),
pod deletion and re-creation. After each sequence the node is made healthy
again and, once quiet, every claim's netclaim entries must be exactly what the
model says (Model.expected_devices). Expensive steps (API server restart, token
rotation) are only enabled in "heavy" sequences (about 1 in 10) and at most
once each; the publisher is killed at most twice per sequence.

CI runs NETCLAIM_MODEL_EXAMPLES (default 200) sequences, derandomized (same
sequences every run, no example database). A failure prints the step list
(and a @reproduce_failure blob); paste it into test_regressions.py. Shrinking
is off by default (each run of a sequence costs seconds on the real stack);
NETCLAIM_MODEL_SHRINK=1 turns it on when minimising a failure by hand.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, precondition, rule, run_state_machine_as_test

from modelkit import NODE, OTHER_NODE
from scenario import Harness, Scenario

pytestmark = [pytest.mark.controlplane, pytest.mark.netns]

EXAMPLES = int(os.environ.get("NETCLAIM_MODEL_EXAMPLES", "200"))
STEPS = int(os.environ.get("NETCLAIM_MODEL_STEPS", "12"))
MAX_SANDBOXES = 4

channels = st.sampled_from(["socket", "socket", "spool"])
del_channels = st.sampled_from(["socket", "socket", "spool", "lost"])
picks = st.integers(0, 7)


def machine_for(harness: Harness) -> type[RuleBasedStateMachine]:
    class NodeMachine(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.s = Scenario(harness)

        @initialize(heavy=st.sampled_from([False] * 9 + [True]))
        def begin(self, heavy: bool) -> None:
            self.s.begin(heavy)

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
            self.s.new_sandbox(slot)

        @precondition(lambda self: self.s.addable())
        @rule(pick=picks, channel=channels)
        def add(self, pick: int, channel: str) -> None:
            self.s.add(pick, channel)

        @precondition(lambda self: self.s.deletable())
        @rule(pick=picks, channel=del_channels)
        def delete(self, pick: int, channel: str) -> None:
            self.s.delete(pick, channel)

        @precondition(lambda self: self.s.deletable())
        @rule(pick=picks, channel=channels)
        def check(self, pick: int, channel: str) -> None:
            self.s.check(pick, channel)

        @precondition(lambda self: self.s.deletable())
        @rule(pick=picks)
        def drift(self, pick: int) -> None:
            self.s.drift(pick)

        @rule(network=st.integers(0, 1), channel=channels)
        def gc(self, network: int, channel: str) -> None:
            self.s.gc(network, channel)

        # -------------------------------------------------- failures of the node's parts

        @precondition(lambda self: harness.publisher.running and self.s.kills < 2)
        @rule()
        def kill_publisher(self) -> None:
            self.s.kill_publisher()

        @precondition(lambda self: not harness.publisher.running)
        @rule()
        def start_publisher(self) -> None:
            self.s.start_publisher()

        @precondition(lambda self: harness.proxy.up)
        @rule()
        def cut_api(self) -> None:
            self.s.cut_api()

        @precondition(lambda self: not harness.proxy.up)
        @rule()
        def restore_api(self) -> None:
            self.s.restore_api()

        @precondition(lambda self: self.s.heavy and harness.apiserver_up and not self.s.apiserver_restarts)
        @rule()
        def stop_apiserver(self) -> None:
            self.s.stop_apiserver()

        @precondition(lambda self: not harness.apiserver_up)
        @rule()
        def start_apiserver(self) -> None:
            self.s.start_apiserver()

        @precondition(lambda self: self.s.heavy and harness.apiserver_up and not self.s.rotations)
        @rule()
        def rotate_token(self) -> None:
            self.s.rotate_token()

        # -------------------------------------------------- scheduler and user (need the API server)

        @precondition(lambda self: harness.apiserver_up)
        @rule(claim=st.sampled_from(["ca", "cb"]), slot=st.one_of(st.none(), st.integers(0, 2)),
              device=st.sampled_from(["dev0", "dev1"]), node=st.sampled_from([NODE, NODE, OTHER_NODE]))
        def allocate(self, claim: str, slot: int | None, device: str, node: str) -> None:
            self.s.allocate(claim, slot, device, node)

        @precondition(lambda self: harness.apiserver_up and self.s.alive_slots())
        @rule(slot=st.integers(0, 2))
        def delete_pod(self, slot: int) -> None:
            self.s.delete_pod(slot)

        @precondition(lambda self: harness.apiserver_up and len(self.s.alive_slots()) < 3)
        @rule(slot=st.integers(0, 2))
        def recreate_pod(self, slot: int) -> None:
            self.s.recreate_pod(slot)

    return NodeMachine


def test_claim_status_matches_the_model_under_random_interleavings(harness: Harness) -> None:
    phases = [Phase.explicit, Phase.generate]
    if os.environ.get("NETCLAIM_MODEL_SHRINK"):
        phases.append(Phase.shrink)
    run_state_machine_as_test(machine_for(harness), settings=settings(
        max_examples=EXAMPLES, stateful_step_count=STEPS, deadline=None, derandomize=True, database=None,
        print_blob=True, phases=phases, suppress_health_check=list(HealthCheck)))
    print(f"model: {harness.sequences} sequences, {harness.sandboxes} sandboxes")
