#!/usr/bin/env bash
# Install the Debian packages the test suite uses, when missing and when running as root.
# Elsewhere it only reports what is missing; the tests that need those tools skip with a reason.
set -euo pipefail
cd "$(dirname "$0")/.."
for script in scripts/*-deps.sh scripts/deps-*.sh; do
    [ -e "$script" ] || continue
    [ "$(basename "$script")" = "install-test-deps.sh" ] && continue
    bash "$script"
done
