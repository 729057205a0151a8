#!/usr/bin/env bash
# Build the Multus thin CNI plugin (k8snetworkplumbingwg/multus-cni, cmd/multus) from its source
# snapshot, once, and cache the binary by the snapshot's commit, like the other Go-built tools.
#
#   scripts/build/multus.sh            prints the binary's path (builds it when absent)
#
# Multus's module is not served by the module proxy, its dependencies are: the snapshot
# (multus-cni-<commit>.tar.gz, unpacking into multus-cni/) is found in $NETCLAIM_PEERS_DIR, else
# in ${XDG_CACHE_HOME:-$HOME/.cache}/netclaim/peers. It is unpacked and built under the cache
# (build/multus-<commit>), never in the repository; nothing of Multus is copied into the project.
# The binary: ${XDG_CACHE_HOME:-$HOME/.cache}/netclaim/bin/multus-<commit>. Thin mode only: the
# plugin reads the API itself with the kubeconfig its conflist names, no daemon runs on the node.
set -euo pipefail

# shellcheck source=peer.sh
source "$(dirname "${BASH_SOURCE[0]}")/peer.sh"
pkg=gopkg.in/k8snetworkplumbingwg/multus-cni.v4/pkg/multus
build_peer multus multus-cni ./cmd/multus "-X $pkg.version=snapshot-{commit} -X $pkg.commit={commit}"
