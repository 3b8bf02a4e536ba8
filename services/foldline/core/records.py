"""Records defined once: every codec and check of a logged record is derived from its class.

Each event payload and nested record (content blocks, usage, image refs, the header and its call config,
tool specs, the replace op) is one frozen msgspec ``Struct`` in ``content.py``, ``header.py`` or
``events.py``. Its fields, their Python names, their logged names (camelCase, or ``msgspec.field(name=...)``),
their types and their constraints (``msgspec.Meta``) are the definition; this module reads them once
(:func:`record_spec`, through :mod:`msgspec.inspect`) and derives

* the logged JSON of a record (:func:`to_json`), which ``orjson`` turns into canonical bytes;
* the validating reader (:func:`from_json`): a decoder generated per record for the well-formed shapes, and
  for anything it does not take, an interpreter of the same definition that names the field path and the
  rule that is broken (:class:`~foldline.errors.FormatError`);
* the value checks every append applies (:func:`check_record`): integer ranges, ids;
* and, in ``adapters/avro/``, the Avro schema and its encoders and decoders.

Conventions the definitions follow (docs/ARCHITECTURE.md, "Defining a record"):

* A field whose default is ``None`` is optional: omitted from the JSON when ``None``, absent on read.
* A ``bool`` field whose default is ``False`` is a flag: written only when true, absent on read means false.
  With ``Meta(extra={"true_only": True})`` an explicit ``false`` is refused (rule of the field).
* Every other field is required in the JSON and always written, whatever its Python default.
* ``Meta(ge=..., le=...)`` bounds an integer (a value above ``MAX_INT`` breaks rule ``value-range``, any other
  bound rule ``format``); ``Meta(min_length=1)`` makes a string or array non-empty; ``Meta(pattern=...)``
  with ``extra={"expect": ...}`` constrains a string; ``extra={"id": "id" | "session"}`` makes a string an
  id (checked by :func:`check_record`, rule ``id``); ``extra={"rule": ...}`` names the rule a bad value of the
  field breaks (default ``format``); ``Meta(description=...)`` documents the field in the Avro schema.
* A ``Mapping[str, Any]`` field is free-form JSON, sorted like every object of canonical JSON; declared
  :data:`OrderedJson` it keeps the key order its author gave (docs/FORMAT.md §1.9).
* ``extra={"content": True}`` (the :data:`Content` type, or the hint on a JSON object or a list of strings) marks a
  field as model-visible content: when encryption is on it is logged sealed under the session's data key, and
  erasing the session destroys it (``core/sealing.py`` derives sealing and opening from these marks alone).
* Content blocks and the replace op are tagged (``tag_field``/``tag``): the tag is their ``type`` (``op``)
  key in JSON and their ``kind`` attribute in Python.
* A class may name constant JSON keys that are not attributes (``JSON_CONSTANTS``, e.g. a message's
  ``role``) and the rule a wrong tag breaks (``TAG_RULE``, the replace op's ``surface-op``); a field may carry
  Avro hints (``Meta(extra={"avro": {...}})``, read only by ``adapters/avro/``).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cache
from typing import Annotated, Any, NoReturn, TypeAlias, TypeVar

import msgspec
import msgspec.inspect as mi

from ..errors import FormatError, ValidationError
from .frozen import freeze_json, freeze_ordered, thaw_json

__all__ = [
    "ID_MAX_BYTES",
    "MAX_INT",
    "SESSION_ID_MAX_BYTES",
    "ArrT",
    "BoolT",
    "Content",
    "Digest",
    "FieldSpec",
    "FloatT",
    "Id",
    "IntT",
    "JsonT",
    "LitT",
    "Nat",
    "Node",
    "OrderedJson",
    "Pos",
    "RecT",
    "Record",
    "RecordSpec",
    "SessionId",
    "StrT",
    "TagT",
    "check_record",
    "fast_decoder",
    "field_signatures",
    "from_json",
    "holds_ordered_json",
    "id_problem",
    "read_json",
    "record_spec",
    "tagged",
    "tagged_union",
    "to_json",
    "union_from_json",
]

#: The largest integer any field may hold: an Avro ``long`` (signed 64 bits), what the Kafka records carry.
MAX_INT = (1 << 63) - 1
#: Ids inside events (message, tool-call and tool-result ids, tool names): at most this many UTF-8 bytes.
ID_MAX_BYTES = 1024
#: A session id: 1..255 UTF-8 bytes of printable text (it names a Kafka key, a Redis key, a table row).
SESSION_ID_MAX_BYTES = 255


class Record(msgspec.Struct, frozen=True, gc=False, rename="camel"):
    """The base of every logged record: frozen, slotted, never in a reference cycle, camelCase when logged."""


#: An integer ``0..MAX_INT``; ``Pos``: ``1..MAX_INT``.
Nat: TypeAlias = Annotated[int, msgspec.Meta(ge=0, le=MAX_INT)]
Pos: TypeAlias = Annotated[int, msgspec.Meta(ge=1, le=MAX_INT)]
#: A message id, call id or tool name: printable text of at most ``ID_MAX_BYTES`` bytes (rule ``id``).
Id: TypeAlias = Annotated[str, msgspec.Meta(extra={"id": "id"})]
#: A session id: non-empty printable text of at most ``SESSION_ID_MAX_BYTES`` bytes (rule ``id``).
SessionId: TypeAlias = Annotated[str, msgspec.Meta(extra={"id": "session"})]
#: A free-form JSON object whose key order is part of its value (docs/FORMAT.md §1.9), held as an
#: :class:`~foldline.core.frozen.OrderedObject`: written in its document order at every depth where every other
#: object is sorted, and equal only to the same members in the same order. For the JSON a model reads as given —
#: a tool's input schema, an output schema. The decoders build the OrderedObject; a record built in code freezes
#: the mapping it is given in ``__post_init__`` (:class:`~foldline.core.header.ToolSpec`), and the encoders freeze
#: one that was not, in its own order.
OrderedJson: TypeAlias = Annotated[Mapping[str, Any], msgspec.Meta(extra={"ordered": True})]
#: Model-visible content: text the model reads or wrote (sealed when encryption is on; docs/ERASURE.md).
Content: TypeAlias = Annotated[str, msgspec.Meta(extra={"content": True})]
#: ``sha256:`` + 64 lowercase hex digits.
Digest: TypeAlias = Annotated[
    str, msgspec.Meta(pattern=r"^sha256:[0-9a-f]{64}\Z", extra={"expect": "'sha256:' + 64 lowercase hex digits"})
]

_R = TypeVar("_R", bound=type)


def tagged(cls: _R) -> _R:
    """Class decorator: the record's tag (``msgspec`` ``tag=``) as its ``kind`` class attribute."""
    cls.kind = cls.__struct_config__.tag  # type: ignore[attr-defined]
    return cls


