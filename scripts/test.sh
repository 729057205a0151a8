#!/usr/bin/env bash
# Set up everything (Debian packages, .venv, Go-built control plane) and run the
# whole test suite: unit, integration against real network namespaces and the
# real kube-apiserver, and end to end with a real containerd.
#
#   scripts/test.sh [--load] [pytest args...]
#
# With no test path among the arguments the suite runs as three lanes side by
# side, each with its own control plane and clusters (scripts/harness/lanes.py);
# with one, pytest runs just that, as usual.
# --load runs it on a loaded machine: a CPU burner on one core and an fsync loop
# on the disk (scripts/harness/load.py) for the whole run. A test that passes
# only on an idle machine waits on time, not on its outcome.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

[[ "$(id -u)" == 0 ]] || { echo "scripts/test.sh needs root (network namespaces, containerd)" >&2; exit 1; }

load=0
if [[ "${1:-}" == "--load" ]]; then
    load=1
    shift
fi

"$ROOT/scripts/setup.sh"

runner=("$ROOT/.venv/bin/python" "$ROOT/scripts/harness/lanes.py")
for arg in "$@"; do
    if [[ "$arg" == tests* || "$arg" == *::* || -e "$arg" ]]; then
        runner=("$ROOT/.venv/bin/python" -m pytest)  # a chosen test path: one ordinary run
        break
    fi
done

if (( load )); then
    "$ROOT/.venv/bin/python" "$ROOT/scripts/harness/load.py" &
    load_pid=$!
    trap 'kill -TERM "$load_pid" 2>/dev/null; wait "$load_pid" 2>/dev/null || true' EXIT
    echo "[test] running the test suite under load" >&2
    rc=0
    "${runner[@]}" "$@" || rc=$?
    exit "$rc"
fi

echo "[test] running the test suite" >&2
exec "${runner[@]}" "$@"
