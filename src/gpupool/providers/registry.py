"""Provider registry: providers register by name, as placement policies do, and by entry point.

A provider class sets `name` and is decorated with `@register_provider` (the idiom of
`register_policy`); a second class under a name already taken is an error. Packages, this one
included, declare providers in the `gpupool.providers` entry-point group (pyproject.toml), so
`provider_names()` lists them without importing any, and a provider's module (with its extra's
dependencies, such as ray) is imported only when that provider is asked for.
"""

from __future__ import annotations

from functools import cache
from importlib import metadata
from typing import Any, TypeVar

from gpupool.errors import InvalidInput, UnknownName, did_you_mean
from gpupool.providers.base import Provider

P = TypeVar("P", bound=type[Provider])

ENTRY_POINT_GROUP = "gpupool.providers"
_REGISTRY: dict[str, type[Provider]] = {}
# This package's own providers, for a source checkout whose metadata is not installed.
_BUILTIN: dict[str, str] = {"local": "gpupool.providers.local:LocalProvider",
                            "fake": "gpupool.providers.fake:FakeProvider"}


def register_provider(cls: P) -> P:
    """Class decorator: make the provider available by its `name`; a name taken by another class
    raises ValueError."""
    if isinstance(cls, str):
        raise TypeError(f"register_provider is a class decorator: set name = {cls!r} on the class and "
                        "write @register_provider above it.")
    name = getattr(cls, "name", None)
    if not isinstance(name, str) or not name:
        raise ValueError(f"provider {cls.__qualname__} has no name; set the class attribute `name`")
    if name in _REGISTRY and _REGISTRY[name] is not cls:
        raise ValueError(f"provider {name!r} registered twice ({_REGISTRY[name].__qualname__} and "
                         f"{cls.__qualname__})")
    _REGISTRY[name] = cls
    return cls


@cache
def _entry_points() -> dict[str, metadata.EntryPoint]:
    """The declared providers by name; two packages declaring one name differently is an error."""
    found: dict[str, metadata.EntryPoint] = {}
    for entry in metadata.entry_points(group=ENTRY_POINT_GROUP):
        known = found.setdefault(entry.name, entry)
        if known.value != entry.value:
            raise ValueError(f"provider {entry.name!r} declared twice ({known.value} and {entry.value})")
    return found


def provider_names() -> list[str]:
    """Every provider name that can be asked for; imports none of them."""
    return sorted(set(_REGISTRY) | set(_entry_points()) | set(_BUILTIN))


def provider_class(name: str) -> type[Provider]:
    """The provider class called `name`, importing its module on first use. Raises UnknownName
    (with a did-you-mean) for a name nobody declares, InvalidInput naming the extra to install when
    the provider's module cannot be imported."""
    if name not in _REGISTRY:
        entry = _entry_points().get(name)
        if entry is None and name in _BUILTIN:
            entry = metadata.EntryPoint(name, _BUILTIN[name], ENTRY_POINT_GROUP)
        if entry is None:
            names = provider_names()
            raise UnknownName(f"Unknown provider {name!r}; choose one of {', '.join(names)}."
                              + did_you_mean(name, names), name=name)
        _register_entry(entry)
    return _REGISTRY[name]


def _register_entry(entry: metadata.EntryPoint) -> None:
    try:
        cls = entry.load()
    except (ImportError, AttributeError) as exc:  # its extra is not installed, or not this version
        raise InvalidInput(f"The {entry.name} provider cannot be loaded ({exc}); install it with "
                           f"pip install '{_extra_for(entry)}'.", name=entry.name) from None
    if not (isinstance(cls, type) and issubclass(cls, Provider)):
        raise InvalidInput(f"The {entry.name} provider's entry point {entry.value} is not a Provider "
                           "class; fix the package that declares it.", name=entry.name)
    if getattr(cls, "name", None) != entry.name:
        raise InvalidInput(f"The entry point {entry.name!r} names {cls.__qualname__}, which calls itself "
                           f"{getattr(cls, 'name', None)!r}; make the two names equal.", name=entry.name)
    register_provider(cls)


def _extra_for(entry: metadata.EntryPoint) -> str:
    """What to pip install for `entry`: its package's extra of the same name, else its server extra."""
    dist = entry.dist
    if dist is None:
        return "gpupool[server]"
    extras = dist.metadata.get_all("Provides-Extra") or []
    extra = entry.name if entry.name in extras else "server" if "server" in extras else ""
    return f"{dist.name}[{extra}]" if extra else dist.name


def make_provider(name: str, **options: Any) -> Provider:
    """Build the provider registered as `name` with its keyword options."""
    return provider_class(name)(**options)
