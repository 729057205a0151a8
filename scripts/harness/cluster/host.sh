# Sourced by scripts/cluster.sh (its variables and state are in scope): the binaries and what the node changes on the host (subnet, cgroups, sysctls)
# shellcheck shell=bash

# ------------------------------------------------------------------ binaries and host facts

# The Kubernetes minor the cluster runs: `up --kube-version 1.34` (an older minor, built on first use
# from scripts/build/gomod/kubernetes-1.34), else the newest. Exported, so that control-plane.sh
# builds its kube-apiserver from the same wrapper; saved in the state as KUBE_MINOR.
KUBE_MINOR_WANTED="${NETCLAIM_KUBE_VERSION:-}"

kube_version_option() { # take --kube-version MINOR out of UP_ARGS (after parse_network_options)
    local rest=()
    set -- "${UP_ARGS[@]}"
    while (($#)); do
        case "$1" in
            --kube-version) KUBE_MINOR_WANTED="${2:-}"; shift 2 || die "--kube-version needs a minor such as 1.34" ;;
            --kube-version=*) KUBE_MINOR_WANTED="${1#--kube-version=}"; shift ;;
            *) rest+=("$1"); shift ;;
        esac
    done
    UP_ARGS=("${rest[@]}")
    KUBE_MINOR_WANTED="${KUBE_MINOR_WANTED#v}"
    if [[ -n "$KUBE_MINOR_WANTED" ]]; then
        [[ "$KUBE_MINOR_WANTED" =~ ^1\.[0-9]+$ ]] || die "--kube-version $KUBE_MINOR_WANTED: give a minor such as 1.34"
        export NETCLAIM_KUBE_VERSION="$KUBE_MINOR_WANTED"
    fi
}

kube_flag() { [[ -z "$KUBE_MINOR_WANTED" ]] || printf -- '--kube\n%s\n' "$KUBE_MINOR_WANTED"; }

kube_version_match() { # a cluster already up runs the version asked for
    [[ -z "$KUBE_MINOR_WANTED" || "$KUBE_MINOR_WANTED" == "${KUBE_MINOR:-}" ]] \
        || die "the cluster in $DIR runs Kubernetes ${KUBE_MINOR:-?}; run down first"
}