# ------------------------------------------------------------------------------------------ the definition


@dataclass(frozen=True, slots=True)
class IntT:
    lo: int
    hi: int


@dataclass(frozen=True, slots=True)
class FloatT:
    lo: float | None
    hi: float | None


@dataclass(frozen=True, slots=True)
class StrT:
    min_len: int
    pattern: re.Pattern[str] | None
    expect: str | None
    id: str | None  # "id" | "session" | None


@dataclass(frozen=True, slots=True)
class BoolT:
    pass


@dataclass(frozen=True, slots=True)
class LitT:
    values: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class JsonT:
    """Free-form JSON object, held as a :class:`FrozenDict` — or, ``ordered``, as an
    :class:`~foldline.core.frozen.OrderedObject` whose key order is kept (:data:`OrderedJson`)."""

    ordered: bool = False


@dataclass(frozen=True, slots=True)
class ArrT:
    item: Node
    min_len: int


@dataclass(frozen=True, slots=True)
class RecT:
    cls: type


@dataclass(frozen=True, slots=True)
class TagT:
    """One of several tagged records, told apart by ``key`` (their tag field)."""

    key: str
    members: tuple[type, ...]  # in declaration order

    def by_tag(self) -> dict[str, type]:
        return {record_spec(c).tag: c for c in self.members}  # type: ignore[misc]


@dataclass(frozen=True, slots=True)
class AltT:
    """A string constant or a tagged record (the surface op: ``"append"`` or a replace)."""

    lit: LitT
    rec: type
    extra: Mapping[str, Any]


Node: TypeAlias = IntT | FloatT | StrT | BoolT | LitT | JsonT | ArrT | RecT | TagT | AltT


@dataclass(frozen=True, slots=True)
class FieldSpec:
    name: str  # the attribute
    json: str  # the logged key
    node: Node
    optional: str | None  # "none": omitted when None; "false": a flag written only when true; None: required
    rule: str  # the rule a bad value breaks
    true_only: bool
    doc: str | None
    extra: Mapping[str, Any]  # every hint of the field (avro hints among them)

    @property
    def content(self) -> bool:
        """Whether the field is model-visible content (sealed when encryption is on)."""
        return bool(self.extra.get("content"))


@dataclass(frozen=True, slots=True)
class RecordSpec:
    cls: type
    name: str
    fields: tuple[FieldSpec, ...]
    tag_key: str | None
    tag: str | None
    constants: Mapping[str, str]  # constant logged keys that are not attributes (a message's role)
    doc: str | None
    keys: frozenset[str] = field(default=frozenset())  # every key the JSON object may hold


def _unwrap(t: Any) -> tuple[Any, dict[str, Any], str | None]:
    extra: dict[str, Any] = {}
    doc = None
    while isinstance(t, mi.Metadata):
        extra.update(t.extra or {})
        doc = (t.extra_json_schema or {}).get("description", doc)
        t = t.type
    return t, extra, doc


