# Sourced by the build and set-up scripts: install the Debian packages they need.
#
#   ensure_debian_packages PKG...
#
# Installs only what is missing, so a machine that has everything never touches apt.
# The caller defines log().

ensure_debian_packages() {
    local missing=() p
    for p in "$@"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
    done
    ((${#missing[@]})) || return 0
    log "installing Debian packages: ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}
