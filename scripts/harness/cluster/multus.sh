# Sourced by scripts/cluster.sh (its variables and state are in scope): Multus (thin plugin) as the node's
# primary CNI, its NetworkAttachmentDefinition CRD and least-privilege identity, and four secondary networks
# whose chains end in netclaim: macvlan and ipvlan on host parents, a second bridge, host-device moving a host
# interface into the pod (the "physical NIC" case). The parents and the host-device interfaces are veth ends
# (this kernel has no dummy links); their peers, *p-$ID..., stay in the host.
# shellcheck shell=bash
#
# Names: every host link carries the cluster id ($ID), so two clusters never share one, and `down`
# removes exactly these: mcm-$ID (macvlan parent), mci-$ID (ipvlan parent), mcb-$ID (second bridge, made by
# the bridge plugin), mch-$ID-0..3 (host-device interfaces, in the host while no pod holds them) and the peers.
#
# Multus reads the kubelet's pod-resources socket at the fixed /var/lib/kubelet/pod-resources/kubelet.sock
# (its device-plugin path, tried before its DRA path); this node's kubelet lives in $KROOT. The plugin is
# therefore run through a wrapper that bind-mounts $KROOT on /var/lib/kubelet in a private mount namespace
# for Multus and its delegates only: the host's /var/lib/kubelet is never touched.
#
# Thick mode (`multus-up --thick`, Multus 4's default deployment): multus-shim is the node's plugin and
# forwards every call to multus-daemon, which runs the delegates itself. The daemon runs as its DaemonSet's
# container would, without an image (multus_container): a mount namespace of its own whose root holds only
# what that DaemonSet mounts from the host (its /run, /tmp, /var are its own), the host's root at /hostroot and
# `chrootDir: /hostroot` in its daemon config, so delegates (netclaim among them) run in the host's mount
# namespace. `--no-chroot` leaves chrootDir out: the misconfiguration where netclaim runs in the daemon's mount
# namespace, far from the publisher's socket and spool.

MULTUS_DIR="$DIR/multus"
MULTUS_NS=kube-system
MULTUS_SA=netclaim-multus
MULTUS_HOSTDEVS=4
# Secondary networks: NAD name, the claim request its netclaim entry names, interface subnet.
MULTUS_NETWORKS=(macvlan:macvlan:172.31.1.0/24 ipvlan:ipvlan:172.31.2.0/24 bridge2:bridge2:172.31.3.0/24)

peer_of() { local l="$1"; echo "${l:0:3}p${l:3}"; }   # mcm-abcdef -> mcmp-abcdef
multus_parents() { echo "mcm-$ID mci-$ID"; }
multus_hostdevs() { local i; for ((i = 0; i < MULTUS_HOSTDEVS; i++)); do echo "mch-$ID-$i"; done; }

nad_crd() { # the NetworkAttachmentDefinition CRD as the Network Plumbing WG spec defines it (v1, spec.config a string)
    cat <<'EOF'
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: network-attachment-definitions.k8s.cni.cncf.io
spec:
  group: k8s.cni.cncf.io
  scope: Namespaced
  names:
    plural: network-attachment-definitions
    singular: network-attachment-definition
    kind: NetworkAttachmentDefinition
    shortNames: [net-attach-def]
  versions:
  - name: v1
    served: true
    storage: true
    schema:
      openAPIV3Schema:
        description: A secondary network a pod may attach to, by name, through a meta plugin such as Multus.
        type: object
        properties:
          apiVersion: {type: string}
          kind: {type: string}
          metadata: {type: object}
          spec:
            type: object
            properties:
              config:
                description: The network's CNI configuration (a conf or a conflist) as a JSON string.
                type: string
EOF
}

multus_rbac() { # exactly what the thin plugin calls: pod get + status update (network-status), NAD get, DRA reads, Events
    cat <<EOF
apiVersion: v1
kind: ServiceAccount
metadata: {name: $MULTUS_SA, namespace: $MULTUS_NS}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: $MULTUS_SA}
rules:
- apiGroups: [""]
  resources: [pods]
  verbs: [get]
- apiGroups: [""]
  resources: [pods/status]
  verbs: [update]
- apiGroups: [k8s.cni.cncf.io]
  resources: [network-attachment-definitions]
  verbs: [get]
- apiGroups: [resource.k8s.io]
  resources: [resourceclaims]
  verbs: [get]
- apiGroups: [resource.k8s.io]
  resources: [resourceslices]
  verbs: [list]
