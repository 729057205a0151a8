#!/usr/bin/env bash
# Build the harness's own DRA kubelet plugin (scripts/harness/netdriver: driver vf.netclaim.test,
# devices carrying Multus's k8s.cni.cncf.io/* attributes) once, and cache the binary by a hash of
# its sources, like the other Go-built tools.
#
#   scripts/build/netdriver.sh         prints the binary's path (builds it when absent)
#
# Its dependencies (k8s.io/dynamic-resource-allocation and client-go, v0.37.2 like the cluster)
# come from the Go module proxy. The sources are copied to ${XDG_CACHE_HOME:-$HOME/.cache}/netclaim/
# build/netdriver-<hash> and built there (CGO_ENABLED=0), never in the repository; the binary:
# ${XDG_CACHE_HOME:-$HOME/.cache}/netclaim/bin/netdriver-<hash>. The same binary, run under a
# name ending in `capture`, is the chained CNI plugin vf-capture (harness/cluster/vfdriver.sh).
set -euo pipefail

SRC="$(cd "$(dirname "${BASH_SOURCE[0]}")/../harness/netdriver" && pwd)"
CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/netclaim"
BIN="$CACHE/bin"
log() { printf '[build] %s\n' "$*" >&2; }

hash="$(cd "$SRC" && sha256sum go.mod go.sum ./*.go | sha256sum | cut -c1-12)"
out="$BIN/netdriver-$hash"
if [[ -x "$out" ]]; then
    log "netdriver $hash cached"
    echo "$out"
    exit 0
fi
mkdir -p "$BIN"
exec 8>"$CACHE/.build.lock"   # one build at a time, shared with components.sh and peer.sh
flock 8
if [[ -x "$out" ]]; then echo "$out"; exit 0; fi
if ! command -v go >/dev/null && [[ -x /usr/local/go/bin/go ]]; then PATH="/usr/local/go/bin:$PATH"; fi
command -v go >/dev/null || { log "go toolchain not found; cannot build netdriver"; exit 1; }

work="$CACHE/build/netdriver-$hash"
rm -rf "$work" && mkdir -p "$work"
cp "$SRC"/go.mod "$SRC"/go.sum "$SRC"/*.go "$work/"
log "building netdriver $hash (a cold build takes a minute or two)"
start=$SECONDS
(
    cd "$work"
    export CGO_ENABLED=0 GOFLAGS="-mod=readonly -buildvcs=false"
    /usr/bin/time -v -o "$work/time.txt" go build -trimpath -ldflags="-s -w" -o "$out.tmp" .
) >&2
mv "$out.tmp" "$out"
rss="$(sed -n 's/.*Maximum resident set size (kbytes): //p' "$work/time.txt" 2>/dev/null || true)"
log "netdriver $hash built in $((SECONDS - start))s, peak RSS of go build ${rss:-?} KiB"
echo "$out"
