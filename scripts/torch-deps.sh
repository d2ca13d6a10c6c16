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
"$python" -m pip install --quiet --no-index --no-deps "torch==2.13.0" >/dev/null 2>&1 \
    || echo "torch-deps: no local torch 2.13.0 wheel; the torchrun test will skip." >&2
