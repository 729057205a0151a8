"""The chain keeper writes the entry's `extendedResourceName` from its option or environment, and refuses a bad one.

Pods that ask for a DRA extended resource in their containers' resources get a claim the
scheduler makes and names the requests of; the publisher finds the interface's device there
only through the extended resource the entry names. The chart sets it through the ConfigMap
(NETCLAIM_EXTENDED_RESOURCE_NAME) the keeper reads as its environment. A name the plugin would
refuse must never reach a node (every ADD would fail with error 7): it is a usage error naming
the option, before the conflist or the CNI bin dir are touched. The keeper runs for real
(`chain-keeper --once`, as the init container runs it) on a scratch conf dir; the entry is read
back with the plugin's own config parser.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

from cni_plugin.config import parse_netconf
from deploylib import DRIVER, netclaim_publisher_bin, python_env

PRIMARY = {"cniVersion": "1.0.0", "name": "podnet", "plugins": [{"type": "bridge", "bridge": "cbr0"}]}
RESOURCE = "example.com/nic"


class Node:
    """A scratch conf dir and bin dir, and the plugin executable the keeper installs into it."""

    def __init__(self, root: Path) -> None:
        self.conf_dir, self.bin_dir = root / "net.d", root / "bin"
        self.conf_dir.mkdir()
        self.bin_dir.mkdir()
        self.conflist = self.conf_dir / "10-podnet.conflist"
        self.conflist.write_text(json.dumps(PRIMARY))
        self.plugin = root / "netclaim"
        self.plugin.write_bytes(Path(os.path.realpath("/bin/true")).read_bytes())  # only copied, never run

    def keeper(self, *options: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(netclaim_publisher_bin()), "chain-keeper", "--once",
                               f"--cni-conf-dir={self.conf_dir}", f"--cni-bin-dir={self.bin_dir}",
                               f"--plugin-binary={self.plugin}", f"--driver-name={DRIVER}", "--cni-cache-dir=",
                               *options],
                              env={**python_env(), **(env or {})}, capture_output=True, text=True, timeout=60)

    def entry(self) -> dict[str, Any]:
        [entry] = [p for p in json.loads(self.conflist.read_text())["plugins"] if p["type"] == "netclaim"]
        return entry

    def as_the_plugin_reads(self) -> Any:
        raw = {**self.entry(), "name": PRIMARY["name"], "cniVersion": PRIMARY["cniVersion"], "prevResult": {}}
        return parse_netconf(raw, PRIMARY["cniVersion"], "ADD")


def test_the_keeper_writes_the_extended_resource_from_its_environment_and_an_emptied_one_takes_it_out(
        tmp_path: Path) -> None:
    node = Node(tmp_path)
    ran = node.keeper(env={"NETCLAIM_EXTENDED_RESOURCE_NAME": RESOURCE, "NETCLAIM_REQUEST": "nic"})
    assert ran.returncode == 0, ran.stderr
    assert (node.entry()["extendedResourceName"], node.entry()["request"]) == (RESOURCE, "nic")
    assert node.as_the_plugin_reads().extended_resource == RESOURCE

    # The chart states every setting: emptying the value removes the key from every node's entry again.
    ran = node.keeper(env={"NETCLAIM_EXTENDED_RESOURCE_NAME": "", "NETCLAIM_REQUEST": "nic"})
    assert ran.returncode == 0, ran.stderr
    assert "extendedResourceName" not in node.entry() and node.entry()["request"] == "nic", node.entry()
    assert node.as_the_plugin_reads().extended_resource == ""


def test_the_keepers_option_names_the_extended_resource_too(tmp_path: Path) -> None:
    node = Node(tmp_path)
    ran = node.keeper("--extended-resource-name=deviceclass.resource.kubernetes.io/sriov-nic")
    assert ran.returncode == 0, ran.stderr
    assert node.entry()["extendedResourceName"] == "deviceclass.resource.kubernetes.io/sriov-nic"


def test_the_keeper_refuses_a_malformed_extended_resource_before_writing_anything(tmp_path: Path) -> None:
    node = Node(tmp_path)
    before = node.conflist.read_bytes()
    ran = node.keeper(env={"NETCLAIM_EXTENDED_RESOURCE_NAME": "Example.com/nic"})
    assert ran.returncode == 2, ran.stderr  # click's usage error
    assert "extendedResourceName=Example.com/nic" in ran.stderr and "DNS subdomain" in ran.stderr, ran.stderr
    assert "--extended-resource-name" in ran.stderr and "NETCLAIM_EXTENDED_RESOURCE_NAME" in ran.stderr, ran.stderr
    assert "nothing was written" in ran.stderr, ran.stderr
    assert node.conflist.read_bytes() == before
    assert sorted(p.name for p in node.conf_dir.iterdir()) == [node.conflist.name], "a backup or temp file was written"
    assert list(node.bin_dir.iterdir()) == [], "the plugin was installed"

    # Control: the same node with a well-formed name is chained.
    ran = node.keeper(env={"NETCLAIM_EXTENDED_RESOURCE_NAME": RESOURCE})
    assert ran.returncode == 0, ran.stderr
    assert node.entry()["extendedResourceName"] == RESOURCE and (node.bin_dir / "netclaim").exists()