def _node(t: Any) -> tuple[Node, dict[str, Any], str | None]:
    t, extra, doc = _unwrap(t)
    if isinstance(t, mi.IntType):
        lo = t.ge if t.ge is not None else (t.gt + 1 if t.gt is not None else 0)
        hi = t.le if t.le is not None else MAX_INT
        return IntT(lo, hi), extra, doc
    if isinstance(t, mi.FloatType):
        return FloatT(t.ge, t.le), extra, doc
    if isinstance(t, mi.StrType):
        pattern = re.compile(t.pattern) if t.pattern else None
        return StrT(t.min_length or 0, pattern, extra.get("expect"), extra.get("id")), extra, doc
    if isinstance(t, mi.BoolType):
        return BoolT(), extra, doc
    if isinstance(t, mi.LiteralType):
        return LitT(tuple(str(v) for v in t.values)), extra, doc
    if isinstance(t, mi.DictType | mi.CustomType):
        return JsonT(bool(extra.get("ordered"))), extra, doc
    if isinstance(t, mi.VarTupleType):
        item, item_extra, _ = _node(t.item_type)
        extra = {**item_extra, **extra}
        return ArrT(item, t.min_length or 0), extra, doc
    if isinstance(t, mi.StructType):
        return RecT(t.cls), extra, doc
    if isinstance(t, mi.UnionType):
        members = [_unwrap(m) for m in t.types]
        structs = [m for m, _, _ in members if isinstance(m, mi.StructType)]
        lits = [(m, e) for m, e, _ in members if isinstance(m, mi.LiteralType)]
        for _, e, _ in members:
            extra.update(e)
        if lits and len(structs) == 1:
            return AltT(LitT(tuple(str(v) for v in lits[0][0].values)), structs[0].cls, lits[0][1]), extra, doc
        key = structs[0].tag_field if structs else None
        if key is not None and len(structs) == len(members) and all(s.tag_field == key for s in structs):
            return TagT(key, tuple(s.cls for s in structs)), extra, doc
    raise TypeError(f"a record field of type {t!r} has no logged form")


@cache
def record_spec(cls: type) -> RecordSpec:
    """The definition of record class ``cls``, read from its annotations."""
    info = mi.type_info(cls)
    assert isinstance(info, mi.StructType), cls
    fields: list[FieldSpec] = []
    for f in info.fields:
        raw, _, _ = _unwrap(f.type)
        is_optional = isinstance(raw, mi.UnionType) and any(isinstance(m, mi.NoneType) for m in raw.types)
        if is_optional:
            inner = [m for m in raw.types if not isinstance(m, mi.NoneType)]
            node, extra, doc = _node(inner[0] if len(inner) == 1 else mi.UnionType(tuple(inner)))
            outer_extra = f.type.extra if isinstance(f.type, mi.Metadata) else None
            extra = {**extra, **(outer_extra or {})}
            if f.default is not None:
                raise TypeError(f"{cls.__name__}.{f.name}: an optional field's default must be None")
            optional: str | None = "none"
        else:
            node, extra, doc = _node(f.type)
            optional = "false" if isinstance(node, BoolT) and f.default is False else None
        fields.append(
            FieldSpec(
                f.name,
                f.encode_name,
                node,
                optional,
                extra.get("rule", "format"),
                bool(extra.get("true_only")),
                doc,
                extra,
            )
        )
    constants: Mapping[str, str] = getattr(cls, "JSON_CONSTANTS", {})
    keys = frozenset({f.json for f in fields} | set(constants) | ({info.tag_field} if info.tag_field else set()))
    return RecordSpec(
        cls,
        cls.__name__,
        tuple(fields),
        info.tag_field,
        info.tag if isinstance(info.tag, str) else None,
        constants,
        (cls.__doc__ or "").strip() or None,
        keys,
    )


# ------------------------------------------------------------------------------------------ to JSON


def _encode_expr(node: Node, v: str, scope: dict[str, Any]) -> str:
    """A Python expression of the logged JSON of value expression ``v``."""
    if isinstance(node, IntT | FloatT | StrT | BoolT | LitT):
        return v
    if isinstance(node, JsonT):
        if node.ordered:  # an OrderedObject (itself when it is one): canonical JSON writes it in its order
            scope["freeze_ordered"] = freeze_ordered
            return f"freeze_ordered({v})"
        scope["thaw"] = thaw_json
        return f"thaw({v})"
    if isinstance(node, ArrT):
        if isinstance(node.item, IntT | StrT | LitT | FloatT | BoolT):
            return f"list({v})"
        return f"[{_encode_expr(node.item, 'x', scope)} for x in {v}]"
    if isinstance(node, RecT):
        name = f"enc_{record_spec(node.cls).name}"
        scope[name] = _encoder(node.cls)
        return f"{name}({v})"
    if isinstance(node, TagT):
        table = f"enc_by_type_{id(node)}"
        scope[table] = {c: _encoder(c) for c in node.members}
        return f"{table}[type({v})]({v})"
    if isinstance(node, AltT):
        name = f"enc_{record_spec(node.rec).name}"
        scope[name] = _encoder(node.rec)
        return f"({v} if type({v}) is str else {name}({v}))"
    raise AssertionError(node)


