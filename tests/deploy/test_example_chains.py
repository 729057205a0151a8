"""The example conflists in conf/cni/ run for real, as chains, in real network namespaces.

Each shipped conflist is loaded as it is and run the way libcni runs a list:
for ADD every plugin in order, with `name` and `cniVersion` injected from the
list and `prevResult` set to the previous plugin's stdout; for DEL every plugin
in reverse order with `prevResult` set to the chain's final ADD result. No
runtimeConfig is passed (no capability arguments), so portmap has no mappings
and bandwidth uses the static rates the example already carries.

What the test copy rewrites, and why (the rest is used unchanged):
- netclaim's socketPath/spoolDir/stateDir/logFile, host-local's dataDir and
  tuning's dataDir point into a private temp dir, so nothing touches /run or /var;
- the bridge name and the macvlan master are unique per run (the master is a
  dummy link made for the test, or a veth pair where the kernel has no dummy
  driver, since the host's eth0 is not ours to use);
- a subnet is replaced only when it overlaps a route already on the host.

The publisher is absent, so netclaim spools its event; the test reads it back
and runs the publisher's own mapper on it, then compares what the mapper would
write into ResourceClaim.status.devices with what the kernel shows in the netns.
"""

from __future__ import annotations

import copy
import ipaddress
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from cni_plugin.wire import event as wire_event
from cni_plugin.wire import spool as wire_spool
from publisher.reconcile.mapper import map_event

pytestmark = pytest.mark.netns

REPO = Path(__file__).resolve().parents[2]
CONF_CNI = REPO / "conf" / "cni"
REFERENCE_BIN = Path(os.environ.get("NETCLAIM_TEST_CNI_BIN", "/usr/lib/cni"))
IFNAME = "eth0"
POD = wire_event.PodRef("team-a", "web-0", "0f6c2f0e-6a55-4c1e-9a43-5a8d1c2b3e4f")
CNI_ARGS = f"IgnoreUnknown=1;K8S_POD_NAMESPACE={POD.namespace};K8S_POD_NAME={POD.name};K8S_POD_UID={POD.uid}"


def conflists() -> list[Path]:
    return sorted(CONF_CNI.glob("*.conflist"))


# ---------------------------------------------------------------- host helpers

def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and proc.returncode != 0:
        raise AssertionError(f"ip {' '.join(args)} failed: {proc.stderr.strip()}")
    return proc


def host_link_kind(name: str) -> str | None:
    """The link's kind (e.g. "ifb", "veth", "bridge") in the host netns, None when absent."""
    from pyroute2 import IPRoute

    with IPRoute() as ipr:
        found = ipr.link_lookup(ifname=name)
        if not found:
            return None
        info = ipr.get_links(found[0])[0].get_attr("IFLA_LINKINFO")
        return info.get_attr("IFLA_INFO_KIND") if info else ""


def host_networks() -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
    """Every non-default destination routed on the host (any table): what a new subnet must not overlap."""
    from pyroute2 import IPRoute

    nets = []
    with IPRoute() as ipr:
        for family in (2, 10):
            for route in ipr.get_routes(family=family, table=0):
                dst = route.get_attr("RTA_DST")
                if dst and route["dst_len"]:
                    nets.append(ipaddress.ip_network(f"{dst}/{route['dst_len']}", strict=False))
    return nets


def _free_subnet(old: ipaddress.IPv4Network | ipaddress.IPv6Network, taken: list) -> str:
    for _ in range(200):
        if old.version == 4:
            new = ipaddress.ip_network(f"10.{100 + secrets.randbelow(150)}.{secrets.randbelow(256)}.0/24")
        else:
            new = ipaddress.ip_network(f"fd00:{secrets.token_hex(2)}:{secrets.token_hex(2)}::/64")
        if not any(new.overlaps(n) for n in taken if n.version == new.version):
            return str(new)
    raise AssertionError(f"no free subnet to replace {old}")


