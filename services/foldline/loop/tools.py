"""Tool registration: typed Python functions become tool specs with a JSON schema.

A tool returns ``str`` or :class:`ToolOutput`. Whatever it raises becomes an error result the model
sees (``isError``), so a failing tool never breaks the log. ``additional_context`` goes to the inbox
and enters the conversation with a later step, as a sourced ``user/message``.
"""

from __future__ import annotations

import inspect
import types
import typing
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal, Union, get_args, get_origin

from ..core import codec
from ..core.content import ImageBlock, TextBlock, ToolResultPart
from ..core.header import ToolSpec
from ..ports.attachments import AttachmentStore

__all__ = ["MAX_TOOL_RESULT_BYTES", "ToolOutput", "Toolset", "fit_result", "schema_for"]

ToolFn = Callable[..., Any]


#: A tool result's text above this many bytes (as escaped in the logged JSON) is cut: see :func:`fit_result`.
MAX_TOOL_RESULT_BYTES = 1024 * 1024


def fit_result(
    parts: tuple[ToolResultPart, ...], limit: int, attachments: AttachmentStore | None
) -> tuple[ToolResultPart, ...]:
    """``parts`` when their text fits ``limit`` bytes (escaped as in the logged JSON), else a result that does.

    A larger output would make an event over the size every backend holds (core/limits.py). Its text is cut
    to the limit, and a last part says so; with an attachment store the whole text is kept there
    (``text/plain``) and the last part names its digest, so what the model did not see stays retrievable.
    Images are references and stay as they are.
    """
    texts = [p.text for p in parts if isinstance(p, TextBlock)]
    sizes = [len(codec.canonical_json(t)) - 2 for t in texts]
    total = sum(sizes)
    if total <= limit:
        return parts
    whole = "".join(texts)
    full = len(whole.encode("utf-8"))
    kept: list[ToolResultPart] = []
    room = limit - _NOTE_ROOM
    for part in parts:
        if not isinstance(part, TextBlock):
            kept.append(part)
            continue
        size = len(codec.canonical_json(part.text)) - 2
        if size <= room:
            kept.append(part)
            room -= size
        elif room > 0:
            kept.append(TextBlock(_head(part.text, room)))
            room = 0
    shown = sum(len(p.text.encode("utf-8")) for p in kept if isinstance(p, TextBlock))
    note = f"[output cut: the tool returned {full:,} bytes of text; the first {shown:,} are above."
    if attachments is not None:
        meta = attachments.put(whole.encode("utf-8"), "text/plain")
        note += f" The whole output is attachment {meta.attachment_id} (text/plain, {meta.bytes:,} bytes).]"
    else:
        note += " The rest was not kept.]"
    return (*kept, TextBlock(note))


_NOTE_ROOM = 512  # bytes kept free for the note that ends a cut result


def _head(text: str, limit: int) -> str:
    """The longest start of ``text`` whose escaped JSON form is at most ``limit`` bytes."""
    lo, hi = 0, min(len(text), limit)
    while lo < hi:  # escaped size grows with length: the longest prefix that fits, by bisection
        mid = (lo + hi + 1) // 2
        if len(codec.canonical_json(text[:mid])) - 2 <= limit:
            lo = mid
        else:
            hi = mid - 1
    return text[:lo]


@dataclass(frozen=True, slots=True)
class ToolOutput:
    content: str | tuple[ToolResultPart, ...]
    is_error: bool = False
    additional_context: str | None = None

    def parts(self) -> tuple[ToolResultPart, ...]:
        return (TextBlock(self.content),) if isinstance(self.content, str) else self.content


_SCALARS: dict[Any, str] = {str: "string", int: "integer", float: "number", bool: "boolean"}