@cache
def _encoder(cls: Any) -> Callable[[Any], dict[str, Any]]:
    spec = record_spec(cls)
    scope: dict[str, Any] = {}
    items = [f"{spec.tag_key!r}: {spec.tag!r}"] if spec.tag_key else []
    items += [f"{k!r}: {v!r}" for k, v in spec.constants.items()]
    optional: list[str] = []
    for f in spec.fields:
        expr = _encode_expr(f.node, f"o.{f.name}", scope)
        if f.optional == "none":
            optional.append(f"    if o.{f.name} is not None:\n        out[{f.json!r}] = {expr}\n")
        elif f.optional == "false":
            optional.append(f"    if o.{f.name}:\n        out[{f.json!r}] = True\n")
        else:
            items.append(f"{f.json!r}: {expr}")
    body = f"    out = {{{', '.join(items)}}}\n" + "".join(optional) + "    return out\n"
    source = f"def encode(o):\n{body}"
    exec(compile(source, f"<encoder of {spec.name}>", "exec"), scope)  # code text from the definition only
    fn: Callable[[Any], dict[str, Any]] = scope["encode"]
    return fn


_TO_JSON: dict[type, Callable[[Any], dict[str, Any]]] = {}


def to_json(record: Any) -> dict[str, Any]:
    """The logged JSON object of a record (its canonical bytes: ``codec.canonical_json`` of it)."""
    cls = type(record)
    fn = _TO_JSON.get(cls)
    if fn is None:
        fn = _TO_JSON[cls] = _encoder(cls)  # type: ignore[arg-type]
    return fn(record)


# ------------------------------------------------------------------------------------------ from JSON: fast


class _Other(Exception):
    """Not a shape the generated decoder takes: the interpreter reads it (and names what is wrong)."""


_MISSING: Any = object()


