# Sourced by scripts/cluster.sh (its variables and state are in scope): the harness's own DRA driver
# `vf.netclaim.test` beside the e2e test driver, for Multus's DRA path (`up --with-multus --with-vf-driver`,
# vf-driver-start, vf-driver-stop; docs/multi-network.md).
# shellcheck shell=bash
#
# The driver (scripts/harness/netdriver, built by scripts/build/netdriver.sh) is a kubelet plugin acting
# with the node's identity, like the test driver. It publishes one ResourceSlice for the node with
# NETCLAIM_VF_DEVICES devices (default 4), vf-0.., whose attributes are what Multus reads:
# k8s.cni.cncf.io/resourceName=netclaim.test/vf and k8s.cni.cncf.io/deviceID=<PCI address> (also
# resource.kubernetes.io/pciBusID). vf-0 has the highest address, the last device the lowest. No VF is
# real: preparing a claim does nothing.
#
# Its DeviceClass `vf.netclaim.test` selects every device of the driver. Its NAD, `vf` in `default`,
# is annotated k8s.v1.cni.cncf.io/resourceName: netclaim.test/vf, so Multus hands each delegate of it
# the device ID of one of the pod's allocated devices (sorted IDs, in the order of the pod's network
# list). The chain: macvlan on multus-up's parent (mcm-$ID), vf-capture (the same binary run as a
# chained CNI plugin: one JSON line per call in $DIR/vf-capture.jsonl with the deviceID, pciBusID and
# runtimeConfig.deviceID it was handed), then netclaim with driverName vf.netclaim.test, request `vf`
# and the `deviceID` capability. Multus's pod-resources lookup, which comes before its DRA lookup, goes
# through multus-up's wrapper (harness/cluster/multus.sh). Single-node clusters only.

VF_DRIVER=vf.netclaim.test
VF_CLASS=vf.netclaim.test
VF_RESOURCE=netclaim.test/vf
VF_NAD=vf
VF_REQUEST=vf
VF_SUBNET=172.31.20.0/24

vf_driver_option() { # take --with-vf-driver out of UP_ARGS (after parse_network_options): WANT_VF_DRIVER
    local a rest=()
    WANT_VF_DRIVER=0
    for a in "${UP_ARGS[@]}"; do
        if [[ "$a" == --with-vf-driver ]]; then WANT_VF_DRIVER=1; else rest+=("$a"); fi
    done
    UP_ARGS=("${rest[@]}")
}

vf_slice_published() { # the node's slice of the driver lists every device with its deviceID attribute
    local ids
    ids="$(kc get resourceslices -o jsonpath="{range .items[?(@.spec.driver==\"$VF_DRIVER\")]}{.spec.nodeName}{range .spec.devices[*]} {.attributes.k8s\.cni\.cncf\.io/deviceID.string}{end}{\"\n\"}{end}")"
    [[ "$(grep "^$NODE " <<<"$ids" | wc -w)" == "$((${NETCLAIM_VF_DEVICES:-4} + 1))" ]]
}

vf_nad() { # the NAD: macvlan, vf-capture, netclaim (driver vf.netclaim.test, request vf, deviceID capability)
    local entry config
    entry="$(DRIVER="$VF_DRIVER" netclaim_entry "$VF_REQUEST")"
    entry="{\"capabilities\": {\"deviceID\": true}, ${entry#\{}"
    config="$(printf '{"cniVersion": "1.1.0", "name": "%s", "plugins": [%s, %s, %s]}' "$VF_NAD" \
        "{\"type\": \"macvlan\", \"master\": \"mcm-$ID\", \"mode\": \"bridge\", \"ipam\": $(ipam "$VF_SUBNET")}" \
        "{\"type\": \"vf-capture\", \"capabilities\": {\"deviceID\": true}, \"captureFile\": \"$DIR/vf-capture.jsonl\"}" \
        "$entry")"
    cat <<EOF
apiVersion: k8s.cni.cncf.io/v1
kind: NetworkAttachmentDefinition
metadata:
  name: $VF_NAD
  namespace: default
  annotations:
    k8s.v1.cni.cncf.io/resourceName: $VF_RESOURCE
spec:
  config: '$config'
EOF
}

cmd_vf_driver_up() { # start the driver (when not running), its DeviceClass and NAD; print its env
    load_state
    [[ "${MULTUS_UP:-0}" == 1 ]] || die "the vf driver's NAD needs Multus: bring the cluster up with --with-multus (or run multus-up)"
    is_multi_node && die "the vf driver runs on the single-node cluster only"
    [[ -x "${VF_DRIVER_BIN:-}" ]] || { VF_DRIVER_BIN="$("$HERE/build/netdriver.sh")"; save_var VF_DRIVER_BIN; }
    [[ "${VF_DRIVER_UP:-0}" == 1 ]] || { VF_DRIVER_UP=1; save_var VF_DRIVER_UP; }
    ln -sfn "$VF_DRIVER_BIN" "$CNI_BIN/vf-capture"
    if ! alive "$DIR/vf-driver.pid"; then
        mkdir -p "$KROOT/plugins/$VF_DRIVER"
        log "starting the vf driver ($VF_DRIVER, ${NETCLAIM_VF_DEVICES:-4} devices of $VF_RESOURCE)"
        start vf-driver "$VF_DRIVER_BIN" --kubeconfig "$CP_DIR/$NODE.kubeconfig" --node-name "$NODE" \
            --driver-name "$VF_DRIVER" --resource-name "$VF_RESOURCE" --devices "${NETCLAIM_VF_DEVICES:-4}" \
            --registry-dir "$KROOT/plugins_registry" --plugin-dir "$KROOT/plugins/$VF_DRIVER" -v=2
    fi
    WATCH=vf-driver wait_for 60 "the vf driver's ResourceSlice" vf_slice_published
    device_class "$VF_CLASS" "$VF_DRIVER"
    # The publisher's ClusterRole gains this driver (associated-node:patch on resourceclaims/driver): the
    # shipped RBAC names the drivers it may write for. The kubeconfig this also writes is not used.
    mkdir -p "$DIR/vf-driver" && chmod 700 "$DIR/vf-driver"
    "$PY" "$HERE/harness/runtime/clusterctl.py" publisher-kubeconfig --admin "$CP_DIR/admin.kubeconfig" \
        --server "https://127.0.0.1:$APISERVER_PORT" --ca "$CP_DIR/pki/ca.crt" --node "$NODE" \
        --driver "$VF_DRIVER" --out "$DIR/vf-driver/publisher-rbac.kubeconfig" >/dev/null
    vf_nad | kc apply -f - >/dev/null
    vf_driver_env
}

vf_driver_env() { # the exports of `cluster.sh env` once the vf driver was started
    printf 'export NETCLAIM_VF_DRIVER=%q\n' "$VF_DRIVER"
    printf 'export NETCLAIM_VF_DEVICE_CLASS=%q\n' "$VF_CLASS"
    printf 'export NETCLAIM_VF_RESOURCE_NAME=%q\n' "$VF_RESOURCE"
    printf 'export NETCLAIM_VF_NAD=%q\n' "$VF_NAD"
    printf 'export NETCLAIM_VF_REQUEST=%q\n' "$VF_REQUEST"
    printf 'export NETCLAIM_VF_CAPTURE=%q\n' "$DIR/vf-capture.jsonl"
    printf 'export NETCLAIM_VF_DRIVER_LOG=%q\n' "$DIR/vf-driver.log"
}
