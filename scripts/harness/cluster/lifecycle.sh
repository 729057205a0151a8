# Sourced by scripts/cluster.sh (its variables and state are in scope): up, down, env and status of the whole cluster
# shellcheck shell=bash

# ------------------------------------------------------------------ up / down

all_alive() {
    local n
    alive "$DIR/containerd.pid" || alive "$DIR/crio.pid" || return 1   # the node's runtime (harness/cluster/crio.sh)
    for n in kubelet kube-controller-manager kube-scheduler dra-driver; do
        alive "$DIR/$n.pid" || return 1
    done
}

cmd_up() { # cmd_up [--with-dranet]
    local want_dranet=0
    [[ "${1:-}" == --with-dranet ]] && want_dranet=1
    [[ -z "${1:-}" || "$want_dranet" == 1 ]] || die "usage: $0 up [--networks N] [--dual-stack] [--with-dranet]"
    [[ "$(id -u)" == 0 ]] || die "needs root (kubelet, containerd, cgroups, network namespaces)"
    state_dir_ensure "$DIR"
    exec 9>"$DIR/.lock"
    flock 9
    if [[ -f "$STATE" ]] && all_alive; then
        load_state
        networks_match
        runtime_match
        kube_version_match
        feature_gates_match
        node_untainted || die "cluster in $DIR runs but node $NODE is not Ready (see $DIR/*.log)"
        # A cluster an older cluster.sh started: its kubelet serves on 127.0.0.1, out of kube-apiserver's reach.
        kubelet_serves_node_ip || die "the kubelet in $DIR serves on 127.0.0.1 only (an older cluster.sh started it):" \
            "kubectl logs/exec/port-forward cannot reach it; run: $0 down, then up"
        if ((want_dranet)); then
            [[ "${WITH_DRANET:-0}" == 1 ]] || die "cluster in $DIR runs without NRI: take it down, then up --with-dranet"
            start_dranet
        fi
        log "already up"
        cmd_env
        return 0
    fi
    [[ -f "$STATE" ]] && { log "a previous cluster in $DIR is half up: taking it down first"; cmd_down_locked; mkdir -p "$DIR"; }
    local t0=$SECONDS
    feature_gates_option
    binaries
    crio_binaries
    NODE_IP="$(node_ip)"
    [[ -n "$NODE_IP" ]] || die "no default route: cannot choose the kubelet's --node-ip"
    pick_subnet
    pick_network_subnets
    KUBELET_PORT="$(free_port "$NODE_IP")"
    KUBELET_HEALTHZ_PORT="$(free_port)"
    VARLIB_KUBELET_CREATED=0; [[ -e /var/lib/kubelet ]] || VARLIB_KUBELET_CREATED=1
    VARLOG_CONTAINERS_CREATED=0; [[ -e /var/log/containers ]] || VARLOG_CONTAINERS_CREATED=1
    WITH_DRANET="$want_dranet"
    : >"$STATE"
    chmod 600 "$STATE"
    for v in NODE NODE_IP SUBNET KUBELET_PORT KUBELET_HEALTHZ_PORT VARLIB_KUBELET_CREATED \
             VARLOG_CONTAINERS_CREATED KUBELET SCHEDULER KCM KUBECTL DRA_DRIVER CONTAINERD SHIM CTR CRICTL RUNC \
             WITH_DRANET KUBE_MINOR KUBE_VERSION FEATURE_GATES; do
        save_var "$v"
    done
    save_network_state
    save_runtime_state
    save_sysctls
    share_netns_dir
    make_cgroups

    log "control plane (etcd, kube-apiserver) in $CP_DIR"
    export_apiserver_gates
    "$HERE/control-plane.sh" up >/dev/null
    state_source "$CP_DIR/ports.env"
    save_var APISERVER_PORT
    kubelet_api_rbac
    start_kcm
    start_scheduler

    prepare_cni
    start_containerd
    log "building and importing the sandbox image $SANDBOX_IMAGE"
    import_image "$("$PY" "$HERE/harness/runtime/clusterctl.py" pause-image "$DIR/img")"

    mkdir -p "$KROOT" "$DIR/pod-logs"
    kubelet_cert
    kubelet_config >"$DIR/kubelet.yaml"
    start_kubelet
    start_driver
    device_class
    ((want_dranet)) && start_dranet
    wait_for 90 "the not-ready taint to go" node_untainted
    restore_sysctls
    log "up in $((SECONDS - t0))s: Kubernetes $KUBE_MINOR, node $NODE Ready, driver $DRIVER publishing, $(network_summary)"
    cmd_env
}

delete_pods() { # let the kubelet stop every sandbox (CNI DEL, unprepare, unmount) while it runs
    alive "$DIR/kubelet.pid" && alive "$CP_DIR/kube-apiserver.pid" || return 0
    kc delete daemonsets,deployments,replicasets,jobs --all-namespaces --all --wait=false >/dev/null 2>&1 || true
    kc delete pods --all-namespaces --all --grace-period=0 --force --wait=false >/dev/null 2>&1 || true
    local i
    for i in $(seq 1 100); do
        [[ -z "$(kc get pods -A -o name 2>/dev/null)" ]] && break
        sleep 0.2
    done
}

unmount_under() { # every mount below DIR, deepest first; again while one goes (a mount over a directory
    # hides the mounts made in it before, such as pod netns under a netns dir bind-mounted onto itself)
    local m pass left
    for pass in 1 2 3; do
        left=0
        for m in $(awk -v d="$1/" 'index($2, d) == 1 {print $2}' /proc/self/mounts | sort -r); do
            umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || { left=1; ((pass < 3)) || log "warning: cannot unmount $m"; }
        done
        ((left)) || break
    done
    if awk -v d="$1" '$2 == d' /proc/self/mounts | grep -q .; then umount "$1" 2>/dev/null || true; fi
    return 0
}