class _Gen:
    """Generates the source of one decoder function per record, each taking exactly what the interpreter
    accepts and raising ``_Other`` (or a ``LookupError``/``TypeError``) on anything else."""

    def __init__(self) -> None:
        self.scope: dict[str, Any] = {
            "Other": _Other,
            "MISSING": _MISSING,
            "freeze": freeze_json,
            "freeze_ordered": freeze_ordered,
        }
        self.names: dict[type, str] = {}
        self.sources: list[str] = []
        self.tables: list[dict[str, Any]] = []  # tag -> decoder name, resolved to the function after exec
        self.counter = 0

    def const(self, value: Any) -> str:
        self.counter += 1
        name = f"k{self.counter}"
        self.scope[name] = value
        return name

    def check(self, node: Node, v: str, out: list[str], ind: str) -> str:
        """Lines checking value ``v`` (a local) for ``node``; returns the expression of its decoded value."""
        if isinstance(node, IntT):
            out.append(f"{ind}if type({v}) is not int or not {node.lo} <= {v} <= {node.hi}: raise Other\n")
            return v
        if isinstance(node, FloatT):
            out.append(f"{ind}if type({v}) is not float: raise Other\n")  # an integer is read by the interpreter
            return v
        if isinstance(node, StrT):
            cond = f"type({v}) is not str"
            if node.min_len:
                cond += f" or len({v}) < {node.min_len}"
            if node.pattern is not None:
                cond += f" or {self.const(node.pattern)}.search({v}) is None"
            out.append(f"{ind}if {cond}: raise Other\n")
            return v
        if isinstance(node, BoolT):
            out.append(f"{ind}if type({v}) is not bool: raise Other\n")
            return v
        if isinstance(node, LitT):
            out.append(
                f"{ind}if type({v}) is not str or {v} not in {self.const(frozenset(node.values))}: raise Other\n"
            )
            return v
        if isinstance(node, JsonT):
            out.append(f"{ind}if type({v}) is not dict: raise Other\n")
            return f"freeze_ordered({v})" if node.ordered else f"freeze({v})"
        if isinstance(node, RecT):
            return f"{self.record(node.cls)}({v})"
        if isinstance(node, TagT):
            table = {tag: self.record(c) for tag, c in node.by_tag().items()}
            self.tables.append(table)
            return f"{self.const(table)}[{v}[{node.key!r}]]({v})"
        if isinstance(node, AltT):
            lits = self.const(frozenset(node.lit.values))
            return f"({v} if type({v}) is str and {v} in {lits} else {self.record(node.rec)}({v}))"
        if isinstance(node, ArrT):
            out.append(f"{ind}if type({v}) is not list: raise Other\n")
            if node.min_len:
                out.append(f"{ind}if len({v}) < {node.min_len}: raise Other\n")
            item = node.item
            if isinstance(item, StrT) and not item.min_len and item.pattern is None:
                out.append(f"{ind}for x in {v}:\n{ind}    if type(x) is not str: raise Other\n")
                return f"tuple({v})"
            if isinstance(item, IntT):
                out.append(
                    f"{ind}for x in {v}:\n{ind}    if type(x) is not int or not {item.lo} <= x <= {item.hi}: "
                    "raise Other\n"
                )
                return f"tuple({v})"
            inner: list[str] = []
            expr = self.check(item, "x", inner, "")
            if not inner:
                return f"tuple([{expr} for x in {v}])"
            self.counter += 1
            helper = f"items{self.counter}"
            src = f"def {helper}(v):\n    out = []\n    for x in v:\n"
            src += "".join("        " + line for line in inner) + f"        out.append({expr})\n    return tuple(out)\n"
            self.sources.append(src)
            return f"{helper}({v})"
        raise AssertionError(node)

    def record(self, cls: type) -> str:
        known = self.names.get(cls)
        if known is not None:
            return known
        spec = record_spec(cls)
        name = self.names[cls] = f"dec_{spec.name}"
        self.scope[f"cls_{spec.name}"] = cls
        keys = self.const(spec.keys)
        lines = [f"def {name}(d):\n", f"    if type(d) is not dict or not d.keys() <= {keys}: raise Other\n"]
        for key, value in spec.constants.items():
            lines.append(f"    if d.get({key!r}) != {value!r}: raise Other\n")
        if spec.tag_key:
            lines.append(f"    if d[{spec.tag_key!r}] != {spec.tag!r}: raise Other\n")
        args = []
        for i, f in enumerate(spec.fields):
            v = f"v{i}"
            if f.optional == "none":
                lines.append(f"    {v} = d.get({f.json!r}, MISSING)\n")
                inner: list[str] = []
                expr = self.check(f.node, v, inner, "        ")
                lines.append(f"    if {v} is MISSING:\n        {v} = None\n    else:\n")
                lines.extend(inner)
                lines.append(f"        {v} = {expr}\n")
            elif f.optional == "false":
                # only what the encoder writes: a flag is absent or true (the interpreter reads an explicit false)
                lines.append(f"    {v} = d.get({f.json!r}, False)\n")
                lines.append(f"    if type({v}) is not bool or {v} is False and {f.json!r} in d: raise Other\n")
            else:
                lines.append(f"    {v} = d[{f.json!r}]\n")
                inner = []
                expr = self.check(f.node, v, inner, "    ")
                lines.extend(inner)
                if expr != v:
                    lines.append(f"    {v} = {expr}\n")
            args.append(v)
        lines.append(f"    return cls_{spec.name}({', '.join(args)})\n")
        self.sources.append("".join(lines))
        return name

    def build(self) -> None:
        if self.sources:
            source = "\n".join(self.sources)
            self.sources.clear()
            exec(compile(source, "<generated record decoders>", "exec"), self.scope)  # text from the definitions
        for table in self.tables:
            for key, value in table.items():
                if isinstance(value, str):
                    table[key] = self.scope[value]


_GEN = _Gen()
_FAST: dict[type, Callable[[Any], Any]] = {}


def _fast(cls: type) -> Callable[[Any], Any]:
    fn = _FAST.get(cls)
    if fn is None:
        name = _GEN.record(cls)
        _GEN.build()
        fn = _FAST[cls] = _GEN.scope[name]
    return fn


def fast_decoder(cls: type) -> Callable[[Any], Any]:
    """The generated decoder of record ``cls``: its object for every well-formed JSON value, else raises
    (``_Other``, ``LookupError``, ``TypeError`` or ``ValueError``) — :func:`from_json` then reads it with the
    interpreter, which names the problem."""
    return _fast(cls)


# ------------------------------------------------------------------------------------------ from JSON: checked


def _tname(v: Any) -> str:
    return "missing" if v is None else type(v).__name__


def _fail(message: str, rule: str, seq: int | None) -> NoReturn:
    raise FormatError(rule, message, seq=seq)


