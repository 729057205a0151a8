#!/usr/bin/env bash
# Build the project's Go-built tools once, from Go modules, and cache them by version.
#
#   scripts/build/components.sh                # etcd and kube-apiserver
#   scripts/build/components.sh TARGET...      # any of the targets below, or a group:
#                                                 #   control-plane, node, runtime, cni-plugins, secondary-cni, tools,
#                                                 #   release-tools (registry, cosign), all
#   scripts/build/components.sh --kube 1.34 control-plane node
#                                                 # the Kubernetes binaries of an older minor (gomod/kubernetes-1.34)
#
# Nothing here is committed: the binaries land in
# ${XDG_CACHE_HOME:-$HOME/.cache}/netclaim/bin/<name>-<version>. A second run
# with the binaries present does nothing. Prints one binary path per target, in order.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/netclaim"
BIN="$CACHE/bin"
mkdir -p "$BIN"
# One build at a time: concurrent callers (parallel test sessions) wait for the lock, taken only
# when something is to be built, so a caller whose binaries are cached never waits behind a build.
exec 8>"$CACHE/.build.lock"

log() { printf '[build] %s\n' "$*" >&2; }

# The Go toolchain's standard install location, for shells whose PATH lacks it.
if ! command -v go >/dev/null && [[ -x /usr/local/go/bin/go ]]; then
    PATH="/usr/local/go/bin:$PATH"
fi

# modver DIR MODULE: the version DIR's wrapper go.mod requires of MODULE.
modver() { sed -n "s#^require $2 \(v[0-9.]*\)\$#\1#p" "$HERE/gomod/$1/go.mod"; }

kube_default_minor() { local v; v="$(modver kubernetes k8s.io/kubernetes)"; v="${v#v}"; echo "${v%.*}"; }

# --kube MINOR picks the wrapper of an older Kubernetes minor; the default is the newest.
KUBE_DIR=kubernetes
if [[ "${1:-}" == --kube ]]; then
    [[ -n "${2:-}" ]] || { log "--kube needs a minor version such as 1.34"; exit 2; }
    [[ "$2" == "$(kube_default_minor)" ]] || KUBE_DIR="kubernetes-$2"
    [[ -f "$HERE/gomod/$KUBE_DIR/go.mod" ]] || { log "no wrapper module for Kubernetes $2 (gomod/$KUBE_DIR)"; exit 2; }
    shift 2
fi

KUBE_VERSION="$(modver "$KUBE_DIR" k8s.io/kubernetes)"
ETCD_VERSION="$(modver etcd go.etcd.io/etcd/server/v3)"
CONTAINERD_VERSION="$(modver containerd github.com/containerd/containerd/v2)"
CRI_TOOLS_VERSION="$(modver cri-tools sigs.k8s.io/cri-tools)"
CNI_VERSION="$(modver cni github.com/containernetworking/cni)"
HELM_VERSION="$(modver helm helm.sh/helm/v3)"
CNI_PLUGINS_VERSION="$(modver cni-plugins github.com/containernetworking/plugins)"
REGISTRY_VERSION="$(modver registry github.com/distribution/distribution/v3)"
COSIGN_VERSION="$(modver cosign github.com/sigstore/cosign/v2)"

KUBE_MINOR="${KUBE_VERSION#v1.}"; KUBE_MINOR="${KUBE_MINOR%%.*}"
# Version stamps, so that nodes and `kubectl version` say v1.37.2 and not v0.0.0-master.
KUBE_LDFLAGS="-X k8s.io/component-base/version.gitVersion=$KUBE_VERSION -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$KUBE_MINOR -X k8s.io/component-base/version.gitTreeState=clean"
KUBE_LDFLAGS="$KUBE_LDFLAGS -X k8s.io/client-go/pkg/version.gitVersion=$KUBE_VERSION -X k8s.io/client-go/pkg/version.gitMajor=1 -X k8s.io/client-go/pkg/version.gitMinor=$KUBE_MINOR"
CNI_PLUGINS_LDFLAGS="-X github.com/containernetworking/plugins/pkg/utils/buildversion.BuildVersion=$CNI_PLUGINS_VERSION"
CONTAINERD_LDFLAGS="-X github.com/containerd/containerd/v2/version.Version=$CONTAINERD_VERSION -X github.com/containerd/containerd/v2/version.Package=github.com/containerd/containerd/v2"

