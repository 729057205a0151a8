#!/usr/bin/env bash
# Build the Multus thin CNI plugin (k8snetworkplumbingwg/multus-cni, cmd/multus) from its source
# snapshot, once, and cache the binary by the snapshot's commit, like the other Go-built tools.
#
#   scripts/build/multus.sh            prints the binary's path (builds it when absent)
#   scripts/build/multus.sh daemon     the same for the thick plugin's daemon (cmd/multus-daemon)
#   scripts/build/multus.sh shim       the same for the thick plugin's shim (cmd/multus-shim)
#
# Multus's module is not served by the module proxy, its dependencies are: the snapshot
# (multus-cni-<commit>.tar.gz, unpacking into multus-cni/) is found in $NETCLAIM_PEERS_DIR, else
# in ${XDG_CACHE_HOME:-$HOME/.cache}/netclaim/peers. It is unpacked and built under the cache
# (build/multus-<commit>), never in the repository; nothing of Multus is copied into the project.
# The binary: ${XDG_CACHE_HOME:-$HOME/.cache}/netclaim/bin/multus-<commit> (multus-daemon-<commit>,
# multus-shim-<commit>). Thin mode: the plugin reads the API itself with the kubeconfig its conflist
# names, no daemon runs on the node. Thick mode: the shim is the node's plugin and forwards every call
# to the daemon, which runs the delegates (harness/cluster/multus.sh).
set -euo pipefail

# shellcheck source=peer.sh
source "$(dirname "${BASH_SOURCE[0]}")/peer.sh"
pkg=gopkg.in/k8snetworkplumbingwg/multus-cni.v4/pkg/multus
case "${1:-thin}" in
    thin) build_peer multus multus-cni ./cmd/multus "-X $pkg.version=snapshot-{commit} -X $pkg.commit={commit}" ;;
    daemon|shim) build_peer "multus-$1" multus-cni "./cmd/multus-$1" "-X $pkg.version=snapshot-{commit} -X $pkg.commit={commit}" ;;
    *) echo "usage: $0 [thin|daemon|shim]" >&2; exit 2 ;;
esac
