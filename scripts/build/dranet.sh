#!/usr/bin/env bash
# Build dranet (kubernetes-sigs/dranet, a network DRA driver) from its source snapshot, once, and
# cache the binary by the snapshot's commit, like the other Go-built tools.
#
#   scripts/build/dranet.sh            prints the binary's path (builds it when absent)
#
# dranet's module is not served by the module proxy, its dependencies are: the snapshot
# (dranet-<commit>.tar.gz, unpacking into dranet/) is found in $NETCLAIM_PEERS_DIR, else in
# ${XDG_CACHE_HOME:-$HOME/.cache}/netclaim/peers. Unpacked and built under the cache
# (build/dranet-<commit>), never in the repository; nothing of dranet is copied into the project.
# The binary: ${XDG_CACHE_HOME:-$HOME/.cache}/netclaim/bin/dranet-<commit>. A cold build takes
# ~1.5 minutes on 2 cores when the Kubernetes modules are already in the module cache.
set -euo pipefail

# shellcheck source=peer.sh
source "$(dirname "${BASH_SOURCE[0]}")/peer.sh"
build_peer dranet dranet ./cmd/dranet