# target NAME: "wrapper-dir version package ldflags" for one binary.
target() {
    case "$1" in
        etcd) echo "etcd|$ETCD_VERSION|go.etcd.io/etcd/server/v3|" ;;
        kube-apiserver|kube-controller-manager|kube-scheduler|kubelet|kubectl)
            echo "$KUBE_DIR|$KUBE_VERSION|k8s.io/kubernetes/cmd/$1|$KUBE_LDFLAGS" ;;
        dra-test-driver) echo "$KUBE_DIR|$KUBE_VERSION|k8s.io/kubernetes/test/e2e/dra/test-driver|$KUBE_LDFLAGS" ;;
        containerd|containerd-shim-runc-v2|ctr)
            echo "containerd|$CONTAINERD_VERSION|github.com/containerd/containerd/v2/cmd/$1|$CONTAINERD_LDFLAGS" ;;
        crictl) echo "cri-tools|$CRI_TOOLS_VERSION|sigs.k8s.io/cri-tools/cmd/crictl|-X sigs.k8s.io/cri-tools/pkg/version.Version=${CRI_TOOLS_VERSION#v}" ;;
        cnitool) echo "cni|$CNI_VERSION|github.com/containernetworking/cni/cnitool|" ;;
        cni-bridge|cni-loopback|cni-macvlan|cni-ipvlan|cni-host-device)
            echo "cni-plugins|$CNI_PLUGINS_VERSION|github.com/containernetworking/plugins/plugins/main/${1#cni-}|$CNI_PLUGINS_LDFLAGS" ;;
        cni-host-local) echo "cni-plugins|$CNI_PLUGINS_VERSION|github.com/containernetworking/plugins/plugins/ipam/host-local|$CNI_PLUGINS_LDFLAGS" ;;
        helm) echo "helm|$HELM_VERSION|helm.sh/helm/v3/cmd/helm|-X helm.sh/helm/v3/internal/version.version=$HELM_VERSION" ;;
        registry) echo "registry|$REGISTRY_VERSION|github.com/distribution/distribution/v3/cmd/registry|-X github.com/distribution/distribution/v3/version.version=$REGISTRY_VERSION" ;;
        cosign) echo "cosign|$COSIGN_VERSION|github.com/sigstore/cosign/v2/cmd/cosign|-X sigs.k8s.io/release-utils/version.gitVersion=$COSIGN_VERSION" ;;
        *) log "unknown target $1"; exit 2 ;;
    esac
}

expand() {
    case "$1" in
        control-plane) echo etcd kube-apiserver ;;
        node) echo kube-controller-manager kube-scheduler kubelet kubectl dra-test-driver ;;
        runtime) echo containerd containerd-shim-runc-v2 ctr crictl cni-bridge cni-host-local cni-loopback ;;
        cni-plugins) echo cni-bridge cni-host-local cni-loopback ;;
        secondary-cni) echo cni-macvlan cni-ipvlan cni-host-device ;;   # behind Multus (harness/cluster/multus.sh)
        tools) echo cnitool helm ;;
        release-tools) echo registry cosign ;;   # release.sh --push and its test
        all) echo etcd kube-apiserver kube-controller-manager kube-scheduler kubelet kubectl dra-test-driver \
                  containerd containerd-shim-runc-v2 ctr crictl cni-bridge cni-host-local cni-loopback cnitool helm \
                  registry cosign ;;
        *) echo "$1" ;;
    esac
}

# build NAME: build one target inside a copy of its wrapper module.
build() {
    local name="$1" spec dir version pkg ldflags
    spec="$(target "$name")"
    IFS='|' read -r dir version pkg ldflags <<<"$spec"
    local out="$BIN/$name-$version"
    if [[ -x "$out" ]]; then
        log "$name $version cached"
        echo "$out"
        return 0
    fi
    flock 8
    if [[ -x "$out" ]]; then   # another caller built it while this one waited
        log "$name $version cached"
        echo "$out"
        return 0
    fi
    command -v go >/dev/null || { log "go toolchain not found; cannot build $name"; exit 1; }
    local work="$CACHE/build/$dir-$version"
    mkdir -p "$work"
    # An older Kubernetes minor's wrapper (kubernetes-1.34) has its own go.mod and the newest one's tools.go.
    local tools="$HERE/gomod/$dir/tools.go"
    [[ -f "$tools" ]] || tools="$HERE/gomod/${dir%%-*}/tools.go"
    if ! cmp -s "$HERE/gomod/$dir/go.mod" "$work/go.mod.src" || ! cmp -s "$tools" "$work/tools.go"; then
        rm -rf "$work" && mkdir -p "$work"
        cp "$HERE/gomod/$dir/go.mod" "$work/go.mod"
        cp "$HERE/gomod/$dir/go.mod" "$work/go.mod.src"
        cp "$tools" "$work/tools.go"
        (cd "$work" && GOFLAGS=-mod=mod go mod tidy >"$work/tidy.log" 2>&1) || { cat "$work/tidy.log" >&2; exit 1; }
    fi
    log "building $name $version (a cold build takes minutes)"
    local start=$SECONDS
    (
        cd "$work"
        export GOFLAGS=-mod=mod CGO_ENABLED=0
        /usr/bin/time -v -o "$work/time-$name.txt" \
            go build -trimpath -ldflags="-s -w $ldflags" -o "$out.tmp" "$pkg"
    ) >&2
    mv "$out.tmp" "$out"
    local rss
    rss="$(sed -n 's/.*Maximum resident set size (kbytes): //p' "$work/time-$name.txt" 2>/dev/null || true)"
    log "$name $version built in $((SECONDS - start))s, peak RSS of go build ${rss:-?} KiB"
    echo "$out"
}

(($#)) || set -- control-plane
for arg in "$@"; do
    for name in $(expand "$arg"); do
        build "$name"
    done
done
