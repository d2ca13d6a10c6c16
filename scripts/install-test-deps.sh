#!/usr/bin/env bash
# Install what the test suite uses, when missing: the Debian packages (only as root) and torch's CPU
# wheel into .venv (only from a wheel already on this machine). Elsewhere each script only reports
# what is missing; the tests that need those tools skip with a reason.
#
#   scripts/install-test-deps.sh            everything
#   scripts/install-test-deps.sh --system   the Debian packages only (no .venv needed: `make test`
#                                           runs this while the virtualenv installs)
#   scripts/install-test-deps.sh --venv     the wheels into .venv only
set -euo pipefail
cd "$(dirname "$0")/.."
only="${1:-}"
case "$only" in
    ""|--system|--venv) ;;
    *) echo "usage: $0 [--system|--venv]" >&2; exit 2 ;;
esac
if [ "$only" != "--venv" ]; then
    # The package lists are refreshed once, by the first script that installs something (it
    # leaves this marker), rather than by every script that does.
    GPUPOOL_APT_UPDATED="$(mktemp -u)"
    export GPUPOOL_APT_UPDATED
    trap 'rm -f "$GPUPOOL_APT_UPDATED"' EXIT
    for script in scripts/*-deps.sh; do
        case "$(basename "$script")" in install-test-deps.sh|torch-deps.sh) continue ;; esac
        bash "$script"
    done
fi
if [ "$only" != "--system" ]; then
    bash scripts/torch-deps.sh
fi
