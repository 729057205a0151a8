# Sourced by scripts/cluster.sh (its variables and state are in scope): netclaim installed the operator way: plugin in the chain, publisher, chain keeper
# shellcheck shell=bash

# ------------------------------------------------------------------ netclaim (the operator way)

# The publisher learns its drivers the systemd unit's way: from the drivers file install.sh writes
# (the unit's /etc/netclaim/drivers; here the cluster's own), read again whenever it changes.
# Where this node's runtime mounts pod netns: the publisher's live watch opens a netns only there (--netns-dir).
pod_netns_dir() {
    if [[ "${RUNTIME:-containerd}" == crio ]]; then echo "$CRIO_DIR/ns/netns"; else echo "$CTD/state/io.containerd.grpc.v1.cri/netns"; fi
}

start_publisher() {
    local port
    port="$(free_port)"
    echo "$port" >"$NC/metrics.port"
    log "starting netclaim-publisher (node $NODE, socket $NC/publisher.sock)"
    start publisher ${NETCLAIM_PUBLISHER_WRAPPER:+"$NETCLAIM_PUBLISHER_WRAPPER"} \
        "$ROOT/.venv/bin/netclaim-publisher" run --node-name "$NODE" \
        --kubeconfig "$NC/publisher.kubeconfig" --socket "$NC/publisher.sock" \
        --state-dir "$NC/state" --spool-dir "$NC/spool" --drivers-file "$NC/drivers" \
        --metrics-address "127.0.0.1:$port" --netns-dir "$(pod_netns_dir)"
    "$PY" "$HERE/harness/runtime/clusterctl.py" publisher-ready --socket "$NC/publisher.sock" --timeout 30 \
        || { tail -20 "$DIR/publisher.log" >&2; die "publisher not answering"; }
}

cmd_install_netclaim() {
    load_state
    mkdir -p "$NC" && chmod 700 "$NC"
    "$PY" "$HERE/harness/runtime/clusterctl.py" publisher-kubeconfig --admin "$CP_DIR/admin.kubeconfig" \
        --server "https://127.0.0.1:$APISERVER_PORT" --ca "$CP_DIR/pki/ca.crt" --node "$NODE" \
        --driver "$DRIVER" --out "$NC/publisher.kubeconfig" >/dev/null
    alive "$DIR/publisher.pid" || start_publisher
    if ! grep -q '"netclaim"' "$CONFLIST"; then
        netclaim_request_args 0
        "$HERE/install.sh" --cni-bin-dir "$CNI_BIN" --conflist "$CONFLIST" --driver-name "$DRIVER" "${REQUEST_ARGS[@]}" \
            --socket "$NC/publisher.sock" --spool-dir "$NC/spool" --state-dir "$NC/state" \
            --log-file "$NC/plugin.log" --drivers-file "$NC/drivers" --python "$PY"
    fi
    install_netclaim_networks
    log "netclaim installed: $CONFLIST"
}

start_chain_keeper() { # the keeper of the DaemonSet, as a node process, for the chain installed above
    grep -q '"netclaim"' "$CONFLIST" || die "netclaim is not installed (run: $0 install-netclaim)"
    mkdir -p "$NC/keeper" && chmod 700 "$NC/keeper"
    [[ -f "$NC/keeper/netclaim" ]] || cp "$CNI_BIN/netclaim" "$NC/keeper/netclaim"
    log "starting the chain keeper (conflist $(basename "$CONFLIST"))"
    netclaim_request_args 0  # with several networks, the primary's entry keeps its request
    start chain-keeper "$ROOT/.venv/bin/netclaim-publisher" chain-keeper --cni-conf-dir "$CNI_CONF" \
        --cni-bin-dir "$CNI_BIN" --conflist "$(basename "$CONFLIST")" --plugin-binary "$NC/keeper/netclaim" \
        --driver-name "$DRIVER" "${REQUEST_ARGS[@]}" --plugin-socket "$NC/publisher.sock" --plugin-spool-dir "$NC/spool" \
        --plugin-log-file "$NC/plugin.log" --log-format json
}

cmd_uninstall_netclaim() {
    load_state
    stop_pid chain-keeper  # or it chains netclaim back in
    uninstall_netclaim_networks
    if grep -q '"netclaim"' "$CONFLIST" 2>/dev/null; then
        "$HERE/install.sh" --uninstall --cni-bin-dir "$CNI_BIN" --conflist "$CONFLIST" --drivers-file "$NC/drivers"
    fi
    stop_pid publisher
    log "netclaim uninstalled"
}
