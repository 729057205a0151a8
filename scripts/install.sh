#!/usr/bin/env bash
# Install (or remove) the netclaim CNI plugin on one node.
#
#   scripts/install.sh --conflist FILE --driver-name NAME [options]   install or update
#   scripts/install.sh --conflist FILE --uninstall [--cni-bin-dir DIR] [--log-file FILE] [--drivers-file FILE]   remove again
#
# Several networks (containerd's own multi-network: max_conf_num > 1, one conflist per interface
# eth0, eth1, ...): run the installer once per conflist, each with its own --driver-name and
# --request; --uninstall removes the plugin executable (and --log-file) only with the last
# netclaim entry left in that conflist's directory. The publisher learns every driver from the
# drivers file (below): each install writes its conflist's line, each --uninstall drops it.
#   scripts/install.sh --print [options]                              show the plugin and the entry
#
# Options:
#   --cni-bin-dir DIR      where the runtime looks for plugins (default /opt/cni/bin)
#   --conflist FILE        the conflist to chain netclaim into (required unless --print)
#   --driver-name NAME     the DRA driver whose devices netclaim reports (required to install)
#   --request NAME         the claim's request name that selects the device
#   --extended-resource-name NAME
#                          the DRA extended resource this network's interface is (e.g. example.com/nic),
#                          for pods that ask for it in their containers' resources instead of a claim
#   --socket PATH          the publisher's socket (plugin default /run/netclaim/publisher.sock)
#   --spool-dir DIR        where the plugin spools events while the publisher is down
#   --state-dir DIR        the publisher's state directory (created 0700)
#   --log-file FILE        the plugin's log file (JSON lines, rotated to FILE.1 at 1 MiB; default:
#                          none); with --uninstall, FILE and FILE.1 are removed
#   --drivers-file FILE    where the publisher reads netclaim's drivers (default /etc/netclaim/drivers,
#                          what the systemd unit passes it, or $NETCLAIM_DRIVERS_FILE): one line
#                          `DRIVER CONFLIST` per conflist installed; --uninstall drops that conflist's
#                          line (give it the same FILE) and the file with its last line
#   --failure-policy P     Ignore (default: a pod never fails because of netclaim) or Fail
#   --bundle FILE          the self-contained plugin executable to install (default: `netclaim`
#                          beside this script or in ../bin (the image's /opt/netclaim/bin), else
#                          what scripts/build-plugin.sh builds from this checkout)
#   --python PATH          interpreter for this installer's conflist editor only (default: the
#                          image's venv, this checkout's .venv, else python3); the plugin needs none
#   --host-root DIR        the node's root file system is mounted at DIR (an init container):
#                          every path above is the node's path; files are written under DIR
#   --uninstall            remove the netclaim entry (restoring the original file) and the plugin
#   --print                print what would be installed and the entry without touching anything
#
# Platforms: x86_64 and aarch64 (arm64) nodes, each with its own build of the plugin
# (scripts/build-plugin.sh [--arch arm64]; the image's linux/amd64 and linux/arm64 variants).
# On any other node (`uname -m`), or with a plugin built for the other machine, the
# install stops with one line before anything is written. Tests only:
# NETCLAIM_NODE_MACHINE=NAME stands in for `uname -m`.
#
# DIR/netclaim is one fully static executable (scripts/build-plugin.sh): the
# Python package cni_plugin/ frozen into an embedded interpreter. It needs no
# Python, no shared library and no file on the node, and points at nothing
# (no source checkout). It is written atomically (temp file + rename, 0755), so
# a runtime starting the plugin meanwhile runs either the old or the new one.
# The conflist is edited by conflist_edit.py (atomic write, backup of the
# original, refuses what it cannot parse). A single-plugin NAME.conf is
# converted to NAME.conflist the way the runtime reads it; --uninstall with the
# same --conflist puts NAME.conf back byte for byte.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# The conflist editor: scripts/operator/ in the source tree, beside this script in a flat install kit.
EDITOR_PY="$HERE/operator/conflist_edit.py"
[[ -f "$EDITOR_PY" ]] || EDITOR_PY="$HERE/conflist_edit.py"

