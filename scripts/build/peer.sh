# Sourced by scripts/build/dranet.sh and multus.sh: build a peer project's binary from its source
# snapshot once, and cache it by the snapshot's commit, like the other Go-built tools.
#
#   build_peer NAME DIR PKG [EXTRA_LDFLAGS]   prints the binary's path (builds it when absent)
#
# The peers' modules are not served by the module proxy, their dependencies are: the snapshot
# (DIR-<commit>.tar.gz, unpacking into DIR/) is found in $NETCLAIM_PEERS_DIR, else in
# ${XDG_CACHE_HOME:-$HOME/.cache}/netclaim/peers (scripts/setup.sh keeps them there). It is unpacked
# and built under the cache (build/NAME-<commit>), never in the repository; nothing of the peer is
# copied into the project. The binary: ${XDG_CACHE_HOME:-$HOME/.cache}/netclaim/bin/NAME-<commit>.
# EXTRA_LDFLAGS may name the commit as {commit}.
# shellcheck shell=bash

build_peer() {
    local name="$1" dir="$2" pkg="$3" extra="${4:-}"
    local cache="${XDG_CACHE_HOME:-$HOME/.cache}/netclaim"
    local bin="$cache/bin" peers="${NETCLAIM_PEERS_DIR:-$cache/peers}"
    local snapshots built snapshot commit out work start rss
    log() { printf '[build] %s\n' "$*" >&2; }

    mapfile -t snapshots < <(find "$peers" -maxdepth 1 -name "$dir-*.tar.gz" 2>/dev/null | sort)
    if ((${#snapshots[@]} == 0)); then
        # No snapshot at hand: a binary built earlier still serves.
        # NAME-<commit> only (multus-<commit>, not multus-daemon-<commit>)
        mapfile -t built < <(find "$bin" -maxdepth 1 -regextype posix-extended -regex ".*/$name-[0-9a-f]+" \
            -perm -u+x 2>/dev/null | sort)
        if ((${#built[@]})); then log "$name cached (no snapshot in $peers)"; echo "${built[-1]}"; return 0; fi
        log "no $name source snapshot ($dir-<commit>.tar.gz) in $peers; run scripts/setup.sh with NETCLAIM_PEERS_DIR set to its directory"
        return 1
    fi
    snapshot="${snapshots[-1]}"
    commit="$(basename "$snapshot" .tar.gz)"; commit="${commit#"$dir"-}"
    out="$bin/$name-$commit"
    if [[ -x "$out" ]]; then
        log "$name $commit cached"
        echo "$out"
        return 0
    fi

    mkdir -p "$bin"
    exec 8>"$cache/.build.lock"   # one build at a time, shared with components.sh
    flock 8
    if [[ -x "$out" ]]; then echo "$out"; return 0; fi
    if ! command -v go >/dev/null && [[ -x /usr/local/go/bin/go ]]; then PATH="/usr/local/go/bin:$PATH"; fi
    command -v go >/dev/null || { log "go toolchain not found; cannot build $name"; return 1; }

    work="$cache/build/$name-$commit"
    rm -rf "$work" && mkdir -p "$work"
    tar -xzf "$snapshot" -C "$work"
    [[ -f "$work/$dir/go.mod" ]] || { log "$snapshot does not unpack into $dir/"; return 1; }
    log "building $name $commit from $(basename "$snapshot") (a cold build takes minutes)"
    start=$SECONDS
    (
        cd "$work/$dir"
        export CGO_ENABLED=0 GOFLAGS=-buildvcs=false
        /usr/bin/time -v -o "$work/time.txt" go build -trimpath -ldflags="-s -w ${extra//\{commit\}/$commit}" \
            -o "$out.tmp" "$pkg"
    ) >&2
    mv "$out.tmp" "$out"
    rss="$(sed -n 's/.*Maximum resident set size (kbytes): //p' "$work/time.txt" 2>/dev/null || true)"
    log "$name $commit built in $((SECONDS - start))s, peak RSS of go build ${rss:-?} KiB"
    echo "$out"
}
