#!/usr/bin/env bash
# A real single-node Kubernetes on this machine: etcd, kube-apiserver, kube-controller-manager,
# kube-scheduler, kubelet, containerd 2.x (with Debian's runc) and a real DRA driver (the
# Kubernetes e2e test driver, `net.example.com`), all built from Go modules by
# scripts/build/components.sh.
#
#   scripts/cluster.sh up                  start everything (no-op when up); the node's CNI chain is the
#                                          primary network only (bridge + host-local), netclaim NOT installed;
#                                          the kubelet serves logs/exec/port-forward and the node proxy on the
#                                          node IP (NETCLAIM_NODE_IP) with a certificate of the cluster's CA
#       [--networks N]                     N conflists, pods get eth0..eth<N-1> (containerd's max_conf_num;
#                                          harness/cluster/networks.sh); default 1
#       [--dual-stack]                     the primary network has an IPv4 and an IPv6 range
#       [--kube-version 1.3x]              kube-apiserver, kubelet, scheduler, controller-manager, kubectl and the DRA
#                                          test driver of that Kubernetes minor (1.34, 1.35, 1.36; default 1.37), built on
#                                          first use (scripts/build/components.sh --kube); `status` says which runs
#       [--runtime crio]                   CRI-O (scripts/build/crio.sh) instead of containerd as the kubelet's runtime:
#                                          same CNI conf dir (install-netclaim chains netclaim there), cdi_spec_dirs =
#                                          NETCLAIM_CDI_DIR; `crio-stop|crio-start` replace containerd-stop|-start, which
#                                          then fail; import-image goes through copyimg; --with-multus (thin) works;
#                                          not with --networks N > 1, --with-dranet, --multus-thick or --nodes
#                                          (harness/cluster/crio.sh)
#   scripts/cluster.sh up --nodes N        one control plane and N nodes (each its own kubelet, containerd,
#                                          DRA driver, node IP, bridge, pod /24, cgroup root, mount namespace;
#                                          kubelets serve logs/exec/port-forward on their node IP); `env` then
#                                          lists the nodes (NETCLAIM_NODES, NETCLAIM_NODE<i>_*); per node:
#   scripts/cluster.sh node NAME|I kubelet-stop|kubelet-start|containerd-stop|containerd-start|stop|start
#   CDI: the single node's containerd reads NETCLAIM_CDI_DIR (a dir of this cluster: the host's
#   /var/run/cdi is shared by every cluster on the host), where the DRA driver writes; a driver run as
#   a pod mounts that path. On `up --nodes N` each node's /var/run/cdi is its own dir (the node's mount
#   namespace), the one its containerd reads: a driver mounting /var/run/cdi from its node finds it.
#   scripts/cluster.sh up --with-dranet    the same, plus containerd's NRI and dranet (driver dra.net, built
#                                          from its source snapshot by scripts/build/dranet.sh) publishing
#                                          the host ends of veth pairs made for it (harness/cluster/dranet.sh)
#   scripts/cluster.sh up --with-multus    `up`, then `multus-up` (may be combined with --with-dranet)
#   scripts/cluster.sh multus-up           Multus (thin plugin) becomes the node's primary CNI, delegating eth0 to the
#                                          node's conflist; NetworkAttachmentDefinitions in `default` for macvlan,
#                                          ipvlan, bridge2 and hostdev0..3, each chain ending in netclaim with its
#                                          own claim request (harness/cluster/multus.sh; docs/multi-network.md)
#       [--thick]                          Multus 4's default, the thick plugin: multus-shim is the node's primary CNI
#                                          and multus-daemon runs the delegates, as its DaemonSet's container would but
#                                          as a host process: a mount namespace of its own (its own /run, /tmp, /var;
#                                          the DaemonSet's host mounts; the host's / at /hostroot) and `chrootDir:
#                                          /hostroot`; same NADs and delegation (`up --with-multus --multus-thick`)
#       [--thick --no-chroot]              the same without chrootDir (a misconfiguration, for tests): delegates, netclaim
#                                          too, run in the daemon's mount namespace (`up ... --multus-no-chroot`)
#   scripts/cluster.sh up --with-multus --with-vf-driver   `up`, `multus-up`, then `vf-driver-start`
#   scripts/cluster.sh vf-driver-start     (Multus nodes) the harness's own DRA driver vf.netclaim.test (scripts/harness/
#                                          netdriver) as a node service beside the test driver: NETCLAIM_VF_DEVICES
#                                          devices (default 4) with Multus's k8s.cni.cncf.io/resourceName and deviceID
#                                          attributes, DeviceClass vf.netclaim.test and NAD `vf` annotated
#                                          k8s.v1.cni.cncf.io/resourceName: netclaim.test/vf (harness/cluster/vfdriver.sh)
#   scripts/cluster.sh vf-driver-stop      stop it (its slice, class and NAD stay)
#   scripts/cluster.sh env                 shell exports: KUBECONFIG, CONTAINER_RUNTIME_ENDPOINT, NETCLAIM_*
#   scripts/cluster.sh status              what runs
#   scripts/cluster.sh down                stop everything `up` started and leave the host as it was
#   scripts/cluster.sh install-netclaim    the operator way: scripts/install.sh chains the plugin into the
#                                          conflist in containerd's CNI conf dir; the publisher runs as a
#                                          node service with the shipped RBAC and a Node-bound token,
#                                          told its drivers by the drivers file install.sh writes (nc/drivers)
#                                          (NETCLAIM_REQUEST: the claim request eth0 reports under)
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
#   scripts/cluster.sh dranet-start|dranet-stop   (--with-dranet nodes) start dranet, giving its interfaces
#                                          back their host addresses / stop it (the interfaces stay)
#
# Everything lives under $NETCLAIM_CLUSTER_DIR (default /tmp/netclaim-cluster; keep it short: the
# kubelet's and the driver's unix sockets live under it and AF_UNIX paths stop at 108 bytes). It is
# made mode 0700; one that exists is used only when it is a real directory of the user running this
# and writable by nobody else, and its env files only when they are ours alone
# (scripts/harness/statedir.sh): this script runs as root and sources them. The
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
#   them and no other kubelet runs; the bridge, dranet's veth pairs and the links of multus-up are deleted.
#   iptables are not touched (makeIPTablesUtilChains: false, ipMasq: false).
#
# Environment: NETCLAIM_CLUSTER_DIR, NETCLAIM_NODE_NAME (default nc-<hash of the dir>; `up --nodes N`:
# <that>-1 ... <that>-N), NETCLAIM_NODE_GRACE (`up --nodes N`: kube-controller-manager's
# --node-monitor-grace-period, default 16s; the kubelets renew their leases every 2 s),
# NETCLAIM_DRA_DEVICES (devices the DRA driver publishes, default 8),
# NETCLAIM_CLUSTER_FEATURE_GATES (`up` on the newest minor: feature gates of all four Kubernetes components, e.g.
# "GenericWorkload=true,DRAWorkloadResourceClaims=true" for KEP-5729's PodGroup claims; harness/cluster/controllers.sh),
# NETCLAIM_PUBLISHER_WRAPPER (tests: an executable the publisher is started through, which must
# `exec "$@"` so the pid file stays the publisher's; the soak uses it to show the publisher another
# boot id and clock).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/.." && pwd)"
PY="${NETCLAIM_PYTHON:-$ROOT/.venv/bin/python}"
DIR="${NETCLAIM_CLUSTER_DIR:-/tmp/netclaim-cluster}"
# shellcheck source=harness/statedir.sh
source "$HERE/harness/statedir.sh"
state_dir_check "$DIR"   # the name as given: a symlink is refused before realpath follows it
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

