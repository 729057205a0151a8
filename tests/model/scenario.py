"""One sequence of what a node does, step by step, with the model kept in step.

The state machine (test_reconcile_model.py) and the replayed regressions
(test_regressions.py) both drive a `Scenario`: its public methods are the steps,
with the same names and arguments as the machine's rules, so a failing sequence
printed by hypothesis is pasted into test_regressions.py as a step list.
Index arguments (`pick`, `slot`) are taken modulo the choices that exist at that
point, so every printed step list replays exactly.
"""

from __future__ import annotations

import json
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from modelkit import (CLAIMS, DRIVER, MERGE, NETWORKS, NODE, QUIESCE_TIMEOUT, ClaimModel, Credentials, JournalLock,
                      Known, Model, PluginRunner, Proxy, PublisherProc, Sandbox, delete_pod, observed_devices)
from publisher import limits
from publisher.live.watcher import LiveSettings
from publisher_testkit import in_boot  # noqa: E402  (on the path once modelkit is imported)

SLOTS = 3
# How long a lock_journal step holds the journal's write lock at most: the live watch's write may wait
# out an attachment's write hold, then another thread's failing write (the publisher's own write slot),
# then its own busy timeout. It is released as soon as that write has failed (typically after ~5 s).
LOCK_WAIT = 2 * limits.JOURNAL_BUSY_TIMEOUT + LiveSettings().hold + 2.0
# How long a netns removal waits for a quiet publisher first (else the step does nothing), and then
# for the live watch to retire what the netns held (it checks every netns path once a second).
QUIET_WAIT = 3.0
RETIRE_WAIT = 10.0
LANDED_WAIT = 10.0  # for the live watch to write, once the lock is gone, what it could not under it


@dataclass
class Harness:
    """What lives across sequences: the namespace, proxy, credentials, publisher, plugin runner."""

    api: client.ApiClient
    control_plane: Any
    workdir: Path
    namespace: str
    proxy: Proxy
    creds: Credentials
    publisher: PublisherProc
    plugin: PluginRunner
    apiserver_up: bool = True
    sequences: int = 0
    sandboxes: int = 0
    boots: int = 0  # reboots simulated so far (each a new boot id for publisher and plugin)
    steps: Counter = field(default_factory=Counter)  # step name -> times run, for the report

    @property
    def core(self) -> client.CoreV1Api:
        return client.CoreV1Api(self.api)

    @property
    def resource(self) -> client.ResourceV1Api:
        return client.ResourceV1Api(self.api)


@dataclass
class Slot:
    name: str = ""
    uid: str = ""
    generation: int = 0


