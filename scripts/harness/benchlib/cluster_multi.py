"""cluster --multi-network: a three-network pod's start-up behind Multus, netclaim in every chain vs in none.

The real node of `scripts/cluster.sh up --with-multus`: Multus is the primary
CNI, eth0 comes from the node's bridge conflist, net1 from the `macvlan` NAD,
net2 from the `bridge2` NAD. Each sample is one pod with a three-request
ResourceClaimTemplate; before it, every chain is switched (the node's conflist,
read by Multus at each ADD, and the two NADs, read from the API at each ADD)
to the variant with netclaim last or to the same chains without it, in ABBA
order. Figures: pod create -> Ready (a watch), the ratio of the medians
(target <= 1.05), and ADD-to-visible per interface: netclaim's ADD log line for
(sandbox, interface) to a watch seeing that interface's Ready entry with the
addresses the pod's netns holds.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import threading
import time
from pathlib import Path
from typing import Any

from kubernetes import client, watch

from runtime import multinet
from runtime.controlplane import api_client
from runtime.observe import _parse_ts
from runtime.realcluster import ClusterError, RealCluster, cluster_sh, parse_env

from .cluster_common import NAMESPACE, TARGET_RATIO, ReadyWatch, progress, summary

NETS = [multinet.Attachment("macvlan", "net1"), multinet.Attachment("bridge2", "net2")]
IFNAMES = ["eth0"] + [a.ifname for a in NETS]


class EntryWatch:
    """First wall time a watch sees each (claim, interface, ips) as a Ready entry."""

    def __init__(self, api: client.ApiClient, driver: str) -> None:
        self.api, self.driver = api, driver
        self.resource = client.ResourceV1Api(api)
        self.seen: dict[tuple[str, str, tuple[str, ...]], float] = {}
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._watch = watch.Watch(return_type="object")
        threading.Thread(target=self._loop, daemon=True).start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                for event in self._watch.stream(self.resource.list_namespaced_resource_claim, NAMESPACE,
                                                timeout_seconds=60):
                    now = time.time()
                    raw = self.api.sanitize_for_serialization(event["object"])
                    for e in (raw.get("status") or {}).get("devices") or []:
                        nd = e.get("networkData") or {}
                        if e.get("driver") == self.driver and any(
                                c.get("type") == "Ready" and c.get("status") == "True" for c in e.get("conditions") or []):
                            key = (raw["metadata"]["name"], nd.get("interfaceName", ""), tuple(sorted(nd.get("ips") or [])))
                            with self._cond:
                                self.seen.setdefault(key, now)
                                self._cond.notify_all()
            except Exception:  # noqa: BLE001 - re-watch; waits time out if it never recovers
                time.sleep(0.2)

    def wait(self, claim: str, ifname: str, ips: list[str], timeout: float = 60) -> float:
        key = (claim, ifname, tuple(sorted(ips)))
        with self._cond:
            if not self._cond.wait_for(lambda: key in self.seen, timeout):
                raise TimeoutError(f"no Ready entry {key} within {timeout}s")
            return self.seen[key]

    def stop(self) -> None:
        self._stop.set()
        self._watch.stop()


def add_times(log_file: str, container_id: str) -> dict[str, float]:
    """ifname -> netclaim's first ADD log line for (sandbox, interface)."""
    out: dict[str, float] = {}
    for line in Path(log_file).read_text(errors="replace").splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if isinstance(rec, dict) and rec.get("containerID") == container_id and rec.get("command") == "ADD":
            ts = _parse_ts(rec.get("ts"))
            if ts is not None:
                out.setdefault(rec.get("ifname", ""), ts)
    return out


class Chains:
    """Every chain of the node with or without netclaim: the node's conflist and the two NADs."""

    def __init__(self, cluster: RealCluster) -> None:
        self.cluster = cluster
        self.conflist = Path(cluster.values["NETCLAIM_CONFLIST"])
        self.conf = {True: self.conflist.read_text()}
        self.conf[False] = json.dumps(_without(json.loads(self.conf[True])), indent=2) + "\n"
        self.nads = {True: [], False: []}
        for a in NETS:
            nad = cluster.get("network-attachment-definition", a.nad, "default")
            nad["metadata"] = {k: nad["metadata"][k] for k in ("name", "namespace", "annotations")}
            config = json.loads(nad["spec"]["config"])
            self.nads[True].append(json.loads(json.dumps(nad)))
            nad["spec"]["config"] = json.dumps(_without(config))
            self.nads[False].append(nad)

    def use(self, netclaim: bool) -> None:
        tmp = self.conflist.with_suffix(".tmp")
        tmp.write_text(self.conf[netclaim])
        tmp.replace(self.conflist)
        self.cluster.apply(*self.nads[netclaim])


