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

CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/netclaim"
BIN="$CACHE/bin"
PEERS="${NETCLAIM_PEERS_DIR:-$CACHE/peers}"
log() { printf '[build] %s\n' "$*" >&2; }

mapfile -t snapshots < <(find "$PEERS" -maxdepth 1 -name 'multus-cni-*.tar.gz' 2>/dev/null | sort)
if ((${#snapshots[@]} == 0)); then
    # No snapshot at hand: a binary built earlier still serves.
    mapfile -t built < <(find "$BIN" -maxdepth 1 -name 'multus-*' -perm -u+x ! -name '*.tmp' 2>/dev/null | sort)
    if ((${#built[@]})); then log "multus cached (no snapshot in $PEERS)"; echo "${built[-1]}"; exit 0; fi
    log "no Multus source snapshot (multus-cni-<commit>.tar.gz) in $PEERS; run scripts/setup.sh with NETCLAIM_PEERS_DIR set to its directory"
    exit 1
fi
SNAPSHOT="${snapshots[-1]}"
COMMIT="$(basename "$SNAPSHOT" .tar.gz)"; COMMIT="${COMMIT#multus-cni-}"
OUT="$BIN/multus-$COMMIT"
if [[ -x "$OUT" ]]; then
    log "multus $COMMIT cached"
    echo "$OUT"
    exit 0
fi

mkdir -p "$BIN"
exec 8>"$CACHE/.build.lock"   # one build at a time, shared with components.sh
flock 8
if [[ -x "$OUT" ]]; then echo "$OUT"; exit 0; fi
if ! command -v go >/dev/null && [[ -x /usr/local/go/bin/go ]]; then PATH="/usr/local/go/bin:$PATH"; fi
command -v go >/dev/null || { log "go toolchain not found; cannot build multus"; exit 1; }

WORK="$CACHE/build/multus-$COMMIT"
rm -rf "$WORK" && mkdir -p "$WORK"
tar -xzf "$SNAPSHOT" -C "$WORK"
[[ -f "$WORK/multus-cni/go.mod" ]] || { log "$SNAPSHOT does not unpack into multus-cni/"; exit 1; }
log "building multus $COMMIT from $(basename "$SNAPSHOT") (a cold build takes a minute or two)"
start=$SECONDS
pkg=gopkg.in/k8snetworkplumbingwg/multus-cni.v4/pkg/multus
(
    cd "$WORK/multus-cni"
    export CGO_ENABLED=0 GOFLAGS=-buildvcs=false
    /usr/bin/time -v -o "$WORK/time.txt" go build -trimpath \
        -ldflags="-s -w -X $pkg.version=snapshot-$COMMIT -X $pkg.commit=$COMMIT" \
        -o "$OUT.tmp" ./cmd/multus
) >&2
mv "$OUT.tmp" "$OUT"
rss="$(sed -n 's/.*Maximum resident set size (kbytes): //p' "$WORK/time.txt" 2>/dev/null || true)"
log "multus $COMMIT built in $((SECONDS - start))s, peak RSS of go build ${rss:-?} KiB"
echo "$OUT"