def _type_schema(tp: Any, where: str) -> dict[str, Any]:
    if tp in _SCALARS:
        return {"type": _SCALARS[tp]}
    origin = get_origin(tp)
    if origin is Literal:
        values = list(get_args(tp))
        return {"enum": values}
    if origin in (list, tuple) or tp in (list, tuple):
        args = get_args(tp)
        item = _type_schema(args[0], where) if args else {}
        return {"type": "array", "items": item} if item else {"type": "array"}
    if origin is dict or tp is dict:
        return {"type": "object"}
    if origin in (Union, types.UnionType):
        non_none = [a for a in get_args(tp) if a is not type(None)]
        if len(non_none) == 1:
            return _type_schema(non_none[0], where)
    raise TypeError(f"{where}: unsupported parameter type {tp!r}; use str, int, float, bool, Literal, list or dict")


def schema_for(fn: ToolFn) -> ToolSpec:
    """The ToolSpec of a typed function: name, first docstring paragraph, JSON schema of its parameters."""
    hints = typing.get_type_hints(fn)
    sig = inspect.signature(fn)
    props: dict[str, Any] = {}
    required: list[str] = []
    for name, param in sig.parameters.items():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise TypeError(f"tool {fn.__name__}: *args/**kwargs cannot be described to a model")
        if name not in hints:
            raise TypeError(f"tool {fn.__name__}: parameter {name!r} needs a type annotation")
        props[name] = _type_schema(hints[name], f"tool {fn.__name__}({name})")
        if param.default is inspect.Parameter.empty:
            required.append(name)
    doc = inspect.getdoc(fn) or ""
    description = doc.split("\n\n")[0].replace("\n", " ").strip()
    if not description:
        raise TypeError(f"tool {fn.__name__}: add a docstring; the model reads it as the tool's description")
    schema: dict[str, Any] = {"type": "object", "properties": props, "additionalProperties": False}
    if required:
        schema["required"] = required
    return ToolSpec(fn.__name__, description, schema)


class Toolset:
    """The tools an agent offers. Registration order is the order the model sees."""

    def __init__(self) -> None:
        self._tools: dict[str, tuple[ToolSpec, ToolFn]] = {}
        self._signatures: dict[str, inspect.Signature] = {}  # computed once: inspect.signature is slow

    def tool(self, fn: ToolFn) -> ToolFn:
        """Decorator: register ``fn`` as a tool."""
        self.add(fn)
        return fn

    def add(self, fn: ToolFn, spec: ToolSpec | None = None) -> None:
        spec = spec or schema_for(fn)
        if spec.name in self._tools:
            raise ValueError(f"tool {spec.name!r} is registered twice")
        self._tools[spec.name] = (spec, fn)
        self._signatures[spec.name] = inspect.signature(fn)

    def remove(self, name: str) -> None:
        del self._tools[name]
        del self._signatures[name]

    def specs(self) -> tuple[ToolSpec, ...]:
        return tuple(spec for spec, _ in self._tools.values())

    async def call(self, name: str, arguments: str) -> ToolOutput:
        """Run a tool on the model's raw argument text; every failure becomes an error result."""
        entry = self._tools.get(name)
        if entry is None:
            known = ", ".join(self._tools) or "none"
            return ToolOutput(f"unknown tool {name!r} (available: {known})", is_error=True)
        _, fn = entry
        try:
            args = codec.loads(arguments) if arguments.strip() else {}
        except ValueError as exc:
            return ToolOutput(f"arguments are not valid JSON: {exc}", is_error=True)
        if not isinstance(args, dict):
            return ToolOutput("arguments must be a JSON object", is_error=True)
        try:
            self._signatures[name].bind(**args)
        except TypeError as exc:
            return ToolOutput(f"bad arguments for {name}: {exc}", is_error=True)
        try:
            result = fn(**args)
            if isinstance(result, Awaitable):
                result = await result
        except Exception as exc:
            return ToolOutput(f"{type(exc).__name__}: {exc}", is_error=True)
        if isinstance(result, ToolOutput):
            return result
        if isinstance(result, str):
            return ToolOutput(result)
        if isinstance(result, ImageBlock | TextBlock):
            return ToolOutput((result,))
        return ToolOutput(codec.canonical_json(result).decode())
