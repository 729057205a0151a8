#!/usr/bin/env bash
# Everything a fresh machine needs before the demo or the tests:
# Debian packages, the project virtualenv at .venv, and every Go-built tool the
# suite uses (cached outside the repo): etcd, the Kubernetes 1.37 components and
# kubectl, the DRA test driver, containerd 2.x with its shim, ctr and crictl, the
# CNI 1.1 reference plugins, cnitool and helm. A cold build takes ~25-30 min on
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
    gcc libc6-dev                 # static pause binary for the local sandbox image
    time                          # peak-memory figures of the Go builds
    procps                        # pgrep/ps used by the scripts
    python3-venv                  # `python3 -m venv` when python3 is Debian's own
    openssl curl                  # the control plane's certificates and readiness probe
    util-linux mount              # nsenter, setsid, flock, umount: the real cluster's node side
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
    "$ROOT/.venv/bin/python" -m pip install -q -e "$ROOT[test,bench]"
    echo "$want" >"$stamp"
}

install_packages
make_venv
"$ROOT/scripts/build-plugin.sh" >/dev/null  # the self-contained CNI plugin (cached outside the repo)
"$ROOT/scripts/build-plugin.sh" --arch arm64 >/dev/null  # the same cross-built for arm64 nodes (tests run it under qemu-user)
# shellcheck disable=SC2086
"$ROOT/scripts/build/components.sh" ${NETCLAIM_BUILD_TARGETS:-all} >/dev/null
log "ready"
