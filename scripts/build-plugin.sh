#!/usr/bin/env bash
# Build the netclaim CNI plugin as one fully static executable and print its path.
#
#   scripts/build-plugin.sh               build (or reuse) and print the cached executable's path
#   scripts/build-plugin.sh --out FILE    also copy it to FILE (atomic, mode 0755)
#
# What it is: a small C program (scripts/bundle/netclaim.c) linked with
# `gcc -static` against Debian's static libpython3.11 and glibc's libc.a, with
# the plugin's modules and every stdlib module they import frozen into the
# binary (scripts/bundle/freeze.py). A node needs no Python, no shared library
# and no other file. `_json` is compiled from the CPython source that matches
# the static library (Debian's python3.11 source package: only Modules/_json.c
# is used); setns(2) is a builtin (scripts/bundle/netclaim_sys.c).
#
# The result is cached under ${XDG_CACHE_HOME:-~/.cache}/netclaim/plugin/<key>/netclaim,
# where <key> hashes cni_plugin/*.py, scripts/bundle/*, this script and the
# libpython version, so changing the plugin's sources rebuilds it.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/.." && pwd)"
CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/netclaim"
PY=/usr/bin/python3.11
LIBPY=/usr/lib/x86_64-linux-gnu/libpython3.11.a
INCLUDE=/usr/include/python3.11
APT_PACKAGES=(gcc libc6-dev libpython3.11-dev python3.11 binutils xz-utils)
OUT=""

log() { printf '[build-plugin] %s\n' "$*" >&2; }
die() { printf '[build-plugin] error: %s\n' "$*" >&2; exit 1; }

while (($#)); do
    case "$1" in
        --out) OUT="${2:?--out needs a value}"; shift 2 ;;
        -h|--help) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed -e '$d' -e 's/^# \{0,1\}//'; exit 0 ;;
        *) die "unknown argument: $1" ;;
    esac
done

# shellcheck source=lib/apt.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/apt.sh"
ensure_packages() { ensure_debian_packages "${APT_PACKAGES[@]}"; }

# The upstream version of the static library, e.g. 3.11.2 (Debian: 3.11.2-6+deb12u6).
libpython_version() {
    local v
    v="$(dpkg-query -W -f='${Version}' libpython3.11-dev)"
    v="${v#*:}"
    printf '%s' "${v%%-*}"
}

# Modules/_json.c of exactly that upstream version, from Debian's source
# package (apt's own client, with a private source list and lists dir so the
# system's apt configuration is left alone). Cached once per version.
json_source() {
    local version="$1" dir apt_dir tarball
    dir="$CACHE/cpython-src/$version"
    if [[ -f "$dir/_json.c" ]]; then printf '%s' "$dir/_json.c"; return 0; fi
    apt_dir="$CACHE/cpython-src/apt"
    mkdir -p "$apt_dir/parts" "$apt_dir/lists/partial" "$apt_dir/download"
    local conf
    for conf in /etc/apt/sources.list.d/*.sources; do
        [[ -f "$conf" ]] && sed 's/^Types:.*/Types: deb-src/' "$conf" >"$apt_dir/parts/$(basename "$conf")"
    done
    if [[ -f /etc/apt/sources.list ]]; then
        sed -n 's/^deb /deb-src /p' /etc/apt/sources.list >"$apt_dir/parts/sources.list.list"
    fi
    local opts=(-o "Dir::Etc::SourceList=/dev/null" -o "Dir::Etc::SourceParts=$apt_dir/parts"
                -o "Dir::State::Lists=$apt_dir/lists" -o "APT::Sandbox::User=root")
    log "fetching Debian's python3.11 source package (for Modules/_json.c)"
    apt-get -q "${opts[@]}" update >"$apt_dir/apt.log" 2>&1 || { cat "$apt_dir/apt.log" >&2; die "apt-get update (deb-src) failed"; }
    # The .dsc of the newest revision may be missing on a mirror; the orig
    # tarball (all that is needed) is checked against the index's hash by apt.
    (cd "$apt_dir/download" && apt-get -q "${opts[@]}" source --download-only python3.11 >>"$apt_dir/apt.log" 2>&1) || true
    tarball="$(ls "$apt_dir/download"/python3.11_"$version".orig.tar.* 2>/dev/null | head -1)"
    [[ -n "$tarball" ]] || { cat "$apt_dir/apt.log" >&2; die "no python3.11_$version.orig tarball from the Debian source archive"; }
    mkdir -p "$dir"
    tar -xf "$tarball" -C "$dir" --strip-components=2 "Python-$version/Modules/_json.c" \
        || die "Modules/_json.c not in $tarball"
    rm -f "$apt_dir/download"/python3.11_*
    printf '%s' "$dir/_json.c"
}

