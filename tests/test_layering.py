"""Imports point downward only: every module of the package sits in one layer and imports no higher one.

    core, errors                          pure values and the error tree
    ports                                 the small abstract interfaces
    adapters, providers, metrics, ...     implementations of the ports; provider adapters; metric families
    config                                settings, and the factories that build adapters from them
    replay                                the request at a boundary, its records, the invariant, verify
    loop                                  the agent loop
    projector, dispatcher, archiver, ...  long-running workers and jobs built on the layers above (replayer: a
                                          changed agent run over recorded sessions)
    cli                                   the ``foldline`` command (and ``python -m`` entry points), the pytest plugin

The check reads the source (every ``import``, including those under ``TYPE_CHECKING`` and inside
functions), so a lazy import cannot hide an upward dependency.
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
    frozenset({"ports"}),
    frozenset({"adapters", "providers", "metrics", "metrics_server"}),
    frozenset({"config"}),
    frozenset({"replay"}),
    frozenset({"loop"}),
    frozenset(
        {"projector", "dispatcher", "archiver", "demo", "demo_data_dir", "export", "worker_processes", "replayer"}
    ),
    frozenset({"fleet"}),
    frozenset({"cli", "__init__", "pytest_plugin"}),
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
