"""The archive's Avro decoder, generated from the record definitions: bodies of the current schema read
straight into envelopes, without fastavro's datum dicts.

fastavro decodes a record into dicts (and the record names of its union branches) that
:func:`~.datum.avro_to_envelope` then turns into an envelope; for the archive's 10,000-event reads that
pair costs several µs an event, most of the read. :func:`decoder_source` writes a module that reads the
binary encoding of every event record of the current schema itself — one function per record of the Avro
layout (:mod:`.layout`), each checking the values the core's decoders check (bounds, patterns, literals, the
constructors' own checks) — and builds the envelope's objects at once.

Anything it does not take — an ``UnknownEvent`` (and so every ignorable event type), a value a check
refuses, bytes that do not decode — goes through fastavro and :func:`~.datum.avro_to_envelope`, record by
record, which either reads it the same or raises the typed error. So both ways give equal envelopes for
every record (``tests/test_avro_direct.py`` holds them together).

The module is generated for one schema: the one :func:`~.layout.event_schema` derives, whose fingerprint
is :data:`DIRECT_FINGERPRINT`; :func:`reads_directly` says whether a writer schema is that one. The package's
build compiles the generated text with mypyc (``hatch_build.py``); :mod:`.decoding` uses the compiled module
when it was built from the very text :func:`decoder_source` writes now, else it runs the text itself.
"""

from __future__ import annotations

import hashlib
from functools import cache

from ...core.events import MAX_TIME_MS, Seal
from ...core.records import AltT, ArrT, BoolT, FieldSpec, FloatT, IntT, JsonT, LitT, Node, RecT, StrT, TagT, record_spec
from .layout import AVRO_EVENTS, avro_fields, event_schema, reasoning_split
from .schemas import parse_schema

__all__ = ["DIRECT_FINGERPRINT", "decoder_source", "reads_directly", "source_sha256"]


@cache
def _fingerprint() -> bytes:
    return parse_schema(event_schema())[1]


DIRECT_FINGERPRINT = _fingerprint()
"""The single-object fingerprint of the schema whose binary layout the generated decoder reads."""


def reads_directly(fingerprint: bytes) -> bool:
    """Whether bodies of the schema with ``fingerprint`` can be passed to the generated ``decode_bodies``."""
    return fingerprint == DIRECT_FINGERPRINT


_RUNTIME = '''
from __future__ import annotations

import io
import re
import struct
from typing import Any

import fastavro
import orjson

from foldline.adapters.avro.datum import avro_to_envelope
from foldline.core.events import Envelope
from foldline.core.frozen import freeze_json, freeze_ordered

_DOUBLE = struct.Struct("<d")


class _Other(Exception):
    """The record is not one read here: read it through fastavro."""


def _long(buf: bytes, p: int) -> tuple[int, int]:
    """The zigzag varint at ``p`` and the position after it."""
    b = buf[p]
    if b < 0x80:
        return (b >> 1) ^ -(b & 1), p + 1
    start = p
    value = b & 0x7F
    shift = 7
    p += 1
    b = buf[p]
    while b >= 0x80:
        value |= (b & 0x7F) << shift
        shift += 7
        p += 1
        b = buf[p]
    value |= b << shift
    p += 1
    if p - start > 10:
        raise ValueError("a varint longer than 10 bytes")
    return (value >> 1) ^ -(value & 1), p


def _count(buf: bytes, p: int) -> tuple[int, int]:
    """A non-negative long; a negative one is not read here."""
    b = buf[p]
    if b < 0x80:
        if b & 1:
            raise _Other
        return b >> 1, p + 1
    value, p = _long(buf, p)
    if value < 0:
        raise _Other
    return value, p


def _string(buf: bytes, p: int) -> tuple[str, int]:
    b = buf[p]
    if b < 0x80 and not b & 1:  # up to 63 bytes: one length byte
        p += 1
        end = p + (b >> 1)
    else:
        size, p = _long(buf, p)
        if size < 0:
            raise ValueError(f"a string of {size} bytes")
        end = p + size
    if end > len(buf):
        raise ValueError("a string runs past the end of the record")
    return buf[p:end].decode(), end


def _json(buf: bytes, p: int) -> tuple[Any, int]:
    text, p = _string(buf, p)
    value = orjson.loads(text)
    if type(value) is not dict:
        raise _Other
    return freeze_json(value), p


def _ordered_json(buf: bytes, p: int) -> tuple[Any, int]:
    """An ordered JSON object (docs/FORMAT.md §1.9): its keys in the order of its text."""
    text, p = _string(buf, p)
    value = orjson.loads(text)
    if type(value) is not dict:
        raise _Other
    return freeze_ordered(value), p


def _merge(content: list[Any], reasoning: list[tuple[int, Any]]) -> tuple[Any, ...]:
    merged: list[Any] = []
    rest = iter(content)
    entries = iter(reasoning)
    entry = next(entries, None)
    for at in range(len(content) + len(reasoning)):
        if entry is not None and entry[0] == at:
            merged.append(entry[1])
            entry = next(entries, None)
        else:
            block = next(rest, None)
            if block is None:
                raise _Other
            merged.append(block)
    if entry is not None:
        raise _Other
    return tuple(merged)
'''

