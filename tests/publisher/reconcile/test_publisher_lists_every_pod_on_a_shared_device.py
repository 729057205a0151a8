"""With --shared-attachments, a device several pods use lists every pod in its one entry's `data`.

KEP-4817 allows one entry per device, so a claim reserved for two pods shows only the newest
sandbox: the other pod's address is nowhere. With the option on, the entry's data carries
`attachments`, one item per pod (its own IPs, MAC and sandbox), sorted by pod name; one pod left,
no list. The option is off by default. The list shares data's 10 KiB: cut to fit, the shown pod
kept first, and `trimmed` says so.

Real plugin, real publisher and kube-apiserver for the publisher tests (every entry read is held to
the shipped schema by the test kit); the limit is shown on the pure function that builds the list.
"""

from __future__ import annotations

import subprocess
from typing import Any

from publisher_testkit import BIN, MERGE, Cluster, Plugin, add, suffix
from runtime.dataschema import data_errors

from cni_plugin.wire.event import PodRef
from publisher import limits
from publisher.journal.store import Attachment
from publisher.reconcile.reconciler import applied_entries
from publisher.reconcile.sharing import ATTACHMENTS, attachment_item, shared_entry, with_attachments

NIC = "0a:58:0a:4d:00:0"


def _shared_claim(cluster: Cluster, claim: str, pods: tuple[str, ...]) -> dict[str, str]:
    """A claim allocated to this node, one device, reserved for every pod of `pods`; their UIDs."""
    cluster.claim(claim)
    uids = {pod: cluster.pod(pod, [claim]) for pod in pods}
    cluster.allocate(claim, [("nic", "nic0")])
    cluster.resource.patch_namespaced_resource_claim_status(claim, cluster.namespace, {"status": {"reservedFor": [
        {"resource": "pods", "name": pod, "uid": uid} for pod, uid in uids.items()]}}, _content_type=MERGE)
    return uids


def _add_both(cluster: Cluster, plugin: Plugin, uids: dict[str, str]) -> dict[str, str]:
    """Each pod's sandbox ADDs (web-a first, so web-b's is the newest and the one shown); their containerIDs."""
    cids = {}
    for i, pod in enumerate(sorted(uids), start=5):
        cids[pod] = f"{pod}-{suffix()}"
        add(plugin, cids[pod], PodRef(cluster.namespace, pod, uids[pod]),
            res={"ipv4": f"10.77.0.{i}/24", "ipv6": f"fd00:77::{i}/64", "mac": f"{NIC}{i}"})
    return cids


def _expected(uids: dict[str, str], cids: dict[str, str]) -> list[dict[str, Any]]:
    return [{"pod": pod, "podUID": uids[pod], "containerID": cids[pod], "interfaceName": "eth0",
             "ips": [f"10.77.0.{i}/24", f"fd00:77::{i}/64"], "hardwareAddress": f"{NIC}{i}"}
            for i, pod in enumerate(sorted(uids), start=5)]


def test_a_shared_device_lists_each_pod_and_the_list_goes_with_the_second_pod(
        cluster: Cluster, publisher_factory, workdir) -> None:
    publisher = publisher_factory(extra=["--shared-attachments"])
    plugin = Plugin(publisher.socket, publisher.spool, workdir)
    claim = f"shared-{suffix()}"
    uids = _shared_claim(cluster, claim, ("web-a", "web-b"))
    cids = _add_both(cluster, plugin, uids)

    [entry] = cluster.wait_devices(claim, lambda d: len(d) == 1 and ATTACHMENTS in d[0]["data"]
                                   and len(d[0]["data"][ATTACHMENTS]) == 2)
    assert entry["data"]["containerID"] == cids["web-b"]  # the newest sandbox is still the one shown
    assert entry["data"][ATTACHMENTS] == _expected(uids, cids)
    assert "trimmed" not in entry["data"]

    # The shown pod goes: the other pod's sandbox is shown again, alone, and the list goes with it.
    cluster.core.delete_namespaced_pod("web-b", cluster.namespace, grace_period_seconds=0)
    [entry] = cluster.wait_devices(claim, lambda d: len(d) == 1 and d[0]["data"]["containerID"] == cids["web-a"])
    assert ATTACHMENTS not in entry["data"], entry["data"]
    assert entry["networkData"]["ips"] == ["10.77.0.5/24", "fd00:77::5/64"]


