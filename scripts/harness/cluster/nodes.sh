# Sourced by scripts/cluster.sh (its variables and state are in scope): a cluster of N nodes on this one
# host (`up --nodes N`), each node made of the single-node parts (node.sh, controllers.sh' driver) run
# with that node's variables.
# shellcheck shell=bash
#
# One node = one sub-dir $TOP/n<i> (kubelet root, containerd, CNI dirs, pid files, logs), its own node
# name <base>-<i>, node IP (an address of the dummy interface ncn-<id>), bridge ncb-<id>-<i> with a /24
# of its own, cgroup root /nc-<id>-<i>, kubelet ports and serving certificate (signed by the control
# plane's CA, so kube-apiserver verifies it for logs/exec/port-forward), and its own mount namespace
# (persisted as $TOP/ns/n<i>; kubelet, containerd, shims and the DRA driver run in it). Inside it:
#   $TOP/node      is $TOP/n<i>: the path a DaemonSet's hostPath names (the same on every node, like
#                  /etc/cni/net.d on real nodes), so one chart install serves every node;
#   /var/run/cdi   is $TOP/n<i>/cdi: the conventional CDI directory, the one the node's containerd
#                  reads (cdi_spec_dirs) and the DRA driver writes (a driver that mounts /var/run/cdi
#                  from its node finds it).
# The host keeps seeing the real dirs; mounts the kubelet makes (pod volumes, netns) live in the
# node's namespace only and go with it. All nodes share the host's network namespace: each bridge's
# connected route gives every pod a path to every other node's pods through the host.

TOP="$DIR"
NSDIR="$TOP/ns"
NODE_ALIAS="$TOP/node"
DUMMY="ncn-$ID"
NODE_BASE="$NODE"
CDI_NODE_DIR=/var/run/cdi
NODE_GRACE="${NETCLAIM_NODE_GRACE:-16s}"   # kube-controller-manager --node-monitor-grace-period

is_multi_node() { [[ -f "$STATE" ]] && grep -q '^NODE_COUNT=' "$STATE"; }

select_node() { # select_node I: every per-node variable the node.sh and driver functions read
    local i="$1"
    DIR="$TOP/n$i"
    NODE="$NODE_BASE-$i"
    KROOT="$DIR/k"; KUBELET_ROOT="$KROOT"; CTD="$DIR/c"; NC="$DIR/nc"
    CNI_BIN="$DIR/cni/bin"; CNI_CONF="$DIR/cni/net.d"; CONFLIST="$CNI_CONF/10-$ID-$i.conflist"
    CDI_DIR="$CDI_NODE_DIR"; CGROOT="nc-$ID-$i"; BRIDGE="ncb-$ID-$i"; NETNAME="nc-$ID-$i"
    NODE_NS="$NSDIR/n$i"
    if [[ -f "$DIR/node.env" || -L "$DIR/node.env" ]]; then state_source "$DIR/node.env"; fi
}

node_index() { # node_index NAME|I: the node's index
    local i
    [[ "$1" =~ ^[0-9]+$ ]] && ((1 <= $1 && $1 <= NODE_COUNT)) && { echo "$1"; return 0; }
    for i in $(seq 1 "$NODE_COUNT"); do [[ "$NODE_BASE-$i" == "$1" ]] && { echo "$i"; return 0; }; done
    die "no node $1 (nodes: $(node_names))"
}

node_names() { local i; for i in $(seq 1 "$NODE_COUNT"); do printf '%s ' "$NODE_BASE-$i"; done; }

free_subnets() { # free_subnets N: N distinct unrouted /24s of 10.64.0.0/10, derived from the dir
    local a=$((64 + 0x${ID:0:2} % 64)) b=$((0x${ID:2:2})) i n=0 s routed
    routed="$(ip -4 route show | awk '{print $1}')"
    for i in $(seq 0 255); do
        s="10.$a.$(((b + i) % 256)).0/24"
        grep -qxF "$s" <<<"$routed" && continue
        echo "$s"; n=$((n + 1))
        ((n < $1)) || return 0
    done
    die "no $1 free /24s in 10.$a.0.0/16"
}

# ------------------------------------------------------------------ host: dummy interface, namespaces