def rewrite_colliding_subnets(ipam: dict[str, Any]) -> dict[str, str]:
    """Replace a host-local range's subnet (and its gateway/rangeStart/rangeEnd) only when it
    overlaps a route already on this host. Returns {old: new} for the ones replaced."""
    taken = host_networks()
    replaced = {}
    for rangeset in ipam.get("ranges") or []:
        for rng in rangeset:
            old = ipaddress.ip_network(rng["subnet"])
            if not any(old.overlaps(n) for n in taken if n.version == old.version):
                continue
            new = ipaddress.ip_network(_free_subnet(old, taken))
            for key in ("gateway", "rangeStart", "rangeEnd"):
                if key in rng:
                    offset = int(ipaddress.ip_address(rng[key])) - int(old.network_address)
                    rng[key] = str(new.network_address + offset)
            rng["subnet"] = str(new)
            replaced[str(old)] = str(new)
            taken.append(new)
    return replaced


# ---------------------------------------------------------------- the chain

@dataclass
class ChainRun:
    """One shipped conflist, rewritten for this run, executed the way libcni executes a list."""

    source: Path
    root: Path
    netns: str
    container_id: str = field(default_factory=lambda: f"ncex{secrets.token_hex(8)}")
    conflist: dict[str, Any] = field(default_factory=dict)
    host_links: list[str] = field(default_factory=list)  # links this test made in the host netns
    final_result: dict[str, Any] | None = None
    added: int = 0  # how many plugins ADD ran for (DEL runs for those, reversed)

    @property
    def netns_path(self) -> str:
        return f"/var/run/netns/{self.netns}"

    @property
    def cni_bin(self) -> Path:
        return self.root / "bin"

    @property
    def spool(self) -> str:
        return str(self.root / "spool")

    def plugin(self, ptype: str) -> dict[str, Any]:
        return next(p for p in self.conflist["plugins"] if p["type"] == ptype)

    def prepare(self) -> None:
        """Install the CNI bin dir, load the conflist and rewrite the copy for this run."""
        self.cni_bin.mkdir()
        for exe in sorted(REFERENCE_BIN.iterdir()):
            if exe.is_file() and os.access(exe, os.X_OK):
                (self.cni_bin / exe.name).symlink_to(exe)
        proc = subprocess.run([sys.executable, "-m", "cni_plugin.launcher", str(self.cni_bin / "netclaim")],
                              cwd=REPO, capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, f"cni_plugin.launcher failed: {proc.stderr}"

        self.conflist = json.loads(self.source.read_text())
        for plugin in self.conflist["plugins"]:
            ptype = plugin["type"]
            ipam = plugin.get("ipam")
            if isinstance(ipam, dict) and ipam.get("type") == "host-local":
                ipam["dataDir"] = str(self.root / "ipam")
                rewrite_colliding_subnets(ipam)
            if ptype == "bridge":
                plugin["bridge"] = f"ncexb{secrets.token_hex(4)}"
                self.host_links.append(plugin["bridge"])  # bridge DEL never removes the bridge
            elif ptype == "macvlan":
                master = f"ncexm{secrets.token_hex(4)}"
                made = _ip("link", "add", "name", master, "type", "dummy", check=False)
                if made.returncode != 0:
                    # Kernels built without CONFIG_DUMMY ("Unknown device type"): one end of a
                    # veth pair is an equally private Ethernet master; deleting it removes both ends.
                    _ip("link", "add", "name", master, "type", "veth", "peer", "name", f"{master}p")
                self.host_links.append(master)
                _ip("link", "set", master, "up")
                plugin["master"] = master
            elif ptype == "tuning":
                plugin["dataDir"] = str(self.root / "tuning")
            elif ptype == "netclaim":
                plugin.update(socketPath=str(self.root / "pub.sock"), spoolDir=self.spool,
                              stateDir=str(self.root / "state"), logFile=str(self.root / "log" / "plugin.log"))

    def _exec(self, plugin: dict[str, Any], command: str, prev: dict[str, Any] | None) -> subprocess.CompletedProcess:
        """libcni's buildOneConfig + invoke: name and cniVersion from the list, prevResult when set."""
        conf = copy.deepcopy(plugin)
        conf["name"] = self.conflist["name"]
        conf["cniVersion"] = self.conflist["cniVersion"]
        if prev is not None:
            conf["prevResult"] = prev
        env = {"CNI_COMMAND": command, "CNI_CONTAINERID": self.container_id, "CNI_NETNS": self.netns_path,
               "CNI_IFNAME": IFNAME, "CNI_PATH": str(self.cni_bin), "CNI_ARGS": CNI_ARGS,
               "PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")}
        return subprocess.run([str(self.cni_bin / plugin["type"])], input=json.dumps(conf).encode(), env=env,
                              capture_output=True, timeout=120)

    def add(self) -> list[dict[str, Any]]:
        """ADD through the whole list; returns every plugin's result, in order. Fails with the plugin's error."""
        results: list[dict[str, Any]] = []
        prev = None
        for plugin in self.conflist["plugins"]:
            proc = self._exec(plugin, "ADD", prev)
            self.added += 1
            assert proc.returncode == 0, (
                f"{self.source.name}: {plugin['type']} ADD failed (exit {proc.returncode}): "
                f"{proc.stdout.decode()} {proc.stderr.decode()}")
            prev = json.loads(proc.stdout)
            results.append(prev)
        self.final_result = prev
        return results

    def delete(self) -> list[str]:
        """DEL in reverse order with the cached final result as prevResult; returns the failures."""
        errors = []
        for plugin in reversed(self.conflist["plugins"][: self.added]):
            proc = self._exec(plugin, "DEL", self.final_result)
            if proc.returncode != 0:
                errors.append(f"{plugin['type']} DEL failed (exit {proc.returncode}): "
                              f"{proc.stdout.decode()} {proc.stderr.decode()}")
        self.added = 0
        return errors


