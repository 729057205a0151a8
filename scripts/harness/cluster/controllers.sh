# Sourced by scripts/cluster.sh (its variables and state are in scope): kube-controller-manager, kube-scheduler, the DRA driver and its DeviceClass
# shellcheck shell=bash

# ------------------------------------------------------------------ feature gates

# NETCLAIM_CLUSTER_FEATURE_GATES="GenericWorkload=true,DRAWorkloadResourceClaims=true": Kubernetes feature gates
# turned on (or off) in all four components at `up`, kube-apiserver, kube-controller-manager, kube-scheduler
# (--feature-gates) and the kubelet (its KubeletConfiguration's featureGates), as a feature such as KEP-5729's
# PodGroup claims needs. GenericWorkload=true also serves its API group (scheduling.k8s.io/v1beta1). The newest
# minor only (no --kube-version): gate names come and go between minors. Saved in the state (FEATURE_GATES), so
# that apiserver-start and kubelet-start keep them; unset, every component keeps its defaults.
feature_gates_option() { # read NETCLAIM_CLUSTER_FEATURE_GATES into FEATURE_GATES (at up, before binaries)
    FEATURE_GATES="${NETCLAIM_CLUSTER_FEATURE_GATES:-}"
    [[ -n "$FEATURE_GATES" ]] || return 0
    [[ "$FEATURE_GATES" =~ ^[A-Za-z0-9]+=(true|false)(,[A-Za-z0-9]+=(true|false))*$ ]] \
        || die "NETCLAIM_CLUSTER_FEATURE_GATES=$FEATURE_GATES: give Name=true|false[,Name=true|false...]"
    [[ -z "$KUBE_MINOR_WANTED" ]] || die "NETCLAIM_CLUSTER_FEATURE_GATES: only for the newest Kubernetes minor," \
        "not with --kube-version $KUBE_MINOR_WANTED (a gate's name and stage differ between minors)"
}

feature_gates_match() { # a cluster already up runs with the gates asked for
    [[ "${NETCLAIM_CLUSTER_FEATURE_GATES:-}" == "${FEATURE_GATES:-}" ]] \
        || die "the cluster in $DIR runs with feature gates '${FEATURE_GATES:-}', not" \
            "'${NETCLAIM_CLUSTER_FEATURE_GATES:-}'; run down first"
}

gate_flags() { # the --feature-gates flag of the control-plane components (none without gates)
    [[ -z "${FEATURE_GATES:-}" ]] || printf -- '--feature-gates=%s\n' "$FEATURE_GATES"
}

export_apiserver_gates() { # control-plane.sh reads NETCLAIM_CP_APISERVER_ARGS at every kube-apiserver start
    [[ -n "${FEATURE_GATES:-}" ]] || return 0
    local args="--feature-gates=$FEATURE_GATES"
    [[ ",$FEATURE_GATES," == *,GenericWorkload=true,* ]] && args+=" --runtime-config=scheduling.k8s.io/v1beta1=true"
    export NETCLAIM_CP_APISERVER_ARGS="${NETCLAIM_CP_APISERVER_ARGS:+$NETCLAIM_CP_APISERVER_ARGS }$args"
}

kubelet_gates_yaml() { # the KubeletConfiguration's featureGates block (nothing without gates)
    [[ -n "${FEATURE_GATES:-}" ]] || return 0
    local gate
    echo "featureGates:"
    for gate in ${FEATURE_GATES//,/ }; do echo "  ${gate%%=*}: ${gate#*=}"; done
}

# ------------------------------------------------------------------ control-plane components, driver

start_kcm() {
    local gates
    mapfile -t gates < <(gate_flags)
    mkdir -p "$DIR/flex"
    start kube-controller-manager "$KCM" --kubeconfig "$CP_DIR/controller-manager.kubeconfig" \
        --use-service-account-credentials=true --leader-elect=false --secure-port=0 \
        --root-ca-file "$CP_DIR/pki/ca.crt" --service-account-private-key-file "$CP_DIR/pki/sa.key" \
        --flex-volume-plugin-dir "$DIR/flex" -v=2 "${gates[@]}" "${KCM_EXTRA_ARGS[@]}"
}

start_scheduler() {
    local gates
    mapfile -t gates < <(gate_flags)
    start kube-scheduler "$SCHEDULER" --kubeconfig "$CP_DIR/scheduler.kubeconfig" \
        --leader-elect=false --secure-port=0 -v=2 "${gates[@]}"
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
        --datadir "$KROOT/plugins" --cdi-dir "$CDI_DIR" --num-devices "${NETCLAIM_DRA_DEVICES:-8}"
    WATCH=dra-driver wait_for 60 "the driver's ResourceSlice" slice_published
}

device_class() { # device_class [NAME DRIVER]: the class of every device of DRIVER (default: the test driver's)
    kc apply -f - >/dev/null <<EOF
apiVersion: resource.k8s.io/v1
kind: DeviceClass
metadata: {name: ${1:-$DEVICE_CLASS}}
spec:
  selectors:
  - cel: {expression: 'device.driver == "${2:-$DRIVER}"'}
EOF
}
