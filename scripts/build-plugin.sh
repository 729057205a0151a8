#!/usr/bin/env bash
# Build the netclaim CNI plugin as one fully static executable and print its path.
#
#   scripts/build-plugin.sh               build (or reuse) and print the cached executable's path
#   scripts/build-plugin.sh --out FILE    also copy it to FILE (atomic, mode 0755)
#   scripts/build-plugin.sh --arch arm64  cross-build the aarch64 executable instead
#                                         (default x86_64; or NETCLAIM_PLUGIN_ARCH=arm64)
#
# What it is: a small C program (scripts/build/bundle/netclaim.c) linked with
# `gcc -static` against Debian's static libpython3.11 and glibc's libc.a, with
# the plugin's modules and every stdlib module they import frozen into the
# binary (scripts/build/bundle/freeze.py) as static code objects (deep-frozen by
# CPython's own Tools/scripts/deepfreeze.py). A node needs no Python, no shared
# library and no other file. `_json` and the deep-freezer come from the CPython
# source that matches the static library (Debian's python3.11 source package:
# only Modules/_json.c and Tools/scripts/{deepfreeze,umarshal}.py are used);
# setns(2) is a builtin (scripts/build/bundle/netclaim_sys.c).
#
# The result is cached under ${XDG_CACHE_HOME:-~/.cache}/netclaim/plugin/<key>/netclaim
# (beside it modules.txt, the frozen modules, and build-info.txt, the static libraries' versions),
# where <key> hashes cni_plugin/**/*.py, scripts/build/bundle/*, this script and the
# libpython version, so changing the plugin's sources rebuilds it.
# The key says what an entry was built from, not what it holds now: when a build succeeds, the
# entry's SHA256SUMS records the SHA-256 of netclaim, modules.txt and build-info.txt (before the
# executable is put in place), and a reuse (and --out's copy) checks them first. A file that
# differs from its record (the cache is the user's to write: another job, a restored CI cache) is
# refused, naming it: remove the entry dir to rebuild. An entry with no record (an older
# build-plugin.sh, whose key differs anyway, or one planted without one) is built again, once.
#
# arm64 (aarch64) is cross-built on an x86_64 Debian 12 host: the same frozen
# bytecode (architecture independent, made by the host's python3.11), the C
# parts compiled by Debian's aarch64-linux-gnu-gcc against libc6-dev-arm64-cross
# and against the static libpython3.11 of Debian's libpython3.11-dev:arm64. That
# package is fetched with apt (private lists, APT::Architecture=arm64) and
# unpacked with dpkg-deb -x into a sysroot under the cache, not installed: a
# multiarch install would force the host's own python3.11 packages to the same
# Debian revision. The built executable answers VERSION under qemu-aarch64-static
# before it is accepted. Cached under .../netclaim/plugin-arm64/<key>/netclaim,
# <key> also hashing the arm64 package's full version.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/.." && pwd)"
CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/netclaim"
PY=/usr/bin/python3.11
LIBPY=/usr/lib/x86_64-linux-gnu/libpython3.11.a
INCLUDE=/usr/include/python3.11
APT_PACKAGES=(gcc libc6-dev libpython3.11-dev python3.11 binutils xz-utils)
ARM64_APT_PACKAGES=(gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user-static)
OUT=""
ARCH="${NETCLAIM_PLUGIN_ARCH:-x86_64}"

log() { printf '[build-plugin] %s\n' "$*" >&2; }
die() { printf '[build-plugin] error: %s\n' "$*" >&2; exit 1; }

while (($#)); do
    case "$1" in
        --out) OUT="${2:?--out needs a value}"; shift 2 ;;
        --arch) ARCH="${2:?--arch needs a value}"; shift 2 ;;
        -h|--help) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed -e '$d' -e 's/^# \{0,1\}//'; exit 0 ;;
        *) die "unknown argument: $1" ;;
    esac
done

case "$ARCH" in
    x86_64|amd64) ARCH=x86_64 ;;
    arm64|aarch64) ARCH=arm64 ;;
    *) die "--arch must be x86_64 (amd64) or arm64 (aarch64), not $ARCH" ;;
esac
[[ "$(uname -m)" == x86_64 ]] || die "the build host must be x86_64 (Debian 12); this is $(uname -m)"

