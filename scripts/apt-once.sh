# Sourced by the scripts/*-deps.sh that install Debian packages (not run on its own).
# apt_update_once NAME: refresh the package lists, once per `install-test-deps.sh` run (the first
# script to ask leaves its marker file, $GPUPOOL_APT_UPDATED), or every time when run alone; a
# failed refresh is reported as NAME's and the install is tried anyway.
apt_update_once() {
    if [ -n "${GPUPOOL_APT_UPDATED:-}" ] && [ -e "$GPUPOOL_APT_UPDATED" ]; then
        return 0
    fi
    apt-get update -qq || echo "$1: apt-get update failed; trying the install anyway" >&2
    [ -z "${GPUPOOL_APT_UPDATED:-}" ] || touch "$GPUPOOL_APT_UPDATED"
}