def _read(node: Node, v: Any, where: str, rule: str, seq: int | None) -> Any:
    """The interpreter: the value of ``v`` read as ``node``, or FormatError naming ``where``."""
    if isinstance(node, IntT):
        if not isinstance(v, int) or isinstance(v, bool):
            _fail(f"{where} must be an integer, got {_tname(v)}", rule, seq)
        if v < node.lo:
            _fail(f"{where} must be >= {node.lo}, got {v}", rule, seq)
        if v > node.hi:
            if node.hi == MAX_INT:
                _fail(f"{where} must fit in a signed 64-bit integer (at most {MAX_INT}), got {v}", "value-range", seq)
            _fail(f"{where} must be <= {node.hi}, got {v}", rule, seq)
        return v
    if isinstance(node, FloatT):
        if not isinstance(v, int | float) or isinstance(v, bool):
            _fail(f"{where} must be a number, got {_tname(v)}", rule, seq)
        return float(v)
    if isinstance(node, StrT):
        if not isinstance(v, str):
            _fail(f"{where} must be a string, got {_tname(v)}", rule, seq)
        if len(v) < node.min_len:
            _fail(f"{where} is empty; an empty value is written as absent", rule, seq)
        if node.pattern is not None and node.pattern.search(v) is None:
            _fail(f"{where} must be {node.expect or node.pattern.pattern}, got {v[:80]!r}", rule, seq)
        return v
    if isinstance(node, BoolT):
        if not isinstance(v, bool):
            _fail(f"{where} must be a boolean, got {_tname(v)}", rule, seq)
        return v
    if isinstance(node, LitT):
        if not isinstance(v, str) or v not in node.values:
            _fail(f"{where} must be one of {sorted(node.values)}, got {v!r}", rule, seq)
        return v
    if isinstance(node, JsonT):
        if not isinstance(v, dict):
            _fail(f"{where} must be an object, got {_tname(v)}", rule, seq)
        return freeze_ordered(v) if node.ordered else freeze_json(v)
    if isinstance(node, ArrT):
        if not isinstance(v, list):
            _fail(f"{where} must be an array, got {_tname(v)}", rule, seq)
        if len(v) < node.min_len:
            _fail(f"{where} is empty; an empty array is written as absent", rule, seq)
        return tuple(_read(node.item, x, f"{where}[{i}]", rule, seq) for i, x in enumerate(v))
    if isinstance(node, RecT):
        return read_json(node.cls, v, where, seq)
    if isinstance(node, TagT):
        if not isinstance(v, dict):
            _fail(f"{where} must be an object, got {_tname(v)}", "format", seq)
        members = node.by_tag()
        tag = v.get(node.key)
        cls = members.get(tag) if isinstance(tag, str) else None
        if cls is None:
            known = _ALL_TAGS.get(node.key, {})
            if isinstance(tag, str) and tag in known:
                _fail(f"{where} must be a {' or '.join(members)} block here, got {v.get(node.key)!r}", "format", seq)
            _fail(f"{where}.{node.key} must be one of {', '.join(members)}; got {v.get(node.key)!r}", "format", seq)
        return read_json(cls, v, where, seq)
    if isinstance(node, AltT):
        if isinstance(v, str) and v in node.lit.values:
            return v
        if isinstance(v, dict):
            return read_json(node.rec, v, where, seq)
        spec = record_spec(node.rec)
        shape = ", ".join([f"{spec.tag_key}: {spec.tag!r}", *(f.json for f in spec.fields)])
        _fail(f"{where} must be {' or '.join(map(repr, node.lit.values))} or {{{shape}}}, got {v!r}", rule, seq)
    raise AssertionError(node)


def read_json(cls: type, value: Any, where: str, seq: int | None = None) -> Any:
    """Record ``cls`` from its logged JSON ``value``, checked field by field: FormatError naming the seq and
    the path of the first field that is wrong (``where`` is the path of ``value``)."""
    spec = record_spec(cls)
    if not isinstance(value, dict):
        _fail(f"{where} must be an object, got {_tname(value)}", "format", seq)
    extra = set(value) - spec.keys
    if extra:
        _fail(f"{where} has unknown field(s) {sorted(extra)}; allowed: {sorted(spec.keys)}", "format", seq)
    for key, constant in spec.constants.items():
        if value.get(key) != constant:
            _fail(f"{where}.{key} must be {constant!r}", "format", seq)
    if spec.tag_key and value.get(spec.tag_key) != spec.tag:
        _fail(f"{where}.{spec.tag_key} must be {spec.tag!r}, got {value.get(spec.tag_key)!r}", _tag_rule(spec), seq)
    args = []
    for f in spec.fields:
        path = f"{where}.{f.json}"
        if f.optional == "none":
            args.append(_read(f.node, value[f.json], path, f.rule, seq) if f.json in value else None)
        elif f.optional == "false":
            flag = value.get(f.json, False)
            if not isinstance(flag, bool):
                _fail(f"{path} must be a boolean, got {_tname(flag)}", "format", seq)
            if f.true_only and f.json in value and not flag:
                _fail(f"{path} is false; it is written only when true (omit it when false)", f.rule, seq)
            args.append(flag)
        else:
            args.append(_read(f.node, value.get(f.json), path, f.rule, seq))
    try:
        return cls(*args)
    except ValueError as exc:
        _fail(f"{where}: {exc}", "format", seq)


def _tag_rule(spec: RecordSpec) -> str:
    return str(getattr(spec.cls, "TAG_RULE", "format"))


_ALL_TAGS: dict[str, dict[str, type]] = {}


