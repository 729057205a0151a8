# Sourced by scripts/cluster.sh (its variables and state are in scope): kube-controller-manager, kube-scheduler, the DRA driver and its DeviceClass
# shellcheck shell=bash

# ------------------------------------------------------------------ control-plane components, driver

start_kcm() {
    mkdir -p "$DIR/flex"
    start kube-controller-manager "$KCM" --kubeconfig "$CP_DIR/controller-manager.kubeconfig" \
        --use-service-account-credentials=true --leader-elect=false --secure-port=0 \
        --root-ca-file "$CP_DIR/pki/ca.crt" --service-account-private-key-file "$CP_DIR/pki/sa.key" \
        --flex-volume-plugin-dir "$DIR/flex" -v=2 "${KCM_EXTRA_ARGS[@]}"
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