def _without(conflist: dict[str, Any]) -> dict[str, Any]:
    return {**conflist, "plugins": [p for p in conflist["plugins"] if p.get("type") != "netclaim"]}


def run(args: argparse.Namespace) -> dict[str, Any]:
    directory = args.dir + "m"
    env = {**os.environ, "NETCLAIM_CLUSTER_DIR": directory,
           "NETCLAIM_REQUEST": multinet.PRIMARY_REQUEST, "NETCLAIM_DRA_DEVICES": "24"}
    progress(f"bringing up the real cluster with Multus in {directory}")
    t0 = time.time()
    try:
        cluster = RealCluster(directory, parse_env(cluster_sh("up", "--with-multus", env=env)), env)
    except ClusterError:
        cluster_sh("down", env=env)
        raise
    up_s = time.time() - t0
    ready = entries = None
    ms: dict[str, list[float]] = {"plain": [], "netclaim": []}
    a2v: dict[str, list[float]] = {i: [] for i in IFNAMES}
    try:
        cluster.sh("install-netclaim")
        cluster.namespace(NAMESPACE)
        cluster.apply(multinet.claim_template(NAMESPACE, "three", [multinet.PRIMARY_REQUEST] + [a.request for a in NETS],
                                              cluster.values["NETCLAIM_DEVICE_CLASS"]))
        api = api_client(cluster.kubeconfig)
        ready, entries = ReadyWatch(api), EntryWatch(api, cluster.driver)
        chains = Chains(cluster)
        n = 0
        for i in range(args.warmup + args.rounds):
            measured = i >= args.warmup
            for variant in (("plain", "netclaim") if i % 2 == 0 else ("netclaim", "plain")):  # ABBA
                n += 1
                name = f"m{n}-{variant}"
                chains.use(variant == "netclaim")
                start = time.time()
                cluster.apply(multinet.pod(NAMESPACE, name, NETS, {"net": {"resourceClaimTemplateName": "three"}}))
                t_ready = ready.wait(name)
                if variant == "netclaim":
                    claim = cluster.pod_claim(NAMESPACE, name)
                    netns = multinet.netns_interfaces(cluster, NAMESPACE, name)
                    seen = {ifn: entries.wait(claim, ifn, netns[ifn].cidrs) for ifn in IFNAMES}
                    adds = add_times(cluster.values["NETCLAIM_PLUGIN_LOG"], cluster.sandbox(NAMESPACE, name)["id"])
                    if measured:
                        for ifn in IFNAMES:
                            if ifn in adds:
                                a2v[ifn].append((seen[ifn] - adds[ifn]) * 1000)
                if measured:
                    ms[variant].append((t_ready - start) * 1000)
                cluster.delete_pod(NAMESPACE, name)
            if measured:
                progress(f"round {i - args.warmup + 1}/{args.rounds}: plain {ms['plain'][-1]:.0f} ms, "
                          f"netclaim {ms['netclaim'][-1]:.0f} ms")
    finally:
        for w in (ready, entries):
            if w is not None:
                w.stop()
        cluster.down()
    ratio = statistics.median(ms["netclaim"]) / statistics.median(ms["plain"])
    return {
        "result_name": "cluster-multi-network",
        "multi_network": True,
        "networks": IFNAMES,
        "cluster_up_s": round(up_s, 1),
        "pod_create_to_ready_ms": {"plain": summary(ms["plain"]), "netclaim": summary(ms["netclaim"])},
        "ratio_create_to_ready_median": round(ratio, 3),
        "target_ratio": TARGET_RATIO,
        "add_to_visible_ms": {i: summary(v) for i, v in a2v.items() if v},
        "samples": {"plain_ms": [round(v, 1) for v in ms["plain"]], "netclaim_ms": [round(v, 1) for v in ms["netclaim"]],
                    "add_to_visible_ms": {i: [round(x, 1) for x in v] for i, v in a2v.items()}},
    }
