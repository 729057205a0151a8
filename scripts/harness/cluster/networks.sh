# Sourced by scripts/cluster.sh (its variables and state are in scope): the node's pod networks beyond the
# default one network: `up --networks N` (containerd's own multi-network, no Multus) and `up --dual-stack`.
# shellcheck shell=bash
#
# --networks N (1..4): containerd's CRI attaches a pod to the first N conflists of its conf dir, by
#   file name, with interfaces eth0, eth1, ... in that order (max_conf_num = N), and reports only
#   eth0's addresses as the pod's IPs. Network 0 is the primary conflist (10-<id>.conflist);
#   network i is 1<i>-<id>.conflist: its own bridge ncb<i>-<id>, its own IPv4 /24 and no
#   routes (eth0 keeps the default route). With N > 1, install-netclaim chains netclaim into every
#   one of them, each entry with its own claim request: `nic` for eth0, `nic<i>` for eth<i>.
# --dual-stack: the primary network gets an IPv6 range besides its IPv4 one (host-local, a ULA /64
#   derived from the cluster's directory and its IPv4 subnet) and a default route for each family;
#   the pod's eth0 then has both, and so has its claim's networkData.ips. The bridge plugin turns
#   on IPv6 forwarding (net.ipv6.conf.all.forwarding) as it does IPv4 forwarding: `down` puts it
#   back when `up` found it off and no other test bridge still carries IPv6.
# Pod IPs need nothing from the control plane: no dual-stack service CIDR (no Services are used).

NETWORKS=1            # saved in the cluster's state by `up`; these are the defaults of an older state
DUAL_STACK=0
SUBNET6=""
EXTRA_SUBNETS=""      # the IPv4 /24 of networks 1..N-1, in order
IPV6_FORWARDING=""    # the host's net.ipv6.conf.all.forwarding before `up` (dual-stack only)
WANT_NETWORKS=""      # what `up` was asked for
WANT_DUAL_STACK=""

parse_network_options() { # the options of `up` about networks; the others are left in UP_ARGS for cmd_up
    UP_ARGS=()
    while (($#)); do
        case "$1" in
            --networks) WANT_NETWORKS="${2:-}"; shift 2 || die "--networks needs a number" ;;
            --networks=*) WANT_NETWORKS="${1#--networks=}"; shift ;;
            --dual-stack) WANT_DUAL_STACK=1; shift ;;
            *) UP_ARGS+=("$1"); shift ;;
        esac
    done
    [[ -z "$WANT_NETWORKS" || "$WANT_NETWORKS" =~ ^[1-4]$ ]] || die "--networks takes 1 to 4"
    return 0
}

networks_match() { # a cluster already up: asked-for options that differ are an error, not a silent reuse
    local want_n="${WANT_NETWORKS:-$NETWORKS}" want_d="${WANT_DUAL_STACK:-$DUAL_STACK}"
    [[ "$want_n" == "$NETWORKS" && "$want_d" == "$DUAL_STACK" ]] \
        || die "the cluster in $DIR runs with --networks $NETWORKS$( ((DUAL_STACK)) && echo ' --dual-stack'); run down first"
}

network_bridge() { if (($1 == 0)); then echo "$BRIDGE"; else echo "ncb$1-$ID"; fi; }
network_conflist() { if (($1 == 0)); then echo "$CONFLIST"; else echo "$CNI_CONF/1$1-$ID.conflist"; fi; }
network_name() { if (($1 == 0)); then echo "$NETNAME"; else echo "$NETNAME-net$1"; fi; }
network_request() { if (($1 == 0)); then echo nic; else echo "nic$1"; fi; }
network_subnet() { # network_subnet I: network I's IPv4 /24
    local extra
    read -r -a extra <<<"$EXTRA_SUBNETS"
    if (($1 == 0)); then echo "$SUBNET"; else echo "${extra[$(($1 - 1))]}"; fi
}

pick_network_subnets() { # after pick_subnet: the other networks' /24s and, dual-stack, the IPv6 /64
    NETWORKS="${WANT_NETWORKS:-1}"
    DUAL_STACK="${WANT_DUAL_STACK:-0}"
    local routed taken="$SUBNET" a b i j s
    routed="$(ip -4 route show | awk '{print $1}')"
    a="${SUBNET#10.}"; a="${a%%.*}"
    b=$((0x${ID:2:2}))
    EXTRA_SUBNETS=""
    for ((i = 1; i < NETWORKS; i++)); do
        for j in $(seq 128 383); do  # the other half of the cluster's /16, away from its neighbours' primaries
            s="10.$a.$(((b + j) % 256)).0/24"
            grep -qxF "$s" <<<"$routed" || [[ " $taken " == *" $s "* ]] || break
        done
        taken+=" $s"
        EXTRA_SUBNETS="${EXTRA_SUBNETS:+$EXTRA_SUBNETS }$s"
    done
    SUBNET6=""
    if ((DUAL_STACK)); then
        # A ULA /64: the global ID from the directory's hash and "nc", the subnet ID from the IPv4 /24.
        local third="${SUBNET#10.*.}"; third="${third%%.*}"
        SUBNET6="fd${ID:0:2}:${ID:2:4}:6e63:$(printf '%x' "$third")::/64"
        ! ip -6 route show | awk '{print $1}' | grep -qxF "$SUBNET6" || die "$SUBNET6 is routed on this host already"
        IPV6_FORWARDING="$(sysctl -n net.ipv6.conf.all.forwarding)"
    fi
    return 0
}

