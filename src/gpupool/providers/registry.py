"""Provider registry: providers register by name with a decorator; unknown names get a suggestion."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any, TypeVar

from gpupool.errors import UnknownName, did_you_mean
from gpupool.providers.base import Provider

P = TypeVar("P", bound=type[Provider])

_REGISTRY: dict[str, type[Provider]] = {}
# Built-in providers, imported on first lookup so registering one is adding one line here.
_BUILTIN_MODULES = ("gpupool.providers.local", "gpupool.providers.fake")


def register_provider(name: str) -> Callable[[P], P]:
    """Class decorator: make the provider available as `name`."""

    def decorate(cls: P) -> P:
        cls.name = name
        _REGISTRY[name] = cls
        return cls

    return decorate


def _load_builtins() -> None:
    for module in _BUILTIN_MODULES:
        importlib.import_module(module)


def provider_names() -> list[str]:
    _load_builtins()
    return sorted(_REGISTRY)


def provider_class(name: str) -> type[Provider]:
    """The provider class registered as `name`; raises UnknownName with a did-you-mean."""
    _load_builtins()
    if name not in _REGISTRY:
        names = sorted(_REGISTRY)
        raise UnknownName(
            f"Unknown provider {name!r}; choose one of {', '.join(names)}." + did_you_mean(name, names),
            name=name,
        )
    return _REGISTRY[name]


def make_provider(name: str, **options: Any) -> Provider:
    """Build the provider registered as `name` with its keyword options."""
    return provider_class(name)(**options)
