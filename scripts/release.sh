#!/usr/bin/env bash
# Make a release: every artefact an operator installs, with checksums, SBOMs and notes.
#
#   scripts/release.sh VERSION [--out DIR] [--allow-dirty] [--push REGISTRY [--sign-key KEY]]
#
# VERSION must be the project's one version (cni_plugin.__version__), the chart's version and
# appVersion, and have a section "## [VERSION] - DATE" in docs/CHANGELOG.md; anything else is
# refused before anything is built. A work tree with uncommitted changes is refused too
# (--allow-dirty: build it anyway; the SBOMs then say so). DIR defaults to dist/VERSION in the
# repository (dist/ is ignored by git); it is replaced as a whole, and only when it is empty or
# an earlier release (it holds SHA256SUMS). Written into DIR:
#
#   netclaim-VERSION.oci.tar             the image for linux/amd64 and linux/arm64, one image index
#                                        (scripts/build-image.sh --multi-arch --tag VERSION)
#   netclaim-VERSION.oci.tar.digest      the index digest, sha256:...
#   netclaim-VERSION.tgz                 the Helm chart (helm package), values.yaml's image.digest
#                                        pinned to that digest
#   netclaim-VERSION-linux-amd64         the static plugin (scripts/build-plugin.sh)
#   netclaim-VERSION-linux-arm64         the same for arm64 (--arch arm64)
#   kubectl-netclaim                     the kubectl plugin (scripts/operator/kubectl-netclaim), one
#                                        standard-library Python file: `install -m 0755` it onto the PATH
#   netclaim.dev_v1_CNIResult.schema.json
#                                        the JSON Schema (draft 2020-12) of the `data` the publisher
#                                        writes in each entry (conf/schema/; docs/publisher.md)
#   <each of the four>.spdx.json         an SPDX 2.3 SBOM (scripts/build/sbom.py)
#   RELEASE-NOTES.md                     the version's section of docs/CHANGELOG.md
#   SHA256SUMS                           `sha256sum -c SHA256SUMS` checks every file above
#
# Nothing is fetched here: the image, the plugins and helm come from the caches under
# ${XDG_CACHE_HOME:-~/.cache}/netclaim/, keyed by their inputs (a cold image cache builds the
# image from conf/image/*.lock and the package store, offline once the store holds them; see
# scripts/build-image.sh). Those caches are the user's to write, so what is staged is checked, not
# trusted: each cached image, plugin and SBOM input has a digest record written when its build
# succeeded (FILE.sha256 beside the image archive, SHA256SUMS in a plugin's entry), which the build
# scripts check before reusing it and this script checks again on its own copies in the stage; a
# copy that differs, or has no record, stops the release before anything is checksummed or
# described. Reproducible: SOURCE_DATE_EPOCH (default: the commit's date) is every
# file's mtime, the chart archive's entries' mtime and the SBOMs' creation time; files are listed
# in sorted order. Run twice from the same commit, it writes the same bytes; the image's own
# times are its lock's, so a cold rebuild of the image gives the same digest too.
#
# --push REGISTRY (host[:port]), once the directory is written: the image index, its platform
# manifests, configs and layers, by digest, to REGISTRY/netclaim (tag VERSION; scripts/build/oci_push.py,
# no docker), and the chart as an OCI artefact to oci://REGISTRY/charts/netclaim (helm push). Prints
# "image REGISTRY/netclaim@sha256:..." and "chart REGISTRY/charts/netclaim@sha256:..." before DIR.
# A loopback registry (localhost, 127.0.0.0/8, [::1]) is spoken to in plain HTTP, any other in HTTPS.
# --sign-key KEY (cosign's private key, from `cosign generate-key-pair`; its password in
# COSIGN_PASSWORD): signs both digests with cosign (scripts/build/components.sh cosign) and attests
# on the image its SBOM and the plugins' (--type spdxjson) and a provenance statement
# (--type slsaprovenance: the commit, conf/image/*.lock's sha256, the builder, NETCLAIM_BUILDER_ID
# or this script), on the chart its SBOM. Key signing is offline: nothing is written to a
# transparency log, so verify with `cosign verify --key cosign.pub --insecure-ignore-tlog`.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/.." && pwd)"
PY=/usr/bin/python3.11
VERSION=""
OUT=""
ALLOW_DIRTY=0
PUSH=""
SIGN_KEY=""