CNI_BIN_DIR=/opt/cni/bin
CONFLIST=""
DRIVER_NAME=""
REQUEST=""
EXTENDED_RESOURCE_NAME=""
SOCKET=""
SPOOL_DIR=""
STATE_DIR=""
LOG_FILE=""
DRIVERS_FILE="${NETCLAIM_DRIVERS_FILE:-/etc/netclaim/drivers}"
FAILURE_POLICY=""
BUNDLE=""
PYTHON=""
HOST_ROOT=""
ACTION=install

log() { printf '[install] %s\n' "$*" >&2; }
die() { printf '[install] error: %s\n' "$*" >&2; exit 2; }

usage() { sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed -e '$d' -e 's/^# \{0,1\}//'; }

parse_args() {
    while (($#)); do
        case "$1" in
            --cni-bin-dir) CNI_BIN_DIR="${2:?--cni-bin-dir needs a value}"; shift 2 ;;
            --conflist) CONFLIST="${2:?--conflist needs a value}"; shift 2 ;;
            --driver-name) DRIVER_NAME="${2:?--driver-name needs a value}"; shift 2 ;;
            --request) REQUEST="${2:?--request needs a value}"; shift 2 ;;
            --extended-resource-name) EXTENDED_RESOURCE_NAME="${2:?--extended-resource-name needs a value}"; shift 2 ;;
            --socket) SOCKET="${2:?--socket needs a value}"; shift 2 ;;
            --spool-dir) SPOOL_DIR="${2:?--spool-dir needs a value}"; shift 2 ;;
            --state-dir) STATE_DIR="${2:?--state-dir needs a value}"; shift 2 ;;
            --log-file) LOG_FILE="${2:?--log-file needs a value}"; shift 2 ;;
            --drivers-file) DRIVERS_FILE="${2:?--drivers-file needs a value}"; shift 2 ;;
            --failure-policy) FAILURE_POLICY="${2:?--failure-policy needs a value}"; shift 2 ;;
            --bundle) BUNDLE="${2:?--bundle needs a value}"; shift 2 ;;
            --python) PYTHON="${2:?--python needs a value}"; shift 2 ;;
            --plugin-path) log "--plugin-path is ignored: the plugin is a self-contained executable"; shift 2 ;;
            --host-root) HOST_ROOT="${2:?--host-root needs a value}"; shift 2 ;;
            --uninstall) ACTION=uninstall; shift ;;
            --print) ACTION=print; shift ;;
            -h|--help) usage; exit 0 ;;
            *) die "unknown argument: $1 (see --help)" ;;
        esac
    done
    case "$FAILURE_POLICY" in ""|Ignore|Fail) ;; *) die "--failure-policy must be Ignore or Fail" ;; esac
    if [[ -n "$HOST_ROOT" && -n "$PYTHON" && ! -x "$PYTHON" ]]; then
        # Older DaemonSets passed the node's interpreter here; the plugin needs none.
        log "--python $PYTHON is ignored: not an interpreter of this installer"
        PYTHON=""
    fi
    if [[ "$ACTION" != print && -z "$CONFLIST" ]]; then die "--conflist is required"; fi
    if [[ "$ACTION" != uninstall && -z "$DRIVER_NAME" ]]; then die "--driver-name is required"; fi
    return 0
}

