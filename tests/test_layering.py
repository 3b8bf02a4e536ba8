"""Imports point downward only: every module of the package sits in one layer and imports no higher one.

    core, errors                          pure values and the error tree
    ports, backoff                        the small abstract interfaces; the back-off schedule
    adapters, providers, metrics, ...     implementations of the ports; provider adapters; metric families
    config                                settings, and the factories that build adapters from them
    replay                                the request at a boundary, its records, the invariant, verify
    loop                                  the agent loop
    projector, dispatcher, archiver, ...  long-running workers and jobs built on the layers above (replayer: a
                                          changed agent run over recorded sessions)
    cli, console                          the ``foldline`` command (and ``python -m`` entry points), the operator
                                          console (a web front end over the same reads), the pytest plugin

Within a layer, modules import each other one way only: the graph of module imports has no cycle (the
provider registry imports every adapter, and no adapter imports the registry back; the loop's helpers
never import the Agent that calls them).

The check reads the source (every ``import``, including those under ``TYPE_CHECKING`` and inside
functions), so a lazy import cannot hide an upward dependency or a cycle.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

import foldline

PACKAGE = Path(foldline.__file__).parent

LAYERS: tuple[frozenset[str], ...] = (
    frozenset({"core", "errors"}),
    frozenset({"ports", "backoff", "diagnostics"}),
    frozenset({"adapters", "providers", "metrics", "metrics_server", "collector", "tracing"}),
    frozenset({"config"}),
    frozenset({"replay"}),
    frozenset({"loop"}),
    frozenset(
        {
            "projector",
            "dispatcher",
            "archiver",
            "demo",
            "demo_data_dir",
            "export",
            "erasure",
            "worker_processes",
            "replayer",
        }
    ),
    frozenset({"fleet"}),
    frozenset({"cli", "console", "__init__", "pytest_plugin"}),
)
LAYER_OF = {name: i for i, names in enumerate(LAYERS) for name in names}


def _unit(path: Path) -> str:
    """The layer unit of a source file: its first path part under the package (``core``, ``config``, ...).

    A ``__main__.py`` (``python -m foldline.x``) is a command entry point: it belongs to the cli layer.
    """
    if path.name == "__main__.py":
        return "cli"
    first = path.relative_to(PACKAGE).parts[0]
    return first.removesuffix(".py")


def _imported_units(path: Path) -> list[tuple[int, str]]:
    """(line, unit) of every foldline module ``path`` imports, resolved to its layer unit."""
    tree = ast.parse(path.read_text(), filename=str(path))
    # the package a relative import starts from: ("loop",) for loop/agent.py and loop/__init__.py, () at the root
    package = path.relative_to(PACKAGE).parts[:-1]
    out: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] == "foldline" and len(parts) > 1:
                    out.append((node.lineno, parts[1]))
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0:
                parts = (node.module or "").split(".")
                if parts[0] == "foldline":
                    targets = [parts[1]] if len(parts) > 1 else [a.name for a in node.names]
                    out += [(node.lineno, t) for t in targets]
                continue
            base = package[: len(package) - (node.level - 1)] if node.level > 1 else package
            if node.level - 1 > len(package):
                raise AssertionError(f"{path}: relative import above the package")
            parts = [*base, *(node.module.split(".") if node.module else [])]
            if parts:
                out.append((node.lineno, parts[0]))
            else:  # ``from .. import x`` at the package root: each name is a unit
                out += [(node.lineno, a.name) for a in node.names]
    return out


def _violations() -> list[str]:
    found: list[str] = []
    for path in sorted(PACKAGE.rglob("*.py")):
        unit = _unit(path)
        if unit not in LAYER_OF:
            found.append(f"{path.relative_to(PACKAGE)}: module {unit!r} has no layer; add it to LAYERS")
            continue
        for line, target in _imported_units(path):
            if target not in LAYER_OF:
                found.append(f"{path.relative_to(PACKAGE)}:{line}: imports {target!r}, which has no layer")
            elif LAYER_OF[target] > LAYER_OF[unit]:
                found.append(
                    f"{path.relative_to(PACKAGE)}:{line}: {unit} (layer {LAYER_OF[unit]}) imports {target} "
                    f"(layer {LAYER_OF[target]})"
                )
    return found


def _module_of(path: Path) -> tuple[str, ...]:
    """The dotted name of a source file under the package, as parts (a package is its ``__init__``)."""
    parts = path.relative_to(PACKAGE).with_suffix("").parts
    return parts[:-1] if parts[-1] == "__init__" else parts


def _module_imports() -> dict[tuple[str, ...], set[tuple[str, ...]]]:
    """module → the package's modules it imports (``from .x import y`` names ``x.y`` when that is a module)."""
    modules = {_module_of(path): path for path in PACKAGE.rglob("*.py")}

    def known(parts: tuple[str, ...]) -> tuple[str, ...] | None:
        while parts and parts not in modules:
            parts = parts[:-1]
        return parts if parts in modules else None

    graph: dict[tuple[str, ...], set[tuple[str, ...]]] = {m: set() for m in modules}
    for module, path in modules.items():
        package = module if path.name == "__init__.py" else module[:-1]
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            targets: list[tuple[str, ...]] = []
            if isinstance(node, ast.Import):
                targets = [tuple(a.name.split(".")[1:]) for a in node.names if a.name.split(".")[0] == "foldline"]
            elif isinstance(node, ast.ImportFrom):
                if node.level == 0:
                    parts = (node.module or "").split(".")
                    if parts[0] != "foldline":
                        continue
                    base = tuple(parts[1:])
                else:
                    base = package[: len(package) - (node.level - 1)] + tuple(
                        (node.module or "").split(".") if node.module else ()
                    )
                targets = [(*base, a.name) if (*base, a.name) in modules else base for a in node.names]
            for target in targets:
                found = known(target)
                if found is not None and found != module:
                    graph[module].add(found)
    return graph


