#!/usr/bin/env bash
# Install the Debian packages the container image tests use (crun, and busybox-static to build a tiny
# image from) when they are missing and we run as root; otherwise do nothing (those tests skip with a
# reason). Nothing is pulled from a registry: the tests build their image from busybox-static.
set -euo pipefail
missing=()
{ command -v crun || [ -x /usr/bin/crun ]; } >/dev/null 2>&1 || missing+=(crun)
# Debian's plain busybox package is linked dynamically: the image needs the static one
dpkg-query -W -f='${Status}' busybox-static 2>/dev/null | grep -q "ok installed" || missing+=(busybox-static)
if [ "${#missing[@]}" -eq 0 ]; then
    exit 0
fi
if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "container-deps: missing ${missing[*]} (install as root with apt-get); container tests will skip." >&2
    exit 0
fi
export DEBIAN_FRONTEND=noninteractive
. "$(dirname "$0")/apt-once.sh"
apt_update_once container-deps
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null \
    || echo "container-deps: could not install ${missing[*]}; container tests will skip." >&2
