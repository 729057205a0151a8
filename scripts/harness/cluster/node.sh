# Sourced by scripts/cluster.sh (its variables and state are in scope): one node: containerd 2.x, its CNI conf dir, the kubelet
# shellcheck shell=bash

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
  "io.containerd.snapshotter.v1.erofs", "io.containerd.tracing.processor.v1.otlp"$(nri_disabled)]

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
    max_conf_num = $NETWORKS

[plugins.'io.containerd.grpc.v1.cri']
  # exec, attach and port-forward: the kubelet proxies each stream to this server itself, so loopback is enough
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
EOF
    [[ "${WITH_DRANET:-0}" == 1 ]] && nri_config
    return 0
}

nri_disabled() { # NRI stays off unless dranet runs on this node (up --with-dranet)
    [[ "${WITH_DRANET:-0}" == 1 ]] || printf ',\n  "io.containerd.nri.v1.nri"'
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
        "ranges": $(primary_ranges "$gw"),
        "routes": $(primary_routes)
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
    write_extra_conflists
}

start_containerd() {
    [[ "${RUNTIME:-containerd}" != crio ]] || { start_crio; return; }   # up --runtime crio (harness/cluster/crio.sh)
    mkdir -p "$CTD/root" "$CTD/state" "$CTD/tmp" "$CTD/opt" "$DIR/bin"
    chmod 700 "$CTD"
    # The shim is found on PATH (by its standard name), and runc through BinaryName.
    ln -sfn "$SHIM" "$DIR/bin/containerd-shim-runc-v2"
    ln -sfn "$CONTAINERD" "$DIR/bin/containerd"
    containerd_config >"$CTD/config.toml"
    log "starting containerd $("$CONTAINERD" --version | awk '{print $3}')"
    PATH="$DIR/bin:$PATH" start containerd "$DIR/bin/containerd" --config "$CTD/config.toml"
    local i
    # Each look is bounded: a containerd that accepts the connection but does not answer yet (busy
    # restoring its sandboxes on a loaded machine) must cost this loop one look, not the caller's
    # whole budget.
    for i in $(seq 1 150); do
        "$CTR" --address "$CTD/containerd.sock" --connect-timeout 2s --timeout 5s version >/dev/null 2>&1 && return 0
        alive "$DIR/containerd.pid" || { tail -20 "$DIR/containerd.log" >&2; die "containerd exited"; }
        sleep 0.2
    done
    die "containerd did not answer within 30s"
}

stop_containerd() {
    [[ "${RUNTIME:-containerd}" != crio ]] || { stop_crio; return; }
    stop_pid containerd
    # Shims outlive containerd by design; ours are the ones serving our containerd's address.
    local pid i
    # The shim re-executes itself by its resolved path (containerd-shim-runc-v2-<version>): match both names.
    for pid in $(pgrep -f "containerd-shim-runc-v2[^ ]* .*-address $CTD/containerd.sock( |$)" || true); do
        kill -TERM "$pid" 2>/dev/null || true
        for i in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    done
    forget_cni_cache "$CTD/"
}

forget_cni_cache() { # forget_cni_cache PREFIX: libcni cache entries of sandboxes whose netns was under PREFIX
    # A teardown that failed (or never ran) leaves libcni's cached result behind: on a host that
    # outlives the test cluster it would pile up, and an uninstall would count it as a live sandbox.
    python3 - "$1" /var/lib/cni/results <<'PY'
import json, os, sys
prefix, results = sys.argv[1], sys.argv[2]
for name in os.listdir(results) if os.path.isdir(results) else []:
    try:
        with open(os.path.join(results, name), "rb") as fh:
            netns = json.load(fh).get("netns") or ""
    except (OSError, ValueError, AttributeError):
        continue
    if netns.startswith(prefix):
        os.unlink(os.path.join(results, name))
PY
}

import_image() { # import_image FILE
    [[ "${RUNTIME:-containerd}" != crio ]] || { crio_import_image "$1"; return; }
    ctr_ images import --all-platforms "$1" >&2
}