def register_tags(*unions: TagT) -> None:
    """Make the tags of ``unions`` known, so a block that exists but is not allowed somewhere is named so."""
    for union in unions:
        _ALL_TAGS.setdefault(union.key, {}).update(union.by_tag())


def from_json(cls: type, value: Any, where: str, seq: int | None = None) -> Any:
    """Record ``cls`` from its logged JSON: the generated decoder, or the interpreter for anything it does
    not take (which then either reads it the same or raises the FormatError that names the problem)."""
    try:
        return _fast(cls)(value)
    except (_Other, LookupError, TypeError, ValueError, AttributeError):
        return read_json(cls, value, where, seq)


# ------------------------------------------------------------------------------------------ value checks


def id_problem(value: str, max_bytes: int, *, empty_ok: bool = False) -> str | None:
    """Why ``value`` is not a valid id (``None`` when it is).

    An id is printable text: no control, format, line/paragraph separator, surrogate, private-use or
    unassigned character (:meth:`str.isprintable`; the ASCII space is allowed), and at most ``max_bytes``
    bytes in UTF-8.
    """
    if not value:
        return None if empty_ok else "it is empty"
    if not value.isprintable():
        bad = next(c for c in value if not c.isprintable())
        return f"it contains the non-printable character U+{ord(bad):04X} (ids are printable text)"
    if len(value) * 4 <= max_bytes:  # a character is at most 4 bytes in UTF-8
        return None
    if len(value) > max_bytes or len(value.encode("utf-8", "surrogatepass")) > max_bytes:
        return f"it is {len(value.encode('utf-8', 'surrogatepass')):,} bytes long (at most {max_bytes} in UTF-8)"
    return None


def _bad_id(value: str, what: str, kind: str, seq: int) -> None:
    if kind == "session":
        problem = id_problem(value, SESSION_ID_MAX_BYTES)
        if problem is not None:
            raise ValidationError("id", f"{what} is not a valid session id: {problem}", seq=seq)
        return
    problem = id_problem(value, ID_MAX_BYTES, empty_ok=True)
    if problem is not None:
        shown = value[:40] + ("…" if len(value) > 40 else "")
        raise ValidationError("id", f"{what} {shown!r} is not valid: {problem}", seq=seq)


def _bad_int(value: int, what: str, lo: int, hi: int, seq: int) -> None:
    raise ValidationError(
        "value-range", f"{what} must be within {lo}..{hi} (a signed 64-bit integer), got {value}", seq=seq
    )


class _Checks:
    """Generates one value-check function per record: every bounded integer and every id of it."""

    def __init__(self) -> None:
        self.scope: dict[str, Any] = {"bad_id": _bad_id, "bad_int": _bad_int}
        self.fns: dict[type, Callable[[Any, int], None]] = {}

    def lines(self, node: Node, v: str, what: str, out: list[str], ind: str) -> None:
        if isinstance(node, IntT):
            out.append(
                f"{ind}if not {node.lo} <= {v} <= {node.hi}: bad_int({v}, {what!r}, {node.lo}, {node.hi}, seq)\n"
            )
        elif isinstance(node, StrT) and node.id:
            out.append(f"{ind}bad_id({v}, {what!r}, {node.id!r}, seq)\n")
        elif isinstance(node, ArrT):
            inner: list[str] = []
            self.lines(node.item, "x", what, inner, ind + "    ")
            if inner:
                out.append(f"{ind}for x in {v}:\n")
                out.extend(inner)
        elif isinstance(node, RecT | TagT | AltT):
            members = (node.cls,) if isinstance(node, RecT) else node.members if isinstance(node, TagT) else (node.rec,)
            for cls in members:
                if self.needed(cls):
                    name = f"check_{record_spec(cls).name}"
                    self.scope[name] = self.fn(cls)
                    guard = f"type({v}) is cls_{record_spec(cls).name}"
                    self.scope[f"cls_{record_spec(cls).name}"] = cls
                    out.append(f"{ind}if {guard}: {name}({v}, seq)\n")

    def needed(self, cls: type) -> bool:
        def walk(node: Node, seen: frozenset[type]) -> bool:
            if isinstance(node, IntT):
                return True
            if isinstance(node, StrT):
                return node.id is not None
            if isinstance(node, ArrT):
                return walk(node.item, seen)
            members: tuple[type, ...] = ()
            if isinstance(node, RecT):
                members = (node.cls,)
            elif isinstance(node, TagT):
                members = node.members
            elif isinstance(node, AltT):
                members = (node.rec,)
            return any(walk(f.node, seen | {c}) for c in members if c not in seen for f in record_spec(c).fields)

        return any(walk(f.node, frozenset({cls})) for f in record_spec(cls).fields)

    def fn(self, cls: type) -> Callable[[Any, int], None]:
        done = self.fns.get(cls)
        if done is not None:
            return done
        spec = record_spec(cls)
        out: list[str] = []
        for f in spec.fields:
            v = f"o.{f.name}"
            inner: list[str] = []
            what = f.json if hasattr(cls, "TYPE") else f"{spec.name}.{f.json}"
            self.lines(f.node, "v", what, inner, "        " if f.optional == "none" else "    ")
            if not inner:
                continue
            out.append(f"    v = {v}\n")
            if f.optional == "none":
                out.append("    if v is not None:\n")
            out.extend(inner)
        body = "".join(out) or "    pass\n"
        source = f"def check(o, seq):\n{body}"
        scope = dict(self.scope)
        exec(compile(source, f"<checks of {spec.name}>", "exec"), scope)  # code text from the definition only
        fn: Callable[[Any, int], None] = scope["check"]
        self.fns[cls] = fn
        return fn