log() { printf '[release] %s\n' "$*" >&2; }
die() { printf '[release] error: %s\n' "$*" >&2; exit 1; }

while (($#)); do
    case "$1" in
        --out) OUT="${2:?--out needs a value}"; shift 2 ;;
        --allow-dirty) ALLOW_DIRTY=1; shift ;;
        --push) PUSH="${2:?--push needs a registry (host[:port])}"; shift 2 ;;
        --sign-key) SIGN_KEY="${2:?--sign-key needs a cosign private key file}"; shift 2 ;;
        -h|--help) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed -e '$d' -e 's/^# \{0,1\}//'; exit 0 ;;
        -*) die "unknown argument: $1" ;;
        *) [[ -z "$VERSION" ]] || die "one VERSION only (got $VERSION and $1)"; VERSION="$1"; shift ;;
    esac
done
[[ -n "$VERSION" ]] || die "usage: $0 VERSION [--out DIR] [--allow-dirty] [--push REGISTRY [--sign-key KEY]]"
[[ -z "$SIGN_KEY" || -n "$PUSH" ]] || die "--sign-key signs what --push pushed: give --push REGISTRY too"
[[ -z "$SIGN_KEY" || -f "$SIGN_KEY" ]] || die "--sign-key $SIGN_KEY: no such file"
REGISTRY_RE='^[][A-Za-z0-9.:-]+$'
[[ -z "$PUSH" || "$PUSH" =~ $REGISTRY_RE ]] || die "--push wants a registry host[:port], not $PUSH"
[[ "$VERSION" =~ ^[0-9]+\.[0-9]+\.[0-9]+([-+][0-9A-Za-z.-]+)?$ ]] || die "VERSION must be semantic (1.2.3), not $VERSION"
OUT="${OUT:-$ROOT/dist/$VERSION}"

# ------------------------------------------------------------------ the version, from one place

check_version() {
    local package chart app
    package="$("$PY" -c 'import sys; sys.path.insert(0, sys.argv[1]); import cni_plugin; print(cni_plugin.__version__)' "$ROOT")"
    chart="$(sed -n 's/^version:[[:space:]]*//p' "$ROOT/conf/helm/netclaim/Chart.yaml" | tr -d "\"'[:space:]")"
    app="$(sed -n 's/^appVersion:[[:space:]]*//p' "$ROOT/conf/helm/netclaim/Chart.yaml" | tr -d "\"'[:space:]")"
    [[ "$package" == "$VERSION" ]] || die "cni_plugin.__version__ is $package, not $VERSION (the project's one version: bump it first)"
    [[ "$chart" == "$VERSION" ]] || die "conf/helm/netclaim/Chart.yaml version is $chart, not $VERSION"
    [[ "$app" == "$VERSION" ]] || die "conf/helm/netclaim/Chart.yaml appVersion is $app, not $VERSION"
    grep -Eq "^## \[${VERSION//./\\.}\] - [0-9]{4}-[0-9]{2}-[0-9]{2}\$" "$ROOT/docs/CHANGELOG.md" \
        || die "docs/CHANGELOG.md has no section \"## [$VERSION] - YYYY-MM-DD\""
}

# The commit, its date (SOURCE_DATE_EPOCH unless given) and whether the tree differs from it.
SOURCE=""
EPOCH=""
source_facts() {
    local commit dirty=""
    git -C "$ROOT" rev-parse --git-dir >/dev/null 2>&1 || {
        [[ -n "${SOURCE_DATE_EPOCH:-}" ]] || die "not a git checkout: set SOURCE_DATE_EPOCH"
        EPOCH="$SOURCE_DATE_EPOCH"
        SOURCE="source tree without git metadata"
        return 0
    }
    commit="$(git -C "$ROOT" rev-parse HEAD)"
    if [[ -n "$(git -C "$ROOT" status --porcelain --untracked-files=normal)" ]]; then
        ((ALLOW_DIRTY)) || die "the work tree has uncommitted changes (git status); commit them, or --allow-dirty"
        dirty=" with uncommitted changes"
        log "warning: building from a work tree with uncommitted changes"
    fi
    EPOCH="${SOURCE_DATE_EPOCH:-$(git -C "$ROOT" log -1 --format=%ct HEAD)}"
    SOURCE="built from git commit $commit$dirty"
}

