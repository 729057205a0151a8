#!/usr/bin/env bash
# Build the netclaim image without any container registry, from Debian packages only.
#
#   scripts/build-image.sh [--tag TAG]     build (or reuse) and print the OCI archive's path
#
# The image holds a minimal Debian root file system with Python 3.11 (made by
# mmdebstrap from the Debian mirror apt already uses), the publisher's venv at
# /opt/netclaim/venv and the self-contained plugin at /opt/netclaim/bin/netclaim
# (scripts/build-plugin.sh). No source tree, no pip, no compiler. Two layers:
# the base (changes rarely) and netclaim itself. Packed with umoci into an OCI
# layout and tarred as an OCI archive that `ctr images import` (and
# scripts/cluster.sh import-image) accept; the archive names the image
# netclaim:TAG (TAG defaults to the project version, cni_plugin.__version__).
# conf/container/Containerfile builds the same image with a registry-based builder.
#
# Everything is cached under ${XDG_CACHE_HOME:-~/.cache}/netclaim/image/: the
# base root file system by its package list, the archive by the hash of its inputs.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/.." && pwd)"
CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/netclaim/image"
PY=/usr/bin/python3.11
BASE_PACKAGES="python3.11-minimal,libpython3.11-stdlib"
APT_PACKAGES=(mmdebstrap umoci python3.11 python3-pip)
TAG=""

log() { printf '[build-image] %s\n' "$*" >&2; }
die() { printf '[build-image] error: %s\n' "$*" >&2; exit 1; }

while (($#)); do
    case "$1" in
        --tag) TAG="${2:?--tag needs a value}"; shift 2 ;;
        -h|--help) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed -e '$d' -e 's/^# \{0,1\}//'; exit 0 ;;
        *) die "unknown argument: $1" ;;
    esac
done
VERSION="$("$PY" -c 'import sys; sys.path.insert(0, sys.argv[1]); import cni_plugin; print(cni_plugin.__version__)' "$ROOT")"
TAG="${TAG:-$VERSION}"

# shellcheck source=lib/apt.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/apt.sh"
ensure_packages() { ensure_debian_packages "${APT_PACKAGES[@]}"; }

# The base: Essential packages plus Python 3.11, no docs, man pages or locales.
base_rootfs() {
    local key out
    key="$(printf '%s\n' bookworm essential "$BASE_PACKAGES" | sha256sum | cut -c1-16)"
    out="$CACHE/base-$key.tar"
    if [[ ! -f "$out" ]]; then
        log "making the base root file system (mmdebstrap, bookworm, $BASE_PACKAGES)"
        mmdebstrap --quiet --variant=essential --include="$BASE_PACKAGES" \
            --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*' \
            --dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-exclude=/usr/share/info/*' \
            --customize-hook='rm -rf "$1"/var/cache/apt/* "$1"/var/lib/apt/lists/* "$1"/var/log/*' \
            bookworm "$out.part.tar" >&2
        mv "$out.part.tar" "$out"
    fi
    printf '%s' "$out"
}

# Wheels of netclaim and its dependencies (from the package registry, pip-cached).
wheels() {
    local dir="$1"
    "$PY" -m pip wheel --quiet --disable-pip-version-check --wheel-dir "$dir" "$ROOT" >&2
    "$PY" -m pip download --quiet --disable-pip-version-check --no-deps --dest "$dir" pip >&2
}

