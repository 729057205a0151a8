#!/usr/bin/env bash
# The whole netclaim story on one machine:
#
#   scripts/demo.sh [--keep]   set up (packages, .venv, control plane), start containerd with
#                              netclaim in its CNI chain and the publisher, create a Node, an
#                              allocated ResourceClaim and a Pod, run the pod's sandbox, print the
#                              claim's status and a one-line summary, then tear down (unless --keep)
#   scripts/demo.sh show       print the kept claim's status again
#   scripts/demo.sh cleanup    tear down what --keep left running
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

if [[ "$(id -u)" != 0 ]]; then
    echo "[demo] needs root (containerd, network namespaces): run it with sudo" >&2
    exit 1
fi

case "${1:-}" in
    show|cleanup) exec "$ROOT/.venv/bin/python" "$ROOT/scripts/runtime/demo.py" "$@" ;;
    -h|--help) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed -e '$d' -e 's/^# \{0,1\}//'; exit 0 ;;
esac

echo "[demo  0] setting up: Debian packages, the virtualenv, the control-plane binaries (first run builds them)"
"$ROOT/scripts/setup.sh"
exec "$ROOT/.venv/bin/python" "$ROOT/scripts/runtime/demo.py" run "$@"
