"""The live-interface watch's writes: conditional on the attachment being the one watched.

Every write names the attachment by (containerID, ifname) *and* the stamp of
the ADD that created it (`added`): a DEL, a GC, the boot rule or a re-ADD
that replaced the row since the watch read it makes the write match nothing,
so an observation never brings back what an event retired. The claim is
marked dirty in the same transaction (its reconcile applies the change), due
now unless its mark is already due later: a sibling hold or a Retry-After floor
is kept (Journal._mark_dirty with keep_later).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from publisher.journal.store import Journal, _mark_dirty


@dataclass(frozen=True)
class Watched:
    """The columns the watch needs of one attachment (no entry decoding per pass)."""

    container_id: str
    ifname: str
    netns: str
    added: str  # the stored stamp text: compared, never parsed
    claim_namespace: str
    claim_name: str
    pod_namespace: str
    pod_name: str
    network: str = ""  # the CNI network's name: whether addresses gained after the ADD are shown

    @property
    def claim(self) -> str:
        return f"{self.claim_namespace}/{self.claim_name}"

    @property
    def key(self) -> tuple[str, str]:
        return (self.container_id, self.ifname)


def watched_rows(journal: Journal) -> list[Watched]:
    """Every attachment with a netns path, cheaply (the watch reads this every pass)."""
    rows = journal._read("SELECT container_id, ifname, netns, added, claim_namespace, claim_name, pod_namespace,"
                         " pod_name, network FROM attachments"
                         " WHERE netns != ''")
    return [Watched(*row) for row in rows]


def entry_and_live(journal: Journal, w: Watched) -> tuple[dict, dict] | None:
    """(ADD entry, stored live) of the attachment, None when it is not the one watched any more."""
    rows = journal._read("SELECT entry, live FROM attachments WHERE container_id=? AND ifname=? AND added=?",
                         (w.container_id, w.ifname, w.added))
    if not rows:
        return None
    entry, live = rows[0]
    return json.loads(entry), (json.loads(live) if live else {})


def record_live(journal: Journal, w: Watched, live: dict) -> bool:
    """Store the observation and mark the claim; False when the attachment is gone or replaced."""
    text = json.dumps(live, separators=(",", ":"), sort_keys=True) if live else ""
    with journal._tx() as db:
        cur = db.execute("UPDATE attachments SET live=? WHERE container_id=? AND ifname=? AND added=?",
                         (text, w.container_id, w.ifname, w.added))
        if cur.rowcount == 0:
            return False
        _mark_dirty(db, w.claim_namespace, w.claim_name, 0.0, keep_later=True)
    return True


def retire_vanished(journal: Journal, w: Watched) -> bool:
    """The sandbox's netns is gone (no DEL came): forget the attachment and mark the claim."""
    with journal._tx() as db:
        cur = db.execute("DELETE FROM attachments WHERE container_id=? AND ifname=? AND added=?",
                         (w.container_id, w.ifname, w.added))
        if cur.rowcount == 0:
            return False
        _mark_dirty(db, w.claim_namespace, w.claim_name, 0.0, keep_later=True)
    return True
