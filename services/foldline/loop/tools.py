"""Typed tools: Python functions whose signature pydantic turns into the JSON Schema a model sees.

A parameter may be any type pydantic validates — primitives, ``Literal``, ``Annotated[T, Field(description=...)]``,
pydantic models, dataclasses, ``TypedDict`` (``typing_extensions.TypedDict`` on Python 3.11), lists, dicts and
unions of them. The tool's description is its docstring's text; the per-argument sections of a Google, NumPy or
Sphinx docstring describe the arguments (an ``Annotated`` description wins). The schema is generated once, when
the tool is registered, in the order the parameters are declared; it is a value the header logs.

The model's arguments are validated before the tool runs: arguments that are not JSON, not an object, or that do
not fit the signature become an error result naming each wrong argument and why, and the tool is not called.

A tool returns ``str``, :class:`ToolOutput`, a content block or a sequence of them (:class:`TextBlock`,
:class:`ImageBlock`, :class:`ImageData` — image bytes the loop keeps in the attachment store by digest), or any
other value pydantic can turn into JSON (a model, a dataclass, a dict...), logged as canonical JSON text (sorted
keys, so the same value is the same text in every process). Whatever a tool raises becomes an error result the
model sees (``isError``), so a failing tool never breaks the log. ``additional_context`` goes to the inbox and
enters the conversation with a later step, as a sourced ``user/message``.

An ``async def`` tool runs on the event loop; a plain ``def`` runs in a worker thread, so a blocking tool stalls
neither the loop nor the other calls of the answer (a timeout cannot stop such a thread: it is abandoned, and its
result dropped). :class:`Toolset` also takes tool sources — MCP servers (:mod:`foldline.loop.mcp`) — whose tools it
renders beside its own at every step.

Besides its time limit and ``exclusive``, a tool may be registered with two traits the loop's pauses read
(``@tools.tool(approval=..., idempotent=...)``): ``approval`` — ``True``, or a function of the call's arguments
that says whether this call needs a decision before it runs (docs/LOOP.md, "Approvals"); ``idempotent`` — running
the call twice does no more than running it once, so a call a crash interrupted is run again instead of being
answered as interrupted (``AgentOptions.on_crash``). Both hold for a tool source's tools too (its
:meth:`ToolSource.settings`).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import re
import typing
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeAlias, overload, runtime_checkable

import docstring_parser
import pydantic
from pydantic.json_schema import GenerateJsonSchema
from pydantic_core import PydanticSerializationError, to_jsonable_python

from ..core import codec
from ..core.content import ImageBlock, TextBlock, ToolResultPart
from ..core.header import ToolSpec
from ..errors import AttachmentError, ConfigError, ToolDefinitionError
from ..ports.attachments import AttachmentStore

__all__ = [
    "MAX_TOOL_RESULT_BYTES",
    "ApprovalPolicy",
    "ImageData",
    "OutputPart",
    "ToolOutput",
    "ToolSettings",
    "ToolSource",
    "Toolset",
    "fit_result",
    "resolve_images",
    "result_output",
    "schema_for",
]

log = logging.getLogger("foldline.tools")

ToolFn = Callable[..., Any]

#: A tool result's text above this many bytes (as escaped in the logged JSON) is cut: see :func:`fit_result`.
MAX_TOOL_RESULT_BYTES = 1024 * 1024


@dataclass(frozen=True, slots=True)
class ImageData:
    """Image bytes a tool returns; the loop keeps them in the attachment store and logs an image block that
    references them by digest (PNG, JPEG, GIF or WebP)."""

    data: bytes
    media_type: str


#: One part of a tool's output: what a ``tool/result`` holds, or image bytes still to be stored.
OutputPart = TextBlock | ImageBlock | ImageData


@dataclass(frozen=True, slots=True)
class ToolOutput:
    content: str | tuple[OutputPart, ...]
    is_error: bool = False
    additional_context: str | None = None
    child_session: str | None = None  # the sub-agent session the call ran (loop/subagents.py), logged on its result

    def parts(self) -> tuple[OutputPart, ...]:
        return (TextBlock(self.content),) if isinstance(self.content, str) else self.content


#: Whether a call of a tool needs an approval decision before it runs: always (``True``), never (``False``), or
#: as a function of the call's parsed arguments says (arguments that do not parse as an object need one).
ApprovalPolicy: TypeAlias = bool | Callable[[dict[str, Any]], bool]


@dataclass(frozen=True, slots=True)
class ToolSettings:
    """How the loop runs one tool: its time limit (``None``: the agent's default, ``AgentOptions.tool_timeout_s``),
    whether it must run alone (no other call of the same answer runs beside it), whether a call waits for an
    approval decision first (``approval``) and whether running a call twice does no more than once
    (``idempotent``: a call a crash interrupted is run again)."""

    timeout_s: float | None = None
    exclusive: bool = False
    approval: ApprovalPolicy = False
    idempotent: bool = False

    def needs_approval(self, arguments: str) -> bool:
        """Whether a call with the raw ``arguments`` text waits for a decision before it runs."""
        policy = self.approval
        if isinstance(policy, bool):
            return policy
        try:
            args = codec.loads(arguments) if arguments.strip() else {}
        except ValueError:
            return True  # the approver sees what the model wrote
        if not isinstance(args, dict):
            return True
        try:
            return bool(policy(args))
        except Exception:
            return True  # a policy that cannot judge a call asks for a decision


_DEFAULT_SETTINGS = ToolSettings()


def resolve_images(parts: Sequence[OutputPart], attachments: AttachmentStore | None) -> tuple[ToolResultPart, ...]:
    """``parts`` with each :class:`ImageData` kept in ``attachments`` and replaced by the image block that names it;
    an image that cannot be kept (no store, bytes that are not the image type they claim) becomes a text part
    saying so."""
    out: list[ToolResultPart] = []
    for part in parts:
        if not isinstance(part, ImageData):
            out.append(part)
            continue
        if attachments is None:
            out.append(TextBlock(f"[an image ({part.media_type}, {len(part.data):,} bytes) was returned, but this "
                                 "agent has no attachment store to keep it: it is not shown]"))  # fmt: skip
            continue
        try:
            out.append(ImageBlock(attachments.put(part.data, part.media_type).image_ref()))
        except (ValueError, AttachmentError) as exc:
            out.append(TextBlock(f"[an image that cannot be used was returned ({part.media_type}): {exc}]"))
    return tuple(out)


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


# ---------------------------------------------------------------------------------------------------- schemas


class _ToolJsonSchema(GenerateJsonSchema):
    """pydantic's JSON Schema without the titles it derives from field names (``"title": "Text"`` for ``text``):
    they repeat the property name and cost the model tokens. Models keep theirs (their class name)."""

    def field_title_should_be_set(self, schema: Any) -> bool:
        return False


#: Tool names the provider APIs accept (Anthropic and OpenAI: letters, digits, ``_`` and ``-``, 1 to 64 of them).
TOOL_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


def _paragraphs(text: str) -> str:
    """Each paragraph's lines joined by spaces, paragraphs apart by a blank line (a docstring's wrapping undone)."""
    paras = [" ".join(line.strip() for line in p.splitlines()).strip() for p in re.split(r"\n\s*\n", text)]
    return "\n\n".join(p for p in paras if p)


def _has_description(annotation: Any) -> bool:
    if typing.get_origin(annotation) is not typing.Annotated:
        return False
    return any(isinstance(m, pydantic.fields.FieldInfo) and m.description for m in annotation.__metadata__)


@dataclass(frozen=True, slots=True)
class _Signature:
    """A tool's arguments as pydantic sees them: the model that validates them and how to call the function."""

    model: type[pydantic.BaseModel]
    fields: tuple[tuple[str, str, bool], ...]  # (field name, parameter name, positional-only)