# ------------------------------------------------------------------ artefacts

# Whether COPY holds the bytes a build recorded for NAME in RECORD (sha256sum's format, written by
# build-image.sh or build-plugin.sh when that build succeeded): the copy itself is checked, so
# nothing that changed in the cache after the build script's own check reaches the release.
check_copy() {
    local copy="$1" record="$2" name="$3" want
    [[ -f "$record" ]] || die "$name has no digest record ($record): rebuild it"
    want="$(awk -v name="$name" '$2 == name { print $1 }' "$record")"
    [[ -n "$want" && "$(sha256sum <"$copy" | cut -d' ' -f1)" == "$want" ]] \
        || die "$copy, copied from the build cache, does not match the digest recorded for $name when it was built ($record)"
}

index_digest() { # index_digest ARCHIVE: the one image index the archive names
    tar -xOf "$1" ./index.json | "$PY" -c '
import json, sys
[top] = json.load(sys.stdin)["manifests"]
assert top["mediaType"] == "application/vnd.oci.image.index.v1+json", top["mediaType"]
print(top["digest"])'
}

# The chart, its values.yaml pinned to the image index (image.digest), packaged by helm; then the
# archive rewritten with every entry's mtime at SOURCE_DATE_EPOCH (helm stamps the time of
# packaging) and a gzip header without a time, entries in helm's order.
package_chart() {
    local digest="$1" dest="$2" chart="$WORK/chart/netclaim" packaged
    mkdir -p "$WORK/chart" "$WORK/helm"
    cp -a "$ROOT/conf/helm/netclaim" "$chart"
    "$PY" - "$chart/values.yaml" "$digest" <<'PYEOF'
import re, sys
path, digest = sys.argv[1], sys.argv[2]
text = open(path).read()
block = re.search(r"^image:\n((?:[ \t].*\n|\n)*)", text, re.M)
assert block, "values.yaml: no image: block"
body, n = re.subn(r'^(  digest:)[ \t]*""[ \t]*$', rf'\1 "{digest}"', block.group(1), flags=re.M)
assert n == 1, f"values.yaml: image.digest found {n} times with an empty value"
open(path, "w").write(text[:block.start(1)] + body + text[block.end(1):])
PYEOF
    packaged="$(helm_ package "$chart" --destination "$WORK/pkg" | sed -n 's/^Successfully packaged chart and saved it to: //p')"
    [[ -f "$packaged" ]] || die "helm package wrote no chart archive"
    [[ "$(basename "$packaged")" == "netclaim-$VERSION.tgz" ]] || die "helm package wrote $(basename "$packaged")"
    "$PY" - "$packaged" "$dest" "$EPOCH" <<'PYEOF'
import gzip, io, sys, tarfile
src, dest, epoch = sys.argv[1], sys.argv[2], int(sys.argv[3])
out = io.BytesIO()
with tarfile.open(src) as tin, tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tout:
    for member in tin.getmembers():
        data = tin.extractfile(member).read() if member.isfile() else None
        member.mtime, member.uid, member.gid, member.uname, member.gname = epoch, 0, 0, "", ""
        member.pax_headers = {}
        tout.addfile(member, io.BytesIO(data) if data is not None else None)
with open(dest, "wb") as fh, gzip.GzipFile(filename="", mode="wb", fileobj=fh, mtime=0, compresslevel=9) as gz:
    gz.write(out.getvalue())
PYEOF
    # What an operator gets: every container of the packaged chart runs the pinned index.
    local images
    images="$(helm_ template netclaim "$dest" --namespace netclaim-system --kube-version 1.34.0 \
                --set driverName=net.example.com | sed -n 's/^[[:space:]]*image:[[:space:]]*//p' | tr -d "\"'" | sort -u)"
    [[ "$images" == "netclaim@$digest" ]] || die "the packaged chart renders images [$images], not netclaim@$digest"
}

