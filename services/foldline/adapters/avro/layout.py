"""The Avro layout of the session events, derived from the record definitions (``core/records.py``).

The Avro record of an event carries the logged fields of its definition under their logged names, in
definition order, with these differences from the JSON form (docs/SCHEMAS.md), all lossless:

* a tagged record (a content block, the replace op) is a union branch, named after its class: the tag is
  carried by the branch; a message's constant ``role`` by the record;
* an optional field is ``["null", T]`` with default ``null``; a flag is a ``boolean`` with default ``false``
  (``["null", "boolean"]`` for a flag with the ``nullable`` Avro hint: ``null`` when false);
* a string constant-or-record union (the surface op) is an enum of the constant | the record (Avro hint
  ``enum``, with its ``default``); a string literal is a ``string`` (checked on decode);
* a free-form JSON object (a tool's ``inputSchema``) is its canonical JSON text;
* the reasoning blocks of a ``content`` list travel in the field ``reasoning`` (``ReasoningEntry {at,
  block}``) placed after the surface fields, so records from before reasoning existed stay readable;
* the event types always written ignorable travel as ``UnknownEvent {json}``, like unknown types;
* the envelope's ``sealed`` marker (content sealed under a data key, docs/ERASURE.md) is the field before
  ``data``, ``["null", Seal {kid, v}]`` with default ``null``: records from before it existed read as not sealed.

:func:`event_schema` is the schema; :func:`datum_encoder` turns a record into its fastavro datum;
:func:`datum_to_json` turns a decoded datum back into the logged JSON form (then read by the core's decoders).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

from ...core import codec
from ...core.content import REASONING_KINDS
from ...core.events import ALWAYS_IGNORABLE, EVENT_TYPES, Event, Seal
from ...core.frozen import freeze_ordered, thaw_json
from ...core.records import (
    AltT,
    ArrT,
    BoolT,
    FieldSpec,
    FloatT,
    IntT,
    JsonT,
    LitT,
    Node,
    RecT,
    StrT,
    TagT,
    record_spec,
)

__all__ = [
    "AVRO_EVENTS",
    "NAMESPACE",
    "REASONING_DOC",
    "AvroField",
    "avro_fields",
    "datum_encoder",
    "datum_to_json",
    "event_schema",
    "reasoning_split",
    "schema_text",
    "write_schema",
]

NAMESPACE = "foldline."
#: The event types with a record of their own in the ``data`` union, in union order (then ``UnknownEvent``).
AVRO_EVENTS: tuple[type[Event], ...] = tuple(c for c in EVENT_TYPES if c.TYPE not in ALWAYS_IGNORABLE)
REASONING_DOC = (
    "The reasoning blocks of content, each with its position 'at' in the whole content list (the other blocks "
    "are in 'content', in order). Absent in records written before reasoning blocks existed."
)
_SURFACE_FIELDS = ("surface_op", "source_event_seqs")


def reasoning_split(f: FieldSpec) -> tuple[tuple[type, ...], tuple[type, ...]] | None:
    """For a ``content`` list that may hold reasoning blocks: (the other blocks, the reasoning blocks)."""
    node = f.node
    if f.json != "content" or not isinstance(node, ArrT) or not isinstance(node.item, TagT):
        return None
    members = node.item.members
    reasoning = tuple(c for c in members if getattr(c, "kind", None) in REASONING_KINDS)
    if not reasoning:
        return None
    return tuple(c for c in members if c not in reasoning), reasoning


class AvroField:
    """One field of an Avro record: a field of the definition, or the ``reasoning`` split off ``content``."""

    __slots__ = ("field", "name", "reasoning")

    def __init__(self, name: str, field: FieldSpec | None, reasoning: tuple[type, ...] = ()) -> None:
        self.name = name
        self.field = field
        self.reasoning = reasoning


@cache
def avro_fields(cls: type) -> tuple[AvroField, ...]:
    """The fields of ``cls``'s Avro record, in order."""
    spec = record_spec(cls)
    out: list[AvroField] = []
    reasoning: tuple[type, ...] = ()
    for f in spec.fields:
        out.append(AvroField(f.json, f))
        split = reasoning_split(f)
        if split is not None:
            reasoning = split[1]
    if reasoning:
        names = [a.field.name if a.field else "" for a in out]
        at = max((names.index(n) for n in _SURFACE_FIELDS if n in names), default=len(out) - 1) + 1
        out.insert(at, AvroField("reasoning", None, reasoning))
    return tuple(out)


# ------------------------------------------------------------------------------------------ the schema


