#!/usr/bin/env bash
# Install torch's CPU build into .venv for the torchrun test (tests/cli/test_torchrun_live.py), only
# from a wheel pip already finds on this machine (its find-links): --no-index, so it never downloads
# the multi-GB CUDA build. Without such a wheel it says so in one line and the test skips.
# --no-deps: the CPU wheel's declared extras (sympy, jinja2, setuptools>=77) serve torch.compile,
# not the gloo all-reduce the test runs, and may not be available offline.
set -euo pipefail
python="${VENV_PYTHON:-.venv/bin/python}"
[ -x "$python" ] || exit 0
if "$python" -c "import torch.distributed" >/dev/null 2>&1; then
    exit 0
fi
# With uv (which `make venv` installs into .venv) where pip is told of a wheel directory: 5.5 s
# against pip's 10 s on 2 cores, bytecode compiled as pip compiles it, and `make test`'s pytest
# waits for it. uv does not read pip's configuration, so the directories are handed over.
uv="$(dirname "$python")/uv"
links="${PIP_FIND_LINKS:-$("$python" -m pip config get global.find-links 2>/dev/null || true)}"
if [ -x "$uv" ] && [ -n "$links" ]; then
    args=()
    for link in $links; do args+=(--find-links "$link"); done
    if "$uv" pip install --python "$python" --quiet --no-index --no-deps --compile-bytecode "${args[@]}" \
            "torch==2.13.0" >/dev/null 2>&1; then
        exit 0
    fi
fi
"$python" -m pip install --quiet --no-index --no-deps "torch==2.13.0" >/dev/null 2>&1 \
    || echo "torch-deps: no local torch 2.13.0 wheel; the torchrun test will skip." >&2
