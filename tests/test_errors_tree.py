"""errors.py draws the whole error tree: every class in it, with its parent, and no error class elsewhere."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re

import foldline
from foldline import errors
from foldline.errors import FoldlineError

_TREE_LINE = re.compile(r"^(?P<indent>[│ ]*)(?:[├└]── )?(?P<name>[A-Z][A-Za-z]+)\b")


def _drawn_tree() -> dict[str, str | None]:
    """class name → parent name, as the module docstring draws it."""
    doc = errors.__doc__ or ""
    lines = [line[4:] for line in doc.splitlines() if line.startswith("    ") and line.strip()]
    parents: dict[str, str | None] = {}
    stack: list[tuple[int, str]] = []  # (depth, name)
    for line in lines:
        m = _TREE_LINE.match(line)
        assert m is not None, f"unreadable tree line {line!r}"
        depth = len(m.group("indent")) // 4 + (1 if "──" in line else 0)
        while stack and stack[-1][0] >= depth:
            stack.pop()
        parents[m.group("name")] = stack[-1][1] if stack else None
        stack.append((depth, m.group("name")))
    return parents


def _classes() -> dict[str, type[BaseException]]:
    return {
        name: obj
        for name, obj in vars(errors).items()
        if inspect.isclass(obj) and issubclass(obj, FoldlineError) and obj.__module__ == errors.__name__
    }


def test_the_docstring_draws_every_class_with_its_parent() -> None:
    drawn = _drawn_tree()
    classes = _classes()
    assert sorted(drawn) == sorted(classes)
    for name, cls in classes.items():
        parent = cls.__bases__[0].__name__ if cls is not FoldlineError else None
        assert drawn[name] == parent, f"{name}: drawn under {drawn[name]}, defined under {parent}"
    assert sorted(errors.__all__) == sorted(classes)


def test_no_error_class_is_defined_outside_errors_py() -> None:
    for info in pkgutil.walk_packages(foldline.__path__, "foldline."):
        if info.name.endswith("__main__"):
            continue
        importlib.import_module(info.name)
    stray: list[str] = []
    pending: list[type[BaseException]] = [FoldlineError]
    while pending:
        cls = pending.pop()
        for sub in cls.__subclasses__():
            pending.append(sub)
            if sub.__module__.startswith("foldline.") and sub.__module__ != errors.__name__:
                stray.append(f"{sub.__module__}.{sub.__qualname__}")
    assert stray == []