@pytest.fixture(params=conflists(), ids=lambda p: p.name)
def chain(request: pytest.FixtureRequest):
    root = Path(tempfile.mkdtemp(prefix="ncex-"))
    name = f"ncex-{secrets.token_hex(4)}"
    _ip("netns", "add", name)
    run = ChainRun(request.param, root, name)
    try:
        run.prepare()
        yield run
    finally:
        if run.added:
            run.delete()  # the test failed before its own DEL: best effort, then remove what is left
        _ip("netns", "del", name, check=False)
        for link in run.host_links:
            _ip("link", "del", link, check=False)
        shutil.rmtree(root, ignore_errors=True)


# ---------------------------------------------------------------- kernel oracle

def sandbox_eth0(netns: str) -> dict[str, Any]:
    """eth0 inside the netns as the kernel reports it (pyroute2, independent of netclaim's netlink code)."""
    from pyroute2 import NetNS

    with NetNS(netns) as ns:
        found = ns.link_lookup(ifname=IFNAME)
        assert found, f"no {IFNAME} in netns {netns}"
        link = ns.get_links(found[0])[0]
        cidrs = sorted(
            str(ipaddress.ip_interface(f"{a.get_attr('IFA_ADDRESS')}/{a['prefixlen']}"))
            for a in ns.get_addr(index=found[0])
            if a["scope"] == 0  # global: the link-local fe80:: the kernel adds is not a CNI address
        )
        props = link.get_attr("IFLA_PROP_LIST")
        altnames = [v for k, v in props["attrs"] if k == "IFLA_ALT_IFNAME"] if props else []
        return {"mac": link.get_attr("IFLA_ADDRESS"), "mtu": link.get_attr("IFLA_MTU"),
                "txqlen": link.get_attr("IFLA_TXQLEN"), "altnames": altnames, "cidrs": cidrs}