def _signature(fn: ToolFn, name: str, spec: ToolSpec | None = None) -> tuple[_Signature, str, dict[str, Any]]:
    """The validating model, the description and the JSON Schema of ``fn``'s parameters.

    With an explicit ``spec`` (the model reads its description and schema), ``fn`` needs no docstring, and a
    ``fn(**arguments)`` receives the model's JSON object as it came, unchecked by a signature it does not have.
    """
    if spec is not None and _takes_only_keywords(fn):
        return _Signature(_PASS_THROUGH, ()), spec.description, dict(spec.input_schema)
    try:
        hints = typing.get_type_hints(fn, include_extras=True)
    except Exception as exc:
        raise ToolDefinitionError(name, f"its annotations cannot be resolved ({exc})") from exc
    sig = inspect.signature(fn)
    doc = docstring_parser.parse(inspect.getdoc(fn) or "")
    param_docs = {p.arg_name: _paragraphs(p.description or "") for p in doc.params}
    description = _paragraphs(doc.description or "")
    if not description and spec is None:
        raise ToolDefinitionError(name, "add a docstring; the model reads it as the tool's description")
    fields: dict[str, Any] = {}
    order: list[tuple[str, str, bool]] = []
    for i, (pname, param) in enumerate(sig.parameters.items()):
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise ToolDefinitionError(name, f"*{pname} cannot be described to a model; name each parameter")
        if pname not in hints:
            raise ToolDefinitionError(name, f"parameter {pname!r} needs a type annotation")
        annotation = hints[pname]
        extra: dict[str, Any] = {"alias": pname}
        if param_docs.get(pname) and not _has_description(annotation):
            extra["description"] = param_docs[pname]
        default = ... if param.default is inspect.Parameter.empty else param.default
        # fields are named f0, f1, ... with the parameter name as alias: any parameter name works, even one a
        # BaseModel attribute has (json, copy, schema)
        fields[f"f{i}"] = (annotation, pydantic.Field(default, **extra))
        order.append((f"f{i}", pname, param.kind is param.POSITIONAL_ONLY))
    try:
        model = pydantic.create_model(
            "arguments", __config__=pydantic.ConfigDict(extra="forbid", populate_by_name=False), **fields
        )
        schema = model.model_json_schema(schema_generator=_ToolJsonSchema)
    except (pydantic.PydanticUserError, pydantic.errors.PydanticSchemaGenerationError, TypeError) as exc:
        raise ToolDefinitionError(name, f"its parameters cannot be described as JSON Schema ({exc})") from exc
    schema.pop("title", None)  # "arguments": the tool's name says it
    return _Signature(model, tuple(order)), description, schema