make_node_ips() { # the node-IP interface and one address per node on it (the kubelet refuses loopback)
    ip link add "$DUMMY" type bridge   # no dummy module here; a port-less bridge holds addresses as well
    ip link set "$DUMMY" up
    local i net="${NODE_NET%.0/24}"
    for i in $(seq 1 "$NODE_COUNT"); do ip addr add "$net.$((10 + i))/24" dev "$DUMMY"; done
}

make_node_ns() { # make_node_ns I: the node's mount namespace, persisted as a file under the private $NSDIR
    local i="$1"
    touch "$NSDIR/n$i"
    unshare --mount="$NSDIR/n$i" --propagation slave -- sh -euc '
        umount -l "$1"                 # no references to the other nodes namespaces in this one
        mount --bind "$2" "$3"
        mount --bind "$2/cdi" "$4"' sh "$NSDIR" "$TOP/n$i" "$NODE_ALIAS" "$CDI_NODE_DIR"
}

# The host's /var/run/cdi is only the mount point of every node's own CDI dir. Made by a cluster, it
# holds a mark (hidden from the nodes by their bind mounts) and goes with the last cluster that maps it:
# removing it while another cluster's nodes map it would take their CDI dirs away (the kernel detaches
# mounts on a directory removed in another mount namespace).
CDI_MARK=.made-by-a-netclaim-test-cluster
claim_cdi_dir() {
    [[ -e "$CDI_NODE_DIR" ]] && return 0
    mkdir -p "$CDI_NODE_DIR"
    : >"$CDI_NODE_DIR/$CDI_MARK"
}

release_cdi_dir() { # after this cluster's node processes are gone
    local real
    [[ -f "$CDI_NODE_DIR/$CDI_MARK" ]] || return 0
    real="$(realpath "$CDI_NODE_DIR")"
    # shellcheck disable=SC2002 - cat goes on past processes that exit meanwhile
    if cat /proc/[0-9]*/mountinfo 2>/dev/null | awk -v m="$real" '$5 == m {found=1} END {exit !found}'; then
        return 0   # another cluster's node still maps it
    fi
    [[ "$(ls -A "$CDI_NODE_DIR")" == "$CDI_MARK" ]] || return 0
    rm -f "$CDI_NODE_DIR/$CDI_MARK"
    rmdir "$CDI_NODE_DIR" 2>/dev/null || true
}

node_kubelet_config() { # the single node's config (node.sh: serving on the node IP), with short leases
    kubelet_config
    cat <<EOF
# Heartbeats every 2 s (a quarter of the lease): the controller-manager declares a node lost after
# $NODE_GRACE (--node-monitor-grace-period), so node-loss tests take seconds, not minutes.
nodeLeaseDurationSeconds: 8
nodeStatusUpdateFrequency: 2s
EOF
}

# ------------------------------------------------------------------ one node

node_up() { # node_up I: containerd, the kubelet and the DRA driver of one node (run in a subshell)
    select_node "$1"
    mkdir -p "$DIR" "$DIR/cdi" "$KROOT" "$DIR/pod-logs"
    cp "$TOP/sysctl.saved" "$DIR/sysctl.saved"
    make_cgroups
    kubelet_cert
    prepare_cni
    start_containerd
    import_image "$PAUSE_ARCHIVE" 2>/dev/null
    node_kubelet_config >"$DIR/kubelet.yaml"
    node_start_kubelet
    start_driver
    wait_for 120 "node $NODE untainted" node_untainted
}

node_start_kubelet() { # start_kubelet of node.sh, with the kernel tunables' write-and-restore one node at a time
    local offset n
    lock_tunables  # host.sh: one kubelet start at a time on the host, whatever cluster it belongs to
    offset="$(stat -c %s "$DIR/kubelet.log" 2>/dev/null || echo 0)"
    n="$(changed_sysctls)"
    log "starting kubelet (node $NODE, IP $NODE_IP, root dir $KROOT, cgroup root /$CGROOT)"
    start kubelet "$KUBELET" --config "$DIR/kubelet.yaml" --kubeconfig "$CP_DIR/$NODE.kubeconfig" \
        --hostname-override "$NODE" --node-ip "$NODE_IP" --root-dir "$KROOT" --cert-dir "$KROOT/pki" -v=2
    if ((n > 0)); then
        WATCH=kubelet wait_for 60 "the kubelet's kernel tunables" kernel_flags_written "$offset" "$n"
    fi
    restore_sysctls
    unlock_tunables
    WATCH=kubelet wait_for 90 "node $NODE Ready" node_ready
}