def _cycles() -> list[str]:
    """Each set of modules that import one another in a circle, as ``a -> b -> a``."""
    graph = _module_imports()
    found: list[str] = []
    done: set[tuple[str, ...]] = set()

    def name(module: tuple[str, ...]) -> str:
        return ".".join(module) or "foldline"

    for start in sorted(graph):
        # the shortest path from each import of ``start`` back to it, breadth first
        paths: dict[tuple[str, ...], list[tuple[str, ...]]] = {t: [start, t] for t in sorted(graph[start])}
        queue = list(paths)
        while queue:
            at = queue.pop(0)
            if at == start:
                circle = paths[at]
                if not set(circle) & done:
                    found.append(" -> ".join(name(m) for m in circle))
                break
            for nxt in sorted(graph[at]):
                if nxt not in paths:
                    paths[nxt] = [*paths[at], nxt]
                    queue.append(nxt)
        done.add(start)
    return found


def test_every_import_points_downward() -> None:
    assert len(list(PACKAGE.rglob("*.py"))) > 50
    assert _violations() == []


def test_the_checker_sees_upward_imports(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A core module importing the loop, lazily or not, and an unknown module are both reported."""
    fake = tmp_path / "foldline"
    (fake / "core").mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    (fake / "core" / "__init__.py").write_text("")
    (fake / "core" / "bad.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..loop.agent import Agent\n"
        "def f() -> None:\n    import foldline.dispatcher\n"
    )
    (fake / "mystery.py").write_text("")
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", fake)
    assert _violations() == [
        "core/bad.py:3: core (layer 0) imports loop (layer 5)",
        "core/bad.py:5: core (layer 0) imports dispatcher (layer 6)",
        "mystery.py: module 'mystery' has no layer; add it to LAYERS",
    ]


def test_no_modules_import_each_other_in_a_circle() -> None:
    assert len(_module_imports()) > 50
    assert _cycles() == []


def test_the_checker_sees_circles(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A registry importing an adapter that imports the registry back (lazily) is a circle; a one-way import is not."""
    fake = tmp_path / "foldline"
    (fake / "providers").mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    (fake / "providers" / "__init__.py").write_text("from . import registry\n")
    (fake / "providers" / "registry.py").write_text("from .adapter import V1\n")
    (fake / "providers" / "adapter.py").write_text("def make() -> None:\n    from . import registry\n")
    (fake / "providers" / "base.py").write_text("")
    (fake / "providers" / "other.py").write_text("from .base import x\nfrom foldline.providers import base\n")
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", fake)
    assert _cycles() == ["providers.adapter -> providers.registry -> providers.adapter"]
