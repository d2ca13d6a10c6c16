"""The provider registry: one idiom with placement policies, and entry points loaded only by name."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpupool.errors import InvalidInput, UnknownName
from gpupool.providers import registry
from gpupool.providers.base import Provider
from gpupool.providers.fake import FakeProvider
from gpupool.providers.local import LocalProvider
from gpupool.providers.registry import make_provider, provider_class, provider_names, register_provider

PLUGIN = '''
from gpupool.providers.fake import FakeProvider


class Plugin(FakeProvider):
    name = "plugin"


class Misnamed(FakeProvider):
    name = "something-else"


NOT_A_PROVIDER = object()
'''


@pytest.fixture
def clean_registry(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A copy of the registry for one test, with the entry points read afresh."""
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    registry._entry_points.cache_clear()
    yield
    registry._entry_points.cache_clear()


def _install(site: Path, dist: str, entries: dict[str, str], extras: tuple[str, ...] = ()) -> None:
    """A distribution's metadata in `site` declaring `entries` in the gpupool.providers group."""
    info = site / f"{dist}-1.0.dist-info"
    info.mkdir(parents=True)
    provides = "".join(f"Provides-Extra: {extra}\n" for extra in extras)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.0\n{provides}")
    lines = "".join(f"{name} = {value}\n" for name, value in entries.items())
    (info / "entry_points.txt").write_text(f"[gpupool.providers]\n{lines}")


@pytest.fixture
def plugins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, clean_registry: None) -> Path:
    """Another package's providers: one that loads, one whose extra is missing, broken ones."""
    (tmp_path / "gpupool_test_plugin.py").write_text(PLUGIN)
    _install(tmp_path, "extpkg", {"plugin": "gpupool_test_plugin:Plugin",
                                  "needs-extra": "gpupool_test_absent.module:Provider",
                                  "misnamed": "gpupool_test_plugin:Misnamed",
                                  "not-a-class": "gpupool_test_plugin:NOT_A_PROVIDER",
                                  "no-attr": "gpupool_test_plugin:Gone"},
             extras=("needs-extra",))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "gpupool_test_plugin", raising=False)
    registry._entry_points.cache_clear()
    return tmp_path


def test_builtin_providers_come_from_their_entry_points() -> None:
    assert {"local", "fake", "ray"} <= set(provider_names())
    assert provider_class("local") is LocalProvider
    assert provider_class("fake") is FakeProvider
    assert isinstance(make_provider("fake", nodes="1x2xT4"), FakeProvider)


def test_listing_imports_no_provider() -> None:
    code = textwrap.dedent("""
        import sys
        from gpupool.providers.registry import provider_names
        names = provider_names()
        modules = ("ray", "gpupool.providers.ray", "gpupool.providers.local", "gpupool.providers.fake")
        print(",".join(names), [m for m in modules if m in sys.modules])
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    names, loaded = out.strip().split(" ", 1)
    assert {"fake", "local", "ray"} <= set(names.split(","))
    assert loaded == "[]"


def test_the_ray_provider_without_its_extra_names_the_extra() -> None:
    code = textwrap.dedent("""
        import importlib.abc, sys

        class NoRay(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name.partition(".")[0] == "ray":
                    raise ModuleNotFoundError(f"No module named {name!r}", name=name)

        sys.meta_path.insert(0, NoRay())
        from gpupool.errors import InvalidInput
        from gpupool.providers.registry import make_provider
        try:
            make_provider("ray")
        except InvalidInput as exc:
            print(exc.message)
    """)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert re.fullmatch(r"The ray provider cannot be loaded \(No module named '[\w.]+'\); install it with "
                        r"pip install 'gpupool\[ray\]'\.\n", result.stdout), result.stdout


def test_a_provider_registers_like_a_policy_and_a_duplicate_name_is_an_error(clean_registry: None) -> None:
    @register_provider
    class First(FakeProvider):
        name = "dup-test"

    assert register_provider(First) is First  # the same class again: nothing changes
    assert provider_class("dup-test") is First
    with pytest.raises(ValueError, match="provider 'dup-test' registered twice"):
        @register_provider
        class Second(FakeProvider):
            name = "dup-test"

    assert provider_class("dup-test") is First


def test_the_decorator_takes_the_class_not_a_name(clean_registry: None) -> None:
    with pytest.raises(TypeError, match="set name = 'x' on the class"):
        register_provider("x")  # type: ignore[type-var]

    class Nameless(Provider):  # abstract: never built, only registered
        pass

    with pytest.raises(ValueError, match="has no name"):
        register_provider(Nameless)  # type: ignore[type-abstract]


def test_another_package_adds_a_provider_by_entry_point(plugins: Path) -> None:
    assert {"plugin", "needs-extra", "misnamed"} <= set(provider_names())
    assert "gpupool_test_plugin" not in sys.modules  # listed, not imported
    built = make_provider("plugin", nodes="1x1xT4")
    assert type(built).__name__ == "Plugin" and built.name == "plugin"


def test_a_missing_extra_is_one_sentence_naming_it_only_when_asked_for(plugins: Path) -> None:
    make_provider("fake")  # the others still work
    with pytest.raises(InvalidInput) as caught:
        make_provider("needs-extra")
    assert caught.value.message == (
        "The needs-extra provider cannot be loaded (No module named 'gpupool_test_absent'); install it "
        "with pip install 'extpkg[needs-extra]'.")
    with pytest.raises(InvalidInput, match=r"pip install 'extpkg'\.$"):  # no extra of that name
        make_provider("no-attr")


def test_broken_entry_points_are_explained(plugins: Path) -> None:
    with pytest.raises(InvalidInput, match="calls itself 'something-else'; make the two names equal"):
        make_provider("misnamed")
    with pytest.raises(InvalidInput, match="is not a Provider class"):
        make_provider("not-a-class")


def test_two_packages_declaring_one_name_differently_is_an_error(plugins: Path) -> None:
    _install(plugins, "otherpkg", {"plugin": "elsewhere:Plugin"})
    registry._entry_points.cache_clear()
    with pytest.raises(ValueError, match="provider 'plugin' declared twice"):
        provider_names()


def test_an_unknown_name_gets_a_suggestion() -> None:
    with pytest.raises(UnknownName, match="Did you mean 'fake'"):
        make_provider("fkae")
