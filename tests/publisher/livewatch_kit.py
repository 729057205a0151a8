"""What the live-watch tests share: a real pod netns with a veth `eth0`, and the publisher's
`Service` running only its live-watch thread over a real journal on disk (no API server:
nothing here publishes). Fixtures are imported by name into the test modules that use them.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from cni_plugin.wire.event import PodRef
from typing import Any

import pytest
from publisher_testkit import suffix, wait_until

from cni_plugin.wire.event import new_order
from publisher import limits
from publisher.journal.schema import Attachment
from publisher.kube.calls import Kube
from publisher.live.watcher import LiveSettings
from publisher.observe.metrics import Metrics
from publisher.service import Service, Settings

CLAIM = ("ns", "claim-a")


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)


@dataclass
class PodNetns:
    """A pod sandbox's netns with its interface `eth0` (a veth whose peer stays in the netns)."""

    name: str

    @property
    def path(self) -> str:
        return f"/var/run/netns/{self.name}"

    def link(self, state: str) -> None:
        ip("-n", self.name, "link", "set", "eth0", state)

    def mac(self) -> str:
        out = subprocess.run(["ip", "-n", self.name, "-j", "link", "show", "dev", "eth0"], check=True,
                             capture_output=True, text=True).stdout
        return json.loads(out)[0]["address"]

    def remove(self) -> None:
        """The runtime unmounts and removes the netns; no DEL comes."""
        subprocess.run(["ip", "netns", "del", self.name], check=False, capture_output=True)


@contextmanager
def made_pod_netns(prefix: str, address: str | None) -> Iterator[PodNetns]:
    """A new netns with `eth0` up (and `address` on it), removed afterwards whatever the test did."""
    ns = PodNetns(f"{prefix}-{suffix()}")
    ip("netns", "add", ns.name)
    try:
        ip("-n", ns.name, "link", "add", "eth0", "type", "veth", "peer", "name", "peer0")
        if address:
            ip("-n", ns.name, "addr", "add", address, "dev", "eth0")
        ip("-n", ns.name, "link", "set", "peer0", "up")
        ns.link("up")
        yield ns
    finally:
        ns.remove()


@pytest.fixture()
def pod_netns() -> Iterator[PodNetns]:
    with made_pod_netns("lw", "10.77.0.5/24") as ns:
        yield ns


@pytest.fixture()
def service(workdir: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Service]:
    """The publisher's Service, not started: each test spawns the live-watch thread under its supervisor."""
    monkeypatch.setattr(limits, "JOURNAL_BUSY_TIMEOUT", 0.3)  # read when the journal opens its connection
    svc = Service(Settings(node_name="node-a", state_dir=str(workdir / "state"), spool_dir=str(workdir / "spool"),
                           workers=1, emit_events=False), Kube(api_client=None), Metrics())
    # Short holds and re-reads, so each step of a test takes a fraction of a second.
    svc.live_watch.settings = LiveSettings(hold=0.2, journal_interval=0.5, retry_unopenable=0.5)
    yield svc
    svc.stop()


def journal_attachment(svc: Service, netns: str, mac: str = "02:00:00:00:00:01", cid: str = "c" * 64,
                       claim: tuple[str, str] = CLAIM, ips: tuple[str, ...] = ("10.77.0.5/24",)) -> str:
    """An attachment as a worker journals it after the ADD, published (its claim clean)."""
    entry = {"driver": "net.example.com", "pool": "p", "device": "nic0",
             "networkData": {"interfaceName": "eth0", "ips": list(ips), "hardwareAddress": mac},
             "conditions": [{"type": "Ready", "status": "True", "reason": "NetworkConfigured", "message": "",
                             "lastTransitionTime": "2026-12-05T00:00:00Z"}]}
    stamp = new_order()
    svc.journal.finish(None, upsert=[Attachment(
        container_id=cid, ifname="eth0", driver="net.example.com", network="podnet", pod_namespace=claim[0],
        pod_name="pod-" + cid[:6], pod_uid="uid-" + cid[:6], claim_namespace=claim[0], claim_name=claim[1],
        claim_uid="cuid", pool="p", device="nic0", share_id="", entry=entry, result_hash="h", event_ts=time.time(),
        stamp=stamp, added=stamp, netns=netns)])
    svc.journal.clean(*claim)
    svc.live_watch.attachments_changed()  # what the worker does once the event is committed
    return cid