# What differs between the two targets: compiler, static libpython, headers,
# how the result is run once, the ELF machine it must be, and the cache dir.
CC=gcc
NM=nm
EXTRA_INCLUDES=()
RUN=()
ELF_MACHINE="Advanced Micro Devices X86-64"
PLUGIN_CACHE="$CACHE/plugin"
SYSROOT=""

# shellcheck source=build/apt.sh
source "$(dirname "${BASH_SOURCE[0]}")/build/apt.sh"
ensure_packages() {
    if [[ "$ARCH" == arm64 ]]; then
        ensure_debian_packages "${APT_PACKAGES[@]}" "${ARM64_APT_PACKAGES[@]}"
    else
        ensure_debian_packages "${APT_PACKAGES[@]}"
    fi
}

# A private apt state (lists, cache, sources copied from the system's) so the
# system's apt configuration and dpkg database are left alone. Extra options follow.
private_apt() {
    local dir="$1"; shift
    mkdir -p "$dir/parts" "$dir/lists/partial" "$dir/cache/archives/partial"
    PRIVATE_APT=(-o "Dir::Etc::SourceList=/dev/null" -o "Dir::Etc::SourceParts=$dir/parts"
                 -o "Dir::State::Lists=$dir/lists" -o "Dir::Cache=$dir/cache" -o "APT::Sandbox::User=root" "$@")
}