save_network_state() {
    local v
    for v in NETWORKS DUAL_STACK SUBNET6 EXTRA_SUBNETS IPV6_FORWARDING; do save_var "$v"; done
}

primary_ranges() { # primary_ranges GATEWAY4: host-local's ranges, one per family
    if ((DUAL_STACK)); then
        printf '[[{"subnet": "%s", "gateway": "%s"}], [{"subnet": "%s", "gateway": "%s"}]]' \
            "$SUBNET" "$1" "$SUBNET6" "${SUBNET6%::/64}::1"
    else
        printf '[[{"subnet": "%s", "gateway": "%s"}]]' "$SUBNET" "$1"
    fi
}

primary_routes() {
    if ((DUAL_STACK)); then printf '[{"dst": "0.0.0.0/0"}, {"dst": "::/0"}]'; else printf '[{"dst": "0.0.0.0/0"}]'; fi
}

extra_conflist() { # extra_conflist I: network I's own bridge and IPv4 /24; no route, eth0 keeps the default
    local subnet
    subnet="$(network_subnet "$1")"
    cat <<EOF
{
  "cniVersion": "1.1.0",
  "name": "$(network_name "$1")",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "$(network_bridge "$1")",
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "dataDir": "$DIR/cni/ipam",
        "ranges": [[{"subnet": "$subnet", "gateway": "${subnet%.0/24}.1"}]]
      }
    }
  ]
}
EOF
}

write_extra_conflists() {
    local i f
    for ((i = 1; i < NETWORKS; i++)); do
        f="$(network_conflist "$i")"
        [[ -f "$f" ]] || { extra_conflist "$i" >"$f.tmp" && mv "$f.tmp" "$f"; }
    done
}

netclaim_request_args() { # netclaim_request_args I: install.sh's --request for network I (none with one network)
    REQUEST_ARGS=()
    if [[ "$1" == 0 && -n "${NETCLAIM_REQUEST:-}" ]]; then REQUEST_ARGS=(--request "$NETCLAIM_REQUEST")  # Multus's eth0
    elif ((NETWORKS > 1)); then REQUEST_ARGS=(--request "$(network_request "$1")"); fi
    return 0
}

install_netclaim_networks() { # chain netclaim into networks 1..N-1, each entry with its own request
    local i f
    for ((i = 1; i < NETWORKS; i++)); do
        f="$(network_conflist "$i")"
        grep -q '"netclaim"' "$f" && continue
        netclaim_request_args "$i"
        "$HERE/install.sh" --cni-bin-dir "$CNI_BIN" --conflist "$f" --driver-name "$DRIVER" \
            "${REQUEST_ARGS[@]}" --socket "$NC/publisher.sock" --spool-dir "$NC/spool" --state-dir "$NC/state" \
            --log-file "$NC/plugin.log" --drivers-file "$NC/drivers" --python "$PY"
    done
}

uninstall_netclaim_networks() {
    local i f
    for ((i = 1; i < NETWORKS; i++)); do
        f="$(network_conflist "$i")"
        grep -q '"netclaim"' "$f" 2>/dev/null || continue
        "$HERE/install.sh" --uninstall --cni-bin-dir "$CNI_BIN" --conflist "$f" --drivers-file "$NC/drivers"
    done
}

remove_networks() { # down: the other networks' bridges; IPv6 forwarding as `up` found it
    local i
    for ((i = 1; i < ${NETWORKS:-1}; i++)); do ip link delete "$(network_bridge "$i")" type bridge 2>/dev/null || true; done
    if [[ "${IPV6_FORWARDING:-}" == 0 ]] && ! ip -6 -o addr show scope global 2>/dev/null | awk '{print $2}' | grep -q '^ncb'; then
        sysctl -qw net.ipv6.conf.all.forwarding=0 >/dev/null || true
    fi
    return 0
}

network_summary() {
    local s="pod subnet $SUBNET${SUBNET6:+ and $SUBNET6}" i
    for ((i = 1; i < NETWORKS; i++)); do s+=", eth$i on $(network_subnet "$i")"; done
    echo "$s"
}

network_env() { # cmd_env's lines for the networks: NETCLAIM_NETWORKS, NETCLAIM_NET<i>_*, NETCLAIM_SUBNET6
    local i
    printf 'export NETCLAIM_NETWORKS=%q\n' "$NETWORKS"
    printf 'export NETCLAIM_DUAL_STACK=%q\n' "$DUAL_STACK"
    printf 'export NETCLAIM_SUBNET6=%q\n' "$SUBNET6"
    for ((i = 0; i < NETWORKS; i++)); do
        printf 'export NETCLAIM_NET%d_CONFLIST=%q\n' "$i" "$(network_conflist "$i")"
        printf 'export NETCLAIM_NET%d_NAME=%q\n' "$i" "$(network_name "$i")"
        printf 'export NETCLAIM_NET%d_BRIDGE=%q\n' "$i" "$(network_bridge "$i")"
        printf 'export NETCLAIM_NET%d_SUBNET=%q\n' "$i" "$(network_subnet "$i")"
        if ((NETWORKS > 1)); then printf 'export NETCLAIM_NET%d_REQUEST=%q\n' "$i" "$(network_request "$i")"; fi
    done
}
