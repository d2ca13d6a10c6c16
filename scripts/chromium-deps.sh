#!/usr/bin/env bash
# Install Debian's Chromium for the dashboard tests (tests/ui, driven by Playwright) when it is
# missing and we run as root; otherwise only say so (those tests skip with a reason). Playwright's
# own browser downloads are never used.
set -euo pipefail
if [ -x /usr/bin/chromium ]; then
    exit 0
fi
if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "chromium-deps: /usr/bin/chromium not found (as root: apt-get install chromium); the dashboard tests will skip." >&2
    exit 0
fi
export DEBIAN_FRONTEND=noninteractive
. "$(dirname "$0")/apt-once.sh"
apt_update_once chromium-deps
apt-get install -y -qq --no-install-recommends chromium >/dev/null \
    || echo "chromium-deps: could not install chromium; the dashboard tests will skip." >&2
