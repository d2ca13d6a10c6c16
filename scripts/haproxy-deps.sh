#!/usr/bin/env bash
# Install Debian's haproxy (the services' router, server/dataplane) for the data plane tests when it is
# missing and we run as root; otherwise do nothing (those tests skip with a reason, and the in-process
# router's tests run either way).
set -euo pipefail
{ command -v haproxy || [ -x /usr/sbin/haproxy ]; } >/dev/null 2>&1 && exit 0
if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "haproxy-deps: missing haproxy (install as root with apt-get); HAProxy data plane tests will skip." >&2
    exit 0
fi
export DEBIAN_FRONTEND=noninteractive
. "$(dirname "$0")/apt-once.sh"
apt_update_once haproxy-deps
apt-get install -y -qq --no-install-recommends haproxy >/dev/null \
    || echo "haproxy-deps: could not install haproxy; HAProxy data plane tests will skip." >&2
# Debian's package starts its own haproxy service on install; the pool runs its own, so stop that one.
if command -v systemctl >/dev/null 2>&1 && systemctl is-active --quiet haproxy 2>/dev/null; then
    systemctl disable --now haproxy >/dev/null 2>&1 || true
fi