# Debian's libpython3.11-dev for arm64, unpacked (not installed) into a sysroot;
# prints the sysroot. One per Debian version of the package, kept in the cache.
arm64_sysroot() {
    local apt_dir="$CACHE/arm64-apt" version deb root
    private_apt "$apt_dir" -o "APT::Architecture=arm64" -o "APT::Architectures=arm64"
    local conf
    for conf in /etc/apt/sources.list.d/*.sources /etc/apt/sources.list.d/*.list /etc/apt/sources.list; do
        if [[ -f "$conf" ]]; then cp "$conf" "$apt_dir/parts/"; fi
    done
    # Refreshed once a day (a warm build needs no network). A third-party source
    # without arm64 indexes only warns; the package must come from Debian's.
    if [[ -z "$(find "$apt_dir/lists" -maxdepth 1 -name '*_Packages*' -mmin -1440 2>/dev/null)" ]]; then
        apt-get -q "${PRIVATE_APT[@]}" update >"$apt_dir/apt.log" 2>&1 \
            || log "apt-get update (arm64) reported errors; see $apt_dir/apt.log"
    fi
    version="$(apt-cache "${PRIVATE_APT[@]}" show --no-all-versions libpython3.11-dev 2>/dev/null \
               | sed -n 's/^Version: //p' | head -1)"
    [[ -n "$version" ]] || { cat "$apt_dir/apt.log" >&2; die "no libpython3.11-dev for arm64 in the Debian archive"; }
    root="$CACHE/sysroot-arm64/$version"
    if [[ ! -f "$root/.complete" ]]; then
        log "fetching Debian's libpython3.11-dev:arm64 $version (unpacked into a sysroot, not installed)"
        rm -rf "$apt_dir/download" "$root"
        mkdir -p "$apt_dir/download" "$root"
        (cd "$apt_dir/download" && apt-get -q "${PRIVATE_APT[@]}" download "libpython3.11-dev=$version" >>"$apt_dir/apt.log" 2>&1) \
            || { cat "$apt_dir/apt.log" >&2; die "apt-get download libpython3.11-dev:arm64 failed"; }
        deb="$(ls "$apt_dir/download"/libpython3.11-dev_*_arm64.deb)"
        dpkg-deb -x "$deb" "$root"
        rm -f "$deb"
        [[ -f "$root/usr/lib/aarch64-linux-gnu/libpython3.11.a" ]] || die "no libpython3.11.a in $deb"
        printf '%s\n' "$version" >"$root/.complete"
    fi
    printf '%s' "$root"
}

configure_arch() {
    [[ "$ARCH" == arm64 ]] || return 0
    SYSROOT="$(arm64_sysroot)"
    CC=aarch64-linux-gnu-gcc
    NM=aarch64-linux-gnu-nm
    LIBPY="$SYSROOT/usr/lib/aarch64-linux-gnu/libpython3.11.a"
    INCLUDE="$SYSROOT/usr/include/python3.11"
    EXTRA_INCLUDES=(-I"$SYSROOT/usr/include" -ffile-prefix-map="$SYSROOT"=)  # <aarch64-linux-gnu/python3.11/pyconfig.h>
    RUN=(qemu-aarch64-static)
    ELF_MACHINE="AArch64"
    PLUGIN_CACHE="$CACHE/plugin-arm64"
}

# The upstream version of the static library, e.g. 3.11.2 (Debian: 3.11.2-6+deb12u6).
libpython_version() {
    local v
    if [[ "$ARCH" == arm64 ]]; then v="$(cat "$SYSROOT/.complete")"; else v="$(dpkg-query -W -f='${Version}' libpython3.11-dev)"; fi
    v="${v#*:}"
    printf '%s' "${v%%-*}"
}

# Modules/_json.c and the deep-freezer (Tools/scripts/deepfreeze.py, umarshal.py)
# of exactly that upstream version, from Debian's source package (apt's own
# client, with a private source list and lists dir so the system's apt
# configuration is left alone); prints the directory holding them (at those
# paths). Cached once per version.
CPYTHON_FILES=(Modules/_json.c Tools/scripts/deepfreeze.py Tools/scripts/umarshal.py)
cpython_sources() {
    local version="$1" dir apt_dir tarball file complete=1
    dir="$CACHE/cpython-src/$version"
    for file in "${CPYTHON_FILES[@]}"; do [[ -f "$dir/$file" ]] || complete=0; done
    if ((complete)); then printf '%s' "$dir"; return 0; fi
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
    log "fetching Debian's python3.11 source package (for Modules/_json.c and Tools/scripts/deepfreeze.py)"
    apt-get -q "${opts[@]}" update >"$apt_dir/apt.log" 2>&1 || { cat "$apt_dir/apt.log" >&2; die "apt-get update (deb-src) failed"; }
    # The .dsc of the newest revision may be missing on a mirror; the orig
    # tarball (all that is needed) is checked against the index's hash by apt.
    (cd "$apt_dir/download" && apt-get -q "${opts[@]}" source --download-only python3.11 >>"$apt_dir/apt.log" 2>&1) || true
    tarball="$(ls "$apt_dir/download"/python3.11_"$version".orig.tar.* 2>/dev/null | head -1)"
    [[ -n "$tarball" ]] || { cat "$apt_dir/apt.log" >&2; die "no python3.11_$version.orig tarball from the Debian source archive"; }
    mkdir -p "$dir"
    tar -xf "$tarball" -C "$dir" --strip-components=1 "${CPYTHON_FILES[@]/#/Python-$version/}" \
        || die "${CPYTHON_FILES[*]} not all in $tarball"
    rm -f "$apt_dir/download"/python3.11_*
    printf '%s' "$dir"
}

cache_key() {
    {
        libpython_version
        if [[ "$ARCH" == arm64 ]]; then printf 'arm64 %s %s\n' "$(cat "$SYSROOT/.complete")" \
            "$(dpkg-query -W -f='${Version}' gcc-aarch64-linux-gnu libc6-dev-arm64-cross)"; fi
        (cd "$ROOT" && find cni_plugin -name "*.py" -print0 | LC_ALL=C sort -z | xargs -0 sha256sum; sha256sum scripts/build/bundle/* scripts/build-plugin.sh)
    } | sha256sum | cut -c1-16
}

# The interpreter's own deep-frozen modules: the _Py_get_*_toplevel functions of
# the static library's deepfreeze.o. The bundle wraps each (ld --wrap) so that a
# module's strings are interned when it is first imported, not all at start-up.
stdlib_getters() {
    local getters
    getters="$(LC_ALL=C "$NM" -A "$LIBPY" 2>/dev/null \
               | sed -n 's/.*:deepfreeze\.o: *[0-9a-f]* T \(_Py_get_[A-Za-z0-9_]*_toplevel\)$/\1/p' | LC_ALL=C sort -u)"
    [[ -n "$getters" ]] || die "no deep-frozen modules (deepfreeze.o) in $LIBPY"
    printf '%s\n' "$getters"
}

# An ELF with no PT_INTERP and no DT_NEEDED: the kernel runs it as is.
check_static() {
    local exe="$1"
    if LC_ALL=C readelf -lW "$exe" | grep -q 'INTERP'; then die "$exe has a program interpreter"; fi
    if LC_ALL=C readelf -dW "$exe" 2>/dev/null | grep -q 'NEEDED'; then die "$exe needs shared libraries"; fi
    local machine
    machine="$(LC_ALL=C readelf -hW "$exe" | sed -n 's/^ *Machine: *//p')"
    [[ "$machine" == "$ELF_MACHINE" ]] || die "$exe is for $machine, not $ELF_MACHINE"
}

