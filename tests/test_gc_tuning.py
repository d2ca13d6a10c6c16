"""The long-running processes' garbage-collector settings."""

from __future__ import annotations

import gc

from gpupool import gc_tuning


def test_tune_freezes_the_heap_and_raises_the_young_threshold() -> None:
    before = gc.get_threshold()
    try:
        survivor = [object() for _ in range(10)]
        gc_tuning.tune()
        assert gc.get_freeze_count() >= len(survivor)
        assert gc.get_threshold()[0] == gc_tuning.YOUNG_THRESHOLD
        gc_tuning.tune()  # idempotent
        assert gc.get_threshold()[0] == gc_tuning.YOUNG_THRESHOLD
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)
