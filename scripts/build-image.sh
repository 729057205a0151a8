#!/usr/bin/env bash
# Build the netclaim image without any container registry, from Debian packages only.
#
#   scripts/build-image.sh [--tag TAG]                build (or reuse) and print the OCI archive's path
#   scripts/build-image.sh --multi-arch [--tag TAG]   the same as a multi-arch image: linux/amd64 and
#                                                     linux/arm64 (or NETCLAIM_IMAGE_MULTIARCH=1)
#   scripts/build-image.sh --offline ...              fetch nothing: every input from the package
#                                                     store and the caches (or NETCLAIM_OFFLINE=1)
#
# The image holds a minimal Debian root file system with Python 3.11 (made by
# mmdebstrap from the Debian mirror apt already uses), the publisher's venv at
# /opt/netclaim/venv and the self-contained plugin at /opt/netclaim/bin/netclaim
# (scripts/build-plugin.sh). No source tree, no pip, no compiler. Two layers:
# the base (changes rarely) and netclaim itself. Packed with umoci into an OCI
# layout and tarred as an OCI archive that `ctr images import` (and
# scripts/cluster.sh import-image) accept; the archive names the image
# netclaim:TAG (TAG defaults to the project version, cni_plugin.__version__).
# It is the one way the image is built: every input locked and hash-checked, no registry.
#
# --multi-arch: the archive's one image is an OCI image index with two
# manifests, linux/amd64 (the image above) and linux/arm64, built on this
# x86_64 host without binfmt_misc: the arm64 base is Debian's arm64 packages of
# the same list, unpacked by mmdebstrap's extract variant (no maintainer script
# runs; /etc/passwd and /etc/group from base-passwd's master files, the loader
# cache made by the arm64 ldconfig); the venv is made by the arm64 python3.11
# run explicitly under qemu-aarch64-static in a chroot, from the same wheels
# with aarch64 builds of the compiled ones; the plugin is the cross-built one
# (scripts/build-plugin.sh --arch arm64). The arm64 venv must import and
# `netclaim-publisher --version` must answer under the emulator before the
# image is written. `ctr images import` picks the node's platform from the index.
#
# Reproducible and offline: every Debian package and wheel is pinned by version and sha256
# in conf/image/debian.lock and conf/image/wheels.lock (scripts/build/image-lock.sh takes new
# ones) and taken from the package store (scripts/build/pkgstore.py), never from a mirror or
# index directly: apt resolves the base from a repository that holds exactly the locked .debs,
# pip installs from a wheelhouse of exactly the locked wheels, netclaim's own wheel is built
# from that wheelhouse too. Every time in the image (file times, the layers' and the config's
# created, the archive's entries) is the lock's SOURCE_DATE_EPOCH and the bytecode is
# hash-checked, so a cold build of the same sources, locks and plugins gives the same digest.
# A store that lacks a locked file fetches it once (apt, pip); --offline (or
# NETCLAIM_OFFLINE=1) fetches nothing and fails with what is missing.
#
# Everything is cached under ${NETCLAIM_IMAGE_CACHE:-${XDG_CACHE_HOME:-~/.cache}/netclaim/image}/:
# the base root file systems by their locked packages and this script, the archive by the hash
# of its inputs. A key says what a file was built from, not what it holds now: beside each base
# and archive, FILE.sha256 records its SHA-256 when its build succeeded (before the file is put in
# place), and a reuse checks it first. A file that differs from its record (the cache is the
# user's to write: another job, a restored CI cache) is refused, naming it: remove it to rebuild.
# A file with no record (an older build-image.sh, whose keys differ anyway) is built again, once.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/.." && pwd)"
CACHE="${NETCLAIM_IMAGE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/netclaim/image}"
PY=/usr/bin/python3.11
# Wheels come from the lock's wheelhouse only, never from a find-links of this machine.
unset PIP_FIND_LINKS PIP_EXTRA_INDEX_URL
BASE_PACKAGES="python3.11-minimal,libpython3.11-stdlib"
APT_PACKAGES=(mmdebstrap umoci python3.11 python3-pip dpkg-dev)
TAG=""
MULTIARCH="${NETCLAIM_IMAGE_MULTIARCH:-}"
OFFLINE="${NETCLAIM_OFFLINE:-}"
ARM64_APT_PACKAGES=(qemu-user-static)

