#!/usr/bin/env bash
# A real single-node Kubernetes on this machine: etcd, kube-apiserver, kube-controller-manager,
# kube-scheduler, kubelet, containerd 2.x (with Debian's runc) and a real DRA driver (the
# Kubernetes e2e test driver, `net.example.com`), all built from Go modules by
# scripts/build-control-plane.sh.
#
#   scripts/cluster.sh up                  start everything (no-op when up); the node's CNI chain is the
#                                          primary network only (bridge + host-local), netclaim NOT installed
#   scripts/cluster.sh env                 shell exports: KUBECONFIG, CONTAINER_RUNTIME_ENDPOINT, NETCLAIM_*
#   scripts/cluster.sh status              what runs
#   scripts/cluster.sh down                stop everything `up` started and leave the host as it was
#   scripts/cluster.sh install-netclaim    the operator way: scripts/install.sh chains the plugin into the
#                                          conflist in containerd's CNI conf dir; the publisher runs as a
#                                          node service with the shipped RBAC and a Node-bound token
#   scripts/cluster.sh uninstall-netclaim  stop the publisher, remove the plugin from the chain
#   scripts/cluster.sh import-image FILE   import an OCI/docker image archive into containerd (k8s.io)
#   scripts/cluster.sh kubectl ARGS...     the built kubectl with the admin kubeconfig
#   scripts/cluster.sh publisher-stop|publisher-start     stop/start only the publisher (tests)
#   scripts/cluster.sh kubelet-stop|kubelet-start|containerd-stop|containerd-start
#                                          stop/start one node component (tests; pods keep running)
#   scripts/cluster.sh apiserver-stop|apiserver-start     stop/start only kube-apiserver (outage tests)
#   scripts/cluster.sh chain-keeper-start|chain-keeper-stop
#                                          run/stop `netclaim-publisher chain-keeper` as a node service (what
#                                          the DaemonSet runs): it re-chains netclaim after a primary CNI
#                                          rewrites the conflist; it installs <dir>/nc/keeper/netclaim (a copy of
#                                          the installed plugin, made at its first start) as the plugin
#
# Everything lives under $NETCLAIM_CLUSTER_DIR (default /tmp/netclaim-cluster; keep it short: the
# kubelet's and the driver's unix sockets live under it and AF_UNIX paths stop at 108 bytes). The
# node name, bridge, pod subnet, cgroup root and ports are derived from that directory or picked
# free, so two clusters with different directories can run side by side. Each cluster has its own
# control plane (scripts/control-plane.sh with NETCLAIM_CP_DIR=$NETCLAIM_CLUSTER_DIR/cp).
#
# Host state the kubelet changes outside its directory, and what `down` does about it:
#   kernel.panic, kernel.panic_on_oops, vm.overcommit_memory (and the other tunables the kubelet
#   sets) are saved before the first kubelet start and restored after EVERY kubelet start;
#   the kubelet's rshared bind mount of its root dir and pod volume mounts are unmounted;
#   the cgroup root is removed depth first from every hierarchy (the cgroup2 one included);
#   /var/lib/kubelet (device-plugins socket) and /var/log/containers are removed if `up` created
#   them and no other kubelet runs; the bridge is deleted. iptables are not touched
#   (makeIPTablesUtilChains: false, ipMasq: false).
#
# Environment: NETCLAIM_CLUSTER_DIR, NETCLAIM_NODE_NAME (default nc-<hash of the dir>),
# NETCLAIM_PUBLISHER_WRAPPER (tests: an executable the publisher is started through, which must
# `exec "$@"` so the pid file stays the publisher's; the soak uses it to show the publisher another
# boot id and clock).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/.." && pwd)"
PY="${NETCLAIM_PYTHON:-$ROOT/.venv/bin/python}"
DIR="${NETCLAIM_CLUSTER_DIR:-/tmp/netclaim-cluster}"
DIR="$(realpath -m "$DIR")"
ID="$(printf '%s' "$DIR" | sha256sum | cut -c1-6)"
NODE="${NETCLAIM_NODE_NAME:-nc-$ID}"
DRIVER=net.example.com
DEVICE_CLASS=net.example.com
SANDBOX_IMAGE=netclaim.local/pause:e2e
CP_DIR="$DIR/cp"
KROOT="$DIR/k"              # kubelet --root-dir (short: sockets live under it)
KUBELET_ROOT="$KROOT"
CTD="$DIR/c"                # containerd root/state/socket/config
CNI_BIN="$DIR/cni/bin"
CNI_CONF="$DIR/cni/net.d"
CONFLIST="$CNI_CONF/10-$ID.conflist"
CDI_DIR="$DIR/cdi"
NC="$DIR/nc"                # netclaim: publisher socket, spool, state, logs
CGROOT="nc-$ID"
BRIDGE="ncb-$ID"
NETNAME="nc-$ID"
STATE="$DIR/cluster.env"
# What the kubelet writes at every start (component-helpers' node sysctl defaults).
SYSCTLS=(vm.overcommit_memory:1 vm.panic_on_oom:0 kernel.panic:10 kernel.panic_on_oops:1
         kernel.keys.root_maxkeys:1000000 kernel.keys.root_maxbytes:25000000)

