# Sourced by scripts/cluster.sh (its variables and state are in scope): dranet beside netclaim on the node
# shellcheck shell=bash

# `up --with-dranet`, dranet-start, dranet-stop.
#
# dranet (kubernetes-sigs/dranet, driver `dra.net`, built by scripts/build/dranet.sh) is a
# kubelet plugin and an NRI plugin: containerd's NRI is enabled only on a --with-dranet node
# (its own socket, $CTD/nri.sock; dranet gets a connection to it through nri_attach.py). It
# publishes the host-side ends of DRANET_COUNT veth pairs made here (this kernel has no dummy
# driver), ndr-<id>-<n> with 198.18.<x>.<10+n>/24, their peers ndp-<id>-<n> stay on the host;
# a CEL filter keeps every other host interface out of its ResourceSlice. It acts as the
# ServiceAccount dranet-system/dranet with a Node-bound token and dranet's own least
# privileges (dranet-rbac.yaml). `down` stops it and deletes the pairs.

DRANET_DRIVER=dra.net
DRANET_CLASS=dra.net
DRANET_COUNT=3
DRANET_DIR="$DIR/dranet"

dranet_ifname() { printf 'ndr-%s-%s' "$ID" "$1"; }
dranet_peer() { printf 'ndp-%s-%s' "$ID" "$1"; }
dranet_address() { printf '198.18.%d.%d/24' "$((0x${ID:2:2}))" "$((10 + $1))"; }

nri_config() { # the NRI section of containerd's config on a --with-dranet node
    cat <<EOT

[plugins.'io.containerd.nri.v1.nri']
  disable = false
  socket_path = $(q "$CTD/nri.sock")
  plugin_path = $(q "$CTD/nri/plugins")
  plugin_config_path = $(q "$CTD/nri/conf.d")
EOT
}

dranet_interfaces() { # make the veth pairs that are missing; give each host-side end its address back
    local n ifname peer
    for n in $(seq 0 $((DRANET_COUNT - 1))); do
        ifname="$(dranet_ifname "$n")" peer="$(dranet_peer "$n")"
        if ! ip link show "$peer" >/dev/null 2>&1; then
            ip link add "$ifname" type veth peer name "$peer"
            ip link set "$peer" up
        fi
        # In a pod the end is not here; dranet drops its addresses when it moves it back.
        if ip link show "$ifname" >/dev/null 2>&1; then
            ip addr replace "$(dranet_address "$n")" dev "$ifname"
            ip link set "$ifname" up
        fi
    done
}

remove_dranet_interfaces() { # deleting either end deletes the pair; a pair inside a pod netns is gone with it
    local n
    [[ -n "${ID:-}" ]] || return 0
    for n in $(seq 0 $((DRANET_COUNT - 1))); do
        ip link delete "$(dranet_peer "$n")" 2>/dev/null || true
        ip link delete "$(dranet_ifname "$n")" 2>/dev/null || true
    done
}

dranet_published() { # every host-side end on the host is in dranet's ResourceSlice, with its host address
    local seen n ifname
    seen="$(kc get resourceslices -o jsonpath="{range .items[?(@.spec.driver==\"$DRANET_DRIVER\")].spec.devices[*]}{.name}={.attributes.dra\.net/ipv4.string}{\"\n\"}{end}")"
    for n in $(seq 0 $((DRANET_COUNT - 1))); do
        ifname="$(dranet_ifname "$n")"
        ip link show "$ifname" >/dev/null 2>&1 || continue  # in a pod now
        grep -qxF -- "$ifname=$(dranet_address "$n")" <<<"$seen" || return 1
    done
}

start_dranet() {
    [[ "${WITH_DRANET:-0}" == 1 ]] || die "containerd runs without NRI here: bring the cluster up with --with-dranet"
    dranet_interfaces
    if alive "$DIR/dranet.pid"; then
        WATCH=dranet wait_for 60 "dranet's ResourceSlice" dranet_published
        return 0
    fi
    [[ -x "${DRANET:-}" ]] || { DRANET="$("$HERE/build/dranet.sh")"; save_var DRANET; }
    mkdir -p "$DRANET_DIR/tmp" && chmod 700 "$DRANET_DIR"
    "$PY" "$HERE/harness/runtime/clusterctl.py" dranet-kubeconfig --admin "$CP_DIR/admin.kubeconfig" \
        --server "https://127.0.0.1:$APISERVER_PORT" --ca "$CP_DIR/pki/ca.crt" --node "$NODE" \
        --rbac "$HERE/harness/cluster/dranet-rbac.yaml" --out "$DRANET_DIR/kubeconfig" >/dev/null
    device_class "$DRANET_CLASS" "$DRANET_DRIVER"
    local offset
    offset="$(stat -c %s "$DIR/dranet.log" 2>/dev/null || echo 0)"
    log "starting dranet (driver $DRANET_DRIVER, interfaces $(dranet_ifname 0)..$(dranet_ifname $((DRANET_COUNT - 1))))"
    # TMPDIR: dranet unpacks its PCI database into a fresh temporary directory at every start.
    TMPDIR="$DRANET_DIR/tmp" start dranet "$PY" "$HERE/harness/runtime/nri_attach.py" "$CTD/nri.sock" "$DRANET" \
        --kubeconfig "$DRANET_DIR/kubeconfig" --hostname-override "$NODE" \
        --kubelet-root-dir "$KROOT" --db-path "$DRANET_DIR/dranet.db" \
        --bind-address "127.0.0.1:$(free_port)" --cloud-provider-hint NONE --profile-provider none \
        --filter "\"dra.net/ifName\" in attributes && attributes[\"dra.net/ifName\"].StringValue.startsWith(\"ndr-$ID-\")" \
        -v=2
    # Its hooks count only once containerd has it registered: a sandbox stopped before that keeps the interface.
    WATCH=dranet wait_for 60 "dranet's NRI registration" nri_registered "$offset"
    WATCH=dranet wait_for 90 "dranet's ResourceSlice" dranet_published
}

nri_registered() { # nri_registered OFFSET: dranet's log says, after OFFSET, that its NRI plugin started
    tail -c +"$(($1 + 1))" "$DIR/dranet.log" | grep -q "Started plugin 00-$DRANET_DRIVER"
}

stop_dranet() {
    stop_pid dranet
}

dranet_env() { # the exports of `cluster.sh env` on a --with-dranet node
    local n names=()
    for n in $(seq 0 $((DRANET_COUNT - 1))); do names+=("$(dranet_ifname "$n")"); done
    printf 'export NETCLAIM_DRANET_DRIVER=%q\n' "$DRANET_DRIVER"
    printf 'export NETCLAIM_DRANET_DEVICE_CLASS=%q\n' "$DRANET_CLASS"
    printf 'export NETCLAIM_DRANET_INTERFACES=%q\n' "${names[*]}"
    printf 'export NETCLAIM_DRANET_LOG=%q\n' "$DIR/dranet.log"
}
