#!/usr/bin/env bash
# A real local Kubernetes control plane (etcd + kube-apiserver) for tests and the demo.
#
#   scripts/control-plane.sh up                 start (no-op when already up); prints the kubeconfig path
#   scripts/control-plane.sh env                shell exports for the running control plane
#   scripts/control-plane.sh down               stop exactly the processes `up` started, remove the state dir
#   scripts/control-plane.sh apiserver-stop     stop only kube-apiserver (outage tests)
#   scripts/control-plane.sh apiserver-start    start it again with the same flags, wait for /readyz
#   scripts/control-plane.sh status             say what runs
#   NETCLAIM_KUBE_VERSION=1.34 scripts/control-plane.sh up   kube-apiserver of an older minor
#
# Everything lives under $NETCLAIM_CP_DIR (default /tmp/netclaim-cp): certificates, the static
# token file, the service-account key, etcd data, logs, pid files and kubeconfigs. The dir is made
# mode 0700; one that exists is used only when it is a real directory of the user running this and
# writable by nobody else (scripts/harness/statedir.sh), since this script sources files from it. The binaries
# are built once from Go modules by scripts/build/components.sh and cached outside the repo.
# No scheduler or controller-manager runs here: clients write status.allocation themselves, as the
# scheduler would, and create ServiceAccounts themselves. scripts/cluster.sh runs the rest of a real
# cluster on top of this script and sets, for its own control plane:
#   NETCLAIM_CP_NODES="n1 n2"   more static node identities (system:node:<name>, group system:nodes)
#   NETCLAIM_CP_CLUSTER=1       the ServiceAccount admission plugin on (pods get projected tokens; needs
#                               kube-controller-manager's serviceaccount controller to run)
# kube-apiserver reaches kubelets (logs, exec, port-forward) on their InternalIP with the client
# certificate pki/kubelet-client.crt (user kube-apiserver-kubelet-client) and verifies their serving
# certificates against pki/ca.crt (which signs them: scripts/cluster.sh up, and up --nodes N).
# Identities for kube-scheduler and kube-controller-manager (system:kube-scheduler,
# system:kube-controller-manager, bound by the bootstrap RBAC roles) always exist, with kubeconfigs
# scheduler.kubeconfig and controller-manager.kubeconfig.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
DIR="${NETCLAIM_CP_DIR:-/tmp/netclaim-cp}"
# shellcheck source=harness/statedir.sh
source "$HERE/harness/statedir.sh"
state_dir_check "$DIR"   # before anything reads, kills or removes what is in it
NODES=(node-a node-b)   # static node identities (system:node:<name>) in the token file
read -r -a EXTRA_NODES <<<"${NETCLAIM_CP_NODES:-}"
NODES+=("${EXTRA_NODES[@]}")
COMPONENTS=(kube-scheduler:scheduler kube-controller-manager:controller-manager)