helm_() {
    HELM_CACHE_HOME="$WORK/helm/cache" HELM_CONFIG_HOME="$WORK/helm/config" HELM_DATA_HOME="$WORK/helm/data" \
        "$HELM" "$@"
}

# The version's section of the changelog, up to the next version's heading or the link list.
release_notes() {
    local digest="$1"
    "$PY" - "$ROOT/docs/CHANGELOG.md" "$VERSION" "$digest" <<'PYEOF'
import re, sys
path, version, digest = sys.argv[1:4]
lines = open(path).read().splitlines()
start = next(i for i, line in enumerate(lines) if re.match(rf"## \[{re.escape(version)}\] - ", line))
end = next((i for i in range(start + 1, len(lines))
            if lines[i].startswith("## [") or re.match(r"\[[^\]]+\]: ", lines[i])), len(lines))
date = lines[start].rsplit(" - ", 1)[1]
body = "\n".join(lines[start + 1:end]).strip()
print(f"# netclaim {version} ({date})\n\n{body}\n")
print("## Artefacts\n")
print(f"- `netclaim-{version}.oci.tar`: the image for linux/amd64 and linux/arm64, image index `{digest}`")
print(f"- `netclaim-{version}.tgz`: the Helm chart, `image.digest` pinned to `{digest}`")
print(f"- `netclaim-{version}-linux-amd64`, `netclaim-{version}-linux-arm64`: the static CNI plugin")
print("- `kubectl-netclaim`: the kubectl plugin (`status`, `why`, `fleet`, `bundle`), one Python 3.9+ file: "
      "`install -m 0755 kubectl-netclaim /usr/local/bin/`")
print("- `netclaim.dev_v1_CNIResult.schema.json`: the JSON Schema (draft 2020-12) of each entry's `data` "
      "(`apiVersion: netclaim.dev/v1`, `kind: CNIResult`)")
print("- `*.spdx.json`: an SPDX 2.3 SBOM of each; `SHA256SUMS`: `sha256sum -c SHA256SUMS`")
print("\nInstalling, verifying and pushing a release: docs/install.md, \"Releases\".")
PYEOF
}

