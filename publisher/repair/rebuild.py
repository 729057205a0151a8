"""The node's attachments rebuilt from the live cluster, after a newer journal was set aside.

A journal this release cannot write (publisher/journal/compat.py) is moved aside and a new one
started. Without the rebuild the new journal would know nothing of the sandboxes the newer
release published: their entries would stay on their claims, those of dead sandboxes too,
until an apply of the claim removed them all, the live ones with them. So, once, before any
worker or housekeeping runs:

1. the claims to look at: those of the pods bound to this node (one paged list) and those
   the set-aside journal names, when it still reads (its attachments are only hints: which
   claims, and each sandbox's netns path, request, device ID and pod);
2. on each claim (one GET), the entries this node's field manager owns: each names its
   sandbox (`data.containerID`) and interface (`networkData.interfaceName`);
3. an entry is a live sandbox's when a pod on this node that uses the claim holds its
   reservation (by its UID or its PodGroup: publisher/reconcile/reservation.py) and, where
   the hint names the sandbox's netns and its directory is visible here, that netns still
   exists; of a claim shared by several pods here, the sandbox is the pod's the hint names
   (sandbox_pod). Those are written to the journal as attachments, ranked
   below every event of this boot (so a spooled or late ADD, CHECK or DEL of the sandbox
   wins); the others are not;
4. every claim looked at is marked dirty: housekeeping's start-up reconcile (the one path that
   applies, publisher/reconcile/reconciler.py) then shows the live sandboxes' entries and
   removes the dead ones', by the ordinary rules (pod gone, reservation, device allocated).

The spool is ingested as at every start; its events are handled after the rebuild.
"""

from __future__ import annotations

import os
import sqlite3
import time
from dataclasses import dataclass
from typing import Any

from cni_plugin.wire.event import boot_id
from publisher import limits, logs
from publisher.journal.store import Attachment, Journal
from publisher.kube.calls import Kube, NotFound
from publisher.reconcile.reservation import pod_group_name, reservations
from publisher.reconcile.resolver import pod_claim_names
from publisher.reconcile.writer import entry_key, owned_keys

ENTRY_FIELDS = ("driver", "pool", "device", "shareID", "conditions", "data", "networkData")


@dataclass(frozen=True)
class Hint:
    """What the set-aside journal said of one attachment (trusted only where checked)."""

    claim: tuple[str, str]
    netns: str = ""
    request: str = ""
    device_id: str = ""
    extended_resource: str = ""
    pod_uid: str = ""  # the pod whose sandbox it was: of a shared claim's users, that one


@dataclass
class Rebuilt:
    claims: int = 0  # claims looked at (and marked dirty)
    adopted: int = 0  # live sandboxes' entries written to the journal
    dropped: int = 0  # entries of sandboxes found dead: the reconcile removes them

    def text(self) -> str:
        return (f"rebuilt {self.adopted} attachment(s) of live sandboxes from {self.claims} claim(s); "
                f"{self.dropped} entr{'y' if self.dropped == 1 else 'ies'} of dead sandboxes to be removed")


def read_hints(path: str) -> dict[tuple[str, str], Hint]:
    """The set-aside journal's attachments, read-only, as far as they still read ({} when not)."""
    if not path:
        return {}
    try:
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    except sqlite3.Error:
        return {}
    try:
        have = {row[1] for row in db.execute("PRAGMA table_info(attachments)")}
        wanted = ["container_id", "ifname", "claim_namespace", "claim_name", "netns", "request", "device_id",
                  "extended_resource", "pod_uid"]
        cols = [c if c in have else "''" for c in wanted]
        if "''" in cols[:4]:
            return {}
        rows = db.execute(f"SELECT {','.join(cols)} FROM attachments LIMIT ?", (limits.REBUILD_HINTS_MAX,)).fetchall()
    except sqlite3.Error:
        return {}
    finally:
        db.close()
    return {(str(cid), str(ifn)): Hint((str(ns), str(name)), str(netns), str(req), str(dev), str(ext), str(uid))
            for cid, ifn, ns, name, netns, req, dev, ext, uid in rows}


def netns_gone(path: str) -> bool:
    """The sandbox's netns path is gone where its directory is visible (as the live watch judges)."""
    return bool(path) and os.path.isdir(os.path.dirname(path)) and not os.path.lexists(path)


@dataclass(frozen=True)
class NodePod:
    namespace: str
    name: str
    uid: str
    claims: frozenset[str]
    pod_group: str = ""  # spec.schedulingGroup.podGroupName