@dataclass
class Scenario:
    h: Harness
    model: Model = field(init=False)
    sid: str = ""
    heavy: bool = False
    faults: bool = False  # a "fault" sequence: the journal's write lock may be taken (once)
    slots: list[Slot] = field(default_factory=list)
    sandboxes: list[Sandbox] = field(default_factory=list)
    added: dict[tuple[int, str], dict[str, Any]] = field(default_factory=dict)  # -> ADD's printed result
    live: set[tuple[int, str]] = field(default_factory=set)  # the runtime's view
    drifted: set[tuple[int, str]] = field(default_factory=set)
    carrierless: set[tuple[int, str]] = field(default_factory=set)  # attachments whose veth host side is down
    kills: int = 0
    apiserver_restarts: int = 0
    rotations: int = 0
    log: list[str] = field(default_factory=list)
    done: Counter = field(default_factory=Counter)  # steps run in this sequence (caps in the machine)
    plan: int | None = None
    cni_steps: int = 0
    dead: set[int] = field(default_factory=set)  # sandboxes (by index) that died with an earlier boot

    def count(self, step: str) -> int:
        return self.done[step]

    # ------------------------------------------------------------ setup

    def begin(self, heavy: bool = False, first: str = "", plan: int | None = None, faults: bool = False) -> None:
        """Claims ca (request a) -> p0 and cb (request b) -> p1, a sandbox for p0 and p1; with
        `first` (a channel) their attachments on the claims' requests are ADDed already. A heavy
        sequence with a `plan` rotates the token after CNI step `plan` and has the API server
        down from step plan+1 to plan+3 (when the rules did not do it already). A `faults`
        sequence may lock the journal (once: the machine's rule)."""
        self.plan = plan if heavy else None
        self.h.sequences += 1
        self.sid = f"{self.h.sequences}{uuid.uuid4().hex[:4]}"
        self.heavy = heavy
        self.faults = faults
        self.model = Model(self.h.namespace)
        for base, request in CLAIMS.items():
            name = f"{base}-{self.sid}"
            self.h.resource.create_namespaced_resource_claim(self.h.namespace, {
                "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": name},
                "spec": {"devices": {"requests": [{"name": request, "exactly": {"deviceClassName": DRIVER}}]}}})
            self.model.claims[base] = ClaimModel(name, request)
        self.slots = [Slot() for _ in range(SLOTS)]
        for slot in range(SLOTS):
            self._create_pod(slot)
        self.allocate(claim="ca", slot=0, device="dev0", node=NODE)
        self.allocate(claim="cb", slot=1, device="dev0", node=NODE)
        for slot in (0, 1):  # the pods holding the claims already have a sandbox (not yet ADDed)
            self.new_sandbox(slot)
        if first:
            self.add(0, first)  # (sandbox 0, eth0): p0 on request a
            self.add(2, first)  # then [(0, net1), (1, eth0), (1, net1)]: (1, net1) is p1 on request b

    def _create_pod(self, slot: int) -> None:
        s = self.slots[slot]
        s.generation += 1
        s.name = f"p{slot}-{self.sid}-{s.generation}"
        claims = [c.name for c in self.model.claims.values()]
        body = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": s.name},
                "spec": {"nodeName": NODE,
                         "containers": [{"name": "c", "image": "local/pause:1",
                                         "resources": {"claims": [{"name": f"c{i}"} for i in range(len(claims))]}}],
                         "resourceClaims": [{"name": f"c{i}", "resourceClaimName": c} for i, c in enumerate(claims)]}}
        s.uid = self.h.core.create_namespaced_pod(self.h.namespace, body).metadata.uid
        self.model.live_pods[s.uid] = s.name

    # ------------------------------------------------------------ what can happen now

    def alive_slots(self) -> list[int]:
        return [i for i, s in enumerate(self.slots) if s.uid]

    def addable(self) -> list[tuple[int, str]]:
        return [(i, ifname) for i, sb in enumerate(self.sandboxes) for ifname in NETWORKS
                if (i, ifname) not in self.added and sb.pod_uid in self.model.live_pods and i not in self.dead]

    def deletable(self) -> list[tuple[int, str]]:
        return sorted(self.live)

    # ------------------------------------------------------------ CNI verbs through the real plugin

    def cni(self, verb: str, pick: int, channel: str) -> None:
        """One CNI verb on an attachment that allows it (a no-op when none does).
        `channel` "lost" applies to DEL only (socket for the others); GC picks its network."""
        if channel == "lost" and verb != "DEL":
            channel = "socket"
        self.h.steps[f"{verb} {channel}"] += 1
        self._cni(verb, pick, channel)
        self.cni_steps += 1
        self._planned()

    def _planned(self) -> None:
        if self.plan is None:
            return
        if self.cni_steps == self.plan and not self.rotations and self.h.apiserver_up:
            self.h.steps["rotate_token"] += 1
            self.rotate_token()
        elif self.cni_steps == self.plan + 1 and not self.apiserver_restarts and self.h.apiserver_up:
            self.h.steps["stop_apiserver"] += 1
            self.stop_apiserver()
        elif self.cni_steps == self.plan + 3 and not self.h.apiserver_up:
            self.h.steps["start_apiserver"] += 1
            self.start_apiserver()

    def _cni(self, verb: str, pick: int, channel: str) -> None:
        if verb == "ADD" and self.addable():
            self.add(pick, channel)
        elif verb == "DEL" and self.deletable():
            self.delete(pick, channel)
        elif verb == "CHECK" and self.deletable():
            self.check(pick, channel)
        elif verb == "GC":
            self.gc(pick, channel)

    def new_sandbox(self, slot: int) -> None:
        alive = self.alive_slots()
        s = self.slots[alive[slot % len(alive)]]
        self.h.sandboxes += 1
        index = self.h.sandboxes
        sb = Sandbox(index, alive[slot % len(alive)], s.name, s.uid, f"mc{uuid.uuid4().hex}", f"mdl-{uuid.uuid4().hex[:10]}")
        self.sandboxes.append(sb)  # before create(): a half-made netns is still removed by cleanup()
        sb.create()
        self.log.append(f"sandbox {index}: pod {s.name} netns {sb.netns}")

    def _pod(self, sb: Sandbox) -> tuple[str, str, str]:
        return (self.h.namespace, sb.pod_name, sb.pod_uid)

    def add(self, pick: int, channel: str) -> None:
        i, ifname = self.addable()[pick % len(self.addable())]
        sb = self.sandboxes[i]
        conf = self.h.plugin.conf(ifname, channel, sb.prev_result(ifname))
        out = self.h.plugin.invoke("ADD", conf, sb.cid, ifname, sb.path, self._pod(sb))
        assert out.returncode == 0, f"plugin ADD failed: {out.stdout} {out.stderr}"
        result = json.loads(out.stdout)
        self.added[(i, ifname)] = result
        self.live.add((i, ifname))
        seq = self.model.tick()
        self.model.known[(sb.cid, ifname)] = Known(sb.cid, ifname, sb.pod_uid, seq, True, list(sb.ips[ifname]),
                                                   sb.mac(ifname), drifted=(i, ifname) in self.drifted,
                                                   no_carrier=(i, ifname) in self.carrierless)

    def delete(self, pick: int, channel: str) -> None:
        i, ifname = self.deletable()[pick % len(self.deletable())]
        sb = self.sandboxes[i]
        conf = self.h.plugin.conf(ifname, channel, self.added[(i, ifname)])
        out = self.h.plugin.invoke("DEL", conf, sb.cid, ifname, sb.path, self._pod(sb))
        assert out.returncode == 0, f"plugin DEL failed: {out.stdout} {out.stderr}"
        self.live.discard((i, ifname))
        self.model.tick()
        if channel != "lost":
            self.model.known.pop((sb.cid, ifname), None)

    def check(self, pick: int, channel: str) -> None:
        i, ifname = self.deletable()[pick % len(self.deletable())]
        sb = self.sandboxes[i]
        conf = self.h.plugin.conf(ifname, channel, self.added[(i, ifname)])
        out = self.h.plugin.invoke("CHECK", conf, sb.cid, ifname, sb.path, self._pod(sb))
        drifted = (i, ifname) in self.drifted
        assert (out.returncode != 0) == drifted, f"plugin CHECK (drift={drifted}): {out.stdout} {out.stderr}"
        self.model.tick()
        known = self.model.known.get((sb.cid, ifname))
        if known:
            known.ready = not drifted

    def driftable(self) -> list[tuple[int, str]]:
        return [a for a in self.deletable() if a not in self.drifted]

    def drift(self, pick: int) -> None:
        """Take an address away in a live attachment's netns (a no-op if that one already drifted:
        the pick is over all live attachments so that recorded sequences replay unchanged)."""
        i, ifname = self.deletable()[pick % len(self.deletable())]
        if (i, ifname) not in self.drifted:
            self.sandboxes[i].drift(ifname)
            self.drifted.add((i, ifname))
            known = self.model.known.get((self.sandboxes[i].cid, ifname))
            if known:
                known.drifted = True

    def carrier(self, pick: int) -> None:
        """Take a live attachment's carrier away, or give it back (its veth's host side down or up):
        the live watch must show Ready=False and then True, never bringing back a retired entry."""
        i, ifname = self.deletable()[pick % len(self.deletable())]
        lose = (i, ifname) not in self.carrierless
        self.sandboxes[i].set_carrier(ifname, not lose)
        if lose:
            self.carrierless.add((i, ifname))
        else:
            self.carrierless.discard((i, ifname))
        known = self.model.known.get((self.sandboxes[i].cid, ifname))
        if known:
            known.no_carrier = lose

    def gc(self, network: int, channel: str) -> None:
        """The runtime's GC of one network, listing the attachments it has live on it."""
        ifname = list(NETWORKS)[network % len(NETWORKS)]
        valid = [{"containerID": self.sandboxes[i].cid, "ifname": f} for i, f in sorted(self.live) if f == ifname]
        conf = self.h.plugin.conf(ifname, channel, None)
        conf["cni.dev/valid-attachments"] = valid
        out = self.h.plugin.invoke("GC", conf)
        assert out.returncode == 0, f"plugin GC failed: {out.stdout} {out.stderr}"
        self.model.tick()
        keep = {(a["containerID"], a["ifname"]) for a in valid}
        for key in [k for k in self.model.known if k[1] == ifname and k not in keep]:
            del self.model.known[key]

    # ------------------------------------------------------------ publisher, network, API server, credentials

    def disturb(self, kind: str, claim: str = "ca", slot: int | None = 0, device: str = "dev0",
                node: str = NODE) -> None:
        if self._disturb(kind, claim, slot, device, node):
            self.h.steps[kind] += 1

    def _disturb(self, kind: str, claim: str, slot: int | None, device: str, node: str) -> bool:
        """One non-CNI step when it applies now (else nothing; False): publisher, network, API
        server, credentials, scheduler, user. Expensive ones only in heavy sequences, at most once."""
        api, h = self.h.apiserver_up, self.h
        if kind == "kill_publisher" and h.publisher.running and self.kills < 1 + self.heavy:
            self.kill_publisher()
        elif kind == "start_publisher" and not h.publisher.running:
            self.start_publisher()
        elif kind == "reboot" and not self.done["reboot"]:
            self.done["reboot"] += 1
            self.reboot()
        elif kind == "cut_api" and h.proxy.up and self.done["cut_api"] < 2:
            self.done["cut_api"] += 1
            self.cut_api()
        elif kind == "restore_api" and not h.proxy.up:
            self.restore_api()
        elif kind == "stop_apiserver" and self.heavy and api and not self.apiserver_restarts:
            self.stop_apiserver()
        elif kind == "start_apiserver" and not api:
            self.start_apiserver()
        elif kind == "rotate_token" and self.heavy and api and not self.rotations:
            self.rotate_token()
        elif kind == "allocate" and api:
            self.allocate(claim, slot, device, node)
        elif kind == "share" and api and self.model.claims[claim].device:
            self.share(claim, slot or 0)
        elif kind == "delete_pod" and api and self.alive_slots() and self.done["delete_pod"] < 2:
            self.done["delete_pod"] += 1
            self.delete_pod(slot or 0)
        elif kind == "recreate_pod" and api and len(self.alive_slots()) < len(self.slots):
            self.recreate_pod(slot or 0)
        else:
            return False
        return True

    def kill_publisher(self) -> None:
        self.h.publisher.kill()
        self.kills += 1

    def start_publisher(self) -> None:
        self.h.publisher.start()

    def reboot(self) -> None:
        """The node crashes and boots again: every sandbox dies with the boot, the publisher comes back.

        The new boot is a new boot id for the publisher and the plugin (their own mount
        namespace, publisher_testkit.in_boot). Nothing tells the publisher which sandboxes
        died: no DEL, no GC. The pods and claims survive in the API, so the model expects
        no entry until the kubelet's new sandboxes (the `new_sandbox` step) are ADDed.
        """
        self.h.publisher.kill()
        self.h.boots += 1
        prefix = in_boot(self.h.workdir, f"{uuid.uuid4()}")
        self.h.publisher.prefix = prefix
        self.h.plugin.prefix = prefix
        self.dead.update(range(len(self.sandboxes)))
        self.live.clear()
        self.drifted.clear()
        self.carrierless.clear()
        self.model.known.clear()
        self.model.tick()
        self.h.publisher.start()

    def lock_journal(self, pick: int) -> None:
        """A supervised thread's journal write fails: another process holds the journal's SQLite write
        lock past the busy timeout while a live attachment loses its IPv4 address (or, when it
        has already, its carrier goes or comes back), so the
        live watch cannot record it (a thread that let that error out was crashed by it and
        restarted by the supervisor). The lock is released as soon as that write has failed (its
        crash is logged or the watch counts a journal error), at most after LOCK_WAIT (a watch that
        has not looked at this attachment yet writes nothing). Then every entry must follow its
        interface again, those watched before the fault included: the change made under the lock
        lands, and so do later ones."""
        if not self.deletable():
            return
        publisher = self.h.publisher
        # The fault hits attachments the watch follows, not events still in flight (a row the journal
        # commits after the fault is watched anew whatever the watch kept): quiet first, if it gets there.
        self._wait(self._watching_quietly, QUIET_WAIT)
        since, started = publisher.log_size(), time.time()
        errors = self._journal_errors()
        i, ifname = self.deletable()[pick % len(self.deletable())]
        with JournalLock(publisher.journal_db):
            if (i, ifname) in self.drifted:
                self.carrier(pick)
            else:  # an address removed stays removed: no later step undoes what the watch had to record
                self.drift(pick)
            failed = self._wait(lambda: "live-watch" in publisher.crashed_since(since)
                                or self._journal_errors() > errors, LOCK_WAIT)
            written = self._interface_changes()
        crashed = sorted(publisher.crashed_since(since))
        self.h.steps["lock_journal: live watch write failed" if failed else "lock_journal: no write failed"] += 1
        for thread in crashed:
            self.h.steps[f"lock_journal: {thread} crashed"] += 1
        self.log.append(f"journal write lock held {time.time() - started:.1f}s: live watch write failed {failed},"
                        f" threads crashed {crashed or '-'}")
        if failed:
            # The watch writes what it could not: wait for that, so that the next step meets a watch that
            # looks again (one that never does fails the final check instead).
            self._wait(lambda: self._interface_changes() > written, LANDED_WAIT)

    def _interface_changes(self) -> float:
        return self.h.publisher.metric("netclaim_interface_changes_total") or 0.0

    def _journal_errors(self) -> float:
        return self.h.publisher.metric("netclaim_interface_watch_journal_errors_total") or 0.0

    def vanishable(self) -> list[int]:
        """Sandboxes of this boot holding an attachment the publisher was told of (and no DEL it saw)."""
        told = {k.cid for k in self.model.known.values()}
        return [i for i, sb in enumerate(self.sandboxes) if i not in self.dead and sb.cid in told]

    def remove_netns(self, pick: int) -> None:
        """The runtime removes a sandbox's netns and no DEL comes: the live watch retires the
        sandbox's attachments at once, and a pod with another live attachment shows that one.

        Only while the publisher is quiet (else the step does nothing): then every attachment it
        was told of is journaled and its netns watched, so this is a netns going away under the
        watch (not one already gone when the watch first looks, which the model does not follow).
        Replayed step lists only: an effect that depends on timing is no hypothesis rule."""
        candidates = self.vanishable()
        publisher = self.h.publisher
        if not candidates or not self._wait(self._watching_quietly, QUIET_WAIT):
            self.h.steps["remove_netns: not quiet, skipped"] += 1
            return
        i = candidates[pick % len(candidates)]
        sb = self.sandboxes[i]
        retired = publisher.metric("netclaim_interface_netns_vanished_total") or 0.0
        sb.destroy()
        self.dead.add(i)
        for ifname in NETWORKS:
            self.live.discard((i, ifname))
            self.drifted.discard((i, ifname))
            self.carrierless.discard((i, ifname))
            self.model.known.pop((sb.cid, ifname), None)
        self.model.tick()
        self.log.append(f"sandbox {sb.index}: netns {sb.netns} removed without DEL")
        # The watch looks at each netns path once a second: wait for it, so that the final check
        # never compares before it looked (a watch that never looks fails that check instead).
        self._wait(lambda: (publisher.metric("netclaim_interface_netns_vanished_total") or 0.0) > retired,
                   RETIRE_WAIT)

    def _watching_quietly(self) -> bool:
        """Quiet, and the live watch has looked at the journal since this process started (a
        publisher is quiet before its first look too)."""
        publisher = self.h.publisher
        return publisher.quiescent() and (publisher.metric("netclaim_interface_watched_attachments") or 0) > 0

    @staticmethod
    def _wait(condition: Any, timeout: float) -> bool:
        deadline = time.time() + timeout
        while time.time() < deadline:
            if condition():
                return True
            time.sleep(0.1)
        return False

    def cut_api(self) -> None:
        self.h.proxy.cut()

    def restore_api(self) -> None:
        self.h.proxy.restore()

    def stop_apiserver(self) -> None:
        self.h.control_plane.stop_apiserver()
        self.h.apiserver_up = False
        self.apiserver_restarts += 1

    def start_apiserver(self) -> None:
        self.h.control_plane.start_apiserver()
        self.h.apiserver_up = True

    def rotate_token(self) -> None:
        self.h.creds.rotate()
        self.rotations += 1

    # ------------------------------------------------------------ the scheduler and the user

    def allocate(self, claim: str, slot: int | None, device: str, node: str) -> None:
        """Deallocate (slot None), or reallocate to the pod in `slot` as the scheduler would."""
        c = self.model.claims[claim]
        self._patch_status(c.name, {"reservedFor": None, "allocation": None})
        c.device = c.node = ""
        c.reserved = {}
        if slot is None:
            return
        alive = self.alive_slots()
        if not alive:
            return
        s = self.slots[alive[slot % len(alive)]]
        self._patch_status(c.name, {
            "allocation": {"devices": {"results": [{"request": c.request, "driver": DRIVER, "pool": node,
                                                    "device": device}]},
                           "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                               {"key": "metadata.name", "operator": "In", "values": [node]}]}]}},
            "reservedFor": [{"resource": "pods", "name": s.name, "uid": s.uid}]})
        c.device, c.node, c.reserved = device, node, {s.uid: s.name}

    def share(self, claim: str, slot: int) -> None:
        """Reserve an allocated claim for one more pod too (a shared claim), as the scheduler does."""
        c = self.model.claims[claim]
        others = [i for i in self.alive_slots() if self.slots[i].uid not in c.reserved]
        if not c.device or not others:
            return
        s = self.slots[others[slot % len(others)]]
        c.reserved[s.uid] = s.name
        self._patch_status(c.name, {"reservedFor": [{"resource": "pods", "name": name, "uid": uid}
                                                    for uid, name in c.reserved.items()]})

    def _patch_status(self, name: str, status: dict[str, Any]) -> None:
        self.h.resource.patch_namespaced_resource_claim_status(name, self.h.namespace, {"status": status},
                                                                _content_type=MERGE)

    def delete_pod(self, slot: int) -> None:
        alive = self.alive_slots()
        s = self.slots[alive[slot % len(alive)]]
        delete_pod(self.h.api, self.h.namespace, s.name)
        self.model.live_pods.pop(s.uid, None)
        s.uid = ""

    def recreate_pod(self, slot: int) -> None:
        dead = [i for i, s in enumerate(self.slots) if not s.uid]
        self._create_pod(dead[slot % len(dead)])

    # ------------------------------------------------------------ quiescence and the invariant

    def observed(self) -> dict[str, dict[str, Any]]:
        out = {}
        for base, c in self.model.claims.items():
            obj = self.h.resource.read_namespaced_resource_claim(c.name, self.h.namespace, _preload_content=False)
            status = json.loads(obj.data).get("status") or {}
            out[base] = observed_devices(status.get("devices") or [])
        return out

    def expected(self) -> dict[str, dict[str, Any]]:
        return {base: self.model.expected_devices(base) for base in self.model.claims}

    def _resyncs(self) -> float:
        return self.h.publisher.metric("netclaim_resyncs_total") or 0.0

    def _wait_resyncs(self, count: int, deadline: float) -> None:
        start = self._resyncs()
        while time.time() < deadline and self._resyncs() < start + count:
            time.sleep(0.05)

    def heal(self) -> None:
        """API reachable, API server up, publisher running: how every sequence ends."""
        if not self.h.proxy.up:
            self.h.proxy.restore()
        if not self.h.apiserver_up:
            self.start_apiserver()
        if not self.h.publisher.running:
            self.h.publisher.start()

    def settle(self) -> None:
        """Back to a healthy node, then wait for quiescence and check the invariant.

        Quiescence, as the publisher reports it (status `quiescent`: journal, spool and dirty
        claims empty) plus one COMPLETE resync pass that ended after we started waiting
        (`last_resync`); the claims must then be what the model says. A publisher without
        those fields: spool dir empty, claims equal, and still equal after two more resync passes.
        Failing needs three quiet rounds that disagree with the model, or the deadline."""
        self.heal()
        deadline = time.time() + QUIESCE_TIMEOUT
        expected = self.expected()
        observed: dict[str, Any] = {}
        since, quiet_mismatches = time.time(), 0
        while time.time() < deadline and quiet_mismatches < 3:
            st = self.h.publisher.status() or {}
            if st.get("quiescent") and (st.get("last_resync") or 0) > since:
                observed = self.observed()
                if observed == expected:
                    return
                quiet_mismatches += 1
                since = time.time()
            elif not self.h.publisher.spooled():
                # Not quiescent (e.g. an event that waits for its pod or claim, which may take the
                # publisher minutes to give up on): claims equal, and still after two resync passes.
                observed = self.observed()
                if observed == expected:
                    self._wait_resyncs(2, deadline)
                    observed = self.observed()
                    if observed == expected and not self.h.publisher.spooled():
                        return
            time.sleep(0.05)
        raise AssertionError(self.report(expected, observed))

    def report(self, expected: dict[str, Any], observed: dict[str, Any]) -> str:
        lines = [f"claims do not match the model once quiet (namespace {self.h.namespace})"]
        for base in sorted(expected):
            if expected[base] != observed.get(base):
                c = self.model.claims[base]
                lines.append(f"  claim {c.name} (device {c.device or '-'} node {c.node or '-'} "
                             f"reservedFor {','.join(c.reserved.values()) or '-'}):")
                lines.append(f"    expected {json.dumps(expected[base], sort_keys=True)}")
                lines.append(f"    observed {json.dumps(observed.get(base), sort_keys=True)}")
        lines.append(f"  spool: {self.h.publisher.spooled()}")
        st = self.h.publisher.status() or {}
        lines.append(f"  publisher status: quiescent={st.get('quiescent')} depth={st.get('journal_depth')} "
                     f"failed={st.get('failed_events')} last_error={st.get('last_error')}")
        lines.extend(f"  {line}" for line in self.log)
        lines.append("  publisher log tail:\n" + self.h.publisher.log_tail(3000))
        return "\n".join(lines)

    def cleanup(self) -> None:
        """Leave nothing for the next sequence: no netns, a healthy node, no claims or pods."""
        for sb in self.sandboxes:  # first: a failing heal must not leak network namespaces
            sb.destroy()
        self.heal()
        for c in getattr(self, "model", Model("")).claims.values():
            try:
                self.h.resource.delete_namespaced_resource_claim(c.name, self.h.namespace)
            except ApiException as exc:
                if exc.status != 404:
                    raise
        for s in self.slots:
            if s.uid:
                delete_pod(self.h.api, self.h.namespace, s.name)


def replay(h: Harness, steps: list[tuple[str, dict[str, Any]]]) -> None:
    """Run a step list (a sequence hypothesis printed) and check the invariant at the end."""
    s = Scenario(h)
    try:
        for name, kwargs in steps:
            getattr(s, name)(**kwargs)
        s.settle()
    finally:
        s.cleanup()
