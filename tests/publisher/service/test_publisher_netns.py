"""End to end on a real network namespace: the reference bridge + host-local chain,
then the real netclaim plugin, exactly as a runtime runs a conflist; the
publisher must publish what the netns really has."""

from __future__ import annotations

import subprocess

import pytest

from cni_plugin.wire.event import PodRef
from livewatch_kit import CNI_BIN, netns_addresses, plugin_binary, run_plugin
from publisher_testkit import Cluster, suffix

pytestmark = [pytest.mark.controlplane, pytest.mark.netns]

@pytest.fixture()
def netns():
    name = f"pubt-{suffix()}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    yield name
    subprocess.run(["ip", "netns", "del", name], check=False)


def test_bridge_host_local_netclaim_chain_publishes_the_netns_truth(cluster: Cluster, publisher, plugin, netns,
                                                                    workdir):
    claim, uid = cluster.pod_with_claim("netpod", [("nic", "nic0")])
    pod = PodRef(cluster.namespace, "netpod", uid)
    cid, bridge, octet = "e2e" + suffix(), "pbr" + suffix(), int(suffix()[:2], 16) % 200 + 20
    network = "testnet"
    bridge_conf = {
        # Debian's reference plugins (1.1.x) speak CNI up to 1.0.0; the plugin normalizes the result.
        "cniVersion": "1.0.0", "name": network, "type": "bridge", "bridge": bridge, "isGateway": True,
        "ipam": {"type": "host-local", "dataDir": str(workdir / "ipam"),
                 "ranges": [[{"subnet": f"10.{octet}.0.0/24"}], [{"subnet": f"fd00:0:{octet:x}::/64"}]]},
    }
    nspath = f"/var/run/netns/{netns}"
    try:
        prev = run_plugin(f"{CNI_BIN}/bridge", "ADD", bridge_conf, cid, nspath, pod)
        result = run_plugin(str(plugin_binary()), "ADD", {**plugin.conf(prev), "name": network, "cniVersion": "1.0.0"}, cid, nspath, pod)
        assert result["ips"] == prev["ips"]  # a chained plugin passes the result on
        mac, ips = netns_addresses(netns)
        devices = cluster.wait_devices(claim, lambda d: len(d) == 1)
        net = devices[0]["networkData"]
        assert net["interfaceName"] == "eth0"
        assert net["hardwareAddress"] == mac.lower()
        assert sorted(net["ips"]) == sorted(ips)
        assert any(":" in ip for ip in net["ips"]) and any("." in ip for ip in net["ips"])
        assert devices[0]["conditions"][0]["status"] == "True"
        # Teardown as a runtime does it: DEL in reverse order.
        run_plugin(str(plugin_binary()), "DEL", {**plugin.conf(prev), "name": network, "cniVersion": "1.0.0"}, cid, nspath, pod)
        cluster.wait_devices(claim, lambda d: d == [])
    finally:
        try:
            run_plugin(f"{CNI_BIN}/bridge", "DEL", bridge_conf, cid, nspath, pod)
        except AssertionError:
            pass  # cleanup only; the test's own assertion is what reports
        subprocess.run(["ip", "link", "del", bridge], capture_output=True)