def netns_sysctl(netns: str, key: str) -> str:
    path = "/proc/sys/" + key.replace(".", "/")
    proc = subprocess.run(["ip", "netns", "exec", netns, "cat", path], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def nat_rules_mentioning(text: str) -> list[str]:
    found = []
    for tool in ("iptables-save", "ip6tables-save"):
        if shutil.which(tool):
            out = subprocess.run([tool, "-t", "nat"], capture_output=True, text=True, timeout=30).stdout
            found += [line for line in out.splitlines() if text in line]
    return found


# ---------------------------------------------------------------- the test

def test_example_chain_reports_the_sandbox_interface(chain: ChainRun) -> None:
    types = [p["type"] for p in chain.conflist["plugins"]]
    assert types[-1] == "netclaim", f"{chain.source.name}: netclaim must be last in the chain"
    netclaim_conf = chain.plugin("netclaim")

    results = chain.add()
    final = chain.final_result
    assert final is not None and final["cniVersion"] == chain.conflist["cniVersion"]
    kernel = sandbox_eth0(chain.netns)

    # The final result still carries the host-side interfaces: netclaim must pick eth0 among them.
    sandbox_side = [i for i in final["interfaces"] if i.get("sandbox")]
    host_side = [i for i in final["interfaces"] if not i.get("sandbox")]
    assert [(i["name"], i["sandbox"]) for i in sandbox_side] == [(IFNAME, chain.netns_path)]
    host_kinds = {i["name"]: host_link_kind(i["name"]) for i in host_side}
    if "bridge" in types:
        assert host_kinds.get(chain.plugin("bridge")["bridge"]) == "bridge", host_kinds
        assert "veth" in host_kinds.values(), host_kinds
    if "ptp" in types:
        assert "veth" in host_kinds.values(), host_kinds
    if "bandwidth" in types:
        before = results[types.index("bandwidth") - 1]["interfaces"]
        ifbs = [name for name, kind in host_kinds.items() if kind == "ifb"]
        assert len(ifbs) == 1 and ifbs[0] not in {i["name"] for i in before}, (
            f"bandwidth must add its host-side ifb to interfaces[]: {final['interfaces']}")
    if "macvlan" in types:
        assert host_side == [], "macvlan reports only the pod-side interface"
    if "portmap" in types:
        i = types.index("portmap")
        assert results[i] == results[i - 1], "portmap without portMappings passes the result through"

    # The event netclaim handed off (spooled: no publisher is running) carries the 1.1.0 result.
    events = [wire_spool.read_spool(p) for p in wire_spool.list_spool(chain.spool)]
    assert len(events) == 1, events
    event = events[0]
    assert (event.op, event.container_id, event.ifname, event.driver, event.network, event.request) == (
        "ADD", chain.container_id, IFNAME, netclaim_conf["driverName"], chain.conflist["name"],
        netclaim_conf.get("request", ""))
    assert event.pod == POD
    assert event.result["cniVersion"] == "1.1.0"
    assert [i["name"] for i in event.result["interfaces"]] == [i["name"] for i in final["interfaces"]]

    # The publisher's mapper on that event: what would be written into ResourceClaim.status.devices.
    entry = map_event(event, "node-a", "nic-0")
    net = entry["networkData"]
    assert net["interfaceName"] == IFNAME
    assert sorted(net["ips"]) == kernel["cidrs"] and len(net["ips"]) == len(kernel["cidrs"]), (net, kernel)
    assert all(ip == str(ipaddress.ip_interface(ip)) for ip in net["ips"]), net["ips"]
    assert net["hardwareAddress"] == kernel["mac"].lower()
    if "bridge" in types:
        assert {ipaddress.ip_interface(ip).version for ip in net["ips"]} == {4, 6}
    assert entry["data"]["network"] == chain.conflist["name"]
    assert all("sandbox" not in i for i in entry["data"]["interfaces"])

    # tuning's effect, and netclaim's own interface block, as the example sets them.
    if "tuning" in types:
        tuning = chain.plugin("tuning")
        if "mtu" in tuning:
            assert kernel["mtu"] == tuning["mtu"]
        for key, value in (tuning.get("sysctl") or {}).items():
            assert netns_sysctl(chain.netns, key.replace("IFNAME", IFNAME)) == value, key
    iface = netclaim_conf.get("interface") or {}
    if "mtu" in iface:
        assert kernel["mtu"] == iface["mtu"]
    if "txQueueLen" in iface:
        assert kernel["txqlen"] == iface["txQueueLen"]
    if "altName" in iface:
        assert iface["altName"] in kernel["altnames"]
    for key, value in (iface.get("sysctl") or {}).items():
        assert netns_sysctl(chain.netns, key.replace("IFNAME", IFNAME)) == value, key

    # DEL in reverse order succeeds and takes the per-pod host-side state with it.
    errors = chain.delete()
    assert errors == [], errors
    leftover = {name: host_link_kind(name) for name in host_kinds if name not in chain.host_links}
    assert all(kind is None for kind in leftover.values()), f"host links left after DEL: {leftover}"
    assert nat_rules_mentioning(chain.container_id) == [], "ipMasq/portmap rules left after DEL"
    assert [wire_spool.read_spool(p).op for p in wire_spool.list_spool(chain.spool)] == ["ADD", "DEL"]
