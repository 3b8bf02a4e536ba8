"""errors.py draws the whole error tree: every class in it, with its parent and whether to try again, and no
error class elsewhere."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re

import foldline
from foldline import errors
from foldline.errors import FoldlineError, PermanentError, TransientError

_TREE_LINE = re.compile(
    r"^(?P<indent>[│ ]*)(?:[├└]── )?(?P<name>[A-Z][A-Za-z]+)\b *"
    r"(?:\[(?P<kind>transient|permanent|per error|per class)\])?"
)
_HALVES = {"TransientError": "transient", "PermanentError": "permanent"}


def _drawn() -> tuple[dict[str, str | None], dict[str, str]]:
    """class name → parent name, and class name → whether to retry it, as the module docstring draws them: a
    class under one of the two halves is of that half; any other says so in brackets (or is ``per class``)."""
    doc = errors.__doc__ or ""
    lines = [line[4:] for line in doc.splitlines() if line.startswith("    ") and line.strip()]
    parents: dict[str, str | None] = {}
    kinds: dict[str, str] = {}
    stack: list[tuple[int, str]] = []  # (depth, name)
    for line in lines:
        m = _TREE_LINE.match(line)
        assert m is not None, f"unreadable tree line {line!r}"
        depth = len(m.group("indent")) // 4 + (1 if "──" in line else 0)
        while stack and stack[-1][0] >= depth:
            stack.pop()
        name = m.group("name")
        parent = stack[-1][1] if stack else None
        parents[name] = parent
        inherited = _HALVES.get(name) or (
            kinds[parent] if parent in kinds and kinds[parent] in _HALVES.values() else None
        )
        kinds[name] = m.group("kind") or inherited or "per class"
        assert not (m.group("kind") and inherited), f"{name}: drawn under a half and marked [{m.group('kind')}] too"
        stack.append((depth, name))
    return parents, kinds


def _drawn_tree() -> dict[str, str | None]:
    return _drawn()[0]


def _kind(cls: type[BaseException]) -> str:
    """Whether to retry an error of ``cls``, as the classes say."""
    transient, permanent = issubclass(cls, TransientError), issubclass(cls, PermanentError)
    assert not (transient and permanent), f"{cls.__name__} is both transient and permanent"
    if transient or permanent:
        return "transient" if transient else "permanent"
    return "per error" if cls is not FoldlineError and "transient" in vars(cls) else "per class"


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


def test_the_docstring_draws_whether_each_class_is_retried() -> None:
    _, drawn = _drawn()
    assert {name: _kind(cls) for name, cls in _classes().items()} == drawn
    # the two halves are the root's first children; a family whose members differ marks every member
    assert [c.__name__ for c in FoldlineError.__subclasses__()][:2] == ["TransientError", "PermanentError"]


def test_every_error_answers_whether_to_try_again() -> None:
    assert errors.StoreUnavailable("Redis did not answer").transient
    assert errors.FoldTimeout("slow").transient
    assert not errors.ConflictError("s", 3, 5).transient
    assert not errors.ConfigError("bad").transient
    assert errors.AttachmentReadFailed("sha256:x", "I/O").transient
    assert not errors.AttachmentNotFound("sha256:x", "gone").transient
    assert errors.DispatchTimeout("s", 3, "DispatchTimeout", "nobody").transient
    # a dispatcher process's error comes back by name: its kind decides
    assert errors.DispatchFailed("s", 3, "StoreUnavailable", "S3 down").transient
    assert errors.DispatchFailed("s", 3, "StoreBusy", "locked").transient
    assert not errors.DispatchFailed("s", 3, "ReconstructionError", "no serializer").transient
    assert errors.ProviderStatusError("p", 529, "overloaded").transient
    assert not errors.ProviderStatusError("p", 400, "bad request").transient
    assert not errors.ProviderStatusError("p", 429, "quota", final=True).transient
    assert errors.ProviderStatusError("p", 400, "odd", should_retry=True).transient
    assert not errors.ContextOverflow("p", 400, "too long", should_retry=True).transient
    assert errors.ProviderTransportError("reset", received_bytes=0).transient
    assert not errors.ProviderTransportError("reset", received_bytes=10).transient
    assert errors.ProviderStreamError("overloaded", retryable=True).transient
    assert not errors.ProviderStreamError("garbled").transient
    assert not errors.AnswerTooLarge("big").transient
    assert errors.RetriesExhausted("gave up", attempts=8).transient
    assert not errors.ProviderError("unusable answer").transient
    for cls in _classes().values():  # a class under a half answers as its half, whatever it is given
        if _kind(cls) in ("transient", "permanent"):
            assert "transient" not in vars(cls), cls


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
