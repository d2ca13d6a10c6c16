"""The long-running processes' garbage-collector settings."""

from __future__ import annotations

import gc

from gpupool import gc_tuning


def test_tune_freezes_the_heap_and_raises_the_young_threshold() -> None:
    """From the interpreter's own settings (the test process itself runs tuned: tests/conftest.py),
    and back to what it had after."""
    before, frozen_before = gc.get_threshold(), gc.get_freeze_count()
    gc.unfreeze()
    gc.set_threshold(700, 10, 10)
    try:
        assert gc.get_freeze_count() == 0
        survivor = [object() for _ in range(10)]
        gc_tuning.tune()
        assert gc.get_freeze_count() >= len(survivor)
        assert gc.get_threshold() == (gc_tuning.YOUNG_THRESHOLD, 20, 100)
        gc_tuning.tune()  # idempotent
        assert gc.get_threshold() == (gc_tuning.YOUNG_THRESHOLD, 20, 100)
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)
        if frozen_before:
            gc.freeze()
