#!/usr/bin/env bash
# The whole netclaim story on a real single-node Kubernetes on this machine:
#
#   scripts/demo.sh [--keep]   set up (packages, .venv, every Go-built component; the first run builds
#                              them), start the cluster (scripts/cluster.sh up: etcd, kube-apiserver,
#                              kube-controller-manager, kube-scheduler, kubelet, containerd 2.x, the DRA
#                              test driver), install netclaim the operator way, create a Pod with a
#                              ResourceClaimTemplate - the scheduler allocates the driver's device, the
#                              kubelet starts the pod - then print `kubectl get resourceclaim -o yaml` and
#                              a one-line summary, and tear everything down (unless --keep)
#   scripts/demo.sh --multi-network [--keep]
#                              the same node with Multus as its primary CNI: one pod with three networks
#                              (eth0, macvlan net1, host-device net2), its claim's three device entries
#                              beside Multus's network-status and the pod's netns (docs/multi-network.md);
#                              then two VFs of one request (count: 2, the same NAD twice), each interface's
#                              entry on the device carrying the device ID Multus handed it
#   scripts/demo.sh show       print the kept claim again
#   scripts/demo.sh cleanup    tear down what --keep left running
#
# The cluster lives in $NETCLAIM_DEMO_DIR (default /tmp/netclaim-demo).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

if [[ "$(id -u)" != 0 ]]; then
    echo "[demo] needs root (kubelet, containerd, network namespaces): run it with sudo" >&2
    exit 1
fi

case "${1:-}" in
    show|cleanup) exec "$ROOT/.venv/bin/python" "$ROOT/scripts/harness/runtime/realdemo.py" "$@" ;;
    -h|--help) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed -e '$d' -e 's/^# \{0,1\}//'; exit 0 ;;
esac

echo "[demo  0] setting up: Debian packages, the virtualenv, the Go-built components (first run builds them)"
"$ROOT/scripts/setup.sh"
exec "$ROOT/.venv/bin/python" "$ROOT/scripts/harness/runtime/realdemo.py" run "$@"
