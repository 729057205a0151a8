# Sourced by scripts/cluster.sh (its variables and state are in scope): CRI-O as the node's runtime
# (`up --runtime crio`) instead of containerd 2.x.
# shellcheck shell=bash
#
# CRI-O (built from the Go module proxy by scripts/build/crio.sh) with Debian's conmon and runc. All
# of its state is under $CRIO_DIR: storage root and runroot (overlay), its socket, the pod namespaces
# pinned by pinns, exit files, container logs, version and shutdown files, a signature policy. It
# reads the same CNI conf and bin dirs containerd would (so install-netclaim chains netclaim into
# the conflist CRI-O runs: CRI-O takes the first conflist of the dir by name, one network per pod) and
# the cluster's NETCLAIM_CDI_DIR (cdi_spec_dirs), where the DRA driver writes. cgroupfs, conmon in the
# pod's cgroup, NRI off. The sandbox image is imported with copyimg (CRI-O's own test tool) into the
# same storage; CRI-O pins it.
# runc goes through a wrapper that edits the OCI spec the way containerd's settings here do: it raises
# process.oomScoreAdj to our own value when lower (CRI-O asks -998 for the infra container, which a host
# without CAP_SYS_RESOURCE refuses: containerd's restrict_oom_score_adj), and drops hugepage limits when
# no hugetlb cgroup hierarchy is mounted (CRI-O sets them whenever the kernel has the controller:
# containerd's tolerate_missing_hugetlb_controller).
# Not with CRI-O: --networks N > 1 (CRI-O attaches one network), --with-dranet (NRI), --multus-thick (its
# daemon mounts containerd's netns dir), up --nodes N. --with-multus (the thin plugin) works as with containerd.
# `down` also removes what CRI-O leaves outside $DIR: its host-port chains (iptables and nftables,
# made only for pods with host ports) when they were absent at `up` and no other CRI-O runs, and
# /var/lib/containers (copyimg's blob-info cache) when `up` made it.

RUNTIME=containerd    # saved in the cluster's state by `up`; the default of an older state
WANT_RUNTIME=""
CRIO_DIR="$DIR/o"     # short: the CRI-O socket lives under it

runtime_option() { # take --runtime NAME out of UP_ARGS (after parse_network_options): WANT_RUNTIME
    local rest=()
    set -- "${UP_ARGS[@]}"
    while (($#)); do
        case "$1" in
            --runtime) WANT_RUNTIME="${2:-}"; shift 2 || die "--runtime needs containerd or crio" ;;
            --runtime=*) WANT_RUNTIME="${1#--runtime=}"; shift ;;
            *) rest+=("$1"); shift ;;
        esac
    done
    UP_ARGS=("${rest[@]}")
    case "$WANT_RUNTIME" in
        ""|containerd) ;;
        crio)
            [[ " ${UP_ARGS[*]} " != *" --with-dranet "* ]] || die "--with-dranet needs containerd's NRI: not with --runtime crio"
            [[ -z "$WANT_NETWORKS" || "$WANT_NETWORKS" == 1 ]] || die "--networks $WANT_NETWORKS: CRI-O attaches one network per pod"
            [[ " ${UP_ARGS[*]} " != *" --multus-thick "* ]] || die "--multus-thick: containerd nodes only (with CRI-O: --with-multus, the thin plugin)"
            ;;
        *) die "--runtime takes containerd or crio, not '$WANT_RUNTIME'" ;;
    esac
    return 0
}

runtime_match() { # a cluster already up runs the runtime asked for
    [[ -z "$WANT_RUNTIME" || "$WANT_RUNTIME" == "${RUNTIME:-containerd}" ]] \
        || die "the cluster in $DIR runs ${RUNTIME:-containerd}; run down first"
}

runtime_socket() { if [[ "${RUNTIME:-containerd}" == crio ]]; then echo "$CRIO_DIR/crio.sock"; else echo "$CTD/containerd.sock"; fi; }

not_crio() { # not_crio COMMAND: a containerd-only command on a CRI-O node fails, saying what to use
    [[ "${RUNTIME:-containerd}" != crio ]] || die "$1: the node runs CRI-O, not containerd (use ${1/containerd/crio})"
}