# The venv, made by the image's own Python inside the root file system, so
# every path and #! line in it is the image's.
app_layer() {
    local rootfs="$1" wheeldir="$2" pip
    mkdir -p "$rootfs/opt/netclaim/bin" "$rootfs/tmp/wheels"
    cp "$wheeldir"/*.whl "$rootfs/tmp/wheels/"
    pip="$(basename "$(ls "$rootfs"/tmp/wheels/pip-*.whl)")"
    chroot "$rootfs" "$PY" -m venv --without-pip /opt/netclaim/venv
    chroot "$rootfs" /opt/netclaim/venv/bin/python "/tmp/wheels/$pip/pip" install --quiet --no-index \
        --disable-pip-version-check --no-warn-script-location --find-links /tmp/wheels netclaim >&2
    rm -rf "$rootfs/tmp/wheels"
    # The asyncio twin of the Kubernetes client (kubernetes/aio: ~68 MB with its
    # bytecode) is never imported by the publisher; the check below proves it.
    rm -rf "$rootfs"/opt/netclaim/venv/lib/python3.*/site-packages/kubernetes/aio
    chroot "$rootfs" /opt/netclaim/venv/bin/python -c \
        'import publisher.cli, publisher.kube, publisher.chainkeeper, kubernetes.client, kubernetes.config' \
        || die "the venv does not import"
    install -m 0755 "$PLUGIN" "$rootfs/opt/netclaim/bin/netclaim"
    # Nothing of the source tree: the venv holds the installed package only.
    [[ ! -e "$rootfs/src" ]] || die "a source tree in the image"
}

main() {
    ensure_packages
    mkdir -p "$CACHE"
    PLUGIN="$("$HERE/build-plugin.sh")"
    local base work key archive layout
    base="$(base_rootfs)"
    WORK="$(mktemp -d "$CACHE/work.XXXXXX")"
    trap 'rm -rf "$WORK"' EXIT
    work="$WORK"
    wheels "$work/wheels"
    # The key: base, plugin, dependency wheels, and netclaim's own sources (its
    # freshly built wheel differs on every build by its timestamps).
    key="$( (sha256sum "$base" "$PLUGIN" "$0" "$work"/wheels/*.whl | grep -v '/netclaim-[^/]*\.whl$' | cut -d' ' -f1
             cd "$ROOT" && find setup.cfg pyproject.toml cni_plugin publisher \( -name '*.py' -o -name '*.cfg' \
                 -o -name '*.toml' \) -print0 | sort -z | xargs -0 sha256sum
             echo "$TAG") | sha256sum | cut -c1-16)"
    archive="$CACHE/netclaim-$TAG-$key.oci.tar"
    if [[ -f "$archive" ]]; then
        log "cached: $archive"
        printf '%s\n' "$archive"
        return 0
    fi
    layout="$work/layout"
    umoci init --layout "$layout"
    umoci new --image "$layout:$TAG"
    # Layer 1: the Debian base.
    umoci unpack --image "$layout:$TAG" "$work/bundle" >/dev/null
    tar -xf "$base" -C "$work/bundle/rootfs"
    umoci repack --image "$layout:$TAG" "$work/bundle"
    # Layer 2: the venv and the plugin.
    umoci unpack --image "$layout:$TAG" "$work/bundle2" >/dev/null
    app_layer "$work/bundle2/rootfs" "$work/wheels"
    umoci repack --image "$layout:$TAG" "$work/bundle2"
    umoci config --image "$layout:$TAG" --author netclaim \
        --config.entrypoint /opt/netclaim/venv/bin/netclaim-publisher --config.cmd run \
        --config.env PATH=/opt/netclaim/venv/bin:/usr/local/bin:/usr/bin:/bin \
        --config.label "org.opencontainers.image.version=$VERSION" \
        --config.label "org.opencontainers.image.title=netclaim"
    umoci gc --layout "$layout"
    # The names `ctr images import` uses for an OCI archive.
    "$PY" - "$layout/index.json" "$TAG" <<'PYEOF'
import json, sys
path, tag = sys.argv[1], sys.argv[2]
index = json.load(open(path))
for m in index["manifests"]:
    ann = m.setdefault("annotations", {})
    if ann.get("org.opencontainers.image.ref.name") == tag:
        ann["io.containerd.image.name"] = f"docker.io/library/netclaim:{tag}"
json.dump(index, open(path, "w"))
PYEOF
    tar -C "$layout" -cf "$archive.tmp" .
    mv "$archive.tmp" "$archive"
    log "image netclaim:$TAG: $(du -b "$archive" | cut -f1) bytes as an archive"
    printf '%s\n' "$archive"
}

main