# The one place that decides what the runtime executes: the self-contained
# plugin. An explicit --bundle wins; an install kit (the image) carries it
# beside this script or in ../bin; a source checkout builds it (cached) with
# build-plugin.sh.
resolve_bundle() {
    check_node
    if [[ -z "$BUNDLE" ]]; then
        if [[ -f "$HERE/netclaim" ]]; then
            BUNDLE="$HERE/netclaim"
        elif [[ -f "$HERE/../bin/netclaim" ]]; then
            BUNDLE="$HERE/../bin/netclaim"
        elif [[ -x "$HERE/build-plugin.sh" ]]; then
            BUNDLE="$("$HERE/build-plugin.sh")" || die "scripts/build-plugin.sh failed"
        else
            die "no plugin executable: pass --bundle FILE"
        fi
    fi
    [[ -f "$BUNDLE" && -x "$BUNDLE" ]] || die "plugin executable $BUNDLE not found or not executable (use --bundle)"
    check_machine
    # It must answer as a CNI plugin here, with nothing from this environment.
    local answer
    answer="$(printf '{}' | env -i CNI_COMMAND=VERSION "$BUNDLE" 2>/dev/null)" || true
    [[ "$answer" == *'"supportedVersions"'* ]] || die "$BUNDLE does not answer VERSION as a CNI plugin"
    local why
    why="$("$(editor_python)" -I -S -c "$STATIC_CHECK" "$BUNDLE")" || die "$BUNDLE is not a static executable: $why"
}

# The node's machine and the ELF e_machine of the plugin built for it.
node_machine() { printf '%s' "${NETCLAIM_NODE_MACHINE:-$(uname -m)}"; }
elf_machine_of() {
    case "$1" in x86_64) echo 62 ;; aarch64) echo 183 ;; *) echo "" ;; esac
}

# Before the plugin is built, run or written: a node that is neither x86_64
# nor aarch64, or a plugin built for the other one, is refused with one line.
check_node() {
    local machine
    machine="$(node_machine)"
    [[ -n "$(elf_machine_of "$machine")" ]] \
        || die "this node is $machine; the netclaim plugin is built for x86_64 and aarch64 nodes only"
}
check_machine() {
    local machine want got name how
    machine="$(node_machine)"
    want="$(elf_machine_of "$machine")"
    [[ "$(od -An -c -N 4 "$BUNDLE" | tr -d ' ')" == '177ELF' ]] || return 0  # not an ELF: the static check says so
    got="$(od -An -t u2 -j 18 -N 2 --endian=little "$BUNDLE" | tr -d ' ')"
    [[ "$got" != "$want" ]] || return 0
    case "$got" in 62) name=x86_64 ;; 183) name=aarch64 ;; *) name="ELF machine $got" ;; esac
    how="scripts/build-plugin.sh or the image's linux/amd64"
    [[ "$machine" == aarch64 ]] && how="scripts/build-plugin.sh --arch arm64 or the image's linux/arm64"
    die "$BUNDLE is built for $name, but this node is $machine: install the $machine build ($how)"
}

# A script needs an interpreter and a dynamic ELF a loader and libraries from
# the node: only an ELF without a program interpreter (PT_INTERP) runs anywhere.
STATIC_CHECK='import struct, sys
data = open(sys.argv[1], "rb").read(1 << 16)
if data[:4] != b"\x7fELF" or data[4] != 2:
    print("not a 64-bit ELF executable (a script?)"); sys.exit(1)
phoff, = struct.unpack_from("<Q", data, 32)
entsize, count = struct.unpack_from("<HH", data, 54)
if any(struct.unpack_from("<I", data, phoff + i * entsize)[0] == 3 for i in range(count)):
    print("dynamically linked (it has a program interpreter)"); sys.exit(1)'

# The plugin config fields, as conflist_edit.py --set pairs (empty ones are dropped).
entry_args() {
    ENTRY_ARGS=(
        --set "driverName=$DRIVER_NAME"
        --set "request=$REQUEST"
        --set "extendedResourceName=$EXTENDED_RESOURCE_NAME"
        --set "socketPath=$SOCKET"
        --set "spoolDir=$SPOOL_DIR"
        --set "failurePolicy=$FAILURE_POLICY"
        --set "logFile=$LOG_FILE"
    )
}