_TAIL = '''

def direct_envelope(body: bytes) -> Envelope | None:
    """The envelope of one body of this schema when it is read here and nothing follows it; ``None``
    otherwise (fastavro and :func:`~foldline.adapters.avro.datum.avro_to_envelope` then)."""
    try:
        env, end = _record(body, 0)
    except (_Other, IndexError, ValueError):
        return None
    return env if end == len(body) else None


def decode_bodies(buf: bytes, count: int, writer_schema: Any) -> list[Envelope]:
    """The ``count`` records written one after the other in ``buf`` (a container block's bytes) under this
    schema (``writer_schema``: it parsed by fastavro).

    Raises what fastavro and :func:`~foldline.adapters.avro.datum.avro_to_envelope` raise for a record that
    does not decode (:class:`~foldline.errors.FormatError` and others), and ``ValueError`` when bytes are
    left over.
    """
    out: list[Envelope] = []
    append = out.append
    p = 0
    view: io.BytesIO | None = None
    for _ in range(count):
        try:
            env, end = _record(buf, p)
        except (_Other, IndexError, ValueError):
            if view is None:
                view = io.BytesIO(buf)
            view.seek(p)
            datum = fastavro.schemaless_reader(
                view, writer_schema, None, return_record_name=True, return_record_name_override=True
            )
            if not isinstance(datum, dict):
                raise ValueError("a record that is not an Avro record") from None
            env, end = avro_to_envelope(datum), view.tell()
        if end > len(buf):
            raise ValueError("a record runs past the end of its block")
        append(env)
        p = end
    if p != len(buf):
        raise ValueError(f"{len(buf) - p} bytes after the block's {count} records")
    return out
'''


