"""Is the chain keeper being uninstalled? Only positive evidence says yes.

On SIGTERM the keeper must tell an uninstall (put the node back: unchain,
remove the plugin, empty the spool and journal) from everything else that
stops a pod: an upgrade, a node drain, a kubelet restart, an eviction. A
wrong "uninstall" wipes the journal and drops netclaim out of the chain for
every later pod; a wrong "not uninstalled" leaves a chain entry that, with
failurePolicy Ignore, harms no pod and that `chain-keeper --uninstall`
removes by hand. So the node is cleaned only on positive evidence that the
keeper's own DaemonSet is going away: the API server said 404 (or listed
no such DaemonSet), or showed it with a deletionTimestamp, or a watch
delivered its DELETED event. 401, 403, 5xx, timeouts and refused
connections prove nothing: a 403 is what an API server answers for a few
hundred ms after a restart, an authorization webhook that is down, or RBAC
being replaced during `helm upgrade --force`; a 401 is what a rotated or
re-created ServiceAccount gives.

Why a watch and not one GET on SIGTERM: `helm uninstall` deletes the
DaemonSet, then (milliseconds later) the RoleBinding, Role and
ServiceAccount; the pods get SIGTERM only when the garbage collector deletes
them, after the DaemonSet is gone (measured in the test cluster: about a
second later). By then the token is usually refused (401, the
ServiceAccount is gone) or forbidden (403, the binding is gone), so a GET
then cannot tell anything. The watch, opened while the credentials were
good, stays open across their revocation (a stream is authorized once, when
it starts) and delivers the DELETED event before the pod is even
terminated; with foreground deletion the DaemonSet first shows a
deletionTimestamp, which is just as positive. The observation is kept in
memory and is what the SIGTERM decision trusts when the final GET is
refused. When the final GET does answer, it wins: a DaemonSet that is
there again under a new UID (deleted and re-created by an upgrade) means
keep.

Until the watch's first answer the keeper is not ready (program.readiness): a SIGTERM then
would find nothing in hand, so a rollout, and `helm upgrade --wait` with it, waits for the look
before it counts the pod ready and an uninstall can follow.

Cost: one LIST (fieldSelector metadata.name, at most one item) at start and
after each broken watch, and one open watch per node; both are allowed by
the Role's `resourceNames` because the name is in the field selector.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

from publisher import logs
from publisher.clock import node_seconds
from publisher.kube.calls import ApiError, Kube, NotFound
from publisher.kube.listwatch import events, follow

PRESENT = "present"
GONE = "gone"
UNKNOWN = "unknown"


@dataclass(frozen=True)
class Observation:
    """What is known about the DaemonSet: `state` and the evidence behind it."""

    state: str = UNKNOWN
    uid: str = ""
    evidence: str = "not looked yet"


def observe(ds: dict[str, Any] | None, evidence: str) -> Observation:
    """The observation an object (or its absence) is: a deletionTimestamp counts as gone."""
    if ds is None:
        return Observation(GONE, "", evidence)
    meta = ds.get("metadata") or {}
    if meta.get("deletionTimestamp"):
        return Observation(GONE, meta.get("uid", ""), f"{evidence}: deletionTimestamp {meta['deletionTimestamp']}")
    return Observation(PRESENT, meta.get("uid", ""), evidence)


def ask_once(get: Callable[[], dict[str, Any]]) -> Observation:
    """One GET: 404 or a deletionTimestamp is gone, 200 is present, any other failure is unknown."""
    try:
        return observe(get(), "get: 200")
    except NotFound:
        return Observation(GONE, "", "get: 404")
    except ApiError as exc:
        return Observation(UNKNOWN, "", f"get: {exc.code or 'no answer'}: {exc.message[:200]}")


def verdict(cached: Observation, answer: Observation) -> Observation | None:
    """The decision from the watch's last observation and one fresh answer; None: ask again.

    A positive answer wins (it is newer). A failed answer leaves a cached 'gone'
    standing: that is the case the watch is for (the token is refused once the
    release's RBAC is deleted).
    """
    if answer.state == GONE:
        return answer
    if answer.state == PRESENT:
        if cached.state == GONE and cached.uid and cached.uid == answer.uid:
            return cached  # cannot happen (a deleted object does not come back); trust the deletion
        return answer
    if cached.state == GONE:
        return Observation(GONE, cached.uid, f"{cached.evidence} (final check refused: {answer.evidence})")
    return None


class OwnerWatch:
    """Watches the keeper's own DaemonSet while the keeper runs; `decide()` on SIGTERM."""

    def __init__(self, kube: Kube, namespace: str, name: str) -> None:
        self.kube = kube
        self.namespace = namespace
        self.name = name
        self.log = logs.get()
        self.stopping = threading.Event()
        self._lock = threading.Lock()
        self._obs = Observation()
        self._thread = threading.Thread(target=self._run, name="owner-watch", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self.stopping.set()

    def observation(self) -> Observation:
        with self._lock:
            return self._obs

    def looked(self) -> bool:
        """Whether the API has answered about the DaemonSet at all since the keeper started: before
        that, a SIGTERM could not tell an uninstall from an upgrade (program.readiness)."""
        return self.observation().state != UNKNOWN

    def _see(self, obs: Observation) -> None:
        """Record an observation; log the changes of state (a deletion is the one that matters)."""
        with self._lock:
            before, self._obs = self._obs, obs
        if before.state != obs.state or before.uid != obs.uid:
            self.log.info("own DaemonSet observed", extra={"daemonset": f"{self.namespace}/{self.name}",
                                                           "state": obs.state, "uid": obs.uid,
                                                           "evidence": obs.evidence})

    # ------------------------------------------------------------ the watch

    def _run(self) -> None:
        # Refused or unreachable: the last observation stands (it is never downgraded to unknown).
        follow(self.stopping, self._relist, self._watch, lambda exc: self.log.info(
            "own DaemonSet watch failed; keeping the last observation",
            extra={"error": f"{type(exc).__name__}: {exc}"[:300]}))

    def _relist(self) -> str:
        page = self.kube.list_daemonset(self.namespace, self.name)
        items = [i for i in page.get("items") or [] if (i.get("metadata") or {}).get("name") == self.name]
        self._see(observe(items[0] if items else None, "list" if items else "list: absent"))
        return (page.get("metadata") or {}).get("resourceVersion", "")

    def _watch(self, rv: str) -> str:
        """Follow the watch until it ends; the resourceVersion to go on from."""
        resp = self.kube.watch_daemonset(self.namespace, self.name, rv)
        for kind, obj, version in events(resp, self.stopping):
            rv = version or rv
            meta = obj.get("metadata") or {}
            if kind != "BOOKMARK" and meta.get("name") == self.name:
                if kind == "DELETED":
                    self._see(Observation(GONE, meta.get("uid", ""), "watch: DELETED"))
                else:
                    self._see(observe(obj, f"watch: {kind}"))
        return rv

    # ------------------------------------------------------------ SIGTERM

    def decide(self, within: float, pause: float = 1.0) -> str:
        """'gone' (clean the node), 'present' or 'unknown' (keep it): asked until `within` seconds pass."""
        deadline = node_seconds() + within
        answer = Observation()
        while True:
            answer = ask_once(lambda: self.kube.get_daemonset(self.namespace, self.name))
            final = verdict(self.observation(), answer)
            if final is not None:
                break
            if node_seconds() + pause >= deadline:
                final = Observation(UNKNOWN, "", answer.evidence)
                break
            time.sleep(pause)
        self.stop()
        self.log.info("uninstall or not", extra={"daemonset": f"{self.namespace}/{self.name}", "owner": final.state,
                                                 "evidence": final.evidence,
                                                 "watched": self.observation().evidence})
        return final.state