class _PassThrough(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="allow")


_PASS_THROUGH: type[pydantic.BaseModel] = _PassThrough


def _takes_only_keywords(fn: ToolFn) -> bool:
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return False
    return len(params) == 1 and params[0].kind is inspect.Parameter.VAR_KEYWORD


def schema_for(fn: ToolFn, name: str | None = None) -> ToolSpec:
    """The ToolSpec of a typed function: its name, the docstring's text, the JSON Schema of its parameters."""
    tool_name = name or fn.__name__
    _, description, schema = _signature(fn, tool_name)
    return ToolSpec(tool_name, description, schema)


def _argument_path(loc: tuple[int | str, ...], names: dict[str, str]) -> str:
    parts = [names.get(str(loc[0]), str(loc[0]))] if loc else []
    for item in loc[1:]:
        parts.append(f"[{item}]" if isinstance(item, int) else f".{item}")
    return "".join(parts)


def _validation_message(tool: str, exc: pydantic.ValidationError, names: dict[str, str], taken: str) -> str:
    """What is wrong with the model's arguments, one clause per error: which argument, why, and what it sent."""
    problems: list[str] = []
    for err in exc.errors(include_url=False):
        kind = err["type"]
        if kind == "json_invalid":
            return f"the arguments for {tool} are not valid JSON ({err['msg']}); the tool was not called"
        if kind == "model_type" and not err["loc"]:
            return f"the arguments for {tool} must be a JSON object of {taken}; the tool was not called"
        where = _argument_path(tuple(err["loc"]), names)
        if kind == "extra_forbidden":
            problems.append(f"unexpected argument `{where}` (the tool takes {taken})")
        elif kind == "missing":
            problems.append(f"argument `{where}` is missing")
        else:
            sent = codec.canonical_json(to_jsonable_python(err.get("input"), fallback=repr)).decode()
            if len(sent) > 200:
                sent = sent[:200] + "…"
            problems.append(f"argument `{where}`: {err['msg']} (got {sent})")
    return f"invalid arguments for {tool}: " + "; ".join(problems) + ". The tool was not called."