node_down() { # node_down I: everything of one node, while the API server may still run
    select_node "$1"
    stop_pid dra-driver kubelet
    if [[ -n "${CRICTL:-}" ]] && alive "$DIR/containerd.pid"; then
        CONTAINER_RUNTIME_ENDPOINT="unix://$CTD/containerd.sock" timeout 60 "$CRICTL" rmp -fa >/dev/null 2>&1 || true
    fi
    stop_containerd
    kill_cgroup_procs
    remove_cgroups
    ip link delete "$BRIDGE" type bridge 2>/dev/null || true
}

kill_cgroup_procs() { # what still runs in the node's cgroup root: containers of a node whose containerd was stopped
    local h f pid
    h="$(awk '$3 == "cgroup" && $4 ~ /(^|,)pids(,|$)/ {print $2; exit}' /proc/mounts)"
    [[ -n "$h" && -d "$h/$CGROOT" ]] || return 0
    for f in $(find "$h/$CGROOT" -name cgroup.procs); do
        while read -r pid; do kill -KILL "$pid" 2>/dev/null || true; done <"$f"
    done
}

node_alive() { alive "$DIR/containerd.pid" && alive "$DIR/kubelet.pid" && alive "$DIR/dra-driver.pid"; }

# ------------------------------------------------------------------ the cluster

cmd_up_nodes() { # cmd_up_nodes N
    local count="${1:-}" i t0=$SECONDS pids=() failed=0
    [[ "$count" =~ ^[0-9]+$ ]] && ((count >= 1)) || die "usage: $0 up --nodes N (N >= 1)"
    [[ "$(id -u)" == 0 ]] || die "needs root (kubelet, containerd, cgroups, namespaces)"
    state_dir_ensure "$TOP"
    exec 9>"$TOP/.lock"
    flock 9
    if is_multi_node; then
        load_state
        if ((NODE_COUNT == count)) && alive "$TOP/kube-controller-manager.pid" \
            && all_nodes node_alive; then log "already up"; cmd_env_nodes; return 0; fi
        log "a previous cluster in $TOP is half up or has another size: taking it down first"
        cmd_down_nodes_locked; mkdir -p "$TOP"; chmod 700 "$TOP"
    elif [[ -f "$STATE" ]]; then
        die "a single-node cluster runs in $TOP (run: $0 down)"
    fi
    binaries
    NODE_COUNT="$count"
    mapfile -t SUBNETS < <(free_subnets $((count + 1)))
    NODE_NET="${SUBNETS[0]}"
    VARLIB_KUBELET_CREATED=0; [[ -e /var/lib/kubelet ]] || VARLIB_KUBELET_CREATED=1
    VARLOG_CONTAINERS_CREATED=0; [[ -e /var/log/containers ]] || VARLOG_CONTAINERS_CREATED=1
    : >"$STATE"; chmod 600 "$STATE"
    for v in NODE_COUNT NODE_BASE NODE_NET DUMMY VARLIB_KUBELET_CREATED VARLOG_CONTAINERS_CREATED \
             KUBELET SCHEDULER KCM KUBECTL DRA_DRIVER CONTAINERD SHIM CTR CRICTL RUNC; do
        save_var "$v"
    done
    save_sysctls
    share_netns_dir
    claim_cdi_dir
    mkdir -p "$NODE_ALIAS" "$NSDIR"
    make_node_ips
    mount --bind "$NSDIR" "$NSDIR" && mount --make-private "$NSDIR"
    for i in $(seq 1 "$count"); do
        mkdir -p "$TOP/n$i/cdi"
        printf 'NODE_IP=%s\nSUBNET=%s\nKUBELET_PORT=%s\nKUBELET_HEALTHZ_PORT=%s\n' "${NODE_NET%.0/24}.$((10 + i))" \
            "${SUBNETS[$i]}" "$(free_port)" "$(free_port)" >"$TOP/n$i/node.env"
        make_node_ns "$i"
    done

    log "control plane (etcd, kube-apiserver) in $CP_DIR, nodes: $(node_names)"
    NETCLAIM_CP_NODES="$(node_names)" "$HERE/control-plane.sh" up >/dev/null
    state_source "$CP_DIR/ports.env"
    save_var APISERVER_PORT
    kubelet_api_rbac
    KCM_EXTRA_ARGS=(--node-monitor-period=1s "--node-monitor-grace-period=$NODE_GRACE")
    start_kcm
    start_scheduler
    PAUSE_ARCHIVE="$("$PY" "$HERE/harness/runtime/clusterctl.py" pause-image "$TOP/img")"
    for i in $(seq 1 "$count"); do
        ( node_up "$i" ) >>"$TOP/up.log" 2>&1 &
        pids+=($!)
    done
    for i in "${!pids[@]}"; do
        wait "${pids[$i]}" || { failed=1; log "node $((i + 1)) failed to come up:"; }
    done
    ((failed == 0)) || { tail -30 "$TOP/up.log" >&2; die "not every node came up (log: $TOP/up.log)"; }
    device_class
    restore_sysctls
    log "up in $((SECONDS - t0))s: nodes $(node_names)Ready, driver $DRIVER publishing on each"
    cmd_env_nodes
}