main() {
    check_version
    source_facts
    local parent image plugin_amd64 plugin_arm64 digest name stage
    parent="$(dirname "$OUT")"
    mkdir -p "$parent"
    if [[ -e "$OUT" ]]; then
        [[ -d "$OUT" && ( -f "$OUT/SHA256SUMS" || -z "$(ls -A "$OUT")" ) ]] \
            || die "$OUT exists and is not an earlier release (no SHA256SUMS): give another --out"
    fi
    WORK="$(mktemp -d -t netclaim-release.XXXXXX)"
    STAGE="$(mktemp -d "$parent/.release-$VERSION.XXXXXX")"
    stage="$STAGE"
    trap 'rm -rf "$WORK" "$STAGE"' EXIT
    HELM="${HELM:-$("$HERE/build/components.sh" helm | tail -n 1)}"
    [[ -x "$HELM" ]] || die "no helm (scripts/build/components.sh helm)"

    log "image (linux/amd64 + linux/arm64), netclaim:$VERSION"
    # The ordinary builds, whose caches other callers share: without SOURCE_DATE_EPOCH, which
    # would change what some tools inside write (pip's bytecode) but not the cache key.
    image="$(env -u SOURCE_DATE_EPOCH "$HERE/build-image.sh" --multi-arch --tag "$VERSION" | tail -n 1)"
    plugin_amd64="$(env -u SOURCE_DATE_EPOCH "$HERE/build-plugin.sh" | tail -n 1)"
    plugin_arm64="$(env -u SOURCE_DATE_EPOCH "$HERE/build-plugin.sh" --arch arm64 | tail -n 1)"

    name="netclaim-$VERSION"
    cp "$image" "$stage/$name.oci.tar"
    check_copy "$stage/$name.oci.tar" "$image.sha256" "$(basename "$image")"
    digest="$(index_digest "$stage/$name.oci.tar")"
    [[ "$digest" =~ ^sha256:[0-9a-f]{64}$ ]] || die "no image index digest in $image"
    printf '%s\n' "$digest" >"$stage/$name.oci.tar.digest"
    # Each plugin with the two files its SBOM is made from, all as recorded in its entry.
    local arch bin file
    for arch in amd64 arm64; do
        if [[ "$arch" == amd64 ]]; then bin="$plugin_amd64"; else bin="$plugin_arm64"; fi
        install -m 0755 "$bin" "$stage/$name-linux-$arch"
        check_copy "$stage/$name-linux-$arch" "$(dirname "$bin")/SHA256SUMS" netclaim
        mkdir -p "$WORK/plugin-$arch"
        for file in modules.txt build-info.txt; do
            [[ -f "$(dirname "$bin")/$file" ]] || die "$(dirname "$bin")/$file missing: remove $(dirname "$bin") to rebuild the plugin"
            cp "$(dirname "$bin")/$file" "$WORK/plugin-$arch/$file"
            check_copy "$WORK/plugin-$arch/$file" "$(dirname "$bin")/SHA256SUMS" "$file"
        done
    done
    # The kubectl plugin as it is in the tree (0644 like every file but the static plugins: a download
    # keeps no mode, the install line sets it).
    cp "$ROOT/scripts/operator/kubectl-netclaim" "$stage/kubectl-netclaim"
    # The schema of the entries' `data`, for consumers that check what they read.
    cp "$ROOT/conf/schema/netclaim.dev_v1_CNIResult.schema.json" "$stage/netclaim.dev_v1_CNIResult.schema.json"
    log "chart, image.digest $digest"
    package_chart "$digest" "$stage/$name.tgz"

    log "SBOMs"
    local sbom=("$PY" "$HERE/build/sbom.py") common=(--version "$VERSION" --created "$EPOCH" --source "$SOURCE")
    "${sbom[@]}" image "$stage/$name.oci.tar" "${common[@]}" --out "$stage/$name.oci.tar.spdx.json"
    "${sbom[@]}" chart "$stage/$name.tgz" "${common[@]}" --image-digest "$digest" --image-name "$name.oci.tar" \
        --out "$stage/$name.tgz.spdx.json"
    for arch in amd64 arm64; do
        "${sbom[@]}" plugin "$stage/$name-linux-$arch" "${common[@]}" --arch "$arch" \
            --build-info "$WORK/plugin-$arch/build-info.txt" --modules "$WORK/plugin-$arch/modules.txt" \
            --out "$stage/$name-linux-$arch.spdx.json"
    done
    release_notes "$digest" >"$stage/RELEASE-NOTES.md"

    # Fixed modes and times, then the checksums of every file, in sorted order.
    find "$stage" -type f -exec chmod 0644 {} +
    chmod 0755 "$stage" "$stage/$name-linux-amd64" "$stage/$name-linux-arm64"
    (cd "$stage" && LC_ALL=C ls -1 | LC_ALL=C sort | xargs sha256sum >"$WORK/SHA256SUMS")
    install -m 0644 "$WORK/SHA256SUMS" "$stage/SHA256SUMS"
    find "$stage" -exec touch -h -d "@$EPOCH" {} +
    (cd "$stage" && sha256sum --quiet -c SHA256SUMS) || die "SHA256SUMS does not verify"

    rm -rf "$OUT"
    mv "$stage" "$OUT"
    trap 'rm -rf "$WORK"' EXIT
    log "netclaim $VERSION ($SOURCE): image index $digest"
    (cd "$OUT" && ls -l >&2)
    [[ -z "$PUSH" ]] || push_release "$digest"
    printf '%s\n' "$OUT"
}