class _Schema:
    def __init__(self) -> None:
        self.defined: set[str] = set()
        self.reasoning_doc = False

    def named(self, name: str, build: Callable[[], dict[str, Any]]) -> Any:
        if name in self.defined:
            return name
        self.defined.add(name)
        return build()

    def record(self, cls: type) -> Any:
        spec = record_spec(cls)
        return self.named(spec.name, lambda: {"type": "record", "name": spec.name, "fields": self.fields(cls)})

    def fields(self, cls: type) -> list[dict[str, Any]]:
        out = []
        for a in avro_fields(cls):
            if a.field is None:
                entry: dict[str, Any] = {"name": "reasoning"}
                if not self.reasoning_doc:
                    entry["doc"] = REASONING_DOC
                    self.reasoning_doc = True
                entry["type"] = ["null", {"type": "array", "items": self.entry(a.reasoning)}]
                entry["default"] = None
                out.append(entry)
            else:
                out.append(self.field(a.field))
        return out

    def entry(self, reasoning: tuple[type, ...]) -> Any:
        return self.named(
            "ReasoningEntry",
            lambda: {
                "type": "record",
                "name": "ReasoningEntry",
                "fields": [
                    {"name": "at", "type": "long"},
                    {"name": "block", "type": [self.record(c) for c in reasoning]},
                ],
            },
        )

    def field(self, f: FieldSpec) -> dict[str, Any]:
        hints: dict[str, Any] = f.extra.get("avro", {})
        split = reasoning_split(f)
        if split is not None:
            avro: Any = {"type": "array", "items": [self.record(c) for c in split[0]]}
        else:
            avro = self.type(f.node)
        entry: dict[str, Any] = {"name": f.json, "type": avro}
        doc = f.doc or (f"{' | '.join(f.node.values)} (checked on decode)" if isinstance(f.node, LitT) else None)
        if f.optional == "none":
            entry["type"] = ["null", avro]
            entry["default"] = None
        elif f.optional == "false":
            if hints.get("nullable"):
                entry["type"] = ["null", "boolean"]
                entry["default"] = None
            else:
                entry["default"] = False
        elif "default" in hints:
            entry["default"] = hints["default"]
        if doc:
            entry["doc"] = doc
        return entry

    def type(self, node: Node) -> Any:
        if isinstance(node, IntT):
            return "long"
        if isinstance(node, FloatT):
            return "double"
        if isinstance(node, StrT | LitT | JsonT):
            return "string"
        if isinstance(node, BoolT):
            return "boolean"
        if isinstance(node, ArrT):
            return {"type": "array", "items": self.type(node.item)}
        if isinstance(node, RecT):
            return self.record(node.cls)
        if isinstance(node, TagT):
            return [self.record(c) for c in node.members]
        if isinstance(node, AltT):
            enum = node.extra["avro"]["enum"]
            symbols = list(node.lit.values)
            return [self.named(enum, lambda: {"type": "enum", "name": enum, "symbols": symbols}), self.record(node.rec)]
        raise AssertionError(node)


@cache
def event_schema() -> dict[str, Any]:
    """The Avro schema of one session event (``schemas/foldline.session_event.avsc``), from the definitions."""
    s = _Schema()
    seal = s.record(Seal)
    branches = [s.record(cls) for cls in AVRO_EVENTS]
    branches.append(
        {
            "type": "record",
            "name": "UnknownEvent",
            "doc": "An event type this schema has no record for (only with ignorable = true): its data object as "
            "canonical JSON text.",
            "fields": [{"name": "json", "type": "string"}],
        }
    )
    return {
        "type": "record",
        "name": "SessionEvent",
        "namespace": "foldline",
        "doc": "One session-log event envelope {type, seq, time, data, ignorable, sealed}. Field names are the "
        "logged (JSON) names; see docs/FORMAT.md and docs/SCHEMAS.md.",
        "fields": [
            {
                "name": "type",
                "type": "string",
                "doc": "The logged event type, e.g. 'user/message'; must agree with the data branch.",
            },
            {"name": "seq", "type": "long"},
            {"name": "time", "type": "long", "doc": "Epoch milliseconds; never model-visible."},
            {"name": "ignorable", "type": "boolean", "default": False},
            {
                "name": "sealed",
                "type": ["null", seal],
                "default": None,
                "doc": "Set when the content fields of data hold sealed tokens (docs/FORMAT.md, 'Sealed content'): "
                "the data key's id and the sealing format's version.",
            },
            {"name": "data", "type": branches},
        ],
    }


# ------------------------------------------------------------------------------------------ record -> datum