cache_key() {
    {
        libpython_version
        (cd "$ROOT" && sha256sum cni_plugin/*.py scripts/bundle/* scripts/build-plugin.sh)
    } | sha256sum | cut -c1-16
}

# An ELF with no PT_INTERP and no DT_NEEDED: the kernel runs it as is.
check_static() {
    local exe="$1"
    if LC_ALL=C readelf -lW "$exe" | grep -q 'INTERP'; then die "$exe has a program interpreter"; fi
    if LC_ALL=C readelf -dW "$exe" 2>/dev/null | grep -q 'NEEDED'; then die "$exe needs shared libraries"; fi
}

build() {
    local work="$1" json_c="$2" cflags=(-O2 -DNDEBUG -ffile-prefix-map="$work"=. -I"$INCLUDE" -I"$work")
    "$PY" -I -S "$HERE/bundle/freeze.py" --src "$ROOT" --inittab "$HERE/bundle/inittab.c" --out "$work"
    gcc "${cflags[@]}" -c "$HERE/bundle/netclaim.c" -o "$work/netclaim.o"
    gcc "${cflags[@]}" -c "$HERE/bundle/netclaim_sys.c" -o "$work/netclaim_sys.o"
    gcc "${cflags[@]}" -c "$HERE/bundle/inittab.c" -o "$work/inittab.o"
    gcc -O1 -DNDEBUG -ffile-prefix-map="$work"=. -I"$INCLUDE" -I"$work" -c "$work/frozen.c" -o "$work/frozen.o"
    gcc "${cflags[@]}" -ffile-prefix-map="$(dirname "$json_c")"=Modules -I"$INCLUDE/internal" -DPy_BUILD_CORE_BUILTIN \
        -c "$json_c" -o "$work/_json.o"
    # glibc warns that getaddrinfo/getpwnam & co. need its NSS modules at run
    # time in a static binary; the plugin never resolves names or users (it
    # speaks AF_UNIX and AF_NETLINK only), and pwd/grp are not even built in.
    gcc -static -s -o "$work/netclaim" "$work"/{netclaim,netclaim_sys,inittab,frozen,_json}.o "$LIBPY" \
        -lm -lpthread -ldl -lutil 2>"$work/link.log" || { cat "$work/link.log" >&2; die "link failed"; }
    check_static "$work/netclaim"
    local answer
    answer="$(echo '{}' | env -i CNI_COMMAND=VERSION "$work/netclaim")" || die "the built plugin failed VERSION"
    [[ "$answer" == *supportedVersions* ]] || die "unexpected VERSION answer: $answer"
}

# Keep the newest few builds: every edit of the plugin's sources makes a new one.
prune() {
    local keep="$1" old
    for old in $(ls -1td "$CACHE"/plugin/*/ 2>/dev/null | tail -n +5); do
        [[ "$(basename "$old")" == "$keep" ]] || rm -rf "$old"
    done
}

main() {
    ensure_packages
    [[ -f "$LIBPY" ]] || die "$LIBPY missing (libpython3.11-dev)"
    local key dest lock
    key="$(cache_key)"
    dest="$CACHE/plugin/$key/netclaim"
    mkdir -p "$CACHE/plugin"
    lock="$CACHE/plugin/.lock"
    exec 9>"$lock"
    flock 9
    if [[ ! -x "$dest" ]]; then
        local json_c work
        json_c="$(json_source "$(libpython_version)")"
        work="$(mktemp -d "$CACHE/plugin/.build.XXXXXX")"
        log "building the static plugin ($key)"
        build "$work" "$json_c"
        mkdir -p "$(dirname "$dest")"
        install -m 0755 "$work/netclaim" "$dest.tmp"
        cp "$work/modules.txt" "$(dirname "$dest")/modules.txt"
        mv -f "$dest.tmp" "$dest"
        rm -rf "$work"
        prune "$key"
    fi
    exec 9>&-
    if [[ -n "$OUT" ]]; then
        local tmp
        mkdir -p "$(dirname "$OUT")"
        tmp="$(mktemp "$(dirname "$OUT")/.netclaim.XXXXXX")"
        cp "$dest" "$tmp"
        chmod 0755 "$tmp"
        mv -f "$tmp" "$OUT"
    fi
    printf '%s\n' "$dest"
}

main
