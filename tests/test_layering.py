"""The package layering: each package of gpupool may import only the packages below it.

An import scan (every `import` and `from ... import` anywhere in a module, function bodies and
TYPE_CHECKING blocks included, relative ones resolved) checks each package against its allow-list:
`core` is pure (only `errors` of gpupool, and no standard module that reaches the outside world),
`api` (the HTTP API's models and reasons) never imports the server, the client and remote functions
speak to the server only through `api`, and the agent and the providers never import the server.
A package missing from RULES is an error too, so a new one is placed in the layering on purpose.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "gpupool"

ANY = "*"


@dataclass(frozen=True)
class Rule:
    may_import: frozenset[str]
    """Packages (`core`) or modules (`providers.nodespec`, with what is under it) of gpupool it may
    import besides itself; ANY for the top of the stack."""
    forbidden_external: frozenset[str] = frozenset()
    """Top-level modules outside gpupool it must not import."""


def _rule(*names: str, forbidden_external: frozenset[str] = frozenset()) -> Rule:
    return Rule(frozenset(names), forbidden_external)


OUTSIDE_WORLD = frozenset({
    "os", "sys", "io", "time", "socket", "subprocess", "threading", "multiprocessing", "asyncio", "signal",
    "shutil", "pathlib", "tempfile", "urllib", "http", "sqlite3", "sqlalchemy", "fastapi", "starlette",
    "httpx", "pydantic", "ray", "yaml", "logging",
})
"""What `core` may not touch: files, processes, clocks, the network, the store, the web stack."""

RULES: dict[str, Rule] = {
    # leaves
    "errors": _rule(),
    "durations": _rule(),
    "gc_tuning": _rule(),
    "textfiles": _rule("errors"),
    "yamlfiles": _rule("errors", "textfiles"),
    "lite_http": _rule("errors"),
    "clientconfig": _rule("errors"),
    # the pure scheduler and the data it shares
    "core": _rule("errors", forbidden_external=OUTSIDE_WORLD),
    "pods": _rule("core"),
    "profiles": _rule("errors", "yamlfiles"),
    "exporters": _rule("core", "errors"),
    "prices": _rule("core", "errors", "profiles", "yamlfiles"),
    "money": _rule(),
    "fedfile": _rule("core", "errors", "yamlfiles"),
    "sim": _rule("core", "errors", "fedfile", "textfiles", "yamlfiles"),
    # the wire's vocabulary, and the two sides of it
    "api": _rule("core", "errors"),
    "config": _rule("api", "core", "errors", "prices", "yamlfiles"),
    "client": _rule("api", "clientconfig", "durations", "errors", "lite_http"),
    "remote": _rule("api", "client", "errors"),
    # where work runs
    "agent": _rule("core", "errors", "pods", "profiles", "providers.nodespec", "textfiles"),
    "providers": _rule("agent", "core", "errors", "pods", "profiles", "textfiles"),
    # the control plane and the command line on top
    # provision.py is where the server builds its provider: it passes the node's pod-network settings
    # money: the budget warning in the audit log says its amount as `tenant ls` does
    "server": _rule("agent.identity", "agent.netns", "api", "config", "core", "errors", "gc_tuning", "money",
                    "pods", "prices", "profiles", "providers", "yamlfiles", "durations"),
    "federation": _rule("api", "core", "errors", "fedfile", "pods", "providers", "server", "yamlfiles"),
    "cli": _rule(ANY),
    "__init__": _rule("remote"),
}


def module_name(path: Path, root: Path) -> str:
    """`root`/a/b.py -> 'a.b'; a package's __init__.py is the package."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__" and len(parts) > 1:
        parts.pop()
    return ".".join(parts)


def imported(tree: ast.AST, module: str, is_package: bool, top: str) -> list[tuple[int, str]]:
    """(line, dotted name) of everything the module imports, relative imports resolved against
    `module`; names under `top` lose that prefix ('gpupool.core.model' -> 'core.model'), and
    `from gpupool import server` counts as importing 'server'."""
    out: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                here = [top, *module.split(".")] if module != "__init__" else [top]
                base = here if is_package else here[:-1]
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target == top:  # from gpupool import server, errors
                out += [(node.lineno, f"{top}.{alias.name}") for alias in node.names]
            else:
                out.append((node.lineno, target))
    return out


def _allowed(target: str, package: str, rule: Rule) -> bool:
    if ANY in rule.may_import or target.split(".")[0] == package:
        return True
    return any(target == name or target.startswith(name + ".") for name in rule.may_import)


