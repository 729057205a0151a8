#!/usr/bin/env bash
# Set up everything (Debian packages, .venv, Go-built control plane) and run the
# whole test suite: unit, integration against real network namespaces and the
# real kube-apiserver, and end to end with a real containerd.
#
#   scripts/test.sh [pytest args...]
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

[[ "$(id -u)" == 0 ]] || { echo "scripts/test.sh needs root (network namespaces, containerd)" >&2; exit 1; }

"$ROOT/scripts/setup.sh"

echo "[test] running the test suite" >&2
exec "$ROOT/.venv/bin/python" -m pytest "$@"