all_nodes() { # all_nodes FN: FN with each node selected, in a subshell; fails when one fails
    local i
    for i in $(seq 1 "$NODE_COUNT"); do ( select_node "$i"; "$1" ) || return 1; done
}

cmd_down_nodes_locked() {
    state_source "$STATE"
    local i pids=()
    if [[ -n "${KUBECTL:-}" ]] && alive "$CP_DIR/kube-apiserver.pid"; then
        kc delete daemonsets,deployments,replicasets,jobs --all-namespaces --all --wait=false >/dev/null 2>&1 || true
        kc delete pods --all-namespaces --all --grace-period=0 --force --wait=false >/dev/null 2>&1 || true
    fi
    for i in $(seq 1 "${NODE_COUNT:-0}"); do ( node_down "$i" ) & pids+=($!); done
    for i in "${pids[@]}"; do wait "$i" || true; done
    stop_pid kube-scheduler kube-controller-manager
    "$HERE/control-plane.sh" down >/dev/null 2>&1 || true
    unmount_under "$TOP"
    ip link delete "${DUMMY:-ncn-$ID}" 2>/dev/null || true
    restore_sysctls
    if [[ -d /var/log/containers ]]; then
        find /var/log/containers -maxdepth 1 -type l -lname "$TOP/*" -delete 2>/dev/null || true
        [[ "${VARLOG_CONTAINERS_CREATED:-0}" == 1 ]] && rmdir /var/log/containers 2>/dev/null || true
    fi
    if [[ "${VARLIB_KUBELET_CREATED:-0}" == 1 ]] && ! running_on_host kubelet; then rm -rf /var/lib/kubelet; fi
    release_cdi_dir
    rm -rf "$TOP"
    log "down"
}

