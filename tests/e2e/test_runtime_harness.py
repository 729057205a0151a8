"""The harness itself: containerd runs a plain bridge + host-local chain for a pod sandbox.

If this fails, every other e2e test would fail for a reason that has nothing
to do with netclaim; it pins the runtime down first.
"""

from __future__ import annotations

import ipaddress
import os
import uuid

import pytest

from runtime.cri import PodMeta

pytestmark = [pytest.mark.containerd]


def test_sandbox_gets_eth0_with_an_ip_from_the_chain(harness, plain_chain):
    pod = PodMeta(name="plain", namespace="e2e-plain", uid=str(uuid.uuid4()))
    sandbox = harness.run_pod(pod)
    try:
        assert sandbox.state == "SANDBOX_READY"
        eth0 = harness.interface_in_netns(sandbox.netns, "eth0")
        subnet = ipaddress.ip_network(harness.network.subnet)
        assert [ipaddress.ip_interface(c).ip in subnet for c in eth0.cidrs] == [True]
        assert eth0.cidrs[0].split("/")[0] == sandbox.ip  # what the runtime reports = what the pod has
        assert len(eth0.mac.split(":")) == 6
    finally:
        harness.stop_pod(sandbox.id)
        harness.remove_pod(sandbox.id)
    assert sandbox.id not in harness.cri.list_sandboxes()
    assert not os.path.exists(sandbox.netns)  # the netns mount went with the sandbox