def test_the_list_is_opt_in_and_appears_once_the_option_is_turned_on(
        cluster: Cluster, publisher_factory, workdir) -> None:
    publisher = publisher_factory(extra=["--no-shared-attachments"])
    plugin = Plugin(publisher.socket, publisher.spool, workdir)
    claim = f"shared-{suffix()}"
    uids = _shared_claim(cluster, claim, ("web-a", "web-b"))
    cids = _add_both(cluster, plugin, uids)
    [entry] = cluster.wait_devices(claim, lambda d: len(d) == 1 and d[0]["data"]["containerID"] == cids["web-b"])
    assert ATTACHMENTS not in entry["data"], entry["data"]  # off: today's entry, the newest sandbox only

    # The positive control, on the same journal and claim: the publisher restarted with the option on
    # lists both pods once the claim is applied again (`resync`, as docs/publisher.md tells operators).
    publisher.stop()
    publisher.extra = ["--shared-attachments"]
    publisher.start()
    out = subprocess.run([str(BIN / "netclaim-publisher"), "resync", "--socket", publisher.socket],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    [entry] = cluster.wait_devices(claim, lambda d: len(d) == 1 and ATTACHMENTS in d[0]["data"], timeout=60)
    assert entry["data"][ATTACHMENTS] == _expected(uids, cids)


# ---------------------------------------------------------------- the list itself, on made-up attachments


def _att(pod: str, cid: str, ip: str, added: int, live: dict | None = None) -> Attachment:
    entry = {"driver": "nic.example.com", "pool": "node-a", "device": "nic0",
             "conditions": [{"type": "Ready", "status": "True", "reason": "NetworkConfigured", "message": "",
                             "lastTransitionTime": "2026-01-01T00:00:00Z"}],
             "data": {"apiVersion": "netclaim.dev/v1", "kind": "CNIResult", "cniVersion": "1.1.0",
                      "network": "net", "containerID": cid},
             "networkData": {"interfaceName": "eth0", "ips": [ip], "hardwareAddress": "0a:58:00:00:00:01"}}
    return Attachment(container_id=cid, ifname="eth0", driver="nic.example.com", network="net",
                      pod_namespace="ns", pod_name=pod, pod_uid=f"uid-{pod}", claim_namespace="ns",
                      claim_name="c", claim_uid="u", pool="node-a", device="nic0", share_id="", entry=entry,
                      result_hash="", event_ts=0.0, stamp=[added], added=[added], live=live or {})


def _newest(atts: list[Attachment]) -> Attachment:
    return max(atts, key=lambda a: a.added)


def test_a_list_over_the_limit_keeps_the_shown_pod_first_and_says_it_was_cut() -> None:
    atts = [_att(f"pod-{i:03d}", f"c{i:03d}" + "0" * 60, f"10.9.{i // 250}.{i % 250}/32", i) for i in range(200)]
    shown = atts[150]
    entry = shared_entry(shown.entry, shown, atts, _newest)
    data = entry["data"]
    assert limits.data_size(data) <= limits.MAX_DATA_BYTES
    assert data["trimmed"] == [ATTACHMENTS]
    kept = [item["pod"] for item in data[ATTACHMENTS]]
    assert 2 <= len(kept) < 200 and "pod-150" in kept and kept == sorted(kept)
    assert data_errors(data) == []
    # As many as fit: one item more would not.
    one_more = with_attachments(shown.entry["data"], [attachment_item(a) for a in atts[:len(kept) + 1]], 0)
    assert one_more["trimmed"] == [ATTACHMENTS]
    assert shown.entry["data"].get(ATTACHMENTS) is None  # the journaled entry is left as it was


def test_each_item_is_what_its_own_entry_shows_and_one_pod_shows_no_list() -> None:
    a = _att("web-a", "ca", "10.1.0.5/24", 1, live={"state": "AddressLost", "ips": [], "ifname": "eth0",
                                                    "message": "10.1.0.5/24 removed", "since": "2026-01-02T00:00:00Z"})
    b = _att("web-b", "cb", "10.1.0.6/24", 2)
    older_b = _att("web-b", "cb-old", "10.1.0.7/24", 0)
    [entry] = applied_entries([b], {b.device_key: [a, older_b, b]}, _order())
    items = entry["data"][ATTACHMENTS]
    assert [(i["pod"], i["containerID"]) for i in items] == [("web-a", "ca"), ("web-b", "cb")]
    assert items[0]["ips"] == [] and items[1]["ips"] == ["10.1.0.6/24"]  # web-a's live view: the address is gone
    assert data_errors(entry["data"]) == []
    [alone] = applied_entries([b], {b.device_key: [older_b, b]}, _order())  # two sandboxes, one pod
    assert ATTACHMENTS not in alone["data"]
    # Off (no sharers): a list an earlier apply wrote, adopted back from the API, is not kept.
    adopted = _att("web-b", "cb", "10.1.0.6/24", 2)
    adopted.entry["data"] = {**entry["data"], "trimmed": [ATTACHMENTS]}
    [off] = applied_entries([adopted])
    assert ATTACHMENTS not in off["data"] and "trimmed" not in off["data"]


def test_broken_attachments_do_not_match_the_schema() -> None:
    """The control: the suite's entry check refuses items netclaim must never write."""
    a, b = _att("web-a", "ca", "10.1.0.5/24", 1), _att("web-b", "cb", "10.1.0.6/24", 2)
    good = shared_entry(b.entry, b, [a, b], _newest)["data"]
    assert data_errors(good) == []
    for breakage, complaint in [
        (lambda d: d[ATTACHMENTS][0].update(podIP="10.1.0.5"), "Additional properties"),
        (lambda d: d[ATTACHMENTS][0].pop("containerID"), "'containerID' is a required property"),
        (lambda d: d[ATTACHMENTS][1].update(ips=["10.1.0.6"]), "does not match '/'"),
        (lambda d: d[ATTACHMENTS].reverse(), "sorted by pod name"),
        (lambda d: d[ATTACHMENTS].pop(1), "the shown sandbox"),
        (lambda d: d[ATTACHMENTS].pop(0), "a list of one pod"),
    ]:
        data = {**good, ATTACHMENTS: [dict(i) for i in good[ATTACHMENTS]]}
        breakage(data)
        errors = data_errors(data)
        assert any(complaint in e for e in errors), (complaint, errors)


def _order() -> Any:
    """The boot order plan() hands applied_entries: here, the ADD stamps compared as numbers."""

    class ByStamp:
        def latest(self, atts: list[Attachment], key: Any) -> Attachment:
            return max(atts, key=key)

    return ByStamp()
