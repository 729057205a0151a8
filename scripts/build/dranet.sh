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

CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/netclaim"
BIN="$CACHE/bin"
PEERS="${NETCLAIM_PEERS_DIR:-$CACHE/peers}"
log() { printf '[build] %s\n' "$*" >&2; }

mapfile -t snapshots < <(find "$PEERS" -maxdepth 1 -name 'dranet-*.tar.gz' 2>/dev/null | sort)
if ((${#snapshots[@]} == 0)); then
    # No snapshot at hand: a binary built earlier still serves.
    mapfile -t built < <(find "$BIN" -maxdepth 1 -name 'dranet-*' -perm -u+x ! -name '*.tmp' 2>/dev/null | sort)
    if ((${#built[@]})); then log "dranet cached (no snapshot in $PEERS)"; echo "${built[-1]}"; exit 0; fi
    log "no dranet source snapshot (dranet-<commit>.tar.gz) in $PEERS; run scripts/setup.sh with NETCLAIM_PEERS_DIR set to its directory"
    exit 1
fi
SNAPSHOT="${snapshots[-1]}"
COMMIT="$(basename "$SNAPSHOT" .tar.gz)"; COMMIT="${COMMIT#dranet-}"
OUT="$BIN/dranet-$COMMIT"
if [[ -x "$OUT" ]]; then
    log "dranet $COMMIT cached"
    echo "$OUT"
    exit 0
fi

mkdir -p "$BIN"
exec 8>"$CACHE/.build.lock"   # one build at a time, shared with build-control-plane.sh
flock 8
if [[ -x "$OUT" ]]; then echo "$OUT"; exit 0; fi
if ! command -v go >/dev/null && [[ -x /usr/local/go/bin/go ]]; then PATH="/usr/local/go/bin:$PATH"; fi
command -v go >/dev/null || { log "go toolchain not found; cannot build dranet"; exit 1; }

WORK="$CACHE/build/dranet-$COMMIT"
rm -rf "$WORK" && mkdir -p "$WORK"
tar -xzf "$SNAPSHOT" -C "$WORK"
[[ -f "$WORK/dranet/go.mod" ]] || { log "$SNAPSHOT does not unpack into dranet/"; exit 1; }
log "building dranet $COMMIT from $(basename "$SNAPSHOT") (a cold build takes minutes)"
start=$SECONDS
(
    cd "$WORK/dranet"
    export CGO_ENABLED=0 GOFLAGS=-buildvcs=false
    /usr/bin/time -v -o "$WORK/time.txt" go build -trimpath -ldflags="-s -w" -o "$OUT.tmp" ./cmd/dranet
) >&2
mv "$OUT.tmp" "$OUT"
rss="$(sed -n 's/.*Maximum resident set size (kbytes): //p' "$WORK/time.txt" 2>/dev/null || true)"
log "dranet $COMMIT built in $((SECONDS - start))s, peak RSS of go build ${rss:-?} KiB"
echo "$OUT"