def result_output(result: Any) -> ToolOutput:
    """A tool's return value as a :class:`ToolOutput` (see the module docstring)."""
    if isinstance(result, ToolOutput):
        return result
    if isinstance(result, str):
        return ToolOutput(result)
    if isinstance(result, TextBlock | ImageBlock | ImageData):
        return ToolOutput((result,))
    if (
        isinstance(result, Sequence)
        and result
        and all(isinstance(p, TextBlock | ImageBlock | ImageData) for p in result)
    ):
        return ToolOutput(tuple(result))
    try:
        value = to_jsonable_python(result)
        return ToolOutput(codec.canonical_json(value).decode())
    except (PydanticSerializationError, TypeError, ValueError) as exc:
        return ToolOutput(f"the tool returned a {type(result).__name__}, which is not JSON ({exc})", is_error=True)


class _FunctionTool:
    """A registered function: its spec, its validating signature and how the loop runs it."""

    __slots__ = ("fn", "is_async", "names", "settings", "signature", "spec", "taken")

    def __init__(self, fn: ToolFn, name: str, settings: ToolSettings, spec: ToolSpec | None) -> None:
        self.signature, description, schema = _signature(fn, name, spec)
        self.spec = spec or ToolSpec(name, description, schema)
        self.fn = fn
        call = getattr(fn, "__call__", None)  # noqa: B004 - an object whose __call__ is async is an async tool
        self.is_async = inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(call)
        self.settings = settings
        self.names = {f: p for f, p, _ in self.signature.fields}
        self.taken = ", ".join(p for _, p, _ in self.signature.fields) or "no arguments"

    async def call(self, arguments: str) -> ToolOutput:
        try:
            values = self.signature.model.model_validate_json(arguments if arguments.strip() else "{}")
        except pydantic.ValidationError as exc:
            return ToolOutput(_validation_message(self.spec.name, exc, self.names, self.taken), is_error=True)
        args: list[Any] = []
        kwargs: dict[str, Any] = {}
        for field, pname, positional in self.signature.fields:
            value = getattr(values, field)
            if positional:
                args.append(value)
            else:
                kwargs[pname] = value
        if self.signature.model is _PASS_THROUGH:
            kwargs = dict(values.model_extra or {})
        try:
            if self.is_async:
                result = await self.fn(*args, **kwargs)
            else:
                result = await asyncio.to_thread(self.fn, *args, **kwargs)
                if isinstance(result, Awaitable):  # a plain def that returned a coroutine
                    result = await result
        except Exception as exc:
            return ToolOutput(f"{type(exc).__name__}: {exc}", is_error=True)
        return result_output(result)


@runtime_checkable
class ToolSource(Protocol):
    """Tools that come from elsewhere (an MCP server): a :class:`Toolset` renders and routes them.

    ``specs`` is the source's current tool list, by the names the model sees (cheap: it is read at every step);
    ``version`` changes whenever that list does. ``refresh`` brings the list up to date where it is due (a
    reconnect, a stale list) and never raises for the source's own failures: it logs them and leaves the list
    as it now is. ``start``/``stop`` bound its lifetime (an agent's ``async with``).
    """

    name: str

    @property
    def version(self) -> int: ...

    def specs(self) -> tuple[ToolSpec, ...]: ...

    def settings(self, name: str) -> ToolSettings: ...

    async def call(self, name: str, arguments: str) -> ToolOutput: ...

    async def refresh(self) -> None: ...

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