- apiGroups: ["", events.k8s.io]
  resources: [events]
  verbs: [create, patch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: $MULTUS_SA}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: $MULTUS_SA}
subjects:
- {kind: ServiceAccount, name: $MULTUS_SA, namespace: $MULTUS_NS}
EOF
}

multus_token() { # a Node-bound token of the ServiceAccount above: dies with the node object
    kc create token "$MULTUS_SA" -n "$MULTUS_NS" --duration 24h --bound-object-kind Node --bound-object-name "$NODE"
}

multus_kubeconfig() {
    local token
    token="$(multus_token)"
    cat <<EOF
apiVersion: v1
kind: Config
clusters:
- name: local
  cluster: {server: "https://127.0.0.1:$APISERVER_PORT", certificate-authority: "$CP_DIR/pki/ca.crt"}
users:
- name: multus
  user: {token: "$token"}
contexts:
- name: multus
  context: {cluster: local, user: multus}
current-context: multus
EOF
}

multus_conf() { # the node's primary CNI: Multus, whose cluster network is the node's conflist (netclaim chained in it)
    cat <<EOF
{
  "cniVersion": "1.0.0",
  "name": "multus-$ID",
  "type": "multus",
  "kubeconfig": "$MULTUS_DIR/multus.kubeconfig",
  "clusterNetwork": "$CONFLIST",
  "confDir": "$CNI_CONF",
  "cniDir": "$MULTUS_DIR/cache",
  "binDir": "$CNI_BIN",
  "logFile": "$DIR/multus.log",
  "logLevel": "verbose"
}
EOF
}

netclaim_entry() { # netclaim_entry REQUEST: the last plugin of a secondary network, reporting under its own request
    cat <<EOF
{"type": "netclaim", "driverName": "$DRIVER", "request": "$1", "socketPath": "$NC/publisher.sock",
 "spoolDir": "$NC/spool", "stateDir": "$NC/state", "logFile": "$NC/plugin.log"}
EOF
}

ipam() { # ipam SUBNET
    printf '{"type": "host-local", "dataDir": "%s", "ranges": [[{"subnet": "%s"}]]}' "$DIR/cni/ipam-multus" "$1"
}

nad_config() { # nad_config NAME REQUEST SUBNET [HOSTDEV]: the NAD's conflist
    local main
    case "$1" in
        macvlan) main="{\"type\": \"macvlan\", \"master\": \"mcm-$ID\", \"mode\": \"bridge\", \"ipam\": $(ipam "$3")}" ;;
        ipvlan) main="{\"type\": \"ipvlan\", \"master\": \"mci-$ID\", \"mode\": \"l2\", \"ipam\": $(ipam "$3")}" ;;
        bridge2) main="{\"type\": \"bridge\", \"bridge\": \"mcb-$ID\", \"isGateway\": false, \"ipam\": $(ipam "$3")}" ;;
        hostdev*) main="{\"type\": \"host-device\", \"device\": \"$4\", \"ipam\": $(ipam "$3")}" ;;
    esac
    printf '{"cniVersion": "1.1.0", "name": "%s", "plugins": [%s, %s]}' "$1" "$main" "$(netclaim_entry "$2")"
}

nad() { # nad NAME REQUEST SUBNET [HOSTDEV]: a NAD in `default`, annotated for Multus's DRA path
    local config
    config="$(nad_config "$@")"
    cat <<EOF
apiVersion: k8s.cni.cncf.io/v1
kind: NetworkAttachmentDefinition
metadata:
  name: $1
  namespace: default
  annotations:
    k8s.v1.cni.cncf.io/resourceName: $DRIVER/$2
spec:
  config: '$config'
---
EOF
}

multus_wrapper() { # the plugin as containerd runs it: Multus with this node's kubelet root at /var/lib/kubelet
    cat <<EOF
#!/bin/sh
# Multus thin plugin for node $NODE: its kubelet's root ($KROOT) at the path Multus expects,
# in a private mount namespace of this one call (the host's /var/lib/kubelet stays as it is).
exec unshare --mount --propagation private /bin/sh -c 'mount --bind "\$0" /var/lib/kubelet && exec "\$1"' \\
    "$KROOT" "$MULTUS"
EOF
}