KCM_EXTRA_ARGS=()           # kube-controller-manager flags a multi-node cluster adds
export NETCLAIM_CP_DIR="$CP_DIR" NETCLAIM_CP_NODES="$NODE" NETCLAIM_CP_CLUSTER=1


# The body lives in scripts/harness/cluster/, one file per part of the node.
for part in common host node crio controllers netclaim networks dranet multus vfdriver lifecycle nodes; do
    # shellcheck source=/dev/null
    source "$HERE/harness/cluster/$part.sh"
done

# `up --nodes N` and every command on a cluster it started: scripts/harness/cluster/nodes.sh.
if wants_multi_node "$@"; then
    [[ "${1:-}" != up || -z "${NETCLAIM_CLUSTER_FEATURE_GATES:-}" ]] \
        || die "NETCLAIM_CLUSTER_FEATURE_GATES: the single-node cluster only (not with --nodes)"
    multi_node_main "$@"; exit
fi

case "${1:-}" in
    up) shift; parse_network_options "$@"; vf_driver_option; runtime_option; kube_version_option; cmd_up_maybe_multus "${UP_ARGS[@]}"
        ((WANT_VF_DRIVER == 0)) || cmd_vf_driver_up ;;
    multus-up) shift; cmd_multus_up "$@" ;;
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
    containerd-stop) load_state; not_crio "$1"; stop_pid containerd ;;   # shims and pods keep running
    containerd-start) cmd_containerd_start ;;
    crio-stop) load_state; [[ "$RUNTIME" == crio ]] || die "$1: the node runs $RUNTIME"; stop_pid crio ;;   # conmons and pods keep running
    crio-start) cmd_crio_start ;;
    apiserver-stop|apiserver-start) load_state; export_apiserver_gates; "$HERE/control-plane.sh" "$1" >/dev/null ;;
    chain-keeper-start) load_state; alive "$DIR/chain-keeper.pid" || start_chain_keeper ;;
    chain-keeper-stop) load_state; stop_pid chain-keeper ;;
    dranet-start) load_state; start_dranet ;;
    dranet-stop) load_state; stop_dranet ;;
    vf-driver-start) cmd_vf_driver_up ;;
    vf-driver-stop) load_state; stop_pid vf-driver ;;
    -h|--help|help) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed -e '$d' -e 's/^# \{0,1\}//' ;;
    *) echo "usage: $0 up [--networks N] [--dual-stack] [--kube-version 1.3x] [--runtime containerd|crio] [--with-dranet] [--with-multus [--multus-thick [--multus-no-chroot]] [--with-vf-driver]]|down|env|status|install-netclaim|uninstall-netclaim|import-image FILE|kubectl ...|multus-up [--thick [--no-chroot]]|publisher-stop|publisher-start|kubelet-stop|kubelet-start|containerd-stop|containerd-start|crio-stop|crio-start|apiserver-stop|apiserver-start|chain-keeper-start|chain-keeper-stop|dranet-start|dranet-stop|vf-driver-start|vf-driver-stop" >&2; exit 2 ;;
esac
