#!/usr/bin/env bash
# Install (or remove) the netclaim CNI plugin on one node.
#
#   scripts/install.sh --conflist FILE --driver-name NAME [options]   install or update
#   scripts/install.sh --conflist FILE --uninstall [--cni-bin-dir DIR] remove again
#   scripts/install.sh --print [options]                              show the entry and launcher
#
# Options:
#   --cni-bin-dir DIR      where the runtime looks for plugins (default /opt/cni/bin)
#   --conflist FILE        the conflist to chain netclaim into (required unless --print)
#   --driver-name NAME     the DRA driver whose devices netclaim reports (required to install)
#   --request NAME         the claim's request name that selects the device
#   --socket PATH          the publisher's socket (plugin default /run/netclaim/publisher.sock)
#   --spool-dir DIR        where the plugin spools events while the publisher is down
#   --state-dir DIR        the publisher's state directory (created 0700)
#   --log-file FILE        the plugin's log file (JSON lines)
#   --failure-policy P     Ignore (default: a pod never fails because of netclaim) or Fail
#   --python PATH          interpreter that can import the netclaim package
#                          (default: the repository's .venv/bin/python)
#   --plugin-path DIR      the directory holding the cni_plugin package (stdlib only), put first
#                          on the plugin's sys.path (default: this checkout)
#   --host-root DIR        the node's root file system is mounted at DIR (an init container):
#                          every path above is the node's path; files are written under DIR and
#                          the interpreter is checked for presence only (it cannot run here)
#   --uninstall            remove the netclaim entry (restoring the original file) and the launcher
#   --print                print the launcher and the entry without touching anything
#
# The launcher DIR/netclaim is a small Python script with a `#!PYTHON -IS` line:
# the runtime executes plugins by name from the CNI bin dir, and the plugin is
# Python, so the launcher pins the interpreter and the package directory. The conflist is edited by conflist_edit.py
# (atomic write, backup of the original, refuses what it cannot parse).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/.." && pwd)"

CNI_BIN_DIR=/opt/cni/bin
CONFLIST=""
DRIVER_NAME=""
REQUEST=""
SOCKET=""
SPOOL_DIR=""
STATE_DIR=""
LOG_FILE=""
FAILURE_POLICY=""
PYTHON="$ROOT/.venv/bin/python"
PLUGIN_PATH=""
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
            --socket) SOCKET="${2:?--socket needs a value}"; shift 2 ;;
            --spool-dir) SPOOL_DIR="${2:?--spool-dir needs a value}"; shift 2 ;;
            --state-dir) STATE_DIR="${2:?--state-dir needs a value}"; shift 2 ;;
            --log-file) LOG_FILE="${2:?--log-file needs a value}"; shift 2 ;;
            --failure-policy) FAILURE_POLICY="${2:?--failure-policy needs a value}"; shift 2 ;;
            --python) PYTHON="${2:?--python needs a value}"; shift 2 ;;
            --plugin-path) PLUGIN_PATH="${2:?--plugin-path needs a value}"; shift 2 ;;
            --host-root) HOST_ROOT="${2:?--host-root needs a value}"; shift 2 ;;
            --uninstall) ACTION=uninstall; shift ;;
            --print) ACTION=print; shift ;;
            -h|--help) usage; exit 0 ;;
            *) die "unknown argument: $1 (see --help)" ;;
        esac
    done
    case "$FAILURE_POLICY" in ""|Ignore|Fail) ;; *) die "--failure-policy must be Ignore or Fail" ;; esac
    if [[ "$ACTION" != print && -z "$CONFLIST" ]]; then die "--conflist is required"; fi
    if [[ "$ACTION" != uninstall && -z "$DRIVER_NAME" ]]; then die "--driver-name is required"; fi
    return 0
}

# The one place that decides how the plugin is started: the plugin's own
# cni_plugin.launcher renders the launcher (a `#!PYTHON -IS` script that puts
# the package's directory on sys.path: no site import, no PYTHON* variables,
# the lean start the plugin is built for). Here we only choose which Python
# renders it and which package directory the node's interpreter will use.
RENDER='import sys
sys.path.insert(0, sys.argv[3])
from cni_plugin.launcher import render, package_root
sys.stdout.write(render(sys.argv[1], sys.argv[2] or package_root()))'