cmd_env_nodes() {
    load_state
    local i v
    printf 'export NETCLAIM_CLUSTER_DIR=%q\n' "$TOP"
    printf 'export NETCLAIM_CP_DIR=%q\n' "$CP_DIR"
    printf 'export KUBECONFIG=%q\n' "$CP_DIR/admin.kubeconfig"
    for v in DRIVER DEVICE_CLASS SANDBOX_IMAGE KUBECTL CTR CRICTL DRA_DRIVER; do
        printf 'export NETCLAIM_%s=%q\n' "$v" "${!v}"
    done
    printf 'export NETCLAIM_APISERVER=%q\n' "https://127.0.0.1:$APISERVER_PORT"
    printf 'export NETCLAIM_APISERVER_CA=%q\n' "$CP_DIR/pki/ca.crt"
    printf 'export NETCLAIM_NODE_COUNT=%q\n' "$NODE_COUNT"
    printf 'export NETCLAIM_NODES=%q\n' "$(node_names | sed 's/ $//')"
    # The path a DaemonSet's hostPath names: on every node, that node's own dir (NETCLAIM_NODE<i>_DIR).
    printf 'export NETCLAIM_NODE_PATHS=%q\n' "$NODE_ALIAS"
    for i in $(seq 1 "$NODE_COUNT"); do
        (
            select_node "$i"
            printf 'export NETCLAIM_NODE%s_NAME=%q\n' "$i" "$NODE"
            printf 'export NETCLAIM_NODE%s_DIR=%q\n' "$i" "$DIR"
            printf 'export NETCLAIM_NODE%s_IP=%q\n' "$i" "$NODE_IP"
            printf 'export NETCLAIM_NODE%s_CONTAINERD_ADDRESS=%q\n' "$i" "$CTD/containerd.sock"
            printf 'export NETCLAIM_NODE%s_MOUNT_NS=%q\n' "$i" "$NODE_NS"
            for v in SUBNET BRIDGE CONFLIST CNI_BIN CNI_CONF KUBELET_PORT KUBELET_ROOT; do
                printf 'export NETCLAIM_NODE%s_%s=%q\n' "$i" "$v" "${!v}"
            done
        )
    done
}

cmd_status_nodes() {
    local i n
    load_state
    "$HERE/control-plane.sh" status
    for n in kube-controller-manager kube-scheduler; do
        if alive "$TOP/$n.pid"; then echo "$n: running (pid $(cat "$TOP/$n.pid"))"; else echo "$n: stopped"; fi
    done
    for i in $(seq 1 "$NODE_COUNT"); do
        (
            select_node "$i"
            for n in containerd kubelet dra-driver; do
                if alive "$DIR/$n.pid"; then echo "$NODE $n: running (pid $(cat "$DIR/$n.pid"))"
                else echo "$NODE $n: stopped"; fi
            done
        )
    done
}

cmd_node() { # cmd_node NAME|I COMMAND: one node's component, for tests (a node lost and back)
    load_state
    local i; i="$(node_index "${1:-}")"
    select_node "$i"
    case "${2:-}" in
        kubelet-stop) stop_pid kubelet ;;
        kubelet-start) alive "$DIR/kubelet.pid" || node_start_kubelet ;;
        containerd-stop) stop_pid containerd ;;   # shims and pods keep running
        containerd-start) alive "$DIR/containerd.pid" || start_containerd ;;
        stop) stop_pid kubelet containerd ;;
        start)
            alive "$DIR/containerd.pid" || start_containerd
            alive "$DIR/kubelet.pid" || node_start_kubelet ;;
        import-image) [[ -f "${3:-}" ]] || die "usage: $0 node N import-image FILE"; import_image "$3" ;;
        *) die "usage: $0 node NAME|I kubelet-stop|kubelet-start|containerd-stop|containerd-start|stop|start|import-image FILE" ;;
    esac
}

multi_node_main() { # the commands of a multi-node cluster (cluster.sh hands them over)
    case "${1:-}" in
        up)
            [[ "${2:-}" == --nodes ]] || die "a multi-node cluster runs in $TOP: $0 up --nodes N, or $0 down first"
            [[ " $* " != *" --runtime"* ]] || die "up --nodes N runs containerd only (--runtime crio: the single node)"
            cmd_up_nodes "${3:-}" ;;
        down) [[ -d "$TOP" ]] || return 0; exec 9>"$TOP/.lock"; flock 9; cmd_down_nodes_locked ;;
        env) cmd_env_nodes ;;
        status) cmd_status_nodes ;;
        node) shift; cmd_node "$@" ;;
        import-image)
            load_state; [[ -f "${2:-}" ]] || die "usage: $0 import-image FILE"
            local i; for i in $(seq 1 "$NODE_COUNT"); do ( select_node "$i"; import_image "$2" ); done ;;
        kubectl) load_state; shift; kc "$@" ;;
        apiserver-stop|apiserver-start) load_state; "$HERE/control-plane.sh" "$1" >/dev/null ;;
        *) die "$1: not for a multi-node cluster (per node: $0 node NAME|I COMMAND)" ;;
    esac
}

wants_multi_node() { [[ "${1:-}" == up && "${2:-}" == --nodes ]] || [[ "${1:-}" == node ]] || is_multi_node; }
