# Sourced by scripts/control-plane.sh and scripts/cluster.sh: state dirs and the files they source.
# shellcheck shell=bash
#
# Both scripts run as root and `source` files from their state dir (ports.env, cluster.env,
# node.env), kill the pids named in its pid files and `rm -rf` it on `down`. Their default dirs are
# fixed names in a world-writable /tmp, so whoever creates such a dir first would have root run
# their code. A state dir is therefore used only when it is a real directory (not a symlink), owned
# by the user running the script and writable by nobody else, below directories that nobody else
# could rename it out of; a file is sourced only when it is a regular file with the same owner and
# not writable by group or others. Anything else is refused with the reason, before any use.

# state_dir_problem DIR: why DIR may not be used as our state dir (one line), or nothing.
state_dir_problem() {
    local dir="$1" uid parent owner mode
    uid="$(id -u)"
    if [[ -L "$dir" ]]; then echo "$dir is a symlink"; return; fi
    if [[ ! -d "$dir" ]]; then echo "$dir is not a directory"; return; fi
    read -r owner mode < <(stat -c '%u %a' -- "$dir")
    if [[ "$owner" != "$uid" ]]; then echo "$dir is owned by uid $owner, not by uid $uid"; return; fi
    if (( 8#$mode & 8#022 )); then echo "$dir is writable by group or others (mode $mode)"; return; fi
    # Its ancestors: owned by root or us, and writable by others only with the sticky bit (/tmp).
    parent="$(realpath -- "$dir")"
    while [[ "$parent" != / ]]; do
        parent="$(dirname -- "$parent")"
        read -r owner mode < <(stat -c '%u %a' -- "$parent")
        if [[ "$owner" != 0 && "$owner" != "$uid" ]]; then
            echo "$parent (above $dir) is owned by uid $owner"; return
        fi
        if (( 8#$mode & 8#022 )) && ! (( 8#$mode & 8#1000 )); then
            echo "$parent (above $dir) is writable by group or others without the sticky bit (mode $mode)"; return
        fi
    done
}

# state_dir_ensure DIR: create DIR (mode 0700) when absent; refuse (exit 1) an unsafe one.
state_dir_ensure() {
    local dir="$1" problem
    [[ -e "$1" || -L "$1" ]] || (umask 077 && mkdir -p -- "$dir") 2>/dev/null || true
    problem="$(state_dir_problem "$dir")"
    if [[ -n "$problem" ]]; then
        printf 'error: refusing state dir %s: %s (remove it or choose another dir)\n' "$dir" "$problem" >&2
        exit 1
    fi
}

# state_dir_check DIR: refuse (exit 1) an unsafe DIR; an absent one is fine (nothing to use yet).
state_dir_check() {
    [[ -e "$1" || -L "$1" ]] || return 0
    state_dir_ensure "$1"
}

# state_file_check FILE: refuse (exit 1) to read a FILE that is not ours alone.
state_file_check() {
    local file="$1" uid owner mode problem=""
    uid="$(id -u)"
    if [[ -L "$file" ]]; then problem="it is a symlink"
    elif [[ ! -f "$file" ]]; then problem="it is not a regular file"
    else
        read -r owner mode < <(stat -c '%u %a' -- "$file")
        if [[ "$owner" != "$uid" ]]; then problem="it is owned by uid $owner, not by uid $uid"
        elif (( 8#$mode & 8#022 )); then problem="it is writable by group or others (mode $mode)"
        fi
    fi
    if [[ -n "$problem" ]]; then
        printf 'error: refusing to read %s: %s\n' "$file" "$problem" >&2
        exit 1
    fi
}

# state_source FILE: source FILE after state_file_check (in the caller's scope).
state_source() {
    state_file_check "$1"
    # shellcheck disable=SC1090
    source "$1"
}