log() { printf '[build-image] %s\n' "$*" >&2; }
die() { printf '[build-image] error: %s\n' "$*" >&2; exit 1; }

while (($#)); do
    case "$1" in
        --tag) TAG="${2:?--tag needs a value}"; shift 2 ;;
        --multi-arch) MULTIARCH=1; shift ;;
        --offline) OFFLINE=1; shift ;;
        -h|--help) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed -e '$d' -e 's/^# \{0,1\}//'; exit 0 ;;
        *) die "unknown argument: $1" ;;
    esac
done
VERSION="$("$PY" -c 'import sys; sys.path.insert(0, sys.argv[1]); import cni_plugin; print(cni_plugin.__version__)' "$ROOT")"
TAG="${TAG:-$VERSION}"
PKGSTORE=("$PY" "$HERE/build/pkgstore.py")
# Every time in the image is the lock's: the same locks and sources give the same bytes.
SOURCE_DATE_EPOCH="$("${PKGSTORE[@]}" epoch)"
export SOURCE_DATE_EPOCH
CREATED="$(date -u -d "@$SOURCE_DATE_EPOCH" +%Y-%m-%dT%H:%M:%SZ)"

# shellcheck source=build/apt.sh
source "$(dirname "${BASH_SOURCE[0]}")/build/apt.sh"
ensure_packages() {
    ensure_debian_packages "${APT_PACKAGES[@]}"
    if [[ -n "$MULTIARCH" ]]; then ensure_debian_packages "${ARM64_APT_PACKAGES[@]}"; fi
}

# Whether the cached FILE can be reused as built: true when it matches FILE.sha256, its record;
# false when it or its record is missing (built again: a record is only ever written with a build);
# a file that differs from its record stops the build, since only a change after the build explains
# it, and a silent rebuild would hide that the cache was written by someone else. WHAT names it.
cached_verified() {
    local file="$1" what="$2" want
    [[ -f "$file" ]] || return 1
    if [[ ! -f "$file.sha256" ]]; then
        log "$file has no digest record ($file.sha256; a file of an older build-image.sh): building it again"
        return 1
    fi
    want="$(awk 'NR == 1 { print $1 }' "$file.sha256")"
    [[ -n "$want" && "$(sha256sum <"$file" | cut -d' ' -f1)" == "$want" ]] \
        || die "cached $what $file does not match the digest recorded when it was built ($file.sha256); remove $file to rebuild"
}

# A finished build PART put in place as FILE: its record first (of the bytes built), then the file,
# by rename, so a file in the cache always has a record beside it.
store_cached() {
    local part="$1" file="$2"
    rm -f "$file"
    printf '%s  %s\n' "$(sha256sum <"$part" | cut -d' ' -f1)" "$(basename "$file")" >"$file.sha256.tmp"
    mv -f "$file.sha256.tmp" "$file.sha256"
    mv -f "$part" "$file"
}

# The locked packages of one image architecture, as lines (what a base's cache key hashes).
locked_debs() { grep "^$1 " "$ROOT/conf/image/debian.lock"; }

# A flat repository of exactly the locked .debs of ARCH, for mmdebstrap (its mirror line).
deb_repo() {
    local arch="$1" repo="$WORK/repo-$1"
    "${PKGSTORE[@]}" debs "$arch" --out "$repo" ${OFFLINE:+--offline} || die "the $arch Debian packages are not at hand"
    printf 'deb [trusted=yes] copy://%s bookworm main' "$repo"
}