binaries() {
    local names=(kubelet kube-scheduler kube-controller-manager kubectl dra-test-driver
                 containerd containerd-shim-runc-v2 ctr crictl cni-bridge cni-host-local cni-loopback) bins i flag
    mapfile -t flag < <(kube_flag)
    mapfile -t bins < <("$HERE/build/components.sh" "${flag[@]}" "${names[@]}")
    ((${#bins[@]} == ${#names[@]})) || die "build/components.sh did not print every binary"
    KUBELET="${bins[0]}" SCHEDULER="${bins[1]}" KCM="${bins[2]}" KUBECTL="${bins[3]}" DRA_DRIVER="${bins[4]}"
    CONTAINERD="${bins[5]}" SHIM="${bins[6]}" CTR="${bins[7]}" CRICTL="${bins[8]}"
    CNI_PLUGINS=("${bins[@]:9:3}")
    for i in "${bins[@]}"; do [[ -x "$i" ]] || die "binary $i missing"; done
    KUBE_VERSION="v${KUBELET##*-v}"; KUBE_MINOR="${KUBE_VERSION#v}"; KUBE_MINOR="${KUBE_MINOR%.*}"
    RUNC="$(command -v runc || true)"
    [[ -x "$RUNC" ]] || die "runc not found (Debian package runc)"
}

node_ip() { # the default route's source address: the kubelet refuses loopback
    ip -4 route get 192.0.2.255 2>/dev/null | sed -n 's/.* src \([0-9.]*\).*/\1/p' | head -1
}

pick_subnet() { # 10.64.0.0/10, derived from the dir; skip what is routed already
    local a=$((64 + 0x${ID:0:2} % 64)) b=$((0x${ID:2:2})) i routed
    routed="$(ip -4 route show | awk '{print $1}')"
    for i in $(seq 0 255); do
        SUBNET="10.$a.$(((b + i) % 256)).0/24"
        grep -qxF "$SUBNET" <<<"$routed" || return 0
    done
    die "no free /24 in 10.$a.0.0/16"
}

cgroup_hierarchies() { # every cgroup v1 hierarchy, then the cgroup2 one
    awk '$3 == "cgroup" {print $2}' /proc/mounts
    awk '$3 == "cgroup2" {print $2}' /proc/mounts
}

make_cgroups() {
    local h
    for h in $(awk '$3 == "cgroup" {print $2}' /proc/mounts); do
        mkdir -p "$h/$CGROOT"
        if [[ -f "$h/cpuset.cpus" ]]; then
            cat "$h/cpuset.cpus" >"$h/$CGROOT/cpuset.cpus"
            cat "$h/cpuset.mems" >"$h/$CGROOT/cpuset.mems"
        fi
    done
}

remove_cgroups() { # depth first, every hierarchy (runc also creates it in cgroup2); shims may still be exiting
    local h i left
    [[ -n "$CGROOT" ]] || return 0
    for i in $(seq 1 50); do
        left=0
        for h in $(cgroup_hierarchies); do
            [[ -d "$h/$CGROOT" ]] || continue
            find "$h/$CGROOT" -depth -type d -exec rmdir {} + 2>/dev/null || true
            [[ -d "$h/$CGROOT" ]] && left=1
        done
        ((left)) || return 0
        sleep 0.2
    done
    log "warning: could not remove cgroup /$CGROOT everywhere (processes left in it?)"
}

share_netns_dir() { # /var/run/netns a shared mount, as `ip netns add` leaves it and as a systemd host has every mount:
    # the chart mounts it into the publisher with HostToContainer propagation (the live-interface watch),
    # which the runtime refuses from a private mount. Left in place on down, as iproute2 leaves it.
    mkdir -p /var/run/netns
    mountpoint -q /var/run/netns || mount --bind /var/run/netns /var/run/netns
    mount --make-shared /var/run/netns
}

# The kernel tunables belong to the host, not to one cluster: clusters of parallel test lanes
# share them. A kubelet start writes its values and logs each write; the start waits for exactly
# those writes and puts the host's values back. Another cluster's kubelet starting in between
# would leave the values already written (this kubelet writes fewer, the wait never ends) or be
# saved as the host's own. So one kubelet start, and no save, at a time on the host. The lock is
# fd 8, which `start` (common.sh) closes in what it launches: a kubelet must not keep it held.
TUNABLES_LOCK=/run/lock/netclaim-kubelet-tunables.lock

lock_tunables() {
    mkdir -p "${TUNABLES_LOCK%/*}"
    exec 8>>"$TUNABLES_LOCK"
    flock 8
}

unlock_tunables() { exec 8>&-; }

save_sysctls() { # once per cluster: the host's values before any kubelet start
    [[ -f "$DIR/sysctl.saved" ]] && return 0
    local s
    lock_tunables
    for s in "${SYSCTLS[@]}"; do printf '%s %s\n' "${s%%:*}" "$(sysctl -n "${s%%:*}")"; done >"$DIR/sysctl.saved"
    unlock_tunables
}

restore_sysctls() {
    [[ -f "$DIR/sysctl.saved" ]] || return 0
    local key value
    while read -r key value; do
        [[ "$(sysctl -n "$key")" == "$value" ]] || sysctl -qw "$key=$value" >/dev/null
    done <"$DIR/sysctl.saved"
}

changed_sysctls() { # how many tunables a kubelet start rewrites on this host
    local key value n=0 s
    while read -r key value; do
        for s in "${SYSCTLS[@]}"; do
            [[ "${s%%:*}" == "$key" && "${s#*:}" != "$value" ]] && n=$((n + 1))
        done
    done <"$DIR/sysctl.saved"
    echo "$n"
}