class Toolset:
    """The tools an agent offers: its own functions, in registration order, then each source's tools, in the
    order the sources were included. A source's tool whose name is already taken is left out (and logged), so a
    name always means one tool."""

    def __init__(self) -> None:
        self._tools: dict[str, _FunctionTool] = {}
        self._sources: list[ToolSource] = []
        self._local: tuple[ToolSpec, ...] = ()
        self._rendered: tuple[tuple[object, ...], tuple[ToolSpec, ...], dict[str, ToolSource]] | None = None
        self._left_out: set[tuple[str, str]] = set()
        self._started = 0

    @overload
    def tool(self, fn: ToolFn) -> ToolFn: ...

    @overload
    def tool(
        self,
        *,
        name: str | None = None,
        timeout_s: float | None = None,
        exclusive: bool = False,
        approval: ApprovalPolicy = False,
        idempotent: bool = False,
    ) -> Callable[[ToolFn], ToolFn]: ...

    def tool(
        self,
        fn: ToolFn | None = None,
        *,
        name: str | None = None,
        timeout_s: float | None = None,
        exclusive: bool = False,
        approval: ApprovalPolicy = False,
        idempotent: bool = False,
    ) -> ToolFn | Callable[[ToolFn], ToolFn]:
        """Decorator: register a function as a tool (``@tools.tool``; ``@tools.tool(timeout_s=5, exclusive=True)``,
        ``@tools.tool(approval=True)``, ``@tools.tool(approval=lambda a: a["amount"] > 100, idempotent=True)``)."""
        if fn is not None:
            self.add(fn)
            return fn

        def register(f: ToolFn) -> ToolFn:
            self.add(f, name=name, timeout_s=timeout_s, exclusive=exclusive, approval=approval, idempotent=idempotent)
            return f

        return register

    def add(
        self,
        fn: ToolFn,
        spec: ToolSpec | None = None,
        *,
        name: str | None = None,
        timeout_s: float | None = None,
        exclusive: bool = False,
        approval: ApprovalPolicy = False,
        idempotent: bool = False,
    ) -> None:
        """Register ``fn`` (under ``name``, else ``spec``'s name or the function's); ``timeout_s`` overrides the
        agent's default limit for this tool, ``exclusive`` makes it run alone, ``approval`` holds its calls for a
        decision (always, or as a function of the arguments says), ``idempotent`` lets a crash's next instance run
        an interrupted call again."""
        tool_name: str = name or (spec.name if spec is not None else str(getattr(fn, "__name__", "")))
        if not TOOL_NAME.match(tool_name):
            raise ToolDefinitionError(tool_name, "a tool name is 1 to 64 letters, digits, '_' or '-'")
        if tool_name in self._tools:
            raise ToolDefinitionError(tool_name, "a tool of this name is registered already")
        if timeout_s is not None and not timeout_s > 0:
            raise ToolDefinitionError(tool_name, f"timeout_s must be positive, got {timeout_s!r}")
        if not (isinstance(approval, bool) or callable(approval)):
            raise ToolDefinitionError(tool_name, "approval must be True, False or a function of the call's arguments")
        settings = ToolSettings(timeout_s, exclusive, approval, bool(idempotent))
        self._tools[tool_name] = _FunctionTool(fn, tool_name, settings, spec)
        self._changed()

    def remove(self, name: str) -> None:
        del self._tools[name]
        self._changed()

    def include(self, source: ToolSource) -> None:
        """Add a tool source (an MCP server): its tools join this set from the next step on."""
        if any(s.name == source.name for s in self._sources):
            raise ConfigError(f"a tool source named {source.name!r} is included already; give each its own name")
        self._sources.append(source)
        self._rendered = None

    def exclude(self, source: ToolSource) -> None:
        """Remove a tool source included earlier (it is not stopped: that is its owner's lifetime)."""
        self._sources.remove(source)
        self._rendered = None

    @property
    def sources(self) -> tuple[ToolSource, ...]:
        return tuple(self._sources)

    def _changed(self) -> None:
        self._local = tuple(t.spec for t in self._tools.values())
        self._rendered = None

    def specs(self) -> tuple[ToolSpec, ...]:
        """Every tool the model sees now (local ones first): rendered again only when a list changed."""
        if not self._sources:
            return self._local
        return self._render()[1]

    def _render(self) -> tuple[tuple[object, ...], tuple[ToolSpec, ...], dict[str, ToolSource]]:
        key: tuple[object, ...] = (self._local, *(s.version for s in self._sources))
        rendered = self._rendered
        if rendered is not None and rendered[0] == key:
            return rendered
        specs = list(self._local)
        owners: dict[str, ToolSource] = {}
        taken = {s.name: "this agent's own tools" for s in self._local}
        for source in self._sources:
            for spec in source.specs():
                if spec.name in taken:
                    if (source.name, spec.name) not in self._left_out:
                        self._left_out.add((source.name, spec.name))
                        log.warning(
                            "tool %r of %s is left out: the name is taken by %s",
                            spec.name,
                            source.name,
                            taken[spec.name],
                        )
                    continue
                taken[spec.name] = f"tool source {source.name!r}"
                owners[spec.name] = source
                specs.append(spec)
        self._rendered = (key, tuple(specs), owners)
        return self._rendered

    def settings(self, name: str) -> ToolSettings:
        """How the loop runs the tool ``name`` (its time limit, whether it runs alone, needs approval, may run
        again); an unknown tool has the defaults."""
        tool = self._tools.get(name)
        if tool is not None:
            return tool.settings
        source = self._render()[2].get(name) if self._sources else None
        return source.settings(name) if source is not None else _DEFAULT_SETTINGS

    def needs_approval(self, name: str, arguments: str) -> bool:
        """Whether a call of ``name`` with the raw ``arguments`` text waits for a decision before it runs."""
        return self.settings(name).needs_approval(arguments)

    async def call(self, name: str, arguments: str) -> ToolOutput:
        """Run a tool on the model's raw argument text; every failure becomes an error result."""
        tool = self._tools.get(name)
        if tool is not None:
            return await tool.call(arguments)
        source = self._render()[2].get(name) if self._sources else None
        if source is not None:
            return await source.call(name, arguments)
        known = ", ".join(s.name for s in self.specs()) or "none"
        return ToolOutput(f"unknown tool {name!r} (available: {known})", is_error=True)

    # ------------------------------------------------------------------------------------------ sources' lifetime

    async def refresh(self) -> None:
        """Bring every source's tool list up to date where it is due (called before each step's render)."""
        if not self._sources:
            return
        if not self._started:
            names = ", ".join(repr(s.name) for s in self._sources)
            raise ConfigError(
                f"the agent's tools include {names}, which run while the agent is entered: use `async with agent:` "
                "(or `async with toolset:`) around its turns"
            )
        if len(self._sources) == 1:
            await self._sources[0].refresh()
        else:
            await asyncio.gather(*(s.refresh() for s in self._sources))

    async def start(self) -> None:
        """Start every source (connect to each MCP server); nested starts count, the last stop stops them."""
        self._started += 1
        if self._started > 1:
            return
        started: list[ToolSource] = []
        try:
            for source in self._sources:
                await source.start()
                started.append(source)
        except BaseException:
            self._started -= 1
            for source in reversed(started):
                await source.stop()
            raise

    async def stop(self) -> None:
        if self._started == 0:
            return
        self._started -= 1
        if self._started:
            return
        for source in reversed(self._sources):
            try:
                await source.stop()
            except Exception:
                log.exception("tool source %r did not stop cleanly", source.name)

    async def __aenter__(self) -> Toolset:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()
