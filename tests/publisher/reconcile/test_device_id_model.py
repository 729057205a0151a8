"""Model-based test: interfaces of one request stay on the devices carrying their IDs, in every order.

dra-driver-sriov's multi-VF shape (one request `vf`, `count: 2`, the same network twice): Multus
hands net1 the lower device ID and net2 the higher, whatever order the allocation lists the
devices in. A hypothesis RuleBasedStateMachine drives, in random order, the real plugin's ADD and
DEL of net1/net2 (socket or spool), publisher SIGKILL and restart, the driver republishing its
devices under new names with the claim allocated again (the new slice before or after the new
allocation), against the real kube-apiserver. Once quiet, the claim must show exactly one entry
per live interface, on the allocated device whose slice carries that interface's ID.

Derandomized (the same sequences every run); NETCLAIM_DEVICE_MODEL_EXAMPLES sets how many.
A failure prints the step list: make it a regression test in this file.
"""

from __future__ import annotations

import os
import random

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, precondition, rule, run_state_machine_as_test

from cni_plugin.wire.event import PodRef
from publisher_testkit import (DRIVER, MERGE, NO_NETNS, Cluster, Plugin, Publisher, cni_result, drained, suffix, wait_until)

EXAMPLES = int(os.environ.get("NETCLAIM_DEVICE_MODEL_EXAMPLES", "8"))
FAST = ["--spool-interval", "0.2", "--resync-interval", "1", "--retry-max-delay", "1"]
# Multus's order: the network listed first gets the lowest sorted ID.
IDS = {"net1": "0000:00:05.0", "net2": "0000:00:05.3"}
ADDRESSES = {"net1": ("10.81.0.5/24", "0a:58:0a:51:00:05"), "net2": ("10.82.0.5/24", "0a:58:0a:52:00:05")}


class Node:
    """The real parts one sequence drives: a pod with a two-VF claim, the plugin, one publisher."""

    def __init__(self, cluster: Cluster, make_publisher, workdir) -> None:
        self.cluster = cluster
        self.publisher: Publisher = make_publisher(extra=FAST, sub=f"p{suffix()}")
        self.plugin = Plugin(self.publisher.socket, self.publisher.spool, workdir)
        self.pod, self.claim, self.cid = f"vf{suffix()}", f"vfs{suffix()}", "c" + suffix()
        self.generation = 0
        self.devices: dict[str, str] = {}  # allocated device name -> the ID its slice carries
        self.slices: list[str] = []
        self.live: set[str] = set()  # interfaces added and not deleted
        cluster.claim(self.claim, ("vf",))
        self.uid = cluster.pod(self.pod, [self.claim])
        self.allocate(slice_first=True, rng=random.Random(0))

    def _slice(self, names: dict[str, str], pool: str) -> None:
        name = f"{self.cluster.namespace}-{pool}"
        self.cluster.resource.create_resource_slice({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": name},
            "spec": {"driver": DRIVER, "nodeName": self.cluster.node,
                     "pool": {"name": pool, "generation": 1, "resourceSliceCount": 1},
                     "devices": [{"name": n, "attributes": {"k8s.cni.cncf.io/deviceID": {"string": i}}}
                                 for n, i in names.items()]}})
        self.slices.append(name)

    def allocate(self, slice_first: bool, rng: random.Random) -> None:
        """The driver publishes its two VFs under new names (random pairing), the claim is allocated again."""
        self.generation += 1
        pool = f"g{self.generation}-{suffix()}"
        ids = list(IDS.values())
        rng.shuffle(ids)
        names = {f"vf-{k}": ids[k] for k in range(2)}
        order = list(names)
        rng.shuffle(order)  # the allocation's order is not the IDs' order
        if self.generation > 1:
            self.cluster.resource.patch_namespaced_resource_claim_status(
                self.claim, self.cluster.namespace, {"status": {"reservedFor": None, "allocation": None}},
                _content_type=MERGE)
        if slice_first:
            self._slice(names, pool)
        self.cluster.allocate(self.claim, [("vf", n) for n in order], self.pod, self.uid, pool=pool)
        if not slice_first:
            self._slice(names, pool)
        self.devices = names

    def cni(self, verb: str, ifname: str, channel: str) -> None:
        ipv4, mac = ADDRESSES[ifname]
        prev = cni_result(ifname=ifname, ipv4=ipv4, ipv6=None, mac=mac)
        conf = self.plugin.conf(prev, request_name="vf")
        conf["capabilities"] = {"deviceID": True}
        conf["runtimeConfig"] = {"deviceID": IDS[ifname]}
        if channel == "spool":
            conf["socketPath"] = self.publisher.socket + ".none"
        out = self.plugin.run(verb, self.cid, PodRef(self.cluster.namespace, self.pod, self.uid), ifname=ifname,
                              netns=NO_NETNS, conf=conf)
        assert out.returncode == 0, out.stdout + out.stderr

    def expected(self) -> dict[str, str]:
        by_id = {i: n for n, i in self.devices.items()}
        return {by_id[IDS[ifname]]: ifname for ifname in self.live}

    def observed(self) -> dict[str, str]:
        return {e["device"]: e["networkData"]["interfaceName"] for e in self.cluster.devices(self.claim)
                if e.get("driver") == DRIVER}

    def settle(self) -> None:
        if self.publisher.proc is None or self.publisher.proc.poll() is not None:
            self.publisher.start()
        drained(self.publisher, timeout=60)
        wait_until(f"claim {self.claim} to show {self.expected()}", lambda: self.observed() == self.expected(),
                   timeout=60)

    def cleanup(self) -> None:
        self.publisher.kill()
        for name in self.slices:
            try:
                self.cluster.resource.delete_resource_slice(name)
            except Exception:  # noqa: BLE001 - already gone
                pass