_CHECKS = _Checks()


def check_record(record: Any, seq: int) -> None:
    """Every bounded integer of ``record`` within its bounds (rule ``value-range``) and every id a valid id
    (rule ``id``): :class:`ValidationError` naming the seq and the field otherwise."""
    fn = _CHECKS.fns.get(type(record))
    if fn is None:
        fn = _CHECKS.fn(type(record))
    fn(record, seq)


def tagged_union(*members: type) -> TagT:
    """The union of tagged records ``members`` (their common tag field tells them apart)."""
    keys = {record_spec(c).tag_key for c in members}
    if len(keys) != 1 or None in keys:
        raise TypeError(f"{[c.__name__ for c in members]} are not tagged records with one tag field")
    union = TagT(next(iter(keys)), members)  # type: ignore[arg-type]
    register_tags(union)
    return union


def union_from_json(union: TagT, value: Any, where: str, seq: int | None = None) -> Any:
    """One record of ``union`` from its logged JSON (the generated decoder of its tag, else the interpreter)."""
    try:
        return _fast(union.by_tag()[value[union.key]])(value)
    except (_Other, LookupError, TypeError, ValueError, AttributeError):
        return _read(union, value, where, "format", seq)


# ------------------------------------------------------------------------------------------ evolution


def _signature(node: Node) -> str:
    if isinstance(node, IntT):
        return "int" if node.lo == 0 else f"int>={node.lo}"
    if isinstance(node, FloatT):
        return "float"
    if isinstance(node, StrT):
        return "string" if not node.min_len else "string+"
    if isinstance(node, BoolT):
        return "bool"
    if isinstance(node, LitT):
        return "|".join(repr(v) for v in node.values)
    if isinstance(node, JsonT):
        return "object"  # ordered or not: the logged type is a JSON object; its key order is a rule of §1
    if isinstance(node, ArrT):
        return f"[{_signature(node.item)}]" + ("+" if node.min_len else "")
    if isinstance(node, RecT):
        return record_spec(node.cls).name
    if isinstance(node, TagT):
        return "|".join(record_spec(c).name for c in node.members)
    if isinstance(node, AltT):
        return f"{_signature(node.lit)}|{record_spec(node.rec).name}"
    raise AssertionError(node)


def holds_ordered_json(cls: type) -> bool:
    """Whether a record of ``cls`` can hold an :data:`OrderedJson` value (at any depth): its canonical bytes are
    then not the sorted encoding of its JSON."""

    def walk(node: Node, seen: frozenset[type]) -> bool:
        if isinstance(node, JsonT):
            return node.ordered
        if isinstance(node, ArrT):
            return walk(node.item, seen)
        members: tuple[type, ...] = ()
        if isinstance(node, RecT):
            members = (node.cls,)
        elif isinstance(node, TagT):
            members = node.members
        elif isinstance(node, AltT):
            members = (node.rec,)
        return any(walk(f.node, seen | {c}) for c in members if c not in seen for f in record_spec(c).fields)

    return any(walk(f.node, frozenset({cls})) for f in record_spec(cls).fields)


def field_signatures(*roots: type) -> list[str]:
    """One line per logged field of ``roots`` and every record they hold: ``Record.jsonName: type``, with
    ``?`` for an optional field and ``!`` for a flag — what ``schemas/fields.v<format version>.txt`` lists."""
    out: list[str] = []
    seen: set[type] = set()
    todo = list(roots)
    while todo:
        cls = todo.pop(0)
        if cls in seen:
            continue
        seen.add(cls)
        spec = record_spec(cls)
        for f in spec.fields:
            mark = "?" if f.optional == "none" else "!" if f.optional == "false" else ""
            out.append(f"{spec.name}.{f.json}: {_signature(f.node)}{mark}")
            nested: list[Node] = [f.node]
            while nested:
                node = nested.pop()
                if isinstance(node, ArrT):
                    nested.append(node.item)
                elif isinstance(node, RecT):
                    todo.append(node.cls)
                elif isinstance(node, TagT):
                    todo.extend(node.members)
                elif isinstance(node, AltT):
                    todo.append(node.rec)
    return out