# The base: Essential packages plus Python 3.11, no docs, man pages or locales, no apt
# sources (the image has no apt; the list would name the build's own repository); apt
# resolves it from the locked packages alone (a package the lock lacks is an error).
base_rootfs() {
    local key out mirror
    key="$( (printf '%s\n' bookworm essential "$BASE_PACKAGES"; sha256sum <"$0"; locked_debs amd64) | sha256sum | cut -c1-16)"
    out="$CACHE/base-$key.tar"
    exec 6>"$CACHE/.lock-base-$key"
    flock 6
    if ! cached_verified "$out" "base root file system"; then
        log "making the base root file system (mmdebstrap, bookworm, $BASE_PACKAGES, from the lock)"
        mirror="$(deb_repo amd64)"
        mmdebstrap --quiet --variant=essential --include="$BASE_PACKAGES" \
            --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*' \
            --dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-exclude=/usr/share/info/*' \
            --customize-hook='rm -rf "$1"/etc/apt/sources.list "$1"/var/cache/apt/* "$1"/var/lib/apt/lists/* "$1"/var/log/*' \
            bookworm "$out.part.tar" "$mirror" >&2 </dev/null \
            || { rm -f "$out.part.tar"; die "mmdebstrap failed"; }
        store_cached "$out.part.tar" "$out"
    fi
    printf '%s' "$out"
}

# The arm64 base: the same Debian packages as the amd64 base (its dpkg status
# lists them), arm64 builds, unpacked without running anything.
base_rootfs_arm64() {
    local key out packages mirror hooks=()
    packages="$(locked_debs arm64 | cut -d' ' -f2 | sort | paste -sd, -)"
    key="$( (printf '%s\n' bookworm arm64 extract; sha256sum <"$0"; locked_debs arm64) | sha256sum | cut -c1-16)"
    out="$CACHE/base-arm64-$key.tar"
    exec 6>"$CACHE/.lock-base-$key"
    flock 6
    if ! cached_verified "$out" "arm64 base root file system"; then
        log "making the arm64 base root file system (mmdebstrap extract, bookworm, the locked arm64 packages)"
        mirror="$(deb_repo arm64)"
        if [[ -d /usr/share/mmdebstrap/hooks/merged-usr ]]; then hooks=(--hook-dir=/usr/share/mmdebstrap/hooks/merged-usr); fi
        # Only those packages and what they depend on (the essential variant installs no recommends either).
        # The stdlib's bytecode, which Debian's postinst would write, is compiled by this host's python3.11
        # (the same bytecode); a read-only root could not cache it at run time.
        # Nothing is installed, so dpkg's status would list no package: each extracted package's
        # control fields are added to it as "install ok unpacked", which is what they are, so the
        # image says what it holds (the release's SBOM reads it, as any scanner does).
        # The merged-usr hook's placeholder package (no files; the essential variant replaces it
        # with Debian's) is taken out again: it is not a Debian package and must not be listed.
        mmdebstrap --quiet --architectures=arm64 --variant=extract --include="$packages" "${hooks[@]}" \
            --aptopt='APT::Install-Recommends "false"' \
            --extract-hook='cp "$1"/usr/share/base-passwd/passwd.master "$1"/etc/passwd' \
            --extract-hook='cp "$1"/usr/share/base-passwd/group.master "$1"/etc/group' \
            --extract-hook='rm -rf "$1"/usr/share/doc/* "$1"/usr/share/man/* "$1"/usr/share/locale/* "$1"/usr/share/info/*' \
            --extract-hook='set -e; ls "$1"/var/cache/apt/archives/*.deb >/dev/null; for deb in "$1"/var/cache/apt/archives/*.deb; do ! grep -qx "Package: $(dpkg-deb -f "$deb" Package)" "$1"/var/lib/dpkg/status || continue; { echo; dpkg-deb -f "$deb" | sed "1a Status: install ok unpacked"; } >>"$1"/var/lib/dpkg/status; done' \
            --extract-hook='rm -f "$1"/var/lib/dpkg/info/usr-is-merged.*; awk -v RS= -v ORS="\n\n" "\$1 != \"Package:\" || \$2 != \"usr-is-merged\"" "$1"/var/lib/dpkg/status >"$1"/var/lib/dpkg/status.new && mv "$1"/var/lib/dpkg/status.new "$1"/var/lib/dpkg/status' \
            --extract-hook='rm -rf "$1"/etc/apt/sources.list "$1"/var/cache/apt/* "$1"/var/lib/apt/lists/* "$1"/var/log/*' \
            --extract-hook="cp $(command -v qemu-aarch64-static) \"\$1\"/qemu-aarch64-static" \
            --extract-hook='chroot "$1" /qemu-aarch64-static /sbin/ldconfig' \
            --extract-hook='rm -f "$1"/qemu-aarch64-static' \
            --extract-hook="$PY -m compileall -qq -s \"\$1\" -p / \"\$1\"/usr/lib/python3.11 || true" \
            bookworm "$out.part.tar" "$mirror" >&2 </dev/null \
            || { rm -f "$out.part.tar"; die "mmdebstrap failed"; }
        store_cached "$out.part.tar" "$out"
    fi
    printf '%s' "$out"
}