cmd_up_maybe_multus() { # cmd_up_maybe_multus ARGS...: `up` with its own flags, then multus-up when --with-multus is one
    local a rest=() multus=0 mode=()
    for a in "$@"; do
        case "$a" in
            --with-multus) multus=1 ;;
            --multus-thick) mode+=(--thick) ;;
            --multus-no-chroot) mode+=(--no-chroot) ;;
            *) rest+=("$a") ;;
        esac
    done
    ((${#mode[@]} == 0 || multus == 1)) || die "--multus-thick and --multus-no-chroot go with --with-multus"
    cmd_up "${rest[@]}"
    ((multus == 0)) || cmd_multus_up "${mode[@]}"
}

cmd_multus_up() { # cmd_multus_up [--thick [--no-chroot]]
    local mode=thin a
    for a in "$@"; do
        case "$a" in
            --thick) [[ "$mode" == thick-no-chroot ]] || mode=thick ;;
            --no-chroot) mode=thick-no-chroot ;;
            *) die "usage: $0 multus-up [--thick [--no-chroot]]" ;;
        esac
    done
    load_state
    [[ -z "${MULTUS_MODE:-}" || "${MULTUS_MODE%-no-chroot}" == "${mode%-no-chroot}" ]] \
        || die "Multus runs ${MULTUS_MODE%-no-chroot} here: take the cluster down before switching to ${mode%-no-chroot}"
    [[ -d /var/lib/kubelet ]] || die "no /var/lib/kubelet (the kubelet makes it at its start): is the node up?"
    MULTUS="$("$HERE/build/multus.sh")"
    local bins p name l i
    mapfile -t bins < <("$HERE/build/components.sh" secondary-cni)
    for p in "${bins[@]}"; do
        name="$(basename "$p")"; name="${name#cni-}"; name="${name%-v*}"
        ln -sfn "$p" "$CNI_BIN/$name"
    done
    mkdir -p "$MULTUS_DIR/cache" "$DIR/cni/ipam-multus" && chmod 700 "$MULTUS_DIR"
    [[ "${MULTUS_UP:-0}" == 1 ]] || { MULTUS_UP=1; save_var MULTUS_UP; }   # before any host link: `down` removes them
    [[ "${MULTUS_MODE:-}" == "$mode" ]] || { MULTUS_MODE="$mode"; save_var MULTUS_MODE; }
    for l in $(multus_parents) $(multus_hostdevs); do
        ip link show "$l" >/dev/null 2>&1 || ip link add "$l" type veth peer name "$(peer_of "$l")"
        ip link set "$l" up && ip link set "$(peer_of "$l")" up
    done
    nad_crd | kc apply -f - >/dev/null
    kc wait --for condition=established --timeout=60s crd/network-attachment-definitions.k8s.cni.cncf.io >/dev/null
    multus_rbac | kc apply -f - >/dev/null
    [[ "$mode" == thin ]] || multus_daemon_rbac | kc apply -f - >/dev/null
    multus_kubeconfig >"$MULTUS_DIR/multus.kubeconfig.tmp" && mv "$MULTUS_DIR/multus.kubeconfig.tmp" "$MULTUS_DIR/multus.kubeconfig"
    chmod 600 "$MULTUS_DIR/multus.kubeconfig"
    {
        local spec req sub
        for spec in "${MULTUS_NETWORKS[@]}"; do
            IFS=: read -r name req sub <<<"$spec"
            nad "$name" "$req" "$sub"
        done
        for ((i = 0; i < MULTUS_HOSTDEVS; i++)); do nad "hostdev$i" hostdev "172.31.$((10 + i)).0/24" "mch-$ID-$i"; done
    } | kc apply -f - >/dev/null
    if [[ "$mode" != thin ]]; then multus_thick_up "$mode"; return; fi
    multus_wrapper >"$CNI_BIN/multus.tmp" && chmod 755 "$CNI_BIN/multus.tmp" && mv "$CNI_BIN/multus.tmp" "$CNI_BIN/multus"
    # First by name: containerd (max_conf_num 1) takes it as the node's network from now on.
    multus_conf >"$CNI_CONF/00-multus.conf.tmp" && mv "$CNI_CONF/00-multus.conf.tmp" "$CNI_CONF/00-multus.conf"
    log "multus: primary CNI of $NODE (cluster network $(basename "$CONFLIST")); NADs in default:" \
        "${MULTUS_NETWORKS[*]%%:*} hostdev0..$((MULTUS_HOSTDEVS - 1))"
}

multus_down() { # host links of this cluster's secondary networks (the API objects go with the control plane)
    [[ "${MULTUS_UP:-0}" == 1 ]] || return 0
    local l
    stop_multus_daemon
    for l in $(multus_parents) $(multus_hostdevs); do
        ip link delete "$l" 2>/dev/null || ip link delete "$(peer_of "$l")" 2>/dev/null || true
    done
    ip link delete "mcb-$ID" 2>/dev/null || true
}

