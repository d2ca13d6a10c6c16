#!/usr/bin/env bash
# Install the Debian packages the InfiniBand tests use (ibsim, the IB diagnostics, OpenSM) when
# they are missing and we run as root; otherwise do nothing (those tests skip with a reason).
set -euo pipefail
missing=()
command -v ibsim >/dev/null 2>&1 || missing+=(ibsim-utils)
{ command -v ibnetdiscover || [ -x /usr/sbin/ibnetdiscover ]; } >/dev/null 2>&1 || missing+=(infiniband-diags)
{ command -v opensm || [ -x /usr/sbin/opensm ]; } >/dev/null 2>&1 || missing+=(opensm)
if [ "${#missing[@]}" -eq 0 ]; then
    exit 0
fi
if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "ib-deps: missing ${missing[*]} (install as root with apt-get); IB tool tests will skip." >&2
    exit 0
fi
export DEBIAN_FRONTEND=noninteractive
. "$(dirname "$0")/apt-once.sh"
apt_update_once ib-deps
apt-get install -y -qq "${missing[@]}" >/dev/null \
    || echo "ib-deps: could not install ${missing[*]}; IB tool tests will skip." >&2
