#!/usr/bin/env bash
# Everything a fresh machine needs before the demo or the tests:
# Debian packages, the project virtualenv at .venv, and every Go-built tool the
# suite uses (cached outside the repo): etcd, the Kubernetes 1.37 components and
# kubectl, the DRA test driver, containerd 2.x with its shim, ctr and crictl, the
# CNI 1.1 reference plugins, cnitool, helm, the harness's own DRA driver
# (scripts/harness/netdriver) and CRI-O (scripts/build/crio.sh). A cold build takes ~25-30 min on
# 2 cores. Safe to run again: each step is skipped when already done.
#
#   NETCLAIM_BUILD_TARGETS="control-plane node"   build only these targets/groups
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
log() { printf '[setup] %s\n' "$*" >&2; }

APT_PACKAGES=(
    iproute2                      # ip netns / veth for tests and the demo
    containernetworking-plugins   # the real reference CNI plugins (bridge, host-local, tuning, ...)
    iptables                      # ipMasq of bridge/ptp and portmap in the example chains
    containerd runc               # the real container runtime for e2e tests and the demo
    conmon                        # CRI-O's container monitor (scripts/cluster.sh up --runtime crio)
    gcc libc6-dev                 # static pause binary for the local sandbox image
    time                          # peak-memory figures of the Go builds
    procps                        # pgrep/ps used by the scripts
    python3-venv                  # `python3 -m venv` when python3 is Debian's own
    openssl curl                  # the control plane's certificates and readiness probe
    util-linux mount              # nsenter, setsid, flock, umount: the real cluster's node side
    prometheus                    # its promtool unit-tests the chart's alerts (tests/deploy/test_monitoring.py)
    graphviz fonts-dejavu-core    # dot renders docs/diagrams/*.dot in DejaVu Sans (scripts/build/diagrams.sh, tests/deploy/test_docs.py)
)

# shellcheck source=build/apt.sh
source "$ROOT/scripts/build/apt.sh"

install_packages() {
    ensure_debian_packages "${APT_PACKAGES[@]}"
    # Debian's containerd package enables and starts a system containerd where
    # systemd runs; the harness starts its own, so nothing else is needed here.
}

make_venv() {
    local stamp="$ROOT/.venv/.netclaim-installed"
    local want
    want="$(sha256sum "$ROOT/setup.cfg" "$ROOT/pyproject.toml" | sha256sum | cut -c1-16)"
    if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
        return 0
    fi
    log "creating the virtualenv at .venv"
    python3 -m venv "$ROOT/.venv"
    "$ROOT/.venv/bin/python" -m pip install -q --upgrade pip
    "$ROOT/.venv/bin/python" -m pip install -q -e "$ROOT[test,bench,lint]"
    echo "$want" >"$stamp"
}

# The peers' source snapshots (Multus, dranet: their modules are not served, so they are built from
# snapshots). A checkout that has them beside it (../shared/peers, or $NETCLAIM_PEERS_DIR) copies them
# into the cache, where every later clone's builds find them.
seed_peers() {
    local src="${NETCLAIM_PEERS_DIR:-$ROOT/../shared/peers}" dst="${XDG_CACHE_HOME:-$HOME/.cache}/netclaim/peers" f
    [[ -d "$src" ]] || return 0
    mkdir -p "$dst"
    for f in "$src"/*.tar.gz; do
        [[ -f "$f" && ! -f "$dst/$(basename "$f")" ]] || continue
        cp "$f" "$dst/.$(basename "$f").tmp" && mv "$dst/.$(basename "$f").tmp" "$dst/$(basename "$f")"
        log "peer snapshot $(basename "$f") kept in the cache"
    done
}

install_packages
make_venv
seed_peers
"$ROOT/scripts/build-plugin.sh" >/dev/null  # the self-contained CNI plugin (cached outside the repo)
"$ROOT/scripts/build-plugin.sh" --arch arm64 >/dev/null  # the same cross-built for arm64 nodes (tests run it under qemu-user)
# shellcheck disable=SC2086
"$ROOT/scripts/build/components.sh" ${NETCLAIM_BUILD_TARGETS:-all} >/dev/null
# Multus from its source snapshot (when the cache has it): the thin plugin, the thick plugin's daemon and shim
# (tests/cluster/test_multus.py runs both modes).
if compgen -G "${NETCLAIM_PEERS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/netclaim/peers}/multus-cni-*.tar.gz" >/dev/null; then
    for part in thin daemon shim; do "$ROOT/scripts/build/multus.sh" "$part" >/dev/null; done
fi
"$ROOT/scripts/build/netdriver.sh" >/dev/null  # the harness's own DRA driver (Multus's DRA path, tests/cluster/test_multus_dra.py)
"$ROOT/scripts/build/crio.sh" >/dev/null  # CRI-O, copyimg and pinns: the node's other runtime (tests/cluster/test_crio_cluster.py)
log "ready"