def node_pods(kube: Kube, node: str) -> list[NodePod]:
    """The pods bound to this node (paged, as the pod watch relists)."""
    pods, cont = [], ""
    while True:
        page = kube.list_pods_on_node(node, cont=cont)
        for pod in page.get("items") or []:
            meta = pod.get("metadata") or {}
            pods.append(NodePod(meta.get("namespace", ""), meta.get("name", ""), meta.get("uid", ""),
                                frozenset(pod_claim_names(pod)), pod_group_name(pod)))
        cont = (page.get("metadata") or {}).get("continue") or ""
        if not cont:
            return pods


def sandbox_pod(users: list[NodePod], hint: Hint) -> NodePod | None:
    """Which of the claim's users on this node the sandbox belongs to: the pod the set-aside journal
    named, when it did (None when that pod no longer uses the claim: the sandbox is a dead pod's); else
    the first user. An entry names its sandbox, not its pod, so without a hint a claim shared by
    several pods on this node is credited to one of them: its entry is then kept while that pod
    lives, and the owner's next ADD, CHECK or DEL (ranked above the rebuild) sets it right."""
    if hint.pod_uid:
        return next((p for p in users if p.uid == hint.pod_uid), None)
    return users[0] if users else None


def live_attachments(claim: dict[str, Any], manager: str, pods: list[NodePod],
                     hints: dict[tuple[str, str], Hint], stamp: list) -> tuple[list[Attachment], int]:
    """The claim's entries owned by `manager` that belong to a live sandbox, as attachments,
    and how many entries were found dead."""
    meta = claim.get("metadata") or {}
    ns, name = meta.get("namespace", ""), meta.get("name", "")
    status = claim.get("status") or {}
    reserved = reservations(claim)
    users = [p for p in pods
             if p.namespace == ns and name in p.claims and reserved.admits(p.namespace, p.uid, p.pod_group)]
    owned = owned_keys(claim, manager) or set()
    out, dead = [], 0
    for entry in status.get("devices") or []:
        if entry_key(entry) not in owned:
            continue
        data, net = entry.get("data") or {}, entry.get("networkData") or {}
        cid, ifname = str(data.get("containerID") or ""), str(net.get("interfaceName") or "")
        hint = hints.get((cid, ifname), Hint((ns, name)))
        pod = sandbox_pod(users, hint)
        if not cid or not ifname or pod is None or netns_gone(hint.netns):
            dead += 1
            continue
        out.append(Attachment(
            container_id=cid, ifname=ifname, driver=entry.get("driver", ""), network=str(data.get("network") or ""),
            pod_namespace=pod.namespace, pod_name=pod.name, pod_uid=pod.uid, claim_namespace=ns, claim_name=name,
            claim_uid=meta.get("uid", ""), pool=entry.get("pool", ""), device=entry.get("device", ""),
            share_id=entry.get("shareID", "") or "", entry={k: entry[k] for k in ENTRY_FIELDS if k in entry},
            result_hash="", event_ts=time.time(), stamp=list(stamp), request=hint.request, added=list(stamp),
            netns=hint.netns if hint.netns and not netns_gone(hint.netns) else "", device_id=hint.device_id,
            extended_resource=hint.extended_resource))
    return out, dead


def rebuild(kube: Kube, journal: Journal, node: str, manager: str, set_aside: str) -> Rebuilt:
    """Steps 1 to 4 of the module docstring; raises TransientError when the API does not answer
    (the caller tries again: nothing is written before every claim was read)."""
    log = logs.get()
    hints = read_hints(set_aside)
    pods = node_pods(kube, node)
    claims = sorted({(p.namespace, c) for p in pods for c in p.claims} | {h.claim for h in hints.values()})
    # Below every event of this boot: whatever the plugin says of a sandbox from now on wins.
    stamp = [boot_id(), 0, time.time_ns()]
    out, atts = Rebuilt(claims=len(claims)), []
    for ns, name in claims:
        try:
            claim = kube.get_claim(ns, name)
        except NotFound:
            continue
        found, dead = live_attachments(claim, manager, pods, hints, stamp)
        atts += found
        out.dropped += dead
    out.adopted = journal.adopt(atts, claims)
    log.info("journal rebuilt from the live cluster", extra={
        "claims": out.claims, "attachments": out.adopted, "dead_entries": out.dropped, "set_aside_to": set_aside})
    return out
