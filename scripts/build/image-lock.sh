#!/usr/bin/env bash
# Take today's Debian packages and wheels for the image: rewrite its two locks.
#
#   scripts/build/image-lock.sh
#
# conf/image/debian.lock: every Debian package of the image's base, per image architecture
# (amd64: Essential plus Python 3.11, as mmdebstrap's essential variant resolves them from this
# machine's apt sources; arm64: the same packages' arm64 builds), with version and sha256, and
# the SOURCE_DATE_EPOCH every image built from it carries (the time the lock was taken).
# conf/image/wheels.lock: the publisher's dependency wheels, the build tools its own wheel needs
# (setuptools, wheel and what they need) and pip, pinned with the sha256 of each platform's file.
# Every file is kept in the package store on the way (scripts/build/pkgstore.py), so the next
# build needs no network. A new lock gives a new image digest: commit it with what needed it.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
PY=/usr/bin/python3.11
# The index only: a find-links of this machine could lock a file no other machine can fetch.
unset PIP_FIND_LINKS PIP_EXTRA_INDEX_URL
BASE_PACKAGES="python3.11-minimal,libpython3.11-stdlib"
BUILD_TOOLS=("setuptools>=68" wheel pip)

log() { printf '[image-lock] %s\n' "$*" >&2; }
die() { printf '[image-lock] error: %s\n' "$*" >&2; exit 1; }
case "${1:-}" in
    -h|--help) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed -e '$d' -e 's/^# \{0,1\}//'; exit 0 ;;
    "") ;;
    *) die "unknown argument: $1" ;;
esac

# shellcheck source=apt.sh
source "$HERE/apt.sh"
ensure_debian_packages mmdebstrap dpkg-dev python3-pip

WORK="$(mktemp -d -t netclaim-image-lock.XXXXXX)"
trap 'rm -rf "$WORK"' EXIT
sources=()
for conf in /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources; do
    if [[ -s "$conf" ]]; then sources+=("$conf"); fi
done
((${#sources[@]})) || die "no apt sources on this machine"

log "amd64: the essential variant plus $BASE_PACKAGES, from this machine's apt sources"
mkdir -p "$WORK/amd64" "$WORK/arm64" "$WORK/wheels"
mmdebstrap --quiet --variant=essential --skip=essential/unlink --include="$BASE_PACKAGES" \
    --customize-hook="cp \"\$1\"/var/cache/apt/archives/*.deb $WORK/amd64/" \
    bookworm "$WORK/base.tar" "${sources[@]}" >&2
rm -f "$WORK/base.tar"
packages="$(for deb in "$WORK"/amd64/*.deb; do dpkg-deb -f "$deb" Package; done | sort | paste -sd, -)"

log "arm64: the same packages' arm64 builds"
mmdebstrap --quiet --architectures=arm64 --variant=extract --include="$packages" \
    --aptopt='APT::Install-Recommends "false"' \
    --extract-hook="cp \"\$1\"/var/cache/apt/archives/*.deb $WORK/arm64/" \
    bookworm "$WORK/base.tar" "${sources[@]}" >&2
rm -f "$WORK/base.tar"
[[ "$(for deb in "$WORK"/arm64/*.deb; do dpkg-deb -f "$deb" Package; done | sort | paste -sd, -)" == "$packages" ]] \
    || die "the arm64 packages are not the amd64 ones"

log "wheels: the publisher's dependencies, its build tools and pip"
"$PY" -m pip wheel --quiet --disable-pip-version-check --no-cache-dir --wheel-dir "$WORK/wheels" "$ROOT" >&2
rm -f "$WORK"/wheels/netclaim-*.whl
"$PY" -m pip download --quiet --disable-pip-version-check --only-binary=:all: --dest "$WORK/wheels" \
    "${BUILD_TOOLS[@]}" >&2
for whl in "$WORK"/wheels/*.whl; do
    case "$whl" in
        *-none-any.whl) ;;
        *) "$PY" "$HERE/pkgstore.py" download arm64 --dest "$WORK/wheels" \
               "$(basename "$whl" | sed -E 's/^([^-]+)-([^-]+)-.*/\1==\2/')" ;;
    esac
done

epoch="$(date -u +%s)"
{
    printf '# The Debian packages of the image, per image architecture: IMAGE PACKAGE VERSION ARCH SHA256.\n'
    printf '# Taken %s by scripts/build/image-lock.sh; every image built from this lock is dated then:\n' \
        "$(date -u -d "@$epoch" +%Y-%m-%dT%H:%M:%SZ)"
    printf '# SOURCE_DATE_EPOCH=%s\n' "$epoch"
    "$PY" "$HERE/pkgstore.py" lock-debs amd64 "$WORK"/amd64/*.deb
    "$PY" "$HERE/pkgstore.py" lock-debs arm64 "$WORK"/arm64/*.deb
} >"$WORK/debian.lock"
{
    printf '# The wheels of the image (pip install --require-hashes -r reads this file): the publisher'"'"'s\n'
    printf '# dependencies, the tools that build its own wheel and pip; one hash per platform build.\n'
    printf '# Taken %s by scripts/build/image-lock.sh.\n' "$(date -u -d "@$epoch" +%Y-%m-%dT%H:%M:%SZ)"
    "$PY" "$HERE/pkgstore.py" lock-wheels "$WORK"/wheels/*.whl
} >"$WORK/wheels.lock"
mkdir -p "$ROOT/conf/image"
install -m 0644 "$WORK/debian.lock" "$ROOT/conf/image/debian.lock"
install -m 0644 "$WORK/wheels.lock" "$ROOT/conf/image/wheels.lock"
log "conf/image/debian.lock: $(grep -c '^amd64 ' "$ROOT/conf/image/debian.lock") amd64 and" \
    "$(grep -c '^arm64 ' "$ROOT/conf/image/debian.lock") arm64 packages; conf/image/wheels.lock:" \
    "$(grep -c '==' "$ROOT/conf/image/wheels.lock") wheels"