# The conflist editor is part of the installer, not of the plugin: it runs
# where this script runs (the image's venv, this checkout's .venv, else python3).
editor_python() {
    local candidate
    if [[ -z "$PYTHON" ]]; then
        for candidate in "$HERE/../venv/bin/python" "$HERE/../.venv/bin/python" python3; do
            if command -v "$candidate" >/dev/null 2>&1; then PYTHON="$candidate"; break; fi
        done
    fi
    command -v "$PYTHON" >/dev/null 2>&1 || die "interpreter ${PYTHON:-python3} for the conflist editor not found (use --python)"
    printf '%s' "$PYTHON"
}

# host PATH: where the node's PATH is, as seen by this script.
host() { printf '%s%s' "$HOST_ROOT" "$1"; }

# Private directories: the socket dir and the spool hold what pods' networking
# looks like and accept events, so only root may enter them.
make_private_dir() {
    [[ -n "$1" ]] || return 0
    mkdir -p "$(host "$1")"
    chmod 0700 "$(host "$1")"
}

# Temp file in the target directory + rename: a runtime exec'ing the plugin
# meanwhile sees the old or the new file, never a partial one.
write_plugin() {
    local dir target tmp
    dir="$(host "$CNI_BIN_DIR")"
    target="$dir/netclaim"
    mkdir -p "$dir"
    tmp="$(mktemp "$dir/.netclaim.XXXXXX")"
    if ! cp "$BUNDLE" "$tmp" || ! chmod 0755 "$tmp"; then
        rm -f "$tmp"
        die "cannot write $target"
    fi
    mv -f "$tmp" "$target"
    log "plugin $target (self-contained, $(wc -c <"$target") bytes)"
}