def machine_for(cluster: Cluster, make_publisher, workdir) -> type[RuleBasedStateMachine]:
    class VfMachine(RuleBasedStateMachine):
        node: Node

        @initialize()
        def begin(self) -> None:
            self.node = Node(cluster, make_publisher, workdir)

        def teardown(self) -> None:
            node = getattr(self, "node", None)
            if node is None:
                return
            try:
                node.settle()
            finally:
                node.cleanup()

        @rule(ifname=st.sampled_from(["net1", "net2"]), channel=st.sampled_from(["socket", "socket", "spool"]))
        def add(self, ifname: str, channel: str) -> None:
            self.node.cni("ADD", ifname, channel)
            self.node.live.add(ifname)

        @precondition(lambda self: self.node.live)
        @rule(pick=st.integers(0, 1), channel=st.sampled_from(["socket", "spool"]))
        def delete(self, pick: int, channel: str) -> None:
            ifname = sorted(self.node.live)[pick % len(self.node.live)]
            self.node.cni("DEL", ifname, channel)
            self.node.live.discard(ifname)

        @rule()
        def restart_publisher(self) -> None:
            self.node.publisher.kill()
            self.node.publisher.start()

        @precondition(lambda self: self.node.generation < 3)
        @rule(slice_first=st.booleans(), seed=st.integers(0, 1 << 16))
        def republish_and_reallocate(self, slice_first: bool, seed: int) -> None:
            self.node.allocate(slice_first, random.Random(seed))

    return VfMachine


@pytest.mark.controlplane
def test_each_interface_stays_on_the_device_with_its_id_under_random_orderings(cluster: Cluster, publisher_factory,
                                                                                workdir) -> None:
    run_state_machine_as_test(machine_for(cluster, publisher_factory, workdir), settings=settings(
        max_examples=EXAMPLES, stateful_step_count=8, deadline=None, derandomize=True, database=None,
        print_blob=True, phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck)))


@pytest.mark.controlplane
def test_a_claim_published_before_publisher_restarts_is_shown_published_not_pending(cluster: Cluster,
                                                                                     publisher_factory,
                                                                                     workdir) -> None:
    """Found by the model (60 examples): after restarts that came once its apply was done, the
    claim was listed as `pending` by a quiescent publisher that had nothing left to do for it."""
    node = Node(cluster, publisher_factory, workdir)
    try:
        node.publisher.kill()
        node.publisher.start()
        node.cni("ADD", "net1", "socket")
        node.live.add("net1")
        node.settle()
        for _ in range(3):
            node.publisher.kill()
            node.publisher.start()
        node.settle()  # drained(): quiescent, and no claim shown as pending
        assert node.publisher.status()["claims"][f"{cluster.namespace}/{node.claim}"]["state"] == "published"
    finally:
        node.cleanup()