def live_state(svc: Service, cid: str = "c" * 64) -> str | None:
    """The interface state the journal holds for the attachment (None: no such attachment)."""
    rows = svc.journal._read("SELECT live FROM attachments WHERE container_id=?", (cid,))
    if not rows:
        return None
    live: dict[str, Any] = json.loads(rows[0][0]) if rows[0][0] else {}
    return live.get("state", "Ready")


def dirty(svc: Service, claim: tuple[str, str] = CLAIM) -> bool:
    return any((ns, name) == claim for ns, name, _ in svc.journal.dirty_claims())


def start_watch(svc: Service) -> None:
    svc._spawn("live-watch", svc.live_watch.run)
    wait_until("the watch to follow the attachment", lambda: svc.live_watch.state()["namespaces"] == 1
               and svc.live_watch.busy() == 0, timeout=30)


def interface_written(svc: Service, state: str) -> bool:
    """The journal holds `state` and the claim is marked for its reconcile (the apply follows)."""
    return live_state(svc) == state and dirty(svc)


def published(svc: Service, cid: str = "c" * 64) -> dict[str, Any]:
    """The entry the claim gets for the attachment: the ADD's with what the watch recorded over it."""
    from publisher.live.status import shown_entry

    att = svc.journal.attachment(cid, "eth0")
    assert att is not None
    return shown_entry(att.entry, att.live)


def ready(entry: dict[str, Any]) -> dict[str, Any]:
    return next(c for c in entry["conditions"] if c["type"] == "Ready")


def address_flags(netns: str, cidr: str) -> set[str]:
    """The IPv6 address's state words as `ip -6 addr` prints them ({'missing'} when absent)."""
    out = subprocess.run(["ip", "-n", netns, "-6", "addr", "show", "dev", "eth0"], check=True, capture_output=True,
                         text=True).stdout
    for line in out.splitlines():
        words = line.split()
        if words[:2] == ["inet6", cidr]:
            return {w for w in words if w in ("tentative", "dadfailed", "deprecated")}
    return {"missing"}


# The real chain on a netns, as a runtime runs a conflist (the reference plugins, then netclaim).
CNI_BIN = "/usr/lib/cni"


def run_plugin(binary: str, command: str, conf: dict, cid: str, netns: str, pod: PodRef) -> dict:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "CNI_COMMAND": command, "CNI_CONTAINERID": cid,
           "CNI_NETNS": netns, "CNI_IFNAME": "eth0", "CNI_PATH": CNI_BIN,
           "CNI_ARGS": f"IgnoreUnknown=1;K8S_POD_NAMESPACE={pod.namespace};K8S_POD_NAME={pod.name};"
                       f"K8S_POD_UID={pod.uid}"}
    out = subprocess.run([binary], input=json.dumps(conf), env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, f"{binary} {command} failed: {out.stdout} {out.stderr}"
    return json.loads(out.stdout) if out.stdout.strip() else {}


def netns_addresses(name: str) -> tuple[str, list[str]]:
    out = subprocess.run(["ip", "-n", name, "-j", "addr", "show", "dev", "eth0"], capture_output=True, text=True,
                         check=True)
    link = json.loads(out.stdout)[0]
    ips = [f"{a['local']}/{a['prefixlen']}" for a in link["addr_info"] if a.get("scope") == "global"]
    return link["address"], ips


def plugin_binary():
    from publisher_testkit import BIN  # the plugin built for this run

    return BIN / "netclaim"