log() { printf '[control-plane] %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

alive() { # alive PIDFILE
    [[ -f "$1" ]] && kill -0 "$(cat "$1")" 2>/dev/null
}

token() { head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n'; }

binaries() {
    # NETCLAIM_KUBE_VERSION=1.34: the kube-apiserver of that minor (scripts/cluster.sh up --kube-version)
    local flag=()
    [[ -z "${NETCLAIM_KUBE_VERSION:-}" ]] || flag=(--kube "$NETCLAIM_KUBE_VERSION")
    mapfile -t BINS < <("$HERE/build/components.sh" "${flag[@]}" control-plane)
    ETCD_BIN="${BINS[0]}"
    APISERVER_BIN="${BINS[1]}"
    [[ -x "$ETCD_BIN" && -x "$APISERVER_BIN" ]] || die "control-plane binaries missing after build"
}

make_pki() {
    local pki="$DIR/pki"
    mkdir -p "$pki"
    chmod 700 "$pki"
    openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj "/CN=netclaim-local-ca" \
        -keyout "$pki/ca.key" -out "$pki/ca.crt" 2>/dev/null
    openssl req -newkey rsa:2048 -nodes -subj "/CN=kube-apiserver" \
        -keyout "$pki/apiserver.key" -out "$pki/apiserver.csr" 2>/dev/null
    printf 'subjectAltName=IP:127.0.0.1,DNS:localhost,DNS:kubernetes.default.svc\n' >"$pki/san.ext"
    openssl x509 -req -in "$pki/apiserver.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" \
        -CAcreateserial -days 3650 -extfile "$pki/san.ext" -out "$pki/apiserver.crt" 2>/dev/null
    # kube-apiserver's client certificate for the kubelets (logs, exec, port-forward): a user of its
    # own, given the kubelet API through RBAC (system:kubelet-api-admin), never system:masters.
    openssl req -newkey rsa:2048 -nodes -subj "/CN=kube-apiserver-kubelet-client" \
        -keyout "$pki/kubelet-client.key" -out "$pki/kubelet-client.csr" 2>/dev/null
    printf 'extendedKeyUsage=clientAuth\n' >"$pki/client.ext"
    openssl x509 -req -in "$pki/kubelet-client.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" \
        -CAcreateserial -days 3650 -extfile "$pki/client.ext" -out "$pki/kubelet-client.crt" 2>/dev/null
    openssl genrsa -out "$pki/sa.key" 2048 2>/dev/null
    openssl rsa -in "$pki/sa.key" -pubout -out "$pki/sa.pub" 2>/dev/null
    chmod 600 "$pki"/*.key
}

make_tokens() {
    # CSV: token,user,uid,"group1,group2". One admin, one identity per static node.
    local f="$DIR/tokens.csv"
    umask 077
    printf '%s,admin,admin,"system:masters"\n' "$(token)" >"$f"
    for n in "${NODES[@]}"; do
        printf '%s,system:node:%s,node-%s,"system:nodes"\n' "$(token)" "$n" "$n" >>"$f"
    done
    local c
    for c in "${COMPONENTS[@]}"; do
        printf '%s,system:%s,%s\n' "$(token)" "${c%%:*}" "${c%%:*}" >>"$f"
    done
}

user_token() { # user_token USER
    awk -F, -v u="$1" '$2 == u {print $1}' "$DIR/tokens.csv"
}

write_kubeconfig() { # write_kubeconfig FILE TOKEN
    umask 077
    cat >"$1" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: netclaim-local
  cluster:
    server: https://127.0.0.1:${APISERVER_PORT}
    certificate-authority: ${DIR}/pki/ca.crt
users:
- name: user
  user:
    token: $2
contexts:
- name: netclaim-local
  context: {cluster: netclaim-local, user: user}
current-context: netclaim-local
EOF
}

start_etcd() {
    log "starting etcd on 127.0.0.1:${ETCD_PORT}"
    setsid "$ETCD_BIN" --name netclaim --data-dir "$DIR/etcd" \
        --listen-client-urls "http://127.0.0.1:${ETCD_PORT}" \
        --advertise-client-urls "http://127.0.0.1:${ETCD_PORT}" \
        --listen-peer-urls "http://127.0.0.1:${ETCD_PEER_PORT}" \
        --initial-advertise-peer-urls "http://127.0.0.1:${ETCD_PEER_PORT}" \
        --initial-cluster "netclaim=http://127.0.0.1:${ETCD_PEER_PORT}" \
        --quota-backend-bytes 2147483648 --unsafe-no-fsync \
        </dev/null >"$DIR/etcd.log" 2>&1 9>&- &
    echo $! >"$DIR/etcd.pid"
    local i
    for i in $(seq 1 100); do
        curl -fsS "http://127.0.0.1:${ETCD_PORT}/health" >/dev/null 2>&1 && return 0
        alive "$DIR/etcd.pid" || { tail -20 "$DIR/etcd.log" >&2; die "etcd exited"; }
        sleep 0.2
    done
    tail -20 "$DIR/etcd.log" >&2
    die "etcd did not become healthy"
}

start_apiserver() {
    # A plain control plane has no controller to create the `default` ServiceAccounts, so
    # the ServiceAccount admission plugin (which refuses pods without one) is off there.
    local SA_ADMISSION=(--disable-admission-plugins ServiceAccount)
    [[ "${CLUSTER_MODE:-0}" == 1 ]] && SA_ADMISSION=()
    # NETCLAIM_CP_APISERVER_ARGS="--max-requests-inflight=20 ...": extra flags, read at every start
    # (the APF test lowers the concurrency limits so that a flood shows queuing on 2 cores).
    local EXTRA_ARGS
    read -r -a EXTRA_ARGS <<<"${NETCLAIM_CP_APISERVER_ARGS:-}"
    # The plain control plane serves Kubernetes 1.37's workload API (beta, off by default): PodGroups
    # (scheduling.k8s.io/v1beta1), pods' spec.schedulingGroup and claims a PodGroup shares (KEP-5729),
    # so the publisher's tests can reserve a claim for a PodGroup. A cluster's API server and an older
    # minor's keep the defaults: a cluster would need the gates on its scheduler and kubelet too.
    local WORKLOAD=()
    if [[ "${CLUSTER_MODE:-0}" != 1 && -z "${NETCLAIM_KUBE_VERSION:-}" ]]; then
        WORKLOAD=(--feature-gates GenericWorkload=true,DRAWorkloadResourceClaims=true
            --runtime-config scheduling.k8s.io/v1beta1=true)
    fi
    log "starting kube-apiserver on https://127.0.0.1:${APISERVER_PORT}"
    setsid "$APISERVER_BIN" \
        --etcd-servers "http://127.0.0.1:${ETCD_PORT}" \
        --bind-address 127.0.0.1 --advertise-address 127.0.0.1 \
        --secure-port "${APISERVER_PORT}" \
        --tls-cert-file "$DIR/pki/apiserver.crt" --tls-private-key-file "$DIR/pki/apiserver.key" \
        --token-auth-file "$DIR/tokens.csv" \
        --authorization-mode Node,RBAC \
        --service-account-issuer https://kubernetes.default.svc \
        --service-account-key-file "$DIR/pki/sa.pub" \
        --service-account-signing-key-file "$DIR/pki/sa.key" \
        --api-audiences https://kubernetes.default.svc \
        --service-cluster-ip-range 10.96.0.0/24 \
        --enable-admission-plugins NodeRestriction \
        --kubelet-client-certificate "$DIR/pki/kubelet-client.crt" --kubelet-client-key "$DIR/pki/kubelet-client.key" \
        --kubelet-certificate-authority "$DIR/pki/ca.crt" --kubelet-preferred-address-types InternalIP \
        "${SA_ADMISSION[@]}" \
        "${WORKLOAD[@]}" \
        --allow-privileged=true \
        --endpoint-reconciler-type none \
        --profiling=false \
        "${EXTRA_ARGS[@]}" \
        </dev/null >"$DIR/kube-apiserver.log" 2>&1 9>&- &
    echo $! >"$DIR/kube-apiserver.pid"
    wait_ready
}

wait_ready() {
    local admin i
    admin="$(user_token admin)"
    for i in $(seq 1 300); do
        if curl -fsS --cacert "$DIR/pki/ca.crt" -H "Authorization: Bearer $admin" \
            "https://127.0.0.1:${APISERVER_PORT}/readyz" >/dev/null 2>&1; then
            return 0
        fi
        alive "$DIR/kube-apiserver.pid" || { tail -30 "$DIR/kube-apiserver.log" >&2; die "kube-apiserver exited"; }
        sleep 0.2
    done
    tail -30 "$DIR/kube-apiserver.log" >&2
    die "kube-apiserver did not become ready within 60s"
}

load_ports() {
    [[ -f "$DIR/ports.env" || -L "$DIR/ports.env" ]] || die "no control plane in $DIR (run: $0 up)"
    state_source "$DIR/ports.env"
}

stop_pid() { # stop_pid PIDFILE NAME
    local pidfile="$1" name="$2" pid i
    [[ -f "$pidfile" ]] || return 0
    pid="$(cat "$pidfile")"
    if kill -0 "$pid" 2>/dev/null; then
        log "stopping $name (pid $pid)"
        kill -TERM "$pid" 2>/dev/null || true
        for i in $(seq 1 50); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.2
        done
        kill -KILL "$pid" 2>/dev/null || true
        while kill -0 "$pid" 2>/dev/null; do sleep 0.1; done
    fi
    rm -f "$pidfile"
}

cmd_up() {
    state_dir_ensure "$DIR"
    exec 9>"$DIR/.lock"
    flock 9
    if alive "$DIR/etcd.pid" && alive "$DIR/kube-apiserver.pid"; then
        load_ports
        wait_ready
        echo "$DIR/admin.kubeconfig"
        return 0
    fi
    binaries
    # A half-started or crashed previous run: clear it and start over.
    stop_pid "$DIR/kube-apiserver.pid" kube-apiserver
    stop_pid "$DIR/etcd.pid" etcd
    rm -rf "$DIR/etcd" "$DIR/pki"
    ETCD_PORT="$(free_port)"
    ETCD_PEER_PORT="$(free_port)"
    APISERVER_PORT="$(free_port)"
    CLUSTER_MODE="${NETCLAIM_CP_CLUSTER:-0}"
    printf 'ETCD_PORT=%s\nETCD_PEER_PORT=%s\nAPISERVER_PORT=%s\nETCD_BIN=%s\nAPISERVER_BIN=%s\nCLUSTER_MODE=%s\n' \
        "$ETCD_PORT" "$ETCD_PEER_PORT" "$APISERVER_PORT" "$ETCD_BIN" "$APISERVER_BIN" "$CLUSTER_MODE" >"$DIR/ports.env"
    make_pki
    make_tokens
    start_etcd
    start_apiserver
    write_kubeconfig "$DIR/admin.kubeconfig" "$(user_token admin)"
    local n
    for n in "${NODES[@]}"; do
        write_kubeconfig "$DIR/$n.kubeconfig" "$(user_token "system:node:$n")"
    done
    local c
    for c in "${COMPONENTS[@]}"; do
        write_kubeconfig "$DIR/${c#*:}.kubeconfig" "$(user_token "system:${c%%:*}")"
    done
    log "ready: https://127.0.0.1:${APISERVER_PORT}"
    echo "$DIR/admin.kubeconfig"
}

cmd_env() {
    load_ports
    printf 'export NETCLAIM_CP_DIR=%q\n' "$DIR"
    printf 'export KUBECONFIG=%q\n' "$DIR/admin.kubeconfig"
    printf 'export NETCLAIM_APISERVER=%q\n' "https://127.0.0.1:${APISERVER_PORT}"
    printf 'export NETCLAIM_APISERVER_CA=%q\n' "$DIR/pki/ca.crt"
}

cmd_down() {
    [[ -d "$DIR" ]] || return 0
    stop_pid "$DIR/kube-apiserver.pid" kube-apiserver
    stop_pid "$DIR/etcd.pid" etcd
    rm -rf "$DIR"
    log "down"
}

cmd_apiserver_stop() {
    load_ports
    stop_pid "$DIR/kube-apiserver.pid" kube-apiserver
}

cmd_apiserver_start() {
    load_ports
    alive "$DIR/kube-apiserver.pid" && { wait_ready; return 0; }
    start_apiserver
}

cmd_status() {
    local name
    for name in etcd kube-apiserver; do
        if alive "$DIR/$name.pid"; then
            echo "$name: running (pid $(cat "$DIR/$name.pid"))"
        else
            echo "$name: stopped"
        fi
    done
}

case "${1:-}" in
    up) cmd_up ;;
    env) cmd_env ;;
    down) cmd_down ;;
    apiserver-stop) cmd_apiserver_stop ;;
    apiserver-start) cmd_apiserver_start ;;
    status) cmd_status ;;
    *) echo "usage: $0 up|env|down|apiserver-stop|apiserver-start|status" >&2; exit 2 ;;
esac