running_on_host() { # running_on_host NAME: a process whose executable's name starts with NAME runs here
    local p exe
    for p in /proc/[0-9]*; do
        exe="$(readlink "$p/exe" 2>/dev/null || true)"
        [[ "$(basename "$exe")" == "$1"* ]] && return 0
    done
    return 1
}

cmd_down_locked() {
    [[ -f "$STATE" || -L "$STATE" ]] && state_source "$STATE"
    [[ -n "${KUBECTL:-}" ]] && delete_pods
    stop_pid chain-keeper publisher dranet vf-driver dra-driver kubelet kube-scheduler kube-controller-manager
    if [[ -n "${CRICTL:-}" ]] && alive "$DIR/containerd.pid"; then
        # What the kubelet left: stop and remove every sandbox so CNI DEL runs.
        CONTAINER_RUNTIME_ENDPOINT="unix://$CTD/containerd.sock" timeout 60 "$CRICTL" rmp -fa >/dev/null 2>&1 || true
    fi
    stop_containerd
    stop_multus_daemon   # (thick Multus) after the last DEL; its open watches would hold up kube-apiserver's stop
    "$HERE/control-plane.sh" down >/dev/null 2>&1 || true
    unmount_under "$DIR"
    remove_cgroups
    ip link delete "$BRIDGE" type bridge 2>/dev/null || true
    remove_networks
    [[ "${WITH_DRANET:-0}" == 1 ]] && remove_dranet_interfaces
    multus_down
    crio_down_host
    restore_sysctls
    if [[ -d /var/log/containers ]]; then
        find /var/log/containers -maxdepth 1 -type l -lname "$DIR/*" -delete 2>/dev/null || true
        [[ "${VARLOG_CONTAINERS_CREATED:-0}" == 1 ]] && rmdir /var/log/containers 2>/dev/null || true
    fi
    if [[ "${VARLIB_KUBELET_CREATED:-0}" == 1 ]] && ! running_on_host kubelet; then rm -rf /var/lib/kubelet; fi
    rm -rf "$DIR"
    log "down"
}

cmd_down() {
    [[ -d "$DIR" ]] || return 0
    exec 9>"$DIR/.lock"
    flock 9
    cmd_down_locked
}

cmd_env() {
    load_state
    local v
    printf 'export NETCLAIM_CLUSTER_DIR=%q\n' "$DIR"
    printf 'export NETCLAIM_CP_DIR=%q\n' "$CP_DIR"
    printf 'export KUBECONFIG=%q\n' "$CP_DIR/admin.kubeconfig"
    printf 'export CONTAINER_RUNTIME_ENDPOINT=%q\n' "unix://$(runtime_socket)"
    for v in NODE NODE_IP DRIVER DEVICE_CLASS SANDBOX_IMAGE SUBNET BRIDGE CONFLIST CNI_BIN CNI_CONF CDI_DIR \
             KUBECTL CTR CRICTL DRA_DRIVER KUBELET_PORT KUBELET_ROOT; do
        printf 'export NETCLAIM_%s=%q\n' "$v" "${!v}"
    done
    printf 'export NETCLAIM_CONTAINERD_ADDRESS=%q\n' "$CTD/containerd.sock"
    printf 'export NETCLAIM_KUBERNETES_VERSION=%q\n' "${KUBE_VERSION:-}"   # informational: up --kube-version picks it
    printf 'export NETCLAIM_APISERVER=%q\n' "https://127.0.0.1:$APISERVER_PORT"
    printf 'export NETCLAIM_APISERVER_CA=%q\n' "$CP_DIR/pki/ca.crt"
    printf 'export NETCLAIM_PUBLISHER_SOCKET=%q\n' "$NC/publisher.sock"
    printf 'export NETCLAIM_PUBLISHER_LOG=%q\n' "$DIR/publisher.log"
    printf 'export NETCLAIM_PLUGIN_LOG=%q\n' "$NC/plugin.log"
    network_env
    [[ "${WITH_DRANET:-0}" == 1 ]] && dranet_env
    crio_env
    [[ "${VF_DRIVER_UP:-0}" == 1 ]] && vf_driver_env
    return 0
}

cmd_status() {
    local n
    [[ -f "$STATE" ]] || { echo "no cluster in $DIR"; return 1; }
    "$HERE/control-plane.sh" status
    state_source "$STATE"
    echo "kubernetes: ${KUBE_VERSION:-?}"
    for n in kube-controller-manager kube-scheduler containerd crio kubelet dra-driver publisher chain-keeper dranet vf-driver multus; do
        if alive "$DIR/$n.pid"; then echo "$n: running (pid $(cat "$DIR/$n.pid"))"; else echo "$n: stopped"; fi
    done
}

cmd_kubelet_start() {
    load_state
    alive "$DIR/kubelet.pid" && return 0
    start_kubelet
    wait_for 60 "the driver's ResourceSlice" slice_published
}

cmd_containerd_start() {
    load_state
    not_crio containerd-start
    alive "$DIR/containerd.pid" && return 0
    start_containerd
    # dranet's NRI connection died with the old containerd: it needs a new one.
    if [[ "${WITH_DRANET:-0}" == 1 ]]; then
        log "containerd answers; restarting dranet, whose NRI connection died with the old containerd"
        stop_dranet
        start_dranet
    fi
    return 0
}