# The locked wheels for ARCH, and netclaim's own wheel, built from the same wheelhouse (its
# build tools are locked too) with the lock's time in every entry.
wheels() {
    local arch="$1" dir="$2"
    "${PKGSTORE[@]}" wheels "$arch" --out "$dir" ${OFFLINE:+--offline} || die "the $arch wheels are not at hand"
    if [[ ! -f "$WORK/own/.built" ]]; then
        rm -rf "$WORK/own" && mkdir -p "$WORK/own"
        # A copy of the sources: the build writes its egg-info and build/ beside them.
        (cd "$ROOT" && tar --exclude=__pycache__ -cf - setup.cfg pyproject.toml README.md cni_plugin publisher) \
            | tar -xf - -C "$WORK/own"
        "$PY" -m pip wheel --quiet --disable-pip-version-check --no-cache-dir --no-deps --no-index \
            --find-links "$dir" --wheel-dir "$WORK/own/dist" "$WORK/own" >&2 || die "netclaim's wheel did not build"
        touch "$WORK/own/.built"
    fi
    cp "$WORK"/own/dist/netclaim-*.whl "$dir/"
}

# The venv, made by the image's own Python inside the root file system, so
# every path and #! line in it is the image's.
# For arm64 (third argument) every command in the root file system runs under
# the emulator, copied in for the time of the build and removed again.
# Reproducible: pip writes hash-checked bytecode (SOURCE_DATE_EPOCH is set), keeps no cache,
# the checks write no bytecode, every new file gets the lock's time and the directories the
# build touched on the way (/, /opt, /tmp) get their own times back (or the lock's, when the
# build made them), so the layer holds only
# /opt/netclaim and nothing in it depends on when it was built.
app_layer() {
    local rootfs="$1" wheeldir="$2" arch="${3:-amd64}" pip plugin="$PLUGIN" run=() d
    rm -f "$WORK"/time-*
    for d in / /opt /tmp; do if [[ -e "$rootfs$d" ]]; then touch -r "$rootfs$d" "$WORK/time-${d//\//_}"; fi; done
    if [[ "$arch" == arm64 ]]; then
        cp "$(command -v qemu-aarch64-static)" "$rootfs/qemu-aarch64-static"
        run=(/qemu-aarch64-static)
        plugin="$PLUGIN_ARM64"
    fi
    mkdir -p "$rootfs/opt/netclaim/bin" "$rootfs/tmp/wheels"
    cp "$wheeldir"/*.whl "$rootfs/tmp/wheels/"
    pip="$(basename "$(ls "$rootfs"/tmp/wheels/pip-*.whl)")"
    chroot "$rootfs" "${run[@]}" "$PY" -m venv --without-pip /opt/netclaim/venv
    chroot "$rootfs" "${run[@]}" /opt/netclaim/venv/bin/python "/tmp/wheels/$pip/pip" install --quiet --no-index \
        --no-cache-dir --disable-pip-version-check --no-warn-script-location --find-links /tmp/wheels netclaim >&2
    rm -rf "$rootfs/tmp/wheels"
    chroot "$rootfs" "${run[@]}" /opt/netclaim/venv/bin/python -B -c \
        'import publisher.cli, publisher.kube.calls, publisher.keeper.keeper, publisher.kube.apiclient, urllib3, yaml' \
        || die "the $arch venv does not import"
    chroot "$rootfs" "${run[@]}" /opt/netclaim/venv/bin/python -B /opt/netclaim/venv/bin/netclaim-publisher --version >&2 \
        || die "the $arch netclaim-publisher does not run"
    install -m 0755 "$plugin" "$rootfs/opt/netclaim/bin/netclaim"
    rm -f "$rootfs/qemu-aarch64-static"
    find "$rootfs/opt/netclaim" -exec touch -h -d "@$SOURCE_DATE_EPOCH" {} +
    for d in / /opt /tmp; do
        if [[ -e "$WORK/time-${d//\//_}" ]]; then touch -h -r "$WORK/time-${d//\//_}" "$rootfs$d"
        elif [[ -e "$rootfs$d" ]]; then touch -h -d "@$SOURCE_DATE_EPOCH" "$rootfs$d"; fi
    done
    # Nothing of the source tree: the venv holds the installed package only.
    [[ ! -e "$rootfs/src" ]] || die "a source tree in the image"
}

# One image (manifest + config) into the layout under REF: the base layer, then
# the venv and the plugin.
image_into() {
    local layout="$1" ref="$2" base="$3" wheeldir="$4" arch="$5" dir
    dir="$WORK/bundle-$arch"
    umoci new --image "$layout:$ref"
    umoci config --image "$layout:$ref" --no-history --os linux --architecture "$arch"
    # Layer 1: the Debian base.
    umoci unpack --image "$layout:$ref" "$dir" >/dev/null
    tar -xf "$base" -C "$dir/rootfs"
    umoci repack --history.created "$CREATED" --history.created_by "Debian bookworm ($arch), conf/image/debian.lock" \
        --image "$layout:$ref" "$dir"
    rm -rf "$dir"
    # Layer 2: the venv and the plugin.
    umoci unpack --image "$layout:$ref" "$dir" >/dev/null
    app_layer "$dir/rootfs" "$wheeldir" "$arch"
    umoci repack --history.created "$CREATED" --history.created_by "netclaim $VERSION: the venv and the plugin" \
        --image "$layout:$ref" "$dir"
    rm -rf "$dir"
    umoci config --image "$layout:$ref" --no-history --created "$CREATED" --author netclaim \
        --config.entrypoint /opt/netclaim/venv/bin/netclaim-publisher --config.cmd run \
        --config.env PATH=/opt/netclaim/venv/bin:/usr/local/bin:/usr/bin:/bin \
        --config.label "org.opencontainers.image.version=$VERSION" \
        --config.label "org.opencontainers.image.title=netclaim"
}

main() {
    ensure_packages
    mkdir -p "$CACHE"
    PLUGIN="$("$HERE/build-plugin.sh")"
    PLUGIN_ARM64=""
    if [[ -n "$MULTIARCH" ]]; then PLUGIN_ARM64="$("$HERE/build-plugin.sh" --arch arm64)"; fi
    local base base64="" work key archive layout
    # The key: everything the image is made of, known before anything is built, so a cached
    # image needs neither the package store nor the network: the locks, the plugins, these
    # scripts, netclaim's sources (README.md is its wheel's description) and the tag.
    key="$( (cd "$ROOT" && sha256sum conf/image/debian.lock conf/image/wheels.lock scripts/build/pkgstore.py
             sha256sum "$0" "$PLUGIN" ${PLUGIN_ARM64:+"$PLUGIN_ARM64"} | cut -d' ' -f1
             echo "${MULTIARCH:+multi-arch}" "$BASE_PACKAGES"
             cd "$ROOT" && find setup.cfg pyproject.toml README.md cni_plugin publisher \( -name '*.py' -o -name '*.cfg' \
                 -o -name '*.toml' -o -name '*.md' \) -print0 | sort -z | xargs -0 sha256sum
             echo "$TAG") | sha256sum | cut -c1-16)"
    archive="$CACHE/netclaim-$TAG-$key.oci.tar"
    # Two builds of the same inputs (test lanes side by side) take turns: the second one finds
    # the first one's archive. Lock files are per key, so different images still build at once.
    exec 7>"$CACHE/.lock-$key"
    flock 7
    if cached_verified "$archive" image; then
        log "cached: $archive"
        printf '%s\n' "$archive"
        return 0
    fi
    WORK="$(mktemp -d "$CACHE/work.XXXXXX")"
    trap 'rm -rf "$WORK"' EXIT
    work="$WORK"
    base="$(base_rootfs)"
    wheels amd64 "$work/wheels"
    if [[ -n "$MULTIARCH" ]]; then
        base64="$(base_rootfs_arm64)"
        wheels arm64 "$work/wheels-arm64"
    fi
    layout="$work/layout"
    umoci init --layout "$layout"
    if [[ -z "$MULTIARCH" ]]; then
        image_into "$layout" "$TAG" "$base" "$work/wheels" amd64
    else
        image_into "$layout" "$TAG-amd64" "$base" "$work/wheels" amd64
        image_into "$layout" "$TAG-arm64" "$base64" "$work/wheels-arm64" arm64
    fi
    umoci gc --layout "$layout"
    # The names `ctr images import` uses for an OCI archive; for the multi-arch
    # image, TAG names an image index of the two manifests (written as a blob),
    # and the per-arch names are dropped.
    "$PY" - "$layout" "$TAG" "${MULTIARCH:+amd64,arm64}" <<'PYEOF'
import hashlib, json, os, sys
layout, tag, arches = sys.argv[1], sys.argv[2], [a for a in sys.argv[3].split(",") if a]
path = os.path.join(layout, "index.json")
index = json.load(open(path))
REF = "org.opencontainers.image.ref.name"
if arches:
    by_ref = {m.get("annotations", {}).get(REF): m for m in index["manifests"]}
    entries = []
    for arch in arches:
        m = by_ref[f"{tag}-{arch}"]
        entries.append({"mediaType": m["mediaType"], "digest": m["digest"], "size": m["size"],
                        "platform": {"architecture": arch, "os": "linux"}})
    blob = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
                       "manifests": entries}, separators=(",", ":")).encode()
    digest = hashlib.sha256(blob).hexdigest()
    with open(os.path.join(layout, "blobs", "sha256", digest), "wb") as fh:
        fh.write(blob)
    index["manifests"] = [{"mediaType": "application/vnd.oci.image.index.v1+json", "digest": f"sha256:{digest}",
                           "size": len(blob), "annotations": {REF: tag}}]
for m in index["manifests"]:
    ann = m.setdefault("annotations", {})
    if ann.get(REF) == tag:
        ann["io.containerd.image.name"] = f"docker.io/library/netclaim:{tag}"
json.dump(index, open(path, "w"))
PYEOF
    # Sorted entries, fixed owners and the lock's time: the archive's bytes are the image's.
    tar --sort=name --mtime="@$SOURCE_DATE_EPOCH" --owner=0 --group=0 --numeric-owner -C "$layout" -cf "$archive.tmp" .
    store_cached "$archive.tmp" "$archive"
    log "image netclaim:$TAG${MULTIARCH:+ (linux/amd64, linux/arm64)}: $(du -b "$archive" | cut -f1) bytes as an archive"
    printf '%s\n' "$archive"
}

main
