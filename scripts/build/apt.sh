# Sourced by the build and set-up scripts: install the Debian packages they need.
#
#   ensure_debian_packages PKG...
#
# Installs only what is missing, so a machine that has everything never touches apt.
# The caller defines log(). Concurrent callers (setup and a build started by a
# test, or two builds) take turns: one lock file around update + install, and
# apt's own dpkg lock is waited for instead of failing when something else holds it.

NETCLAIM_APT_LOCK="${NETCLAIM_APT_LOCK:-/run/lock/netclaim-apt.lock}"

ensure_debian_packages() {
    local missing=() p
    for p in "$@"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
    done
    ((${#missing[@]})) || return 0
    log "installing Debian packages: ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    mkdir -p "$(dirname "$NETCLAIM_APT_LOCK")"
    (
        flock 8
        apt-get -o DPkg::Lock::Timeout=600 update -qq
        apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    ) 8>"$NETCLAIM_APT_LOCK"
}
