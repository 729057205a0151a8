# Sourced by scripts/cluster.sh (its variables and state are in scope): logging, processes, state and waiting
# shellcheck shell=bash

log() { printf '[cluster] %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

free_port() { # free_port [ADDRESS]: a TCP port free on ADDRESS (default 127.0.0.1)
    python3 -c 'import socket, sys; s=socket.socket(); s.bind((sys.argv[1],0)); print(s.getsockname()[1])' "${1:-127.0.0.1}"
}
alive() { [[ -f "$1" ]] && kill -0 "$(cat "$1")" 2>/dev/null; }
load_state() { [[ -f "$STATE" || -L "$STATE" ]] || die "no cluster in $DIR (run: $0 up)"; state_source "$STATE"; }
save_var() { printf '%s=%q\n' "$1" "${!1}" >>"$STATE"; }
kc() { "$KUBECTL" --kubeconfig "$CP_DIR/admin.kubeconfig" "$@"; }
ctr_() { "$CTR" --address "$CTD/containerd.sock" -n k8s.io "$@"; }

# start NAME CMD...: a detached process with its log and pid file under $DIR (in the mount
# namespace $NODE_NS when a node of a multi-node cluster sets it; nsenter execs, so the pid stays).
start() {
    local name="$1"; shift
    setsid ${NODE_NS:+nsenter "--mount=$NODE_NS" --} "$@" </dev/null >>"$DIR/$name.log" 2>&1 8>&- 9>&- &
    echo $! >"$DIR/$name.pid"
}

stop_pid() { # stop_pid NAME...: SIGTERM to each, wait, SIGKILL; exactly the pids we started, in parallel
    local name pidfile pid i pids=()
    for name in "$@"; do
        pidfile="$DIR/$name.pid"
        [[ -f "$pidfile" ]] || continue
        pid="$(cat "$pidfile")"
        if kill -0 "$pid" 2>/dev/null; then
            log "stopping $name (pid $pid)"
            kill -TERM "$pid" 2>/dev/null || true
            pids+=("$pid")
        fi
        rm -f "$pidfile"
    done
    for pid in "${pids[@]}"; do
        for i in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$pid" 2>/dev/null || true
        while kill -0 "$pid" 2>/dev/null; do sleep 0.1; done
    done
    return 0
}

wait_for() { # wait_for SECONDS WHAT CMD...: poll CMD until it succeeds; fail early when WATCH_PID dies
    local secs="$1" what="$2" i; shift 2
    for i in $(seq 1 $((secs * 5))); do
        "$@" >/dev/null 2>&1 && return 0
        if [[ -n "${WATCH:-}" ]] && ! alive "$DIR/$WATCH.pid"; then
            tail -5 "$DIR/$WATCH.log" >&2
            die "$WATCH exited while waiting for $what (log: $DIR/$WATCH.log)"
        fi
        sleep 0.2
    done
    die "timed out after ${secs}s waiting for $what"
}