# ------------------------------------------------------------------ thick mode: multus-shim + multus-daemon

MULTUS_SOCKET_DIR="$MULTUS_DIR/run/multus"   # the daemon empties and re-creates it at its start
MULTUS_SA_DIR="$MULTUS_DIR/sa"               # its "projected service-account token": token, ca.crt, namespace

multus_daemon_rbac() { # what the daemon adds to the thin plugin's calls: its pod (this node's) and NAD informers
    cat <<EOF
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: $MULTUS_SA-daemon}
rules:
- apiGroups: [""]
  resources: [pods]
  verbs: [list, watch]
- apiGroups: [k8s.cni.cncf.io]
  resources: [network-attachment-definitions]
  verbs: [list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: $MULTUS_SA-daemon}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: $MULTUS_SA-daemon}
subjects:
- {kind: ServiceAccount, name: $MULTUS_SA, namespace: $MULTUS_NS}
EOF
}

multus_daemon_config() { # multus_daemon_config MODE: the quick start's daemon-config.json, this node's paths
    local chroot='"chrootDir": "/hostroot",'
    [[ "$1" == thick ]] || chroot=''
    cat <<EOF
{
  $chroot
  "cniVersion": "1.0.0",
  "logLevel": "verbose",
  "logToStderr": true,
  "cniConfigDir": "/host/etc/cni/net.d",
  "multusAutoconfigDir": "/host/etc/cni/net.d",
  "multusConfigFile": "auto",
  "socketDir": "$MULTUS_SOCKET_DIR",
  "daemonSocketDir": "$MULTUS_SOCKET_DIR",
  "binDir": "$CNI_BIN",
  "cniDir": "/var/lib/cni/multus"
}
EOF
}

cri_netns_dir() { echo "$CTD/state/io.containerd.grpc.v1.cri/netns"; }   # netns_mounts_under_state_dir

multus_container() { # multus_container DAEMON: the daemon as the thick DaemonSet's container runs it, without an image
    local r="$MULTUS_DIR/root" netns links
    netns="$(cri_netns_dir)"
    # The node's plugins are links into the build cache: the container sees their targets where they are.
    links="$(find "$CNI_BIN" -maxdepth 1 -type l -exec readlink -f {} + | xargs -r -n1 dirname | sort -u | tr '\n' ' ')"
    cat <<EOF
#!/bin/sh
# multus-daemon of node $NODE, as the thick DaemonSet's privileged hostNetwork/hostPID container runs it.
# Run by \`unshare --mount --propagation slave\`: a mount namespace of its own into which host mounts propagate
# (HostToContainer) and from which nothing propagates back. Its root is a tmpfs: the host's /usr read-only
# and a passwd stand in for the image; then exactly the DaemonSet's host mounts (/etc/cni/net.d at
# /host/etc/cni/net.d, the CNI bin dir at its own path, /run at /host/run, /run/netns, /var/lib/kubelet,
# /var/lib/cni/multus, / at /hostroot) at this node's paths. Everything else (/run, /tmp, /var) is its own.
set -eu
R=$r
mount -t tmpfs -o mode=755 multus-root "\$R"
cd "\$R"
mkdir -p usr etc proc sys dev run tmp hostroot host/run host/etc/cni/net.d etc/cni/net.d/multus.d \\
    var/lib/cni/multus var/lib/kubelet var/run/secrets/kubernetes.io/serviceaccount \\
    ".$CNI_BIN" ".$MULTUS_DIR/run" ".$netns" run/netns
ln -s usr/bin bin; ln -s usr/sbin sbin; ln -s usr/lib lib; ln -s usr/lib64 lib64
chmod 1777 tmp
grep '^root:' /etc/passwd >etc/passwd; grep '^root:' /etc/group >etc/group
: >etc/cni/net.d/multus.d/daemon-config.json; : >multus-daemon
mount --rbind / hostroot                      # hostPath /, HostToContainer
mount --bind /usr usr && mount -o remount,bind,ro usr
mount -t proc proc proc
mount --rbind /sys sys
mount --rbind /dev dev
mount --bind "$CNI_CONF" host/etc/cni/net.d
mount --bind "$CNI_BIN" ".$CNI_BIN"
for d in $links; do mkdir -p ".\$d" && mount --bind "\$d" ".\$d" && mount -o remount,bind,ro ".\$d"; done
mount --rbind /run host/run
mount --rbind /run/netns run/netns
mount --rbind "$netns" ".$netns"               # this node's pod netns (a default containerd's /run/netns)
mount --rbind "$KROOT" var/lib/kubelet
mount --bind "$MULTUS_DIR/cache" var/lib/cni/multus
mount --bind "$MULTUS_DIR/run" ".$MULTUS_DIR/run"
mount --bind "$MULTUS_SA_DIR" var/run/secrets/kubernetes.io/serviceaccount
mount --bind "$MULTUS_DIR/daemon-config.json" etc/cni/net.d/multus.d/daemon-config.json
mount --bind "\$1" multus-daemon
exec chroot "\$R" /multus-daemon
EOF
}

