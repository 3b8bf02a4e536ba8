"""The core stays pure: no I/O, clock, randomness or vendor imports (checked on the source)."""

from __future__ import annotations

import ast
from pathlib import Path

import foldline.core

CORE = Path(foldline.core.__file__).parent
ALLOWED_MODULES = {
    "__future__",
    "abc",
    "collections",
    "collections.abc",
    "dataclasses",
    "decimal",  # exact money arithmetic (core/cost.py)
    "difflib",  # pure text diffs (header snapshot diffs)
    "enum",
    "fnmatch",  # model patterns of the price table (core/cost.py)
    "functools",
    "hashlib",
    "itertools",
    "math",
    "re",
    "struct",
    "types",
    "typing",
    "orjson",  # a pure encoder: no I/O, used only by codec.py
    "msgspec",  # the record definitions are msgspec Structs (no I/O; read through msgspec.inspect)
    "msgspec.inspect",
}
#: ``exec`` of code text written from the record definitions alone (no input, no I/O): the generated codecs.
EXEC_ALLOWED = {"records.py"}
ALLOWED_PARENT_IMPORTS = {"errors"}  # foldline.errors: exception classes only
FORBIDDEN_CALLS = {"open", "print", "input", "exec", "eval", "__import__", "breakpoint"}


def _violations(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [f"import {a.name}" for a in node.names if a.name not in ALLOWED_MODULES]
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0 and node.module not in ALLOWED_MODULES:
                found.append(f"from {node.module} import ...")
            elif node.level >= 2 and (node.module or "").split(".")[0] not in ALLOWED_PARENT_IMPORTS:
                found.append(f"from {'.' * node.level}{node.module} import ...")
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in FORBIDDEN_CALLS
            and not (node.func.id == "exec" and path.name in EXEC_ALLOWED)
        ):
            found.append(f"call {node.func.id}()")
    return [f"{path.name}:{v}" for v in found]


def test_core_imports_only_pure_modules() -> None:
    files = sorted(CORE.glob("*.py"))
    assert len(files) >= 8
    assert [v for f in files for v in _violations(f)] == []


def test_the_checker_catches_impurity(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text(
        "import time\nimport os.path\nfrom random import random\nfrom ..adapters import x\nopen('f')\nexec('1')\n"
    )
    assert _violations(bad) == [
        "bad.py:import time",
        "bad.py:import os.path",
        "bad.py:from random import ...",
        "bad.py:from ..adapters import ...",
        "bad.py:call open()",
        "bad.py:call exec()",
    ]