class _Encoders:
    def __init__(self) -> None:
        self.scope: dict[str, Any] = {
            "thaw": thaw_json,
            "canonical": codec.canonical_json,
            "freeze_ordered": freeze_ordered,
        }
        self.names: dict[type, str] = {}
        self.sources: list[str] = []
        self.counter = 0

    def expr(self, node: Node, v: str) -> str:
        if isinstance(node, IntT | FloatT | StrT | BoolT | LitT):
            return v
        if isinstance(node, JsonT):  # ordered: canonical JSON writes it in its own order (docs/FORMAT.md §1.9)
            return f"canonical(freeze_ordered({v})).decode()" if node.ordered else f"canonical(thaw({v})).decode()"
        if isinstance(node, ArrT):
            if isinstance(node.item, IntT | StrT | LitT | FloatT | BoolT):
                return f"list({v})"
            return f"[{self.expr(node.item, 'x')} for x in {v}]"
        if isinstance(node, RecT):
            return f"{self.record(node.cls)}({v})"
        if isinstance(node, TagT):
            return f"{self.union(node.members)}[type({v})]({v})"
        if isinstance(node, AltT):
            name = NAMESPACE + record_spec(node.rec).name
            return f"({v} if type({v}) is str else ({name!r}, {self.record(node.rec)}({v})))"
        raise AssertionError(node)

    def union(self, members: tuple[type, ...]) -> str:
        self.counter += 1
        table = f"branch{self.counter}"
        self.scope[table] = {c: self.branch(c) for c in members}
        return table

    def branch(self, cls: type) -> Callable[[Any], tuple[str, dict[str, Any]]]:
        name = self.record(cls)
        self.build()
        fn = self.scope[name]
        full = NAMESPACE + record_spec(cls).name
        return lambda value: (full, fn(value))

    def record(self, cls: type) -> str:
        known = self.names.get(cls)
        if known is not None:
            return known
        spec = record_spec(cls)
        name = self.names[cls] = f"enc_{spec.name}"
        items: list[str] = []
        pre: list[str] = []
        for a in avro_fields(cls):
            f = a.field
            if f is None:
                items.append("'reasoning': reasoning or None")
                continue
            split = reasoning_split(f)
            v = f"o.{f.name}"
            if split is not None:
                others = self.union(split[0])
                entries = self.union(split[1])
                pre.append(
                    f"    blocks = []\n    reasoning = []\n    for at, b in enumerate({v}):\n"
                    f"        t = type(b)\n        if t in {entries}:\n"
                    f"            reasoning.append({{'at': at, 'block': {entries}[t](b)}})\n"
                    f"        else:\n            blocks.append({others}[t](b))\n"
                )
                items.append(f"{f.json!r}: blocks")
                continue
            expr = self.expr(f.node, v)
            if f.optional == "none":
                expr = f"(None if {v} is None else {expr})"
            elif f.optional == "false" and f.extra.get("avro", {}).get("nullable"):
                expr = f"(True if {v} else None)"
            items.append(f"{f.json!r}: {expr}")
        self.sources.append(f"def {name}(o):\n{''.join(pre)}    return {{{', '.join(items)}}}\n")
        return name

    def build(self) -> None:
        if self.sources:
            source = "\n".join(self.sources)
            self.sources.clear()
            exec(compile(source, "<generated Avro datum encoders>", "exec"), self.scope)  # text from the definitions


_ENCODERS = _Encoders()
#: The encoders are generated on first use, and the writers of several threads (Kafka's producer threads, the
#: archiver) may ask for one at the same moment: one at a time writes the shared scope, so none reads a name
#: another has registered but not yet compiled.
_BUILDING = threading.Lock()


@cache
def datum_encoder(cls: type) -> Callable[[Any], tuple[str, dict[str, Any]]]:
    """The function giving a record of ``cls`` as its ``data`` union branch: ``(record name, datum)``."""
    with _BUILDING:
        fn = _ENCODERS.branch(cls)
        _ENCODERS.build()
    return fn


# ------------------------------------------------------------------------------------------ datum -> JSON


def _value_to_json(node: Node, v: Any) -> Any:
    if v is None or isinstance(node, IntT | FloatT | StrT | BoolT | LitT):
        return v
    if isinstance(node, JsonT):
        return codec.loads(v)
    if isinstance(node, ArrT):
        return [_value_to_json(node.item, x) for x in v]
    if isinstance(node, RecT):
        return record_to_json(node.cls, v)
    if isinstance(node, TagT):
        return _branch_to_json(node.members, v)
    if isinstance(node, AltT):
        if isinstance(v, tuple):  # (the enum's name, its symbol) or (the record's name, its datum)
            name, v = v
            if name == NAMESPACE + record_spec(node.rec).name:
                return record_to_json(node.rec, v)
        return v if isinstance(v, str) else record_to_json(node.rec, v)
    raise AssertionError(node)


