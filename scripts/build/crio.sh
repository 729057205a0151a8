#!/usr/bin/env bash
# Build CRI-O (the second container runtime of the real cluster, `scripts/cluster.sh up --runtime crio`)
# once from the Go module proxy, and cache it by version like the other Go-built tools.
#
#   scripts/build/crio.sh              prints three paths, one a line: crio, copyimg, pinns
#
# The module github.com/cri-o/cri-o at $CRIO_VERSION (pinned below: the newest release the proxy
# serves) is downloaded with `go mod download`, copied to ${XDG_CACHE_HOME:-$HOME/.cache}/netclaim/
# build/crio-<version> and built there, never in the repository:
#   crio     ./cmd/crio, CGO_ENABLED=0, with the tags that drop what needs C libraries (ostree,
#            gpgme, btrfs);
#   copyimg  ./test/copyimg, CRI-O's own test tool that copies an image archive into the same
#            containers/storage (the cluster imports its sandbox image with it: there is no registry);
#   pinns    ./pinns, a small static C program CRI-O runs to pin the pod's namespaces (gcc, libc6-dev).
# The binaries: ${XDG_CACHE_HOME:-$HOME/.cache}/netclaim/bin/{crio,copyimg,pinns}-<version>. A cold
# build takes ~2-3 minutes on 2 cores. CRI-O also needs Debian's conmon and runc at run time (installed
# here when missing, as scripts/setup.sh does).
set -euo pipefail

CRIO_VERSION=v1.36.3
CRIO_TAGS="containers_image_ostree_stub containers_image_openpgp exclude_graphdriver_btrfs btrfs_noversion"

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/netclaim"
BIN="$CACHE/bin"
log() { printf '[build] %s\n' "$*" >&2; }

outs=("$BIN/crio-$CRIO_VERSION" "$BIN/copyimg-$CRIO_VERSION" "$BIN/pinns-$CRIO_VERSION")
built() { local o; for o in "${outs[@]}"; do [[ -x "$o" ]] || return 1; done; }

# shellcheck source=apt.sh
source "$HERE/apt.sh"
ensure_debian_packages conmon runc gcc libc6-dev make

if built; then
    log "crio $CRIO_VERSION cached"
    printf '%s\n' "${outs[@]}"
    exit 0
fi
mkdir -p "$BIN"
exec 8>"$CACHE/.build.lock"   # one build at a time, shared with components.sh and the others
flock 8
if built; then printf '%s\n' "${outs[@]}"; exit 0; fi
if ! command -v go >/dev/null && [[ -x /usr/local/go/bin/go ]]; then PATH="/usr/local/go/bin:$PATH"; fi
command -v go >/dev/null || { log "go toolchain not found; cannot build crio"; exit 1; }

work="$CACHE/build/crio-$CRIO_VERSION"
log "building crio, copyimg and pinns $CRIO_VERSION from the module proxy (a cold build takes minutes)"
start=$SECONDS
moddir="$(GOFLAGS=-mod=mod go mod download -json "github.com/cri-o/cri-o@$CRIO_VERSION" \
    | python3 -c 'import json, sys; m = json.load(sys.stdin); print(m.get("Dir") or sys.exit(m.get("Error", "no Dir")))')"
rm -rf "$work" && mkdir -p "$(dirname "$work")"
cp -r "$moddir" "$work" && chmod -R u+w "$work"
(
    cd "$work"
    export CGO_ENABLED=0 GOFLAGS="-mod=readonly -buildvcs=false"
    go mod download
    /usr/bin/time -v -o "$work/time-crio.txt" \
        go build -trimpath -tags "$CRIO_TAGS" -ldflags="-s -w" -o "${outs[0]}.tmp" ./cmd/crio
    go build -trimpath -tags "$CRIO_TAGS" -ldflags="-s -w" -o "${outs[1]}.tmp" ./test/copyimg
    make -C pinns >/dev/null
    cp bin/pinns "${outs[2]}.tmp"
) >&2
for o in "${outs[@]}"; do mv "$o.tmp" "$o"; done
rss="$(sed -n 's/.*Maximum resident set size (kbytes): //p' "$work/time-crio.txt" 2>/dev/null || true)"
log "crio $CRIO_VERSION built in $((SECONDS - start))s, peak RSS of go build ${rss:-?} KiB"
printf '%s\n' "${outs[@]}"
