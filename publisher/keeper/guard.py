"""Chain fights: count the keeper's writes per conflist, back off, and say so.

Another writer that wants the same conflist its own way (Cilium's exclusive
mode re-renders its conflist on any directory event, the keeper's own write
included) turns "re-chain within a poll" into a rewrite loop, and every
rewrite makes the runtime reload its networks. So each keeper write of a
conflist is counted: more than `limits.CHAIN_WRITES_MAX` within
`limits.CHAIN_WRITES_WINDOW` means the conflist is contested. The keeper then
stops writing it, retries once after a backoff that doubles after each lost
retry (up to `limits.CHAIN_BACKOFF_CAP`), and reports the contest: a Warning
Event `ChainContested` on the Node (when it has an API client), the
`netclaim_chain_contested{conflist}` gauge, a log line and its /readyz text.
A contested conflist that keeps netclaim for a whole window is settled.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.process_collector import ProcessCollector

from publisher import limits
from publisher.observe.metrics import EVENT_RESULTS, listen_taken_counter, preset  # also: no `_created` series


@dataclass
class Contest:
    """One conflist's recent keeper writes and, when contested, its backoff."""

    writes: deque[float] = field(default_factory=deque)
    contested: bool = False
    backoff: float = 0.0
    retry_at: float = 0.0
    last_write: float = 0.0


class ChainGuard:
    """Decides whether the keeper may write a conflist now; all times are node_seconds()."""

    def __init__(self) -> None:
        self.contests: dict[str, Contest] = {}

    def _get(self, name: str) -> Contest:
        return self.contests.setdefault(name, Contest())

    def may_write(self, name: str, now: float) -> bool:
        c = self._get(name)
        return not c.contested or now >= c.retry_at

    def retry_due(self, name: str, now: float) -> bool:
        """A contested conflist whose backoff ran out: look at it even if the directory did not change."""
        c = self.contests.get(name)
        return c is not None and c.contested and now >= c.retry_at

    def wrote(self, name: str, now: float) -> bool:
        """Count one keeper write; True when this write made the conflist contested (report it once)."""
        c = self._get(name)
        c.last_write = now
        c.writes.append(now)
        while c.writes and now - c.writes[0] > limits.CHAIN_WRITES_WINDOW:
            c.writes.popleft()
        if c.contested:
            # A retry: the other writer wins again later or not; back off further either way
            # (settle() resets it once netclaim stayed chained for a window).
            c.backoff = min(c.backoff * 2, limits.CHAIN_BACKOFF_CAP)
            c.retry_at = now + c.backoff
            return False
        if len(c.writes) > limits.CHAIN_WRITES_MAX:
            c.contested = True
            c.backoff = limits.CHAIN_BACKOFF_FIRST
            c.retry_at = now + c.backoff
            return True
        return False

    def settle(self, name: str, now: float) -> bool:
        """netclaim is chained in `name`: True when that ends a contest (a whole window without a write)."""
        c = self.contests.get(name)
        if c is None or not c.contested or now - c.last_write < limits.CHAIN_WRITES_WINDOW:
            return False
        self.contests[name] = Contest()
        return True

    def contested(self) -> list[str]:
        return sorted(n for n, c in self.contests.items() if c.contested)


class KeeperMetrics:
    """The keeper's own series, served by publisher/observe/metrics.py's bounded HealthServer.

    Named like the publisher's (counters exposed as `<name>_total` only, Event outcomes at 0 from the
    start); the per-conflist series appear with the first conflist the keeper looks at."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        ProcessCollector(registry=r)
        self.chained = Gauge("netclaim_chained", "1 when netclaim is in the chain of this conflist (the primary)",
                             ["conflist"], registry=r)
        self.rewrites = Counter("netclaim_chain_rewrites_total", "Keeper writes of a conflist (chaining, "
                                "re-chaining, converting a .conf)", ["conflist"], registry=r)
        self.contested = Gauge("netclaim_chain_contested", "1 while another writer keeps undoing the keeper's "
                               "writes of this conflist and the keeper backs off", ["conflist"], registry=r)
        self.aborted = Counter("netclaim_chain_edits_aborted_total", "Edits abandoned because the file changed "
                               "while being edited (retried on the next look)", registry=r)
        self.ready = Gauge("netclaim_chain_keeper_ready", "1 when /readyz answers ready", registry=r)
        self.k8s_events = preset(Counter("netclaim_k8s_events_total", "Warning Events by outcome", ["result"],
                                         registry=r), *EVENT_RESULTS)
        self.http_refused = Counter("netclaim_http_connections_refused_total", "Connections to /metrics or "
                                    "/readyz closed at once because every handler was busy", registry=r)
        self.probe_refused = Counter("netclaim_probe_connections_refused_total", "Connections to the probe "
                                     "listener closed at once because every probe handler was busy", registry=r)
        self.listen_taken = listen_taken_counter(r)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