# The conflist as the drivers file names it: the node's absolute path of the file the runtime reads
# (a NAME.conf the install converts is NAME.conflist), so install and --uninstall find the same line.
conflist_key() {
    local path="$CONFLIST"
    [[ "$path" == /* ]] || path="$PWD/$path"
    [[ "$path" == *.conf ]] && path="${path%.conf}.conflist"
    printf '%s' "$path"
}

# The drivers file: one `DRIVER CONFLIST` line per conflist netclaim is chained into, the
# publisher's only source of its driver names on this install (its unchained check is off
# without one). record_driver DRIVER sets this conflist's line, record_driver "" drops it; the
# other lines stay (several networks, several drivers); the file goes with its last line.
# Written as a temp file + rename: the publisher, which reads it when it changes, sees all or nothing.
# Two installs at once (one per network, from a configuration tool) take turns on the file's
# directory, so neither loses the other's line.
record_driver() {
    local file dir
    file="$(host "$DRIVERS_FILE")"
    dir="$(dirname "$file")"
    [[ -f "$file" || -n "$1" ]] || return 0
    if [[ ! -d "$dir" ]]; then mkdir -p "$dir" && chmod 0700 "$dir"; fi  # the unit's ConfigurationDirectoryMode
    ( flock 9 && rewrite_drivers "$file" "$1" ) 9<"$dir"
}

rewrite_drivers() {
    local file="$1" dir key tmp line name rest
    dir="$(dirname "$file")"
    key="$(conflist_key)"
    tmp="$(mktemp "$dir/.drivers.XXXXXX")"
    {
        if [[ -f "$file" ]]; then
            while IFS= read -r line || [[ -n "$line" ]]; do
                read -r name rest <<<"$line"
                [[ -n "$name" && "$name" != \#* && "$rest" == "$key" ]] || printf '%s\n' "$line"
            done <"$file"
        else
            printf '# netclaim: the DRA driver of each conflist scripts/install.sh chained netclaim into, one\n'
            printf '# `DRIVER CONFLIST` line each; netclaim-publisher reports claimed pods of these drivers that\n'
            printf '# started without netclaim in their chain (--drivers-file). --uninstall drops a line.\n'
        fi
        [[ -z "$2" ]] || printf '%s %s\n' "$2" "$key"
    } >"$tmp" || { rm -f "$tmp"; die "cannot write $DRIVERS_FILE"; }
    if ! grep -qv -e '^[[:space:]]*#' -e '^[[:space:]]*$' "$tmp"; then
        rm -f "$tmp" "$file"
        log "no netclaim driver left: $DRIVERS_FILE removed"
        return 0
    fi
    chmod 0644 "$tmp"
    mv -f "$tmp" "$file"
}

do_install() {
    editor_python >/dev/null
    resolve_bundle
    local converted="${CONFLIST%.*}.conflist" outcome
    if [[ ! -f "$(host "$CONFLIST")" ]] && ! [[ -f "$(host "$CONFLIST").netclaim.bak" && -f "$(host "$converted")" ]]; then
        die "conflist $CONFLIST not found"
    fi
    # Edit the conflist first: if it is refused, nothing else has changed.
    entry_args
    outcome="$("$(editor_python)" "$EDITOR_PY" install --conflist "$(host "$CONFLIST")" "${ENTRY_ARGS[@]}")" \
        || die "conflist $CONFLIST was not changed"
    if [[ "$outcome" == *'"outcome": "converted"'* ]]; then
        # A single-plugin .conf: the runtime reads it as a one-plugin conflist, so that is what it
        # becomes (same sort position); --uninstall --conflist $CONFLIST gives the original back.
        log "converted the single-plugin $CONFLIST to $converted (original kept for --uninstall)"
    fi
    write_plugin
    [[ -n "$SOCKET" ]] && make_private_dir "$(dirname "$SOCKET")"
    make_private_dir "$SPOOL_DIR"
    make_private_dir "$STATE_DIR"
    record_driver "$DRIVER_NAME"
    log "netclaim chained last in $CONFLIST (driver $DRIVER_NAME, recorded for the publisher in $DRIVERS_FILE)"
}

do_uninstall() {
    "$(editor_python)" "$EDITOR_PY" uninstall --conflist "$(host "$CONFLIST")" >/dev/null \
        || die "conflist $CONFLIST was not changed"
    record_driver ""  # this conflist's driver only: another network's stays the publisher's
    # Several networks (containerd's max_conf_num > 1) each chain netclaim: the executable and
    # its log stay until the last entry in the conf dir is gone.
    local others
    others="$("$(editor_python)" "$EDITOR_PY" chained --dir "$(dirname "$(host "$CONFLIST")")")" \
        || die "cannot read $(dirname "$CONFLIST")"
    if [[ -n "$others" ]]; then
        log "netclaim removed from $CONFLIST; the plugin stays for $(wc -l <<<"$others") other conflist(s) of that dir"
        return 0
    fi
    rm -f "$(host "$CNI_BIN_DIR")/netclaim"
    # The plugin's log and its one rotated generation (cni_plugin/log.py), when named.
    if [[ -n "$LOG_FILE" ]]; then rm -f -- "$(host "$LOG_FILE")" "$(host "$LOG_FILE").1"; fi
    log "netclaim removed from $CONFLIST and $CNI_BIN_DIR"
}

do_print() {
    resolve_bundle
    printf '# %s/netclaim <- %s (%s bytes, sha256 %s)\n' "$CNI_BIN_DIR" "$BUNDLE" "$(wc -c <"$BUNDLE")" \
        "$(sha256sum "$BUNDLE" | cut -c1-16)"
    printf '# conflist entry\n'
    entry_args
    "$(editor_python)" "$EDITOR_PY" entry "${ENTRY_ARGS[@]}"
}

parse_args "$@"
case "$ACTION" in
    install) do_install ;;
    uninstall) do_uninstall ;;
    print) do_print ;;
esac