class _Source:
    """Writes the reading functions of every record of the Avro layout."""

    def __init__(self) -> None:
        self.imports: dict[type, str] = {}
        self.consts: list[str] = []
        self.functions: list[str] = []
        self.done: dict[type, str] = {}
        self.counter = 0

    def cls(self, cls: type) -> str:
        name = self.imports.get(cls)
        if name is None:
            name = self.imports[cls] = f"c_{record_spec(cls).name}"
        return name

    def const(self, expr: str) -> str:
        self.counter += 1
        name = f"_K{self.counter}"
        self.consts.append(f"{name} = {expr}\n")
        return name

    def read(self, node: Node, v: str, out: list[str], ind: str) -> None:
        """Lines reading one value of ``node`` at ``p`` into ``v``, moving ``p`` past it."""
        if isinstance(node, IntT):
            out.append(
                f"{ind}b = buf[p]\n{ind}if b < 0x80 and not b & 1:\n{ind}    {v} = b >> 1\n{ind}    p += 1\n"
                f"{ind}else:\n{ind}    {v}, p = _count(buf, p)\n"
            )
            if node.lo > 0:
                out.append(f"{ind}if {v} < {node.lo}: raise _Other\n")
        elif isinstance(node, FloatT):
            out.append(f"{ind}{v} = _DOUBLE.unpack_from(buf, p)[0]\n{ind}p += 8\n")
        elif isinstance(node, StrT | LitT):
            out.append(f"{ind}{v}, p = _string(buf, p)\n")
            if isinstance(node, LitT):
                values = self.const(f"frozenset({sorted(node.values)!r})")
                out.append(f"{ind}if {v} not in {values}: raise _Other\n")
            else:
                if node.min_len:
                    out.append(f"{ind}if len({v}) < {node.min_len}: raise _Other\n")
                if node.pattern is not None:
                    pattern = self.const(f"re.compile({node.pattern.pattern!r})")
                    out.append(f"{ind}if {pattern}.search({v}) is None: raise _Other\n")
        elif isinstance(node, BoolT):
            out.append(f"{ind}b = buf[p]\n{ind}p += 1\n{ind}if b > 1: raise _Other\n{ind}{v} = b == 1\n")
        elif isinstance(node, JsonT):
            reader = "_ordered_json" if node.ordered else "_json"  # the record's definition says which
            out.append(f"{ind}{v}, p = {reader}(buf, p)\n")
        elif isinstance(node, RecT):
            out.append(f"{ind}{v}, p = {self.record(node.cls)}(buf, p)\n")
        elif isinstance(node, TagT):
            self.union(node.members, v, out, ind)
        elif isinstance(node, AltT):
            out.append(
                f"{ind}if buf[p] == 0 and buf[p + 1] == 0:\n{ind}    {v} = {node.lit.values[0]!r}\n{ind}    p += 2\n"
                f"{ind}elif buf[p] == 2:\n{ind}    {v}, p = {self.record(node.rec)}(buf, p + 1)\n"
                f"{ind}else:\n{ind}    raise _Other\n"
            )
        elif isinstance(node, ArrT):
            self.array(node.item, v, out, ind)
        else:
            raise AssertionError(node)

    def union(self, members: tuple[type, ...], v: str, out: list[str], ind: str) -> None:
        out.append(f"{ind}b = buf[p]\n{ind}p += 1\n")
        for i, cls in enumerate(members):
            out.append(
                f"{ind}{'if' if i == 0 else 'elif'} b == {2 * i}:\n{ind}    {v}, p = {self.record(cls)}(buf, p)\n"
            )
        out.append(f"{ind}else:\n{ind}    raise _Other\n")

    def array(self, item: Node, v: str, out: list[str], ind: str, union: tuple[type, ...] | None = None) -> None:
        self.counter += 1
        items = f"items{self.counter}"
        out.append(f"{ind}{items}: list[Any] = []\n{ind}n, p = _long(buf, p)\n{ind}while n:\n")
        out.append(f"{ind}    if n < 0:\n{ind}        n = -n\n{ind}        p = _long(buf, p)[1]\n")
        out.append(f"{ind}    for _ in range(n):\n")
        inner = ind + "        "
        if union is not None:
            self.union(union, "x", out, inner)
        else:
            self.read(item, "x", out, inner)
        out.append(f"{inner}{items}.append(x)\n{ind}    n, p = _long(buf, p)\n")
        out.append(f"{ind}{v} = {items}\n" if union is not None else f"{ind}{v} = tuple({items})\n")

    def field(self, f: FieldSpec, v: str, out: list[str]) -> None:
        ind = "    "
        split = reasoning_split(f)
        if split is not None:
            self.array(f.node, v, out, ind, union=split[0])  # a list, merged with the reasoning below
            return
        if f.optional == "none":
            out.append(f"{ind}b = buf[p]\n{ind}p += 1\n{ind}if b == 0:\n{ind}    {v} = None\n")
            out.append(f"{ind}elif b == 2:\n")
            self.read(f.node, v, out, ind + "    ")
            out.append(f"{ind}else:\n{ind}    raise _Other\n")
        elif f.optional == "false" and f.extra.get("avro", {}).get("nullable"):
            out.append(
                f"{ind}if buf[p] == 0:\n{ind}    {v} = False\n{ind}    p += 1\n"
                f"{ind}elif buf[p] == 2 and buf[p + 1] == 1:\n{ind}    {v} = True\n{ind}    p += 2\n"
                f"{ind}else:\n{ind}    raise _Other\n"
            )
        else:
            self.read(f.node, v, out, ind)

    def record(self, cls: type) -> str:
        known = self.done.get(cls)
        if known is not None:
            return known
        spec = record_spec(cls)
        name = self.done[cls] = f"_r_{spec.name}"
        fields = avro_fields(cls)
        out = [f"def {name}(buf: bytes, p: int) -> tuple[Any, int]:\n"]
        # every value is Any to the compiler (a literal's string, a list that becomes a tuple)
        out.extend(f"    v{i}: Any\n" for i in range(len(fields)))
        out.append("    x: Any\n    reasoning: Any\n" if any(a.field is None for a in fields) else "    x: Any\n")
        args: dict[str, str] = {}
        content = None
        for i, a in enumerate(fields):
            v = f"v{i}"
            if a.field is None:  # the reasoning entries of the content list
                out.append("    b = buf[p]\n    p += 1\n    if b == 0:\n        reasoning = None\n")
                out.append("    elif b == 2:\n")
                entry: list[str] = []
                self.counter += 1
                entries = f"entries{self.counter}"
                entry.append(f"        {entries}: list[Any] = []\n        n, p = _long(buf, p)\n        while n:\n")
                entry.append("            if n < 0:\n                n = -n\n                p = _long(buf, p)[1]\n")
                entry.append("            for _ in range(n):\n")
                self.read(IntT(0, 0), "at", entry, "                ")
                self.union(a.reasoning, "x", entry, "                ")
                entry.append(f"                {entries}.append((at, x))\n            n, p = _long(buf, p)\n")
                entry.append(f"        reasoning = {entries}\n")
                out.extend(entry)
                out.append("    else:\n        raise _Other\n")
                continue
            self.field(a.field, v, out)
            args[a.field.name] = v
            if reasoning_split(a.field) is not None:
                content = a.field.name
        if content is not None:
            v = args[content]
            out.append(f"    {v} = tuple({v}) if not reasoning else _merge({v}, reasoning)\n")
        values = ", ".join(args[f.name] for f in spec.fields)
        out.append(f"    return {self.cls(cls)}({values}), p\n")
        self.functions.append("".join(out))
        return name

    def envelope(self) -> str:
        out = [
            "def _record(buf: bytes, start: int) -> tuple[Envelope, int]:\n",
            "    etype, p = _string(buf, start)\n",
            "    seq, p = _count(buf, p)\n",
            "    time, p = _count(buf, p)\n",
            f"    if time > {MAX_TIME_MS}: raise _Other\n",
            "    b = buf[p]\n    if b > 1: raise _Other\n    ignorable = b == 1\n    p += 1\n",
            "    b = buf[p]\n    p += 1\n    if b == 0:\n        sealed = None\n",
            f"    elif b == 2:\n        sealed, p = {self.record(Seal)}(buf, p)\n    else:\n        raise _Other\n",
            "    branch = buf[p]\n    p += 1\n",
        ]
        for i, cls in enumerate(AVRO_EVENTS):
            out.append(
                f"    {'if' if i == 0 else 'elif'} branch == {2 * i}:\n"
                f"        if etype != {cls.TYPE!r}: raise _Other\n"
                f"        data, p = {self.record(cls)}(buf, p)\n"
            )
        out.append("    else:\n        raise _Other\n")
        out.append("    return Envelope(seq, time, data, ignorable, sealed), p\n")
        return "".join(out)


@cache
def decoder_source() -> str:
    """The text of the decoder module for the current schema (deterministic: a pure function of the
    definitions)."""
    s = _Source()
    envelope = s.envelope()
    imports = "".join(
        f"from {cls.__module__} import {cls.__name__} as {alias}\n"
        for cls, alias in sorted(s.imports.items(), key=lambda kv: kv[1])
    )
    return (
        '"""The archive\'s Avro decoder, generated by foldline.adapters.avro.direct from the record definitions '
        f'(schema fingerprint {DIRECT_FINGERPRINT.hex()}); do not edit."""\n'
        + _RUNTIME
        + imports
        + "\n"
        + "".join(s.consts)
        + "\n\n"
        + "\n\n".join(s.functions)
        + "\n\n"
        + envelope
        + _TAIL
    )


def source_sha256() -> str:
    """The sha256 of :func:`decoder_source`: a compiled build of it carries the same digest."""
    return hashlib.sha256(decoder_source().encode()).hexdigest()
