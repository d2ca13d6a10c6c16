"""gpupool's framework memory cap: when the pod imports torch, cap its per-process CUDA memory.

gpupool puts this directory first on a pod's PYTHONPATH. It reads GPUPOOL_TORCH_MEMORY_FRACTION
and, right after `import torch` finishes, calls torch.cuda.set_per_process_memory_fraction on
every visible device. It imports nothing heavy itself, so Python start-up is unchanged for pods
that never import torch. Any other sitecustomize further down sys.path still runs.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
from types import ModuleType
from typing import Any

_FRACTION_ENV = "GPUPOOL_TORCH_MEMORY_FRACTION"
_HERE = os.path.dirname(os.path.abspath(__file__))


def _apply_torch_cap(torch: Any, fraction: float) -> None:
    try:
        if torch.cuda.is_available():
            for index in range(torch.cuda.device_count()):
                torch.cuda.set_per_process_memory_fraction(fraction, index)
    except Exception as exc:  # a cap that fails must not break the pod; say so on stderr
        print(f"gpupool: could not cap torch CUDA memory ({exc})", file=sys.stderr, flush=True)


class _TorchImportHook(importlib.abc.MetaPathFinder):
    """Finds `torch` through the normal finders, then wraps its loader to apply the cap."""

    def __init__(self, fraction: float) -> None:
        self.fraction = fraction

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname != "torch":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec("torch")
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        original = loader.exec_module
        fraction = self.fraction

        def exec_module(module: ModuleType) -> None:
            original(module)
            _apply_torch_cap(module, fraction)

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def _install() -> None:
    raw = os.environ.get(_FRACTION_ENV, "")
    try:
        fraction = float(raw) if raw else 0.0
    except ValueError:
        fraction = 0.0
    if 0.0 < fraction <= 1.0:
        sys.meta_path.insert(0, _TorchImportHook(fraction))


def _chain() -> None:
    """Run the sitecustomize this one shadows, if any."""
    others = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", others)
    if spec is not None and spec.loader is not None:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)


_install()
_chain()