launcher_text() {
    if [[ -n "$HOST_ROOT" ]]; then
        # The node's interpreter cannot run here; the plugin code is the copy on the node.
        python3 -I -c "$RENDER" "$PYTHON" "$PLUGIN_PATH" "$(host "$PLUGIN_PATH")"
    else
        "$PYTHON" -I -c "$RENDER" "$PYTHON" "$PLUGIN_PATH" "${PLUGIN_PATH:-$ROOT}"
    fi
}

# The plugin config fields, as conflist_edit.py --set pairs (empty ones are dropped).
entry_args() {
    ENTRY_ARGS=(
        --set "driverName=$DRIVER_NAME"
        --set "request=$REQUEST"
        --set "socketPath=$SOCKET"
        --set "spoolDir=$SPOOL_DIR"
        --set "failurePolicy=$FAILURE_POLICY"
        --set "logFile=$LOG_FILE"
    )
}

# The stdlib-only editor runs with the plugin's interpreter when it exists, so a
# node needs no second Python; on uninstall that interpreter may already be gone.
editor_python() {
    if [[ -z "$HOST_ROOT" && -x "$PYTHON" ]]; then printf '%s' "$PYTHON"; else printf 'python3'; fi
}

# host PATH: where the node's PATH is, as seen by this script.
host() { printf '%s%s' "$HOST_ROOT" "$1"; }

check_interpreter() {
    [[ "$PYTHON" != *[[:space:]]* ]] || die "--python $PYTHON: a path with spaces cannot go on a #! line"
    [[ -x "$(host "$PYTHON")" ]] || die "interpreter $PYTHON not found or not executable (use --python)"
    if [[ -n "$HOST_ROOT" ]]; then
        [[ -n "$PLUGIN_PATH" ]] || die "--host-root needs --plugin-path (the plugin code's directory on the node)"
        [[ -f "$(host "$PLUGIN_PATH")/cni_plugin/__init__.py" ]] || die "no cni_plugin package under $PLUGIN_PATH on the node"
        return 0
    fi
    # Exactly the import the launcher will do: -I -S, package directory first.
    "$PYTHON" -I -S -c 'import sys; sys.path.insert(0, sys.argv[1]); import cni_plugin.main' "${PLUGIN_PATH:-$ROOT}" \
        || die "$PYTHON cannot import cni_plugin.main from ${PLUGIN_PATH:-$ROOT} (use --plugin-path)"
}

# Private directories: the socket dir and the spool hold what pods' networking
# looks like and accept events, so only root may enter them.
make_private_dir() {
    [[ -n "$1" ]] || return 0
    mkdir -p "$(host "$1")"
    chmod 0700 "$(host "$1")"
}

write_launcher() {
    local dir target tmp
    dir="$(host "$CNI_BIN_DIR")"
    target="$dir/netclaim"
    mkdir -p "$dir"
    tmp="$(mktemp "$dir/.netclaim.XXXXXX")"
    launcher_text >"$tmp"
    chmod 0755 "$tmp"
    mv -f "$tmp" "$target"
    log "launcher $target -> $PYTHON"
}

do_install() {
    check_interpreter
    [[ -f "$(host "$CONFLIST")" ]] || die "conflist $CONFLIST not found"
    # Edit the conflist first: if it is refused, nothing else has changed.
    entry_args
    "$(editor_python)" "$HERE/conflist_edit.py" install --conflist "$(host "$CONFLIST")" "${ENTRY_ARGS[@]}" >/dev/null \
        || die "conflist $CONFLIST was not changed"
    write_launcher
    [[ -n "$SOCKET" ]] && make_private_dir "$(dirname "$SOCKET")"
    make_private_dir "$SPOOL_DIR"
    make_private_dir "$STATE_DIR"
    log "netclaim chained last in $CONFLIST (driver $DRIVER_NAME)"
}

do_uninstall() {
    "$(editor_python)" "$HERE/conflist_edit.py" uninstall --conflist "$(host "$CONFLIST")" >/dev/null \
        || die "conflist $CONFLIST was not changed"
    rm -f "$(host "$CNI_BIN_DIR")/netclaim"
    log "netclaim removed from $CONFLIST and $CNI_BIN_DIR"
}

do_print() {
    printf '# %s/netclaim\n' "$CNI_BIN_DIR"
    launcher_text
    printf '# conflist entry\n'
    entry_args
    "$(editor_python)" "$HERE/conflist_edit.py" entry "${ENTRY_ARGS[@]}"
}

parse_args "$@"
case "$ACTION" in
    install) do_install ;;
    uninstall) do_uninstall ;;
    print) do_print ;;
esac