def _branch_to_json(members: tuple[type, ...], value: Any) -> dict[str, Any]:
    name, datum = value
    for cls in members:
        if NAMESPACE + record_spec(cls).name == name:
            return record_to_json(cls, datum)
    raise ValueError(f"the record {name!r} is not one of {[c.__name__ for c in members]} here")


def record_to_json(cls: type, datum: dict[str, Any]) -> dict[str, Any]:
    """The logged JSON form of a record of ``cls`` from its decoded datum (``return_record_name`` form)."""
    spec = record_spec(cls)
    out: dict[str, Any] = {}
    if spec.tag_key:
        out[spec.tag_key] = spec.tag
    out.update(spec.constants)
    reasoning = None
    for a in avro_fields(cls):
        f = a.field
        if f is None:
            reasoning = datum.get("reasoning")
            continue
        if f.json not in datum:
            raise ValueError(f"the datum of {spec.name} has no field {f.json!r}")
        v = datum[f.json]
        if v is None or (f.optional == "false" and v is False):
            continue  # absent (an explicit false of a flag is written by omission)
        split = reasoning_split(f)
        if split is not None:
            out[f.json] = [_branch_to_json(split[0], b) for b in v]
            continue
        out[f.json] = _value_to_json(f.node, v)
    if reasoning:
        split = next(s for a in avro_fields(cls) if a.field and (s := reasoning_split(a.field)))
        out["content"] = _merge(out["content"], [(e["at"], _branch_to_json(split[1], e["block"])) for e in reasoning])
    return out


def _merge(content: list[Any], reasoning: list[tuple[int, Any]]) -> list[Any]:
    """``content`` with the reasoning entries put back at their positions."""
    merged: list[Any] = []
    rest = iter(content)
    total = len(content) + len(reasoning)
    entries = iter(reasoning)
    entry = next(entries, None)
    for at in range(total):
        if entry is not None and entry[0] == at:
            merged.append(entry[1])
            entry = next(entries, None)
        else:
            block = next(rest, None)
            if block is None:
                raise ValueError(f"reasoning entries out of order at content position {at}")
            merged.append(block)
    if entry is not None:
        raise ValueError(f"reasoning entry at {entry[0]} is outside the {total} content blocks or out of order")
    return merged


def datum_to_json(etype: str, branch: str, datum: dict[str, Any]) -> dict[str, Any]:
    """The logged JSON ``data`` of an event of type ``etype`` decoded as the ``data`` branch ``branch``."""
    if branch == NAMESPACE + "UnknownEvent":
        value: dict[str, Any] = codec.loads(datum["json"])
        return value
    cls = _BY_BRANCH.get(branch)
    if cls is None or etype != cls.TYPE:
        raise TypeError(f"envelope type {etype!r} does not match its data record {branch!r}")
    return record_to_json(cls, datum)


_BY_BRANCH: dict[str, type[Event]] = {NAMESPACE + record_spec(c).name: c for c in AVRO_EVENTS}


def schema_text() -> str:
    """The text of ``schemas/foldline.session_event.avsc``: :func:`event_schema` as indented JSON."""
    return json.dumps(event_schema(), indent=2, ensure_ascii=False) + "\n"


def write_schema(directory: Path) -> list[Path]:
    """Write the schema the definitions give into ``directory`` (the repository's ``schemas/``).

    When it differs from the schema there (a new field), the schema there is first kept as
    ``previous/foldline.session_event.<fingerprint>.avsc`` (docs/SCHEMAS.md, rule 5), so records written with
    it stay decodable. Returns the files written."""
    from .schemas import EVENT_SCHEMA_NAME, load_schema_json, parse_schema

    path = directory / f"{EVENT_SCHEMA_NAME}.avsc"
    written: list[Path] = []
    if path.exists():
        old = load_schema_json(EVENT_SCHEMA_NAME, directory)
        old_fingerprint = parse_schema(old)[1]
        if old_fingerprint != parse_schema(event_schema())[1]:
            keep = directory / "previous" / f"{EVENT_SCHEMA_NAME}.{old_fingerprint.hex()}.avsc"
            if not keep.exists():
                keep.write_bytes(path.read_bytes())
                written.append(keep)
    if not path.exists() or path.read_text(encoding="utf-8") != schema_text():
        path.write_text(schema_text(), encoding="utf-8")
        written.append(path)
    return written
