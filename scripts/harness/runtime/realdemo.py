"""The demo on a real single-node Kubernetes: the scheduler allocates, the kubelet starts, netclaim reports.

    realdemo.py run [--keep] [--multi-network]
                               bring up the cluster (scripts/cluster.sh), install netclaim the operator
                               way, create a Pod with a ResourceClaimTemplate and show what kubectl shows;
                               --multi-network: Multus as the primary CNI and one pod with three networks
                               (runtime/multidemo.py)
    realdemo.py show           print the kept claim again
    realdemo.py cleanup        take the kept cluster down

Nothing here writes an allocation or creates a sandbox: kube-controller-manager
generates the claim, kube-scheduler allocates a device of the DRA test driver
(net.example.com), the kubelet prepares it and asks containerd 2.x for the
sandbox, and the CNI chain ends in netclaim, whose publisher writes the status.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

import yaml  # noqa: E402

from runtime import multidemo  # noqa: E402
from runtime.controlplane import api_client  # noqa: E402
from runtime.observe import ClaimWatcher, plugin_add_time, ready_entry  # noqa: E402
from runtime.realcluster import ClusterError, RealCluster, cluster_sh, parse_env  # noqa: E402

DEMO_DIR = os.environ.get("NETCLAIM_DEMO_DIR", "/tmp/netclaim-demo")
NAMESPACE, POD, TEMPLATE = "demo", "web", "net"


class Steps:
    """Numbered progress lines a new user can follow."""

    def __init__(self) -> None:
        self.n = 0

    def __call__(self, text: str) -> None:
        self.n += 1
        print(f"[demo {self.n:>2}] {text}", flush=True)


def _env() -> dict[str, str]:
    return {**os.environ, "NETCLAIM_CLUSTER_DIR": DEMO_DIR}


def _kept() -> RealCluster | None:
    try:
        return RealCluster(DEMO_DIR, parse_env(cluster_sh("env", env=_env())), _env())
    except ClusterError:
        return None


def story(cluster: RealCluster, step: Steps) -> None:
    step("installing netclaim: scripts/install.sh chains it into containerd's conflist; the publisher runs "
         "as a node service (shipped RBAC, Node-bound token)")
    cluster.sh("install-netclaim")
    step(f"creating namespace {NAMESPACE}, ResourceClaimTemplate {TEMPLATE} (class {cluster.values['NETCLAIM_DEVICE_CLASS']}) "
         f"and Pod {POD}")
    cluster.namespace(NAMESPACE)
    cluster.claim_template(NAMESPACE, TEMPLATE)
    watcher = ClaimWatcher(api_client(cluster.kubeconfig), NAMESPACE, cluster.driver).start()
    t0 = time.time()
    cluster.pod(NAMESPACE, POD, template=TEMPLATE)
    claim = cluster.pod_claim(NAMESPACE, POD)
    step(f"kube-controller-manager generated claim {claim}; waiting for the scheduler and the kubelet")
    cluster.wait_running(NAMESPACE, POD)
    t_running = time.time()
    result = cluster.claim_yaml(NAMESPACE, claim)["status"]["allocation"]["devices"]["results"][0]
    step(f"Pod Running {t_running - t0:.1f}s after create; scheduler allocated {result['driver']}/{result['pool']}/"
         f"{result['device']}")
    eth0 = cluster.interface(NAMESPACE, POD)
    visible = watcher.wait(claim, eth0.cidrs)
    watcher.stop()
    sandbox = cluster.sandbox(NAMESPACE, POD)["id"]
    t_add = plugin_add_time(cluster.values["NETCLAIM_PLUGIN_LOG"], sandbox)
    latency = f"add-to-visible={(visible - t_add) * 1000:.0f}ms" if t_add else "add-to-visible=unknown"
    claim_obj = cluster.claim_yaml(NAMESPACE, claim)
    print(f"\n$ kubectl get resourceclaim {claim} -n {NAMESPACE} -o yaml   # .status")
    print(yaml.safe_dump({"status": claim_obj.get("status")}, sort_keys=False, default_flow_style=False))
    entry = ready_entry(claim_obj.get("status") or {}, cluster.driver) or {}
    nd = entry.get("networkData") or {}
    print(f"pod={NAMESPACE}/{POD} interface={nd.get('interfaceName')} ips={','.join(nd.get('ips') or [])} "
          f"mac={nd.get('hardwareAddress')} Ready={'True' if entry else 'False'} {latency}")
    if nd.get("ips") != eth0.cidrs or nd.get("hardwareAddress") != eth0.mac:
        raise SystemExit(f"the claim does not show what the pod's netns shows: {eth0}")


def run(keep: bool, multi_network: bool = False) -> int:
    step = Steps()
    if _kept() is not None:
        print(f"[demo] a kept demo cluster runs in {DEMO_DIR}: scripts/demo.sh cleanup first", file=sys.stderr)
        return 1
    step("starting a real single-node Kubernetes 1.37 (etcd, apiserver, controller-manager, scheduler, kubelet, "
         "containerd 2.x, DRA test driver)")
    t0 = time.time()
    try:
        if multi_network:
            env = {**_env(), "NETCLAIM_REQUEST": "nic"}
            cluster = RealCluster(DEMO_DIR, parse_env(cluster_sh("up", "--with-multus", "--with-vf-driver", env=env)),
                                  env)
        else:
            cluster = RealCluster.up(DEMO_DIR, _env())
        step(f"node {cluster.node} Ready in {time.time() - t0:.0f}s; driver {cluster.driver} published its devices")
        (multidemo.story if multi_network else story)(cluster, step)
    except BaseException:
        step("failed; tearing down (logs were under " + DEMO_DIR + ")")
        cluster_sh("down", env=_env())
        raise
    if keep:
        print(f"\nLeft running (--keep). Look around with:\n  eval \"$(scripts/cluster.sh env)\"  "
              f"# with NETCLAIM_CLUSTER_DIR={DEMO_DIR}\n  scripts/demo.sh show\n  "
              f"NETCLAIM_CLUSTER_DIR={DEMO_DIR} scripts/cluster.sh kubectl get pods,resourceclaims -A\n"
              f"  logs: {DEMO_DIR}/*.log\nTo clean up:\n  scripts/demo.sh cleanup")
        return 0
    step("tearing down (use --keep to leave it running)")
    cluster.down()
    step("done")
    return 0


def show() -> int:
    cluster = _kept()
    if cluster is None:
        print("[demo] no kept demo cluster", file=sys.stderr)
        return 1
    print(cluster.kubectl("get", "resourceclaim", "-n", NAMESPACE, "-o", "yaml"))
    return 0


def cleanup() -> int:
    cluster_sh("down", env=_env())
    print("[demo] cleaned up")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("action", nargs="?", default="run", choices=("run", "show", "cleanup"))
    parser.add_argument("--keep", action="store_true", help="leave the cluster running and print how to look")
    parser.add_argument("--multi-network", action="store_true",
                        help="Multus as the primary CNI; one pod with three networks and three device entries")
    args = parser.parse_args(argv)
    if args.action == "show":
        return show()
    if args.action == "cleanup":
        return cleanup()
    return run(args.keep, args.multi_network)


if __name__ == "__main__":
    sys.exit(main())
