#!/usr/bin/env bash
# Install Debian's PostgreSQL server for the store tests, when missing and when running as root.
# Elsewhere it only says what is missing; the PostgreSQL tests then skip with a reason.
set -euo pipefail
if ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || command -v initdb >/dev/null 2>&1; then
    exit 0
fi
if [ "$(id -u)" != "0" ]; then
    echo "postgres-deps: PostgreSQL server not found; as root run: apt-get install postgresql" >&2
    exit 0
fi
export DEBIAN_FRONTEND=noninteractive
. "$(dirname "$0")/apt-once.sh"
apt_update_once postgres-deps
if apt-get install -y -qq --no-install-recommends postgresql >/dev/null; then
    echo "postgres-deps: installed PostgreSQL $(ls /usr/lib/postgresql)"
else
    echo "postgres-deps: could not install postgresql; the PostgreSQL tests will skip." >&2
fi