crio_binaries() { # after binaries(), when `up` was asked for CRI-O: RUNTIME and the CRI-O binaries
    RUNTIME="${WANT_RUNTIME:-containerd}"
    [[ "$RUNTIME" == crio ]] || return 0
    local bins
    mapfile -t bins < <("$HERE/build/crio.sh")
    ((${#bins[@]} == 3)) || die "build/crio.sh did not print crio, copyimg and pinns"
    CRIO="${bins[0]}" COPYIMG="${bins[1]}" PINNS="${bins[2]}"
    CONMON="$(command -v conmon || true)"
    [[ -x "$CONMON" ]] || die "conmon not found (Debian package conmon)"
    VARLIB_CONTAINERS_CREATED=0; [[ -e /var/lib/containers ]] || VARLIB_CONTAINERS_CREATED=1
    CRIO_HOSTPORT_STATE="$(crio_hostport_state)"
}

save_runtime_state() {
    save_var RUNTIME
    [[ "$RUNTIME" == crio ]] || return 0
    local v
    for v in CRIO COPYIMG PINNS CONMON VARLIB_CONTAINERS_CREATED CRIO_HOSTPORT_STATE; do save_var "$v"; done
}

crio_runc_wrapper() {
    cat <<EOF
#!/bin/sh
# runc for CRI-O: never an oom_score_adj below ours (no CAP_SYS_RESOURCE), no limits of an unmounted hugetlb cgroup.
bundle=""; prev=""
for a in "\$@"; do
    case "\$prev" in --bundle|-b) bundle="\$a" ;; esac
    case "\$a" in --bundle=*) bundle="\${a#--bundle=}" ;; esac
    prev="\$a"
done
if [ -n "\$bundle" ] && [ -f "\$bundle/config.json" ]; then
    python3 -I -S - "\$bundle/config.json" <<'PY'
import json, sys
path = sys.argv[1]
own = int(open("/proc/self/oom_score_adj").read())
with open(path) as fh:
    spec = json.load(fh)
changed = False
proc = spec.get("process") or {}
if proc.get("oomScoreAdj") is not None and proc["oomScoreAdj"] < own:
    proc["oomScoreAdj"] = own
    changed = True
# CRI-O sets hugetlb limits when the kernel has the controller (/proc/cgroups), mounted or not; runc
# cannot join an unmounted v1 hierarchy. Drop them then (containerd's tolerate_missing_hugetlb_controller).
mounts = [line.split() for line in open("/proc/self/mounts")]
hugetlb = any(m[2] == "cgroup" and "hugetlb" in m[3].split(",") for m in mounts) or any(
    m[2] == "cgroup2" and m[1] == "/sys/fs/cgroup" for m in mounts)
res = (spec.get("linux") or {}).get("resources") or {}
if not hugetlb and res.get("hugepageLimits"):
    del res["hugepageLimits"]
    changed = True
if changed:
    with open(path, "w") as fh:
        json.dump(spec, fh)
PY
fi
exec $(q "$RUNC") "\$@"
EOF
}

crio_config() {
    local o="$CRIO_DIR"
    cat <<EOF
# CRI-O $("$CRIO" --version 2>/dev/null | awk '/^crio version/ {print $3}') for one netclaim test node.
[crio]
root = $(q "$o/root")
runroot = $(q "$o/run")
storage_driver = "overlay"
log_dir = $(q "$o/log")
version_file = $(q "$o/run/version")
version_file_persist = $(q "$o/version")
clean_shutdown_file = $(q "$o/clean.shutdown")

[crio.api]
listen = $(q "$o/crio.sock")
# exec, attach and port-forward: the kubelet proxies each stream to this server itself, so loopback is enough
stream_address = "127.0.0.1"
stream_port = "0"

[crio.runtime]
default_runtime = "runc"
cgroup_manager = "cgroupfs"
conmon_cgroup = "pod"
selinux = false
apparmor_profile = ""
irqbalance_config_file = ""
irqbalance_config_restore_file = ""
hooks_dir = [$(q "$o/hooks")]
cdi_spec_dirs = [$(q "$CDI_DIR")]
container_exits_dir = $(q "$o/exits")
container_attach_socket_dir = $(q "$o/attach")
namespaces_dir = $(q "$o/ns")
pinns_path = $(q "$PINNS")
enable_criu_support = false
decryption_keys_path = $(q "$o/keys")
log_level = "info"

[crio.runtime.runtimes.runc]
runtime_path = $(q "$o/bin/runc")
runtime_type = "oci"
runtime_root = $(q "$o/runc")
monitor_path = $(q "$CONMON")
monitor_cgroup = "pod"

[crio.image]
pause_image = $(q "$SANDBOX_IMAGE")
pause_command = "/pause"
pinned_images = [$(q "$SANDBOX_IMAGE")]
signature_policy = $(q "$o/policy.json")
signature_policy_dir = $(q "$o/policies")
namespaced_auth_dir = $(q "$o/auth")

[crio.network]
network_dir = $(q "$CNI_CONF")
plugin_dirs = [$(q "$CNI_BIN")]

[crio.metrics]
enable_metrics = false

[crio.nri]
enable_nri = false
nri_listen = $(q "$o/nri.sock")
nri_plugin_dir = $(q "$o/nri/plugins")
nri_plugin_config_dir = $(q "$o/nri/conf")
EOF
}

crio_answers() { "$CRICTL" --config /dev/null --runtime-endpoint "unix://$CRIO_DIR/crio.sock" --timeout 5s version; }

start_crio() {
    mkdir -p "$CRIO_DIR"/{root,run,log,hooks,exits,attach,ns,keys,runc,bin,policies,auth,nri/plugins,nri/conf}
    chmod 700 "$CRIO_DIR"
    echo '{"default": [{"type": "insecureAcceptAnything"}]}' >"$CRIO_DIR/policy.json"
    crio_runc_wrapper >"$CRIO_DIR/bin/runc" && chmod 755 "$CRIO_DIR/bin/runc"
    crio_config >"$CRIO_DIR/crio.conf"
    mkdir -p "$CRIO_DIR/conf.d"
    log "starting CRI-O $("$CRIO" --version 2>/dev/null | awk '/^crio version/ {print $3}')"
    start crio "$CRIO" --config "$CRIO_DIR/crio.conf" --config-dir "$CRIO_DIR/conf.d"
    WATCH=crio wait_for 60 "CRI-O's socket" crio_answers
}

stop_crio() { # for down: every sandbox removed (CNI DEL), CRI-O stopped, conmons of our containers gone
    if alive "$DIR/crio.pid"; then
        timeout 60 "$CRICTL" --config /dev/null --runtime-endpoint "unix://$CRIO_DIR/crio.sock" rmp -fa >/dev/null 2>&1 || true
    fi
    stop_pid crio
    local pid i
    # conmon outlives CRI-O by design; ours are the ones whose exit dir is ours.
    for pid in $(pgrep -f "conmon .*--exit-dir $CRIO_DIR/exits( |$)" || true); do
        kill -TERM "$pid" 2>/dev/null || true
        for i in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$pid" 2>/dev/null || true
    done
    forget_cni_cache "$CRIO_DIR/"
}

crio_hostport_state() { # which of CRI-O's host-port chains and tables exist now (iptables nat, nftables)
    local c
    for c in KUBE-HOSTPORTS CRIO-HOSTPORTS-MASQ; do
        iptables -w -t nat -S "$c" >/dev/null 2>&1 && printf 'ipt:%s ' "$c"
        ip6tables -w -t nat -S "$c" >/dev/null 2>&1 && printf 'ip6t:%s ' "$c"
    done
    for c in ip ip6; do
        nft list table "$c" crio-hostports >/dev/null 2>&1 && printf 'nft:%s ' "$c"
    done
    return 0
}

crio_down_host() { # what CRI-O and copyimg left outside $DIR, when this cluster made it
    [[ "${RUNTIME:-containerd}" == crio ]] || return 0
    running_on_host crio && return 0  # another CRI-O: host-wide chains and caches it may use must stay
    local s tool table chain
    for s in $(crio_hostport_state); do
        [[ " ${CRIO_HOSTPORT_STATE:-} " == *" $s "* ]] && continue
        case "$s" in
            ipt:*|ip6t:*)
                tool=iptables; [[ "$s" == ip6t:* ]] && tool=ip6tables
                chain="${s#*:}"
                # the jumps into it first (from the nat table's system chains), then the chain
                "$tool" -w -t nat -S | grep -e "-j $chain\$" | sed 's/^-A/-D/' | while read -r rule; do
                    xargs "$tool" -w -t nat <<<"$rule" 2>/dev/null || true   # xargs: the rule's quoted comment
                done
                "$tool" -w -t nat -F "$chain" 2>/dev/null || true
                "$tool" -w -t nat -X "$chain" 2>/dev/null || true
                # a sandbox torn down without CRI-O leaves its own chains (KUBE-HP-<hash>, CRIO-MASQ-<hash>)
                for chain in $("$tool" -w -t nat -S | sed -n 's/^-N \(KUBE-HP-[A-Z0-9]*\|CRIO-MASQ-[A-Z0-9]*\)$/\1/p'); do
                    "$tool" -w -t nat -F "$chain" 2>/dev/null || true
                    "$tool" -w -t nat -X "$chain" 2>/dev/null || true
                done ;;
            nft:*) table="${s#nft:}"; nft delete table "$table" crio-hostports 2>/dev/null || true ;;
        esac
    done
    if [[ "${VARLIB_CONTAINERS_CREATED:-0}" == 1 ]]; then rm -rf /var/lib/containers; fi
    return 0
}

