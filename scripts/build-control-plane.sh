#!/usr/bin/env bash
# Build etcd and kube-apiserver once, from Go modules, and cache them by version.
#
# Nothing here is committed: the binaries land in
# ${XDG_CACHE_HOME:-$HOME/.cache}/netclaim/bin/<name>-<version>. A second run
# with the binaries present does nothing. Prints the two binary paths.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/netclaim"
KUBE_VERSION="$(sed -n 's/^require k8s.io\/kubernetes \(v[0-9.]*\)$/\1/p' "$HERE/gomod/kube-apiserver/go.mod")"
ETCD_VERSION="$(sed -n 's/^require go.etcd.io\/etcd\/server\/v3 \(v[0-9.]*\)$/\1/p' "$HERE/gomod/etcd/go.mod")"
BIN="$CACHE/bin"
mkdir -p "$BIN"
# One build at a time: concurrent callers (parallel test sessions) wait here.
exec 8>"$CACHE/.build.lock"
flock 8

log() { printf '[build] %s\n' "$*" >&2; }

# The Go toolchain's standard install location, for shells whose PATH lacks it.
if ! command -v go >/dev/null && [[ -x /usr/local/go/bin/go ]]; then
    PATH="/usr/local/go/bin:$PATH"
fi

# build NAME VERSION PACKAGE: build PACKAGE inside a copy of scripts/gomod/NAME.
build() {
    local name="$1" version="$2" pkg="$3"
    local out="$BIN/$name-$version"
    if [[ -x "$out" ]]; then
        log "$name $version cached"
        return 0
    fi
    command -v go >/dev/null || { log "go toolchain not found; cannot build $name"; exit 1; }
    local work="$CACHE/build/$name-$version"
    rm -rf "$work"
    mkdir -p "$work"
    cp "$HERE/gomod/$name/go.mod" "$HERE/gomod/$name/tools.go" "$work/"
    log "building $name $version (a cold build takes minutes)"
    local start=$SECONDS
    (
        cd "$work"
        export GOFLAGS=-mod=mod CGO_ENABLED=0
        go mod tidy >"$work/tidy.log" 2>&1 || { cat "$work/tidy.log" >&2; exit 1; }
        /usr/bin/time -v -o "$work/time.txt" \
            go build -trimpath -ldflags='-s -w' -o "$out.tmp" "$pkg"
    )
    mv "$out.tmp" "$out"
    local rss
    rss="$(sed -n 's/.*Maximum resident set size (kbytes): //p' "$work/time.txt" 2>/dev/null || true)"
    log "$name $version built in $((SECONDS - start))s, peak RSS of go build ${rss:-?} KiB"
}

build etcd "$ETCD_VERSION" go.etcd.io/etcd/server/v3
build kube-apiserver "$KUBE_VERSION" k8s.io/kubernetes/cmd/kube-apiserver
echo "$BIN/etcd-$ETCD_VERSION"
echo "$BIN/kube-apiserver-$KUBE_VERSION"
