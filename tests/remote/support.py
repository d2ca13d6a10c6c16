"""Helpers of the remote-call tests."""

from __future__ import annotations

import time
from collections.abc import Callable

GPU_VARS = ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES",
            "ASCEND_RT_VISIBLE_DEVICES")


def until(predicate: Callable[[], object], timeout_s: float, what: str) -> None:
    """Poll `predicate` until it is true; fail naming `what` after timeout_s."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached within {timeout_s:g} s")
        time.sleep(0.05)