crio_import_image() { # crio_import_image FILE: an OCI or docker archive into CRI-O's storage, under its names
    local refs transport name
    refs="$(python3 - "$1" <<'PY'
import json, sys, tarfile
path = sys.argv[1]
try:
    tar = tarfile.open(path)
except (OSError, tarfile.TarError) as exc:
    sys.exit(f"{path}: not an image archive ({exc.__class__.__name__})")
with tar:
    # a member by its name in the layout: `tar -C DIR -cf FILE .` (scripts/build-image.sh) stores ./index.json
    names = {n[2:] if n.startswith("./") else n: n for n in tar.getnames()}
    if "index.json" in names:
        manifests = json.load(tar.extractfile(names["index.json"])).get("manifests") or []
        for i, m in enumerate(manifests):
            ann = m.get("annotations") or {}
            # oci-archive:FILE[:REF] picks one manifest of the index (by its ref name, or @INDEX)
            ref = "" if len(manifests) == 1 else ":" + (ann.get("org.opencontainers.image.ref.name") or f"@{i}")
            print(f"oci-archive:{path}{ref}", ann.get("io.containerd.image.name") or "-")
    elif "manifest.json" in names:
        for i, m in enumerate(json.load(tar.extractfile(names["manifest.json"]))):
            for tag in m.get("RepoTags") or ["-"]:
                print(f"docker-archive:{path}:@{i}", tag)
    else:
        sys.exit(f"{path}: neither an OCI nor a docker image archive")
PY
    )" || die "cannot read the image names of $1"
    while read -r transport name; do
        [[ "$name" != - ]] || die "$1 names no image (io.containerd.image.name / RepoTags)"
        "$COPYIMG" --root "$CRIO_DIR/root" --runroot "$CRIO_DIR/run" --storage-driver overlay \
            --signature-policy "$CRIO_DIR/policy.json" --image-name "$name" --import-from "$transport" >&2 \
            || die "copyimg could not import $name from $1"
    done <<<"$refs"
}

cmd_crio_start() {
    load_state
    [[ "${RUNTIME:-containerd}" == crio ]] || die "crio-start: the node runs ${RUNTIME:-containerd}, not CRI-O"
    alive "$DIR/crio.pid" && return 0
    start_crio
}

crio_env() {
    printf 'export NETCLAIM_RUNTIME=%q\n' "${RUNTIME:-containerd}"
    [[ "${RUNTIME:-containerd}" == crio ]] || return 0
    printf 'export NETCLAIM_CRIO_ADDRESS=%q\n' "$CRIO_DIR/crio.sock"
    printf 'export NETCLAIM_CRIO_DIR=%q\n' "$CRIO_DIR"
}
