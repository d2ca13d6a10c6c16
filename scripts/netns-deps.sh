#!/usr/bin/env bash
# Install the Debian packages the network tests use (iproute2's `ip`, nftables' `nft` and conntrack's `conntrack` for the pod
# network; `iptables` for the federation's partition test, which cuts a hub's link on loopback) when
# they are missing and we run as root; otherwise do nothing (those tests skip with a reason).
set -euo pipefail
missing=()
{ command -v ip || [ -x /usr/sbin/ip ] || [ -x /sbin/ip ]; } >/dev/null 2>&1 || missing+=(iproute2)
{ command -v nft || [ -x /usr/sbin/nft ]; } >/dev/null 2>&1 || missing+=(nftables)
{ command -v iptables || [ -x /usr/sbin/iptables ]; } >/dev/null 2>&1 || missing+=(iptables)
{ command -v conntrack || [ -x /usr/sbin/conntrack ]; } >/dev/null 2>&1 || missing+=(conntrack)
if [ "${#missing[@]}" -eq 0 ]; then
    exit 0
fi
if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "netns-deps: missing ${missing[*]} (install as root with apt-get); pod network (or partition) tests will skip." >&2
    exit 0
fi
export DEBIAN_FRONTEND=noninteractive
. "$(dirname "$0")/apt-once.sh"
apt_update_once netns-deps
apt-get install -y -qq "${missing[@]}" >/dev/null \
    || echo "netns-deps: could not install ${missing[*]}; pod network (or partition) tests will skip." >&2