multus_thick_up() { # multus_thick_up MODE: the shim as the node's plugin, the daemon running
    local daemon shim netns
    [[ "${RUNTIME:-containerd}" == containerd ]] || die "multus-up --thick: containerd nodes only (the daemon mounts its netns dir)"
    daemon="$("$HERE/build/multus.sh" daemon)"
    shim="$("$HERE/build/multus.sh" shim)"
    ln -sfn "$shim" "$CNI_BIN/multus-shim"
    mkdir -p "$MULTUS_DIR/run" "$MULTUS_DIR/root" "$MULTUS_SA_DIR"
    # The pod netns directory a shared mount (as a systemd host has every mount), so that the netns
    # containerd mounts from now on also appear in the daemon's namespace; `down` unmounts it.
    netns="$(cri_netns_dir)"
    mkdir -p "$netns"
    awk -v d="$netns" '$5 == d' /proc/self/mountinfo | grep -q . || mount --rbind "$netns" "$netns"
    mount --make-shared "$netns"
    multus_daemon_config "$1" >"$MULTUS_DIR/daemon-config.json.tmp" \
        && mv "$MULTUS_DIR/daemon-config.json.tmp" "$MULTUS_DIR/daemon-config.json"
    multus_container >"$MULTUS_DIR/container.sh"
    if alive "$DIR/multus.pid" && [[ "$(cat "$MULTUS_DIR/daemon.mode" 2>/dev/null)" == "$1" ]]; then
        log "multus: daemon already runs ($1)"
        return 0
    fi
    stop_multus_daemon
    multus_token >"$MULTUS_SA_DIR/token.tmp" && mv "$MULTUS_SA_DIR/token.tmp" "$MULTUS_SA_DIR/token"
    cp "$CP_DIR/pki/ca.crt" "$MULTUS_SA_DIR/ca.crt"
    echo "$MULTUS_NS" >"$MULTUS_SA_DIR/namespace"
    chmod 600 "$MULTUS_SA_DIR/token"
    rm -f "$CNI_CONF/00-multus.conf"   # the daemon writes it (multusConfigFile: auto) once it serves
    echo "$1" >"$MULTUS_DIR/daemon.mode"
    log "multus: starting multus-daemon ($1) in a mount namespace of its own"
    start multus env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin MULTUS_NODE_NAME="$NODE" \
        KUBERNETES_SERVICE_HOST=127.0.0.1 KUBERNETES_SERVICE_PORT="$APISERVER_PORT" \
        unshare --mount --propagation slave /bin/sh "$MULTUS_DIR/container.sh" "$daemon"
    WATCH=multus wait_for 60 "multus-daemon's socket" test -S "$MULTUS_SOCKET_DIR/multus.sock"
    WATCH=multus wait_for 60 "multus-daemon to write 00-multus.conf" grep -q multus-shim "$CNI_CONF/00-multus.conf"
    log "multus: $1, multus-shim primary CNI of $NODE (cluster network $(basename "$CONFLIST")); NADs in" \
        "default: ${MULTUS_NETWORKS[*]%%:*} hostdev0..$((MULTUS_HOSTDEVS - 1))"
}

stop_multus_daemon() { # SIGKILL: on SIGTERM it waits 10 s, then removes 00-multus.conf, which `down` removes anyway
    alive "$DIR/multus.pid" || { rm -f "$DIR/multus.pid"; return 0; }
    local pid
    pid="$(cat "$DIR/multus.pid")"
    log "stopping multus-daemon (pid $pid)"
    kill -KILL "$pid" 2>/dev/null || true
    while kill -0 "$pid" 2>/dev/null; do sleep 0.1; done
    rm -f "$DIR/multus.pid"
}
