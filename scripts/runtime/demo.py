"""The demo: one pod's network attachment, from containerd's RunPodSandbox to ResourceClaim status.

    demo.py [--keep]     run the whole story; tear down unless --keep
    demo.py show         print the kept claim's status again
    demo.py cleanup      tear down what --keep left running

Progress goes to stdout as numbered steps a new user can follow; the
components' own JSON logs go to files under the harness dir (paths printed
with --keep).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

import yaml  # noqa: E402

from runtime.cri import PodMeta  # noqa: E402
from runtime.observe import ClaimWatcher, plugin_add_time, ready_entry  # noqa: E402
from runtime.stack import Stack, cleanup_saved  # noqa: E402

STATE_FILE = Path("/run/netclaim-demo.state.json")
POD, CLAIM = "demo-web", "demo-web-net"


class Steps:
    """Numbered progress lines: '[demo 3] creating ...'."""

    def __init__(self) -> None:
        self.n = 0

    def __call__(self, text: str) -> None:
        self.n += 1
        print(f"[demo {self.n:>2}] {text}", flush=True)


def run(keep: bool) -> int:
    step = Steps()
    stack = Stack(prefix="ncdemo", progress=step)
    stack.up()
    try:
        cluster, harness = stack.cluster, stack.harness
        step(f"creating ResourceClaim {cluster.namespace}/{CLAIM} and Pod {cluster.namespace}/{POD}")
        cluster.create_claim(CLAIM)
        pod = cluster.create_pod(POD, CLAIM)
        step(f"allocating device 'eth0-dev' of driver {stack.driver} on {cluster.node} (as the scheduler would)")
        cluster.allocate(CLAIM, pod, "eth0-dev")

        watcher = ClaimWatcher(stack._api, cluster.namespace, stack.driver).start()
        step("RunPodSandbox through containerd (bridge -> host-local -> netclaim)")
        t0 = time.time()
        sandbox = harness.run_pod(PodMeta(pod.name, pod.namespace, pod.uid))
        t_run = time.time()
        step(f"sandbox {sandbox.id[:12]} ready in {t_run - t0:.3f}s with IP {sandbox.ip}; waiting for the claim status")
        visible = watcher.wait(CLAIM, [f"{ip}/{_prefix(harness)}" for ip in sandbox.ips])
        watcher.stop()

        t_add = plugin_add_time(str(stack.install.log_file), sandbox.id)
        latency = f"add-to-visible={(visible - t_add) * 1000:.0f}ms" if t_add else "add-to-visible=unknown (no plugin log line)"
        status = cluster.claim_status(CLAIM)
        print("\n# ResourceClaim " + f"{cluster.namespace}/{CLAIM} .status.devices")
        print(yaml.safe_dump({"devices": status.get("devices")}, sort_keys=False, default_flow_style=False))
        entry = ready_entry(status, stack.driver) or {}
        nd = entry.get("networkData") or {}
        print(
            f"pod={cluster.namespace}/{POD} interface={nd.get('interfaceName')} ips={','.join(nd.get('ips') or [])} "
            f"mac={nd.get('hardwareAddress')} Ready={'True' if entry else 'False'} "
            f"{latency} (RunPodSandbox start to visible {(visible - t0) * 1000:.0f}ms)"
        )
    except BaseException:
        step("failed; tearing down")
        stack.down()
        raise
    if keep:
        stack.save(STATE_FILE)
        _print_keep_help(stack, sandbox)
        return 0
    step("tearing down (use --keep to leave it running)")
    harness.stop_pod(sandbox.id)
    harness.remove_pod(sandbox.id)
    stack.down()
    step("done")
    return 0


def _prefix(harness) -> str:
    return harness.network.subnet.split("/")[1]


def _print_keep_help(stack: Stack, sandbox) -> None:
    h = stack.harness
    print(
        "\nLeft running (--keep). To look around:\n"
        f"  scripts/demo.sh show                                   # the claim status again\n"
        f"  nsenter --net={sandbox.netns} ip addr     # the pod's interfaces\n"
        f"  ctr --address {h.paths.socket} -n k8s.io containers ls\n"
        f"  KUBECONFIG={stack.cp.kubeconfig}  (admin kubeconfig of the local API server)\n"
        f"  {stack.publisher_kubeconfig}  (the publisher's: Node-bound token of netclaim-system/netclaim-publisher)\n"
        f"  logs: {stack.publisher.log_file} (publisher), {stack.install.log_file} (plugin), {h.paths.log} (containerd)\n"
        "To clean up:\n"
        "  scripts/demo.sh cleanup"
    )


def show() -> int:
    from runtime.controlplane import api_client
    from kubernetes import client

    state = json.loads(STATE_FILE.read_text())
    api = api_client(state["kubeconfig"])
    obj = client.ResourceV1Api(api).read_namespaced_resource_claim_status(CLAIM, state["namespace"])
    print(yaml.safe_dump(api.sanitize_for_serialization(obj).get("status"), sort_keys=False))
    return 0


def cleanup() -> int:
    if not STATE_FILE.exists():
        print("[demo] nothing to clean up (no kept demo found)")
        return 0
    cleanup_saved(STATE_FILE, Steps())
    print("[demo] cleaned up")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("action", nargs="?", default="run", choices=("run", "show", "cleanup"))
    parser.add_argument("--keep", action="store_true", help="leave everything running and print how to look")
    args = parser.parse_args(argv)
    if args.action == "show":
        return show()
    if args.action == "cleanup":
        return cleanup()
    if STATE_FILE.exists():
        print("[demo] a kept demo is still running: scripts/demo.sh cleanup first", file=sys.stderr)
        return 1
    return run(args.keep)


if __name__ == "__main__":
    sys.exit(main())