# ------------------------------------------------------------------ registry: push, sign, attest

# push_release DIGEST: the image index and the chart to $PUSH, then (--sign-key) signatures and
# attestations on both digests. Prints the two pushed references.
push_release() {
    local digest="$1" name="netclaim-$VERSION" plain=() pushed chart_digest
    case "${PUSH%%/*}" in localhost|localhost:*|127.*|"[::1]"*) plain=(--plain-http) ;; esac
    local py="${NETCLAIM_PUSH_PYTHON:-$ROOT/.venv/bin/python}"
    log "push: image index to $PUSH/netclaim:$VERSION"
    pushed="$("$py" "$HERE/build/oci_push.py" "$OUT/$name.oci.tar" "$PUSH/netclaim:$VERSION" "${plain[@]}")" \
        || die "pushing the image to $PUSH failed"
    [[ "$pushed" == "$digest" ]] || die "the registry got index $pushed, not the release's $digest"
    log "push: chart to oci://$PUSH/charts"
    chart_digest="$(helm_ push "$OUT/$name.tgz" "oci://$PUSH/charts" "${plain[@]}" 2>&1 | tee /dev/stderr \
                    | sed -n 's/^Digest:[[:space:]]*//p')"
    [[ "$chart_digest" =~ ^sha256:[0-9a-f]{64}$ ]] || die "helm push printed no chart digest"
    local image_ref="$PUSH/netclaim@$digest" chart_ref="$PUSH/charts/netclaim@$chart_digest"
    [[ -z "$SIGN_KEY" ]] || sign_release "$image_ref" "$chart_ref" "${#plain[@]}"
    printf 'image %s\nchart %s\n' "$image_ref" "$chart_ref"
}

# sign_release IMAGE_REF CHART_REF PLAIN: cosign signatures on both, and the attestations.
sign_release() {
    local image_ref="$1" chart_ref="$2" plain="$3" name="netclaim-$VERSION" cosign arch
    cosign="${COSIGN:-$("$HERE/build/components.sh" cosign | tail -n 1)}"
    [[ -x "$cosign" ]] || die "no cosign (scripts/build/components.sh cosign)"
    local flags=(--key "$SIGN_KEY" --tlog-upload=false --yes)
    ((plain == 0)) || flags+=(--allow-http-registry --allow-insecure-registry)
    log "sign: $image_ref and $chart_ref"
    "$cosign" sign "${flags[@]}" "$image_ref" >&2 || die "cosign sign $image_ref failed"
    "$cosign" sign "${flags[@]}" "$chart_ref" >&2 || die "cosign sign $chart_ref failed"
    log "attest: SBOMs and provenance"
    attest_() { "$cosign" attest "${flags[@]}" --type "$1" --predicate "$2" "$3" >&2 || die "cosign attest $2 on $3 failed"; }
    attest_ spdxjson "$OUT/$name.oci.tar.spdx.json" "$image_ref"
    for arch in amd64 arm64; do attest_ spdxjson "$OUT/$name-linux-$arch.spdx.json" "$image_ref"; done
    attest_ spdxjson "$OUT/$name.tgz.spdx.json" "$chart_ref"
    local commit dirty=() tools=(--tool "helm=$(helm_ version --template '{{.Version}}')")
    commit="$(git -C "$ROOT" rev-parse HEAD 2>/dev/null || echo unknown)"
    [[ "$SOURCE" != *"uncommitted changes"* ]] || dirty=(--dirty)
    tools+=(--tool "cosign=$("$cosign" version --json 2>/dev/null | "$PY" -c 'import json,sys; print(json.load(sys.stdin)["gitVersion"])')")
    "$PY" "$HERE/build/provenance.py" --version "$VERSION" --commit "$commit" --epoch "$EPOCH" "${dirty[@]}" \
        --builder "${NETCLAIM_BUILDER_ID:-scripts/release.sh}" "${tools[@]}" "$ROOT"/conf/image/*.lock \
        >"$WORK/provenance.json"
    attest_ slsaprovenance "$WORK/provenance.json" "$image_ref"
}

main