# ------------------------------------------------------------------ kubelet

# The kubelet serves its API (logs, exec, port-forward, the node proxy, /metrics) where kube-apiserver
# looks for it: the Node's InternalIP (--node-ip), port $KUBELET_PORT, with a serving certificate the
# cluster CA signed for that IP and the node's name (kube-apiserver --kubelet-certificate-authority
# verifies it). kube-apiserver calls it with its client certificate (user kube-apiserver-kubelet-client,
# the kubelet's x509 client CA) and is allowed the kubelet API by kubelet_api_rbac; every other caller
# with a token the kubelet's webhook checks. /healthz alone stays on 127.0.0.1 (healthzPort).

kubelet_cert() { # the kubelet's serving certificate and key under $DIR/pki, signed by the cluster CA
    local pki="$DIR/pki"
    mkdir -p "$pki" && chmod 700 "$pki"
    openssl req -newkey rsa:2048 -nodes -subj "/CN=system:node:$NODE/O=system:nodes" \
        -keyout "$pki/kubelet.key" -out "$pki/kubelet.csr" 2>/dev/null
    printf 'subjectAltName=IP:%s,DNS:%s\nextendedKeyUsage=serverAuth\n' "$NODE_IP" "$NODE" >"$pki/kubelet.ext"
    openssl x509 -req -in "$pki/kubelet.csr" -CA "$CP_DIR/pki/ca.crt" -CAkey "$CP_DIR/pki/ca.key" \
        -CAcreateserial -days 3650 -extfile "$pki/kubelet.ext" -out "$pki/kubelet.crt" 2>/dev/null
    chmod 600 "$pki/kubelet.key"
}

kubelet_api_rbac() { # kube-apiserver's kubelet client user may use every kubelet's API
    kc apply -f - >/dev/null <<EOF
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: netclaim-kube-apiserver-kubelet-client}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: 'system:kubelet-api-admin'}
subjects:
- {apiGroup: rbac.authorization.k8s.io, kind: User, name: kube-apiserver-kubelet-client}
EOF
}

kubelet_serves_node_ip() { # kubelet.yaml is of the shape above (an older cluster.sh's kubelet served on 127.0.0.1)
    grep -qxF "address: $NODE_IP" "$DIR/kubelet.yaml" \
        && grep -qxF "tlsCertFile: $DIR/pki/kubelet.crt" "$DIR/kubelet.yaml"
}

kubelet_config() {
    cat <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupRoot: /$CGROOT
cgroupsPerQOS: true
failSwapOn: false
containerRuntimeEndpoint: unix://$(runtime_socket)
address: $NODE_IP
port: $KUBELET_PORT
tlsCertFile: $DIR/pki/kubelet.crt
tlsPrivateKeyFile: $DIR/pki/kubelet.key
healthzBindAddress: 127.0.0.1
healthzPort: $KUBELET_HEALTHZ_PORT
readOnlyPort: 0
makeIPTablesUtilChains: false
oomScoreAdj: 0
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $CP_DIR/pki/ca.crt}
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
$(kubelet_gates_yaml)
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
    # The kubelet rewrites kernel tunables once, when its container manager starts (before the
    # node is Ready): wait for exactly those writes, then put the host's values back.
    lock_tunables
    offset="$(stat -c %s "$DIR/kubelet.log" 2>/dev/null || echo 0)"
    n="$(changed_sysctls)"
    log "starting kubelet (node $NODE, root dir $KROOT, cgroup root /$CGROOT)"
    start kubelet "$KUBELET" --config "$DIR/kubelet.yaml" --kubeconfig "$CP_DIR/$NODE.kubeconfig" \
        --hostname-override "$NODE" --node-ip "$NODE_IP" --root-dir "$KROOT" --cert-dir "$KROOT/pki" -v=2
    if ((n > 0)); then
        WATCH=kubelet wait_for 60 "the kubelet's kernel tunables" kernel_flags_written "$offset" "$n"
    fi
    restore_sysctls
    unlock_tunables
    WATCH=kubelet wait_for 60 "node $NODE Ready" node_ready
}