build() {
    local work="$1" cpython="$2" cflags=(-O2 -DNDEBUG -ffile-prefix-map="$work"=. -I"$INCLUDE" "${EXTRA_INCLUDES[@]}" -I"$work")
    local json_c="$cpython/Modules/_json.c" getters=() wraps=(-Wl,--wrap=_Py_Deepfreeze_Init) getter
    mapfile -t getters < <(stdlib_getters)
    ((${#getters[@]})) || die "no deep-frozen modules (deepfreeze.o) in $LIBPY"
    for getter in "${getters[@]}"; do wraps+=("-Wl,--wrap=$getter"); done
    "$PY" -I -S "$HERE/build/bundle/freeze.py" --src "$ROOT" --inittab "$HERE/build/bundle/inittab.c" --out "$work" \
        --deepfreeze "$cpython/Tools/scripts" --include "$INCLUDE" --stdlib-getters "${getters[@]}"
    "$CC" "${cflags[@]}" -c "$HERE/build/bundle/netclaim.c" -o "$work/netclaim.o"
    "$CC" "${cflags[@]}" -c "$HERE/build/bundle/netclaim_sys.c" -o "$work/netclaim_sys.o"
    "$CC" "${cflags[@]}" -c "$HERE/build/bundle/inittab.c" -o "$work/inittab.o"
    # Deep-frozen objects are laid out with the interpreter's internal structs.
    "$CC" -O1 -DNDEBUG -DPy_BUILD_CORE -ffile-prefix-map="$work"=. -I"$INCLUDE" "${EXTRA_INCLUDES[@]}" -I"$work" \
        -c "$work/frozen.c" -o "$work/frozen.o"
    "$CC" "${cflags[@]}" -ffile-prefix-map="$(dirname "$json_c")"=Modules -I"$INCLUDE/internal" -DPy_BUILD_CORE_BUILTIN \
        -c "$json_c" -o "$work/_json.o"
    # glibc warns that getaddrinfo/getpwnam & co. need its NSS modules at run
    # time in a static binary; the plugin never resolves names or users (it
    # speaks AF_UNIX and AF_NETLINK only), and pwd/grp are not even built in.
    "$CC" -static -s "${wraps[@]}" -o "$work/netclaim" "$work"/{netclaim,netclaim_sys,inittab,frozen,_json}.o "$LIBPY" \
        -lm -lpthread -ldl -lutil 2>"$work/link.log" || { cat "$work/link.log" >&2; die "link failed"; }
    check_static "$work/netclaim"
    local answer
    answer="$(echo '{}' | env -i CNI_COMMAND=VERSION "${RUN[@]}" "$work/netclaim")" || die "the built plugin failed VERSION"
    [[ "$answer" == *supportedVersions* ]] || die "unexpected VERSION answer: $answer"
}

# What went into the executable besides its modules (modules.txt), one "key value" a line,
# for the release's SBOM (scripts/build/sbom.py): the CPython version, and the Debian
# packages whose static libraries it links, as "deb:<package> <version>".
build_info() {
    printf 'arch %s\n' "$ARCH"
    printf 'python %s\n' "$(libpython_version)"
    if [[ "$ARCH" == arm64 ]]; then
        printf 'deb:libpython3.11-dev %s\n' "$(cat "$SYSROOT/.complete")"
        printf 'deb:libc6-dev-arm64-cross %s\n' "$(dpkg-query -W -f='${Version}' libc6-dev-arm64-cross)"
    else
        printf 'deb:libpython3.11-dev %s\n' "$(dpkg-query -W -f='${Version}' libpython3.11-dev)"
        printf 'deb:libc6-dev %s\n' "$(dpkg-query -W -f='${Version}' libc6-dev)"
    fi
}

# What an entry holds and the record of it, written when its build succeeded: the executable and
# the two files the release's SBOM reads back (scripts/release.sh checks its copies against it too).
ENTRY_FILES=(netclaim modules.txt build-info.txt)
RECORD=SHA256SUMS

sha256_of() { sha256sum <"$1" 2>/dev/null | cut -d' ' -f1; }

# The digest the entry's record lists for one of its files (empty if none).
recorded_digest() { awk -v name="$2" '$2 == name { print $1 }' "$1/$RECORD" 2>/dev/null; }

# Whether the entry DIR can be reused as built: true when every file matches its record; false
# when there is no executable or no record (built again: a record is only ever written with a
# build); a file that differs from its record stops the build, since only a change after the
# build explains it, and a silent rebuild would hide that the cache was written by someone else.
entry_verified() {
    local dir="$1" file
    [[ -x "$dir/netclaim" ]] || return 1
    if [[ ! -f "$dir/$RECORD" ]]; then
        log "$dir has no digest record ($RECORD; an entry of an older build-plugin.sh): building it again"
        return 1
    fi
    for file in "${ENTRY_FILES[@]}"; do
        local want
        want="$(recorded_digest "$dir" "$file")"
        [[ -n "$want" ]] || die "$dir/$RECORD records no digest for $file; remove $dir to rebuild"
        [[ "$(sha256_of "$dir/$file")" == "$want" ]] \
            || die "cached plugin $dir/$file does not match the digest recorded when it was built ($dir/$RECORD); remove $dir to rebuild"
    done
}

# A finished build into the entry DIR: its record first (of the bytes built), the executable last,
# by rename, so an executable in the cache always has a record beside it.
store_entry() {
    local work="$1" dir="$2" file
    mkdir -p "$dir"
    rm -f "$dir/netclaim"
    install -m 0755 "$work/netclaim" "$dir/netclaim.tmp"
    cp "$work/modules.txt" "$dir/modules.txt"
    build_info >"$dir/build-info.txt"
    for file in "${ENTRY_FILES[@]}"; do
        local src="$dir/$file"
        [[ "$file" != netclaim ]] || src="$dir/netclaim.tmp"
        printf '%s  %s\n' "$(sha256_of "$src")" "$file"
    done >"$dir/$RECORD.tmp"
    mv -f "$dir/$RECORD.tmp" "$dir/$RECORD"
    mv -f "$dir/netclaim.tmp" "$dir/netclaim"
}

# Keep the newest few builds: every edit of the plugin's sources makes a new one.
prune() {
    local keep="$1" old
    for old in $(ls -1td "$PLUGIN_CACHE"/*/ 2>/dev/null | tail -n +5); do
        [[ "$(basename "$old")" == "$keep" ]] || rm -rf "$old"
    done
}

main() {
    local key dest lock
    ensure_packages
    mkdir -p "$CACHE/plugin"
    lock="$CACHE/plugin/.lock"
    exec 9>"$lock"
    flock 9
    configure_arch
    mkdir -p "$PLUGIN_CACHE"
    [[ -f "$LIBPY" ]] || die "$LIBPY missing (libpython3.11-dev)"
    key="$(cache_key)"
    dest="$PLUGIN_CACHE/$key/netclaim"
    if ! entry_verified "$(dirname "$dest")"; then
        local cpython work
        cpython="$(cpython_sources "$(libpython_version)")"
        work="$(mktemp -d "$PLUGIN_CACHE/.build.XXXXXX")"
        log "building the static plugin for $ARCH ($key)"
        build "$work" "$cpython"
        store_entry "$work" "$(dirname "$dest")"
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
        # The copy, not only the entry: nothing changed between the check and the copy.
        [[ "$(sha256_of "$tmp")" == "$(recorded_digest "$(dirname "$dest")" netclaim)" ]] \
            || { rm -f "$tmp"; die "cached plugin $dest does not match the digest recorded when it was built ($(dirname "$dest")/$RECORD); remove $(dirname "$dest") to rebuild"; }
        mv -f "$tmp" "$OUT"
    fi
    printf '%s\n' "$dest"
}

main