export NETCLAIM_CP_DIR="$CP_DIR" NETCLAIM_CP_NODES="$NODE" NETCLAIM_CP_CLUSTER=1

log() { printf '[cluster] %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}
alive() { [[ -f "$1" ]] && kill -0 "$(cat "$1")" 2>/dev/null; }
load_state() { [[ -f "$STATE" ]] || die "no cluster in $DIR (run: $0 up)"; source "$STATE"; }
save_var() { printf '%s=%q\n' "$1" "${!1}" >>"$STATE"; }
kc() { "$KUBECTL" --kubeconfig "$CP_DIR/admin.kubeconfig" "$@"; }
ctr_() { "$CTR" --address "$CTD/containerd.sock" -n k8s.io "$@"; }

# start NAME CMD...: a detached process with its log and pid file under $DIR.
start() {
    local name="$1"; shift
    setsid "$@" </dev/null >>"$DIR/$name.log" 2>&1 9>&- &
    echo $! >"$DIR/$name.pid"
}

stop_pid() { # stop_pid NAME...: SIGTERM to each, wait, SIGKILL; exactly the pids we started, in parallel
    local name pidfile pid i pids=()
    for name in "$@"; do
        pidfile="$DIR/$name.pid"
        [[ -f "$pidfile" ]] || continue
        pid="$(cat "$pidfile")"
        if kill -0 "$pid" 2>/dev/null; then
            log "stopping $name (pid $pid)"
            kill -TERM "$pid" 2>/dev/null || true
            pids+=("$pid")
        fi
        rm -f "$pidfile"
    done
    for pid in "${pids[@]}"; do
        for i in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$pid" 2>/dev/null || true
        while kill -0 "$pid" 2>/dev/null; do sleep 0.1; done
    done
    return 0
}

wait_for() { # wait_for SECONDS WHAT CMD...: poll CMD until it succeeds; fail early when WATCH_PID dies
    local secs="$1" what="$2" i; shift 2
    for i in $(seq 1 $((secs * 5))); do
        "$@" >/dev/null 2>&1 && return 0
        if [[ -n "${WATCH:-}" ]] && ! alive "$DIR/$WATCH.pid"; then
            tail -5 "$DIR/$WATCH.log" >&2
            die "$WATCH exited while waiting for $what (log: $DIR/$WATCH.log)"
        fi
        sleep 0.2
    done
    die "timed out after ${secs}s waiting for $what"
}

# ------------------------------------------------------------------ binaries and host facts

binaries() {
    local names=(kubelet kube-scheduler kube-controller-manager kubectl dra-test-driver
                 containerd containerd-shim-runc-v2 ctr crictl cni-bridge cni-host-local cni-loopback) bins i
    mapfile -t bins < <("$HERE/build-control-plane.sh" "${names[@]}")
    ((${#bins[@]} == ${#names[@]})) || die "build-control-plane.sh did not print every binary"
    KUBELET="${bins[0]}" SCHEDULER="${bins[1]}" KCM="${bins[2]}" KUBECTL="${bins[3]}" DRA_DRIVER="${bins[4]}"
    CONTAINERD="${bins[5]}" SHIM="${bins[6]}" CTR="${bins[7]}" CRICTL="${bins[8]}"
    CNI_PLUGINS=("${bins[@]:9:3}")
    for i in "${bins[@]}"; do [[ -x "$i" ]] || die "binary $i missing"; done
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

save_sysctls() { # once per cluster: the host's values before any kubelet start
    [[ -f "$DIR/sysctl.saved" ]] && return 0
    local s
    for s in "${SYSCTLS[@]}"; do printf '%s %s\n' "${s%%:*}" "$(sysctl -n "${s%%:*}")"; done >"$DIR/sysctl.saved"
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

# ------------------------------------------------------------------ containerd 2.x

q() { printf '"%s"' "$1"; }

containerd_config() {
    cat <<EOF
# containerd $("$CONTAINERD" --version | awk '{print $3}') for one netclaim test node (config version 3).
version = 3
root = $(q "$CTD/root")
state = $(q "$CTD/state")
temp = $(q "$CTD/tmp")
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.erofs", "io.containerd.tracing.processor.v1.otlp",
  "io.containerd.nri.v1.nri"]

[grpc]
  address = $(q "$CTD/containerd.sock")

[ttrpc]
  address = $(q "$CTD/containerd.sock.ttrpc")

[debug]
  level = "info"

[plugins.'io.containerd.internal.v1.opt']
  path = $(q "$CTD/opt")

[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = $(q "$SANDBOX_IMAGE")

[plugins.'io.containerd.cri.v1.runtime']
  # No CAP_SYS_RESOURCE here: never lower a container's oom_score_adj below ours.
  restrict_oom_score_adj = true
  # Pod netns mounts under our state dir: found and released with everything else.
  netns_mounts_under_state_dir = true
  disable_apparmor = true
  enable_selinux = false
  cdi_spec_dirs = [$(q "$CDI_DIR")]
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = "runc"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
        SystemdCgroup = false
        BinaryName = $(q "$RUNC")
        Root = $(q "$CTD/runc")
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = [$(q "$CNI_BIN")]
    conf_dir = $(q "$CNI_CONF")
    max_conf_num = 1

[plugins.'io.containerd.grpc.v1.cri']
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
EOF
}

primary_conflist() { # the node's own network: bridge + host-local, nothing else
    # CNI 1.1.0: containerd 2.x then polls STATUS (and the runtime may call GC) through the chain.
    local gw="${SUBNET%.0/24}.1"
    cat <<EOF
{
  "cniVersion": "1.1.0",
  "name": "$NETNAME",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "$BRIDGE",
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "dataDir": "$DIR/cni/ipam",
        "ranges": [[{"subnet": "$SUBNET", "gateway": "$gw"}]],
        "routes": [{"dst": "0.0.0.0/0"}]
      }
    }
  ]
}
EOF
}

prepare_cni() {
    mkdir -p "$CNI_BIN" "$CNI_CONF" "$DIR/cni/ipam" "$CDI_DIR"
    # The reference plugins built from Go modules (CNI 1.1.0), under their standard names.
    local p name
    for p in "${CNI_PLUGINS[@]}"; do
        name="$(basename "$p")"; name="${name#cni-}"; name="${name%-v*}"
        ln -sfn "$p" "$CNI_BIN/$name"
    done
    [[ -f "$CONFLIST" ]] || { primary_conflist >"$CONFLIST.tmp" && mv "$CONFLIST.tmp" "$CONFLIST"; }
}

start_containerd() {
    mkdir -p "$CTD/root" "$CTD/state" "$CTD/tmp" "$CTD/opt" "$DIR/bin"
    chmod 700 "$CTD"
    # The shim is found on PATH (by its standard name), and runc through BinaryName.
    ln -sfn "$SHIM" "$DIR/bin/containerd-shim-runc-v2"
    ln -sfn "$CONTAINERD" "$DIR/bin/containerd"
    containerd_config >"$CTD/config.toml"
    log "starting containerd $("$CONTAINERD" --version | awk '{print $3}')"
    PATH="$DIR/bin:$PATH" start containerd "$DIR/bin/containerd" --config "$CTD/config.toml"
    local i
    for i in $(seq 1 150); do
        "$CTR" --address "$CTD/containerd.sock" version >/dev/null 2>&1 && return 0
        alive "$DIR/containerd.pid" || { tail -20 "$DIR/containerd.log" >&2; die "containerd exited"; }
        sleep 0.2
    done
    die "containerd did not answer within 30s"
}

stop_containerd() {
    stop_pid containerd
    # Shims outlive containerd by design; ours are the ones serving our containerd's address.
    local pid i
    for pid in $(pgrep -f "containerd-shim-runc-v2 .*-address $CTD/containerd.sock" || true); do
        kill -TERM "$pid" 2>/dev/null || true
        for i in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    done
}

import_image() { # import_image FILE
    ctr_ images import --all-platforms "$1" >&2
}

# ------------------------------------------------------------------ kubelet

kubelet_config() {
    cat <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupRoot: /$CGROOT
cgroupsPerQOS: true
failSwapOn: false
containerRuntimeEndpoint: unix://$CTD/containerd.sock
address: 127.0.0.1
port: $KUBELET_PORT
healthzBindAddress: 127.0.0.1
healthzPort: $KUBELET_HEALTHZ_PORT
readOnlyPort: 0
makeIPTablesUtilChains: false
oomScoreAdj: 0
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
authorization:
  mode: Webhook
evictionHard:
  memory.available: 100Mi
  nodefs.available: 1%
  imagefs.available: 1%
  nodefs.inodesFree: 1%
imageGCHighThresholdPercent: 100
resolvConf: /etc/resolv.conf
podLogsDir: $DIR/pod-logs
volumePluginDir: $KROOT/volume-plugins
registerNode: true
EOF
}

node_ready() {
    [[ "$(kc get node "$NODE" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}')" == True ]]
}

node_untainted() {
    node_ready && ! kc get node "$NODE" -o jsonpath='{.spec.taints[*].key}' | grep -q 'node.kubernetes.io/not-ready'
}

kernel_flags_written() { # kernel_flags_written OFFSET N: N "Updating kernel flag" lines since OFFSET
    (($(tail -c +"$(($1 + 1))" "$DIR/kubelet.log" | grep -c 'Updating kernel flag') >= $2))
}

start_kubelet() {
    local offset n
    offset="$(stat -c %s "$DIR/kubelet.log" 2>/dev/null || echo 0)"
    log "starting kubelet (node $NODE, root dir $KROOT, cgroup root /$CGROOT)"
    start kubelet "$KUBELET" --config "$DIR/kubelet.yaml" --kubeconfig "$CP_DIR/$NODE.kubeconfig" \
        --hostname-override "$NODE" --node-ip "$NODE_IP" --root-dir "$KROOT" --cert-dir "$KROOT/pki" -v=2
    WATCH=kubelet wait_for 60 "node $NODE Ready" node_ready
    # The kubelet rewrites kernel tunables once, when its container manager starts: wait for
    # exactly those writes, then put the host's values back.
    n="$(changed_sysctls)"
    if ((n > 0)); then
        WATCH=kubelet wait_for 60 "the kubelet's kernel tunables" kernel_flags_written "$offset" "$n"
    fi
    restore_sysctls
}

# ------------------------------------------------------------------ control-plane components, driver

start_kcm() {
    mkdir -p "$DIR/flex"
    start kube-controller-manager "$KCM" --kubeconfig "$CP_DIR/controller-manager.kubeconfig" \
        --use-service-account-credentials=true --leader-elect=false --secure-port=0 \
        --root-ca-file "$CP_DIR/pki/ca.crt" --service-account-private-key-file "$CP_DIR/pki/sa.key" \
        --flex-volume-plugin-dir "$DIR/flex" -v=2
}

start_scheduler() {
    start kube-scheduler "$SCHEDULER" --kubeconfig "$CP_DIR/scheduler.kubeconfig" \
        --leader-elect=false --secure-port=0 -v=2
}

slice_published() {
    [[ -n "$(kc get resourceslices -o jsonpath="{.items[?(@.spec.nodeName==\"$NODE\")].spec.driver}" | grep -w "$DRIVER")" ]]
}

start_driver() {
    mkdir -p "$KROOT/plugins/$DRIVER"
    # The driver acts with the node's identity: the Node authorizer lets a node manage its own
    # ResourceSlices and read the claims of its pods, which is all a kubelet plugin does.
    start dra-driver "$DRA_DRIVER" --kubeconfig "$CP_DIR/$NODE.kubeconfig" --drivername "$DRIVER" -v=2 \
        kubelet-plugin --node-name "$NODE" --plugin-registration-path "$KROOT/plugins_registry" \
        --datadir "$KROOT/plugins" --cdi-dir "$CDI_DIR" --num-devices 8
    WATCH=dra-driver wait_for 60 "the driver's ResourceSlice" slice_published
}

device_class() {
    kc apply -f - >/dev/null <<EOF
apiVersion: resource.k8s.io/v1
kind: DeviceClass
metadata: {name: $DEVICE_CLASS}
spec:
  selectors:
  - cel: {expression: 'device.driver == "$DRIVER"'}
EOF
}

# ------------------------------------------------------------------ netclaim (the operator way)

start_publisher() {
    local port
    port="$(free_port)"
    echo "$port" >"$NC/metrics.port"
    log "starting netclaim-publisher (node $NODE, socket $NC/publisher.sock)"
    start publisher ${NETCLAIM_PUBLISHER_WRAPPER:+"$NETCLAIM_PUBLISHER_WRAPPER"} \
        "$ROOT/.venv/bin/netclaim-publisher" run --node-name "$NODE" \
        --kubeconfig "$NC/publisher.kubeconfig" --socket "$NC/publisher.sock" \
        --state-dir "$NC/state" --spool-dir "$NC/spool" --metrics-address "127.0.0.1:$port"
    "$PY" "$HERE/runtime/clusterctl.py" publisher-ready --socket "$NC/publisher.sock" --timeout 30 \
        || { tail -20 "$DIR/publisher.log" >&2; die "publisher not answering"; }
}

cmd_install_netclaim() {
    load_state
    mkdir -p "$NC" && chmod 700 "$NC"
    "$PY" "$HERE/runtime/clusterctl.py" publisher-kubeconfig --admin "$CP_DIR/admin.kubeconfig" \
        --server "https://127.0.0.1:$APISERVER_PORT" --ca "$CP_DIR/pki/ca.crt" --node "$NODE" \
        --driver "$DRIVER" --out "$NC/publisher.kubeconfig" >/dev/null
    alive "$DIR/publisher.pid" || start_publisher
    if ! grep -q '"netclaim"' "$CONFLIST"; then
        "$HERE/install.sh" --cni-bin-dir "$CNI_BIN" --conflist "$CONFLIST" --driver-name "$DRIVER" \
            --socket "$NC/publisher.sock" --spool-dir "$NC/spool" --state-dir "$NC/state" \
            --log-file "$NC/plugin.log" --python "$PY"
    fi
    log "netclaim installed: $CONFLIST"
}

start_chain_keeper() { # the keeper of the DaemonSet, as a node process, for the chain installed above
    grep -q '"netclaim"' "$CONFLIST" || die "netclaim is not installed (run: $0 install-netclaim)"
    mkdir -p "$NC/keeper" && chmod 700 "$NC/keeper"
    [[ -f "$NC/keeper/netclaim" ]] || cp "$CNI_BIN/netclaim" "$NC/keeper/netclaim"
    log "starting the chain keeper (conflist $(basename "$CONFLIST"))"
    start chain-keeper "$ROOT/.venv/bin/netclaim-publisher" chain-keeper --cni-conf-dir "$CNI_CONF" \
        --cni-bin-dir "$CNI_BIN" --conflist "$(basename "$CONFLIST")" --plugin-binary "$NC/keeper/netclaim" \
        --driver-name "$DRIVER" --plugin-socket "$NC/publisher.sock" --plugin-spool-dir "$NC/spool" \
        --plugin-log-file "$NC/plugin.log" --log-format json
}

cmd_uninstall_netclaim() {
    load_state
    stop_pid chain-keeper  # or it chains netclaim back in
    if grep -q '"netclaim"' "$CONFLIST" 2>/dev/null; then
        "$HERE/install.sh" --uninstall --cni-bin-dir "$CNI_BIN" --conflist "$CONFLIST"
    fi
    stop_pid publisher
    log "netclaim uninstalled"
}

# ------------------------------------------------------------------ up / down

all_alive() {
    local n
    for n in containerd kubelet kube-controller-manager kube-scheduler dra-driver; do
        alive "$DIR/$n.pid" || return 1
    done
}

cmd_up() {
    [[ "$(id -u)" == 0 ]] || die "needs root (kubelet, containerd, cgroups, network namespaces)"
    mkdir -p "$DIR" && chmod 700 "$DIR"
    exec 9>"$DIR/.lock"
    flock 9
    if [[ -f "$STATE" ]] && all_alive; then
        load_state
        node_untainted || die "cluster in $DIR runs but node $NODE is not Ready (see $DIR/*.log)"
        log "already up"
        cmd_env
        return 0
    fi
    [[ -f "$STATE" ]] && { log "a previous cluster in $DIR is half up: taking it down first"; cmd_down_locked; mkdir -p "$DIR"; }
    local t0=$SECONDS
    binaries
    NODE_IP="$(node_ip)"
    [[ -n "$NODE_IP" ]] || die "no default route: cannot choose the kubelet's --node-ip"
    pick_subnet
    KUBELET_PORT="$(free_port)"
    KUBELET_HEALTHZ_PORT="$(free_port)"
    VARLIB_KUBELET_CREATED=0; [[ -e /var/lib/kubelet ]] || VARLIB_KUBELET_CREATED=1
    VARLOG_CONTAINERS_CREATED=0; [[ -e /var/log/containers ]] || VARLOG_CONTAINERS_CREATED=1
    : >"$STATE"
    chmod 600 "$STATE"
    for v in NODE NODE_IP SUBNET KUBELET_PORT KUBELET_HEALTHZ_PORT VARLIB_KUBELET_CREATED \
             VARLOG_CONTAINERS_CREATED KUBELET SCHEDULER KCM KUBECTL DRA_DRIVER CONTAINERD SHIM CTR CRICTL RUNC; do
        save_var "$v"
    done
    save_sysctls
    make_cgroups

    log "control plane (etcd, kube-apiserver) in $CP_DIR"
    "$HERE/control-plane.sh" up >/dev/null
    source "$CP_DIR/ports.env"
    save_var APISERVER_PORT
    start_kcm
    start_scheduler

    prepare_cni
    start_containerd
    log "building and importing the sandbox image $SANDBOX_IMAGE"
    import_image "$("$PY" "$HERE/runtime/clusterctl.py" pause-image "$DIR/img")"

    mkdir -p "$KROOT" "$DIR/pod-logs"
    kubelet_config >"$DIR/kubelet.yaml"
    start_kubelet
    start_driver
    device_class
    wait_for 90 "the not-ready taint to go" node_untainted
    restore_sysctls
    log "up in $((SECONDS - t0))s: node $NODE Ready, driver $DRIVER publishing, pod subnet $SUBNET"
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

unmount_under() { # every mount below DIR, deepest first
    local m
    for m in $(awk -v d="$1/" 'index($2, d) == 1 {print $2}' /proc/self/mounts | sort -r); do
        umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || log "warning: cannot unmount $m"
    done
    if awk -v d="$1" '$2 == d' /proc/self/mounts | grep -q .; then umount "$1" 2>/dev/null || true; fi
    return 0
}

other_kubelet() { # another kubelet runs on this host (its /var/lib/kubelet must stay)
    local p exe
    for p in /proc/[0-9]*; do
        exe="$(readlink "$p/exe" 2>/dev/null || true)"
        [[ "$(basename "$exe")" == kubelet* ]] && return 0
    done
    return 1
}

cmd_down_locked() {
    [[ -f "$STATE" ]] && source "$STATE"
    [[ -n "${KUBECTL:-}" ]] && delete_pods
    stop_pid chain-keeper publisher dra-driver kubelet kube-scheduler kube-controller-manager
    if [[ -n "${CRICTL:-}" ]] && alive "$DIR/containerd.pid"; then
        # What the kubelet left: stop and remove every sandbox so CNI DEL runs.
        CONTAINER_RUNTIME_ENDPOINT="unix://$CTD/containerd.sock" timeout 60 "$CRICTL" rmp -fa >/dev/null 2>&1 || true
    fi
    stop_containerd
    "$HERE/control-plane.sh" down >/dev/null 2>&1 || true
    unmount_under "$DIR"
    remove_cgroups
    ip link delete "$BRIDGE" type bridge 2>/dev/null || true
    restore_sysctls
    if [[ -d /var/log/containers ]]; then
        find /var/log/containers -maxdepth 1 -type l -lname "$DIR/*" -delete 2>/dev/null || true
        [[ "${VARLOG_CONTAINERS_CREATED:-0}" == 1 ]] && rmdir /var/log/containers 2>/dev/null || true
    fi
    if [[ "${VARLIB_KUBELET_CREATED:-0}" == 1 ]] && ! other_kubelet; then rm -rf /var/lib/kubelet; fi
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
    printf 'export CONTAINER_RUNTIME_ENDPOINT=%q\n' "unix://$CTD/containerd.sock"
    for v in NODE DRIVER DEVICE_CLASS SANDBOX_IMAGE SUBNET BRIDGE CONFLIST CNI_BIN CNI_CONF CDI_DIR \
             KUBECTL CTR CRICTL DRA_DRIVER KUBELET_PORT KUBELET_ROOT; do
        printf 'export NETCLAIM_%s=%q\n' "$v" "${!v}"
    done
    printf 'export NETCLAIM_CONTAINERD_ADDRESS=%q\n' "$CTD/containerd.sock"
    printf 'export NETCLAIM_APISERVER=%q\n' "https://127.0.0.1:$APISERVER_PORT"
    printf 'export NETCLAIM_APISERVER_CA=%q\n' "$CP_DIR/pki/ca.crt"
    printf 'export NETCLAIM_PUBLISHER_SOCKET=%q\n' "$NC/publisher.sock"
    printf 'export NETCLAIM_PUBLISHER_LOG=%q\n' "$DIR/publisher.log"
    printf 'export NETCLAIM_PLUGIN_LOG=%q\n' "$NC/plugin.log"
}

cmd_status() {
    local n
    [[ -f "$STATE" ]] || { echo "no cluster in $DIR"; return 1; }
    "$HERE/control-plane.sh" status
    for n in kube-controller-manager kube-scheduler containerd kubelet dra-driver publisher chain-keeper; do
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
    alive "$DIR/containerd.pid" && return 0
    start_containerd
}

case "${1:-}" in
    up) cmd_up ;;
    down) cmd_down ;;
    env) cmd_env ;;
    status) cmd_status ;;
    install-netclaim) cmd_install_netclaim ;;
    uninstall-netclaim) cmd_uninstall_netclaim ;;
    import-image) load_state; [[ -f "${2:-}" ]] || die "usage: $0 import-image FILE"; import_image "$2" ;;
    kubectl) load_state; shift; kc "$@" ;;
    publisher-stop) load_state; stop_pid publisher ;;
    publisher-start) load_state; alive "$DIR/publisher.pid" || start_publisher ;;
    kubelet-stop) load_state; stop_pid kubelet ;;
    kubelet-start) cmd_kubelet_start ;;
    containerd-stop) load_state; stop_pid containerd ;;   # shims and pods keep running
    containerd-start) cmd_containerd_start ;;
    apiserver-stop|apiserver-start) load_state; "$HERE/control-plane.sh" "$1" >/dev/null ;;
    chain-keeper-start) load_state; alive "$DIR/chain-keeper.pid" || start_chain_keeper ;;
    chain-keeper-stop) load_state; stop_pid chain-keeper ;;
    -h|--help|help) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed -e '$d' -e 's/^# \{0,1\}//' ;;
    *) echo "usage: $0 up|down|env|status|install-netclaim|uninstall-netclaim|import-image FILE|kubectl ...|publisher-stop|publisher-start|kubelet-stop|kubelet-start|containerd-stop|containerd-start|apiserver-stop|apiserver-start|chain-keeper-start|chain-keeper-stop" >&2; exit 2 ;;
esac