def violations(root: Path, rules: dict[str, Rule], top: str = "gpupool") -> list[str]:
    """Every import under `root` (the `top` package's directory) that its package's rule refuses,
    as 'file:line: package imports target', plus every package no rule covers."""
    found: list[str] = []
    unruled: set[str] = set()
    for path in sorted(root.rglob("*.py")):
        module = module_name(path, root)
        package = module.split(".")[0]
        rule = rules.get(package)
        if rule is None:
            if package in unruled:
                continue
            unruled.add(package)
            found.append(f"{path.relative_to(root)}: package {package!r} has no layering rule; add it to "
                         "RULES in tests/test_layering.py")
            continue
        tree = ast.parse(path.read_text(), filename=str(path))
        for line, target in imported(tree, module, path.name == "__init__.py", top):
            where = f"{path.relative_to(root)}:{line}"
            if target == top or target.startswith(top + "."):
                inner = target.removeprefix(top).removeprefix(".")
                if inner and not _allowed(inner, package, rule):
                    found.append(f"{where}: {package} imports {target}")
            elif target.split(".")[0] in rule.forbidden_external:
                found.append(f"{where}: {package} imports {target}, which it must not touch")
    return found


def test_every_package_imports_only_what_its_layer_allows() -> None:
    assert violations(SRC, RULES) == []


def test_the_client_side_never_imports_the_server() -> None:
    """Spelled out apart from the table, as the rule that must never be loosened by accident."""
    for package in ("api", "client", "remote", "core", "agent", "providers", "pods"):
        assert not _allowed("server", package, RULES[package]), package
        assert not _allowed("server.settings", package, RULES[package]), package


# ---- the checker itself, on a synthetic tree --------------------------------------------------------

def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "gpupool"
    for name, text in {"__init__.py": "", **files}.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        for parent in path.relative_to(root).parents:
            (root / parent / "__init__.py").touch()
        path.write_text(text)
    return root


SMALL_RULES = {"__init__": _rule(), "core": _rule("errors", forbidden_external=frozenset({"os"})),
               "errors": _rule(), "server": _rule("core", "errors"),
               "agent": _rule("core", "providers.nodespec"), "providers": _rule("agent")}


def test_a_clean_tree_passes(tmp_path: Path) -> None:
    root = _tree(tmp_path, {"core/model.py": "from gpupool.errors import Bad\nimport math\n",
                            "server/app.py": "from gpupool.core.model import Node\nfrom . import routes\n",
                            "server/routes.py": "import os\n",
                            "agent/node.py": "from gpupool.providers.nodespec import LABEL\n"})
    assert violations(root, SMALL_RULES) == []


@pytest.mark.parametrize(("source", "target"), [
    ("from gpupool.server.app import create\n", "gpupool.server.app"),
    ("import gpupool.server.app\n", "gpupool.server.app"),
    ("from gpupool import server\n", "gpupool.server"),
    ("def later():\n    from gpupool.server import app\n", "gpupool.server"),
    ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from gpupool.server.app import X\n",
     "gpupool.server.app"),
    ("from ..server import app\n", "gpupool.server"),
    ("from .. import server\n", "gpupool.server"),
])
def test_an_import_running_back_up_is_found_however_it_is_written(tmp_path: Path, source: str,
                                                                   target: str) -> None:
    root = _tree(tmp_path, {"core/model.py": source, "server/app.py": ""})
    found = violations(root, SMALL_RULES)
    assert len(found) == 1 and found[0].startswith("core/model.py:"), found
    assert found[0].endswith(f"core imports {target}")


def test_core_touching_the_outside_world_is_found(tmp_path: Path) -> None:
    root = _tree(tmp_path, {"core/model.py": "import os.path\n"})
    assert violations(root, SMALL_RULES) == ["core/model.py:1: core imports os.path, which it must not touch"]


def test_a_module_allowance_does_not_open_its_whole_package(tmp_path: Path) -> None:
    root = _tree(tmp_path, {"agent/node.py": "from gpupool.providers.nodespec import LABEL\n"
                                             "from gpupool.providers.local import LocalProvider\n",
                            "providers/nodespec.py": "", "providers/local.py": ""})
    assert violations(root, SMALL_RULES) == ["agent/node.py:2: agent imports gpupool.providers.local"]


def test_a_package_without_a_rule_is_reported(tmp_path: Path) -> None:
    root = _tree(tmp_path, {"newthing/mod.py": "import json\n"})
    found = violations(root, SMALL_RULES)
    assert len(found) == 1 and "package 'newthing' has no layering rule" in found[0]
