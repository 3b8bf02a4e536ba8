"""Avro bodies of the current event schema decoded straight into envelopes, without fastavro's datum dicts.

fastavro decodes a record into dicts (and the record names of its union branches) that
:func:`~.datum.avro_to_envelope` then turns into an envelope; for the archive's 10,000-event reads that
pair costs ~8 µs an event, most of the read. :func:`decode_bodies` reads the binary encoding of the
common shapes itself — the loop's events: turns, steps, tool calls, dispatches, and messages of text and
tool-call blocks appended to the surface — and builds the envelope's objects at once.

Every other record goes through fastavro and :func:`~.datum.avro_to_envelope`, record by record: another
branch (a request header, a compaction, an unknown event), an ignorable event, a replace op, source
seqs, reasoning, images, and every value the direct path of :func:`~.datum.avro_to_envelope` would not
take (a negative number, a turn-end reason or digest the core refuses). So both ways give equal
envelopes for every record (``tests/test_avro_direct.py`` holds them together), and bytes that do not
decode fail as fastavro fails on them.

The reading is written for one schema, the one with fingerprint :data:`DIRECT_FINGERPRINT`
(``schemas/foldline.session_event.avsc`` today): :func:`reads_directly` says whether a writer schema is
that one; bodies of any other schema are not passed here. A new schema version that leaves it behind
only makes reads slower until it is updated (a test fails meanwhile).
"""

from __future__ import annotations

import dataclasses
import io
from collections.abc import Callable
from typing import Any, TypeVar, cast

import fastavro

from ...core import codec
from ...core.content import ContentBlock, TextBlock, ToolCallBlock, ToolResultPart, Usage
from ...core.events import (
    TURN_END_REASONS,
    AssistantMessage,
    Envelope,
    RequestDispatch,
    StepEnd,
    StepStart,
    ToolCall,
    ToolResult,
    TurnEnd,
    TurnEndReason,
    TurnStart,
    UserMessage,
)
from .datum import avro_to_envelope

__all__ = ["DIRECT_FINGERPRINT", "decode_bodies", "direct_envelope", "reads_directly"]

DIRECT_FINGERPRINT = bytes.fromhex("a69663e9e89a0460")
"""The single-object fingerprint of the schema whose binary layout :func:`decode_bodies` reads."""

# the zigzag byte of each ``data`` union branch read here (branch index x 2), and its ``type`` field's
# encoding (length byte + the type): a record whose type is not its branch's takes the checked path
_USER, _ASSISTANT, _TOOL_RESULT = 0, 2, 4
_TURN_START, _TURN_END, _STEP_START, _STEP_END, _TOOL_CALL, _DISPATCH = 6, 8, 10, 12, 14, 18
_TYPE_FIELD = {
    _USER: "user/message",
    _ASSISTANT: "assistant/message",
    _TOOL_RESULT: "tool/result",
    _TURN_START: "turn/start",
    _TURN_END: "turn/end",
    _STEP_START: "step/start",
    _STEP_END: "step/end",
    _TOOL_CALL: "tool/call",
    _DISPATCH: "request/dispatch",
}
_TYPE_BYTES = {k: bytes([len(v) * 2]) + v.encode() for k, v in _TYPE_FIELD.items()}
_APPENDED = b"\x00\x00\x00"  # surfaceOp: AppendOp (branch 0, symbol 0); sourceEventSeqs: null
_REASONS = frozenset(TURN_END_REASONS)
_HEX = frozenset("0123456789abcdef")
_DIGEST_PREFIX = codec.DIGEST_PREFIX


_T = TypeVar("_T")


def _maker(cls: type[_T]) -> Callable[..., _T]:
    """A constructor of the frozen, slotted dataclass ``cls`` taking every field positionally, in declaration
    order (defaults too), that sets the slots through their descriptors. The dataclass's own ``__init__``
    assigns each field through ``object.__setattr__`` (frozen classes must): building an assistant message
    with a text block and its usage that way costs ~3x what it costs here, and in a 10,000-event archive
    read the constructors were a third of the decoding. The object is the same either way; only classes
    without ``__post_init__`` are taken (nothing is checked here)."""
    if getattr(cls, "__post_init__", None) is not None or not dataclasses.is_dataclass(cls):
        raise TypeError(f"{cls.__name__} is not a plain dataclass")
    names = [f.name for f in dataclasses.fields(cls)]
    scope: dict[str, Any] = {"new": object.__new__, "cls": cls}
    scope.update({f"set_{name}": getattr(cls, name).__set__ for name in names})
    args = ", ".join(names)
    sets = "".join(f"    set_{name}(o, {name})\n" for name in names)
    exec(f"def make({args}):\n    o = new(cls)\n{sets}    return o\n", scope)  # the text: field names only
    return cast(Callable[..., _T], scope["make"])


_envelope = _maker(Envelope)
_text = _maker(TextBlock)
_tool_call_block = _maker(ToolCallBlock)
_usage = _maker(Usage)
_assistant = _maker(AssistantMessage)
_user = _maker(UserMessage)
_tool_result = _maker(ToolResult)
_tool_call = _maker(ToolCall)
_step_start = _maker(StepStart)
_step_end = _maker(StepEnd)
_turn_start = _maker(TurnStart)
_turn_end = _maker(TurnEnd)
_dispatch = _maker(RequestDispatch)


class _Other(Exception):
    """The record is not of the shapes read here: read it through fastavro."""


def reads_directly(fingerprint: bytes) -> bool:
    """Whether bodies of the schema with ``fingerprint`` can be passed to :func:`decode_bodies`."""
    return fingerprint == DIRECT_FINGERPRINT


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
    """A non-negative long (a count, a turn, a step...); a negative one is not read here."""
    b = buf[p]
    if b < 0x80:
        if b & 1:
            raise _Other
        return b >> 1, p + 1
    c = buf[p + 1]
    if c < 0x80:  # below 8,192: two bytes
        value = (b & 0x7F) | (c << 7)
        if value & 1:
            raise _Other
        return value >> 1, p + 2
    d = buf[p + 2]
    if d < 0x80:  # below 1,048,576: three bytes
        value = (b & 0x7F) | (c & 0x7F) << 7 | d << 14
        if value & 1:
            raise _Other
        return value >> 1, p + 3
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


def _optional_string(buf: bytes, p: int) -> tuple[str | None, int]:
    branch = buf[p]
    if branch == 0:
        return None, p + 1
    if branch != 2:
        raise _Other
    return _string(buf, p + 1)


def _blocks(buf: bytes, p: int, calls: bool) -> tuple[tuple[Any, ...], int]:
    """An array of content blocks: text blocks, and (``calls``) tool-call blocks; anything else is _Other."""
    if buf[p] == 2 and not buf[p + 1]:  # one text block, the commonest (count 1, text branch)
        size = buf[p + 2]
        if size < 0x80 and not size & 1:
            start, end = p + 3, p + 3 + (size >> 1)
        else:
            size, start = _long(buf, p + 2)
            end = start + size
        if size >= 0 and end < len(buf) and not buf[end]:  # the array's end follows
            return (_text(buf[start:end].decode(), "text"),), end + 1
    out: list[Any] = []
    n, p = _long(buf, p)
    while n:
        if n < 0:
            n = -n
            p = _long(buf, p)[1]  # the block's size in bytes
        for _ in range(n):
            branch = buf[p]
            if branch == 0:
                text, p = _string(buf, p + 1)
                out.append(_text(text, "text"))
            elif branch == 4 and calls:
                id_, p = _string(buf, p + 1)
                name, p = _string(buf, p)
                arguments, p = _string(buf, p)
                out.append(_tool_call_block(id_, name, arguments, "tool-call"))
            else:
                raise _Other
        n, p = _long(buf, p)
    return tuple(out), p


def _record(buf: bytes, start: int) -> tuple[Envelope, int]:
    """One record from ``start``, of the shapes read here (else _Other), and the position after it."""
    b = buf[start]
    if b >= 0x80 or b & 1:
        raise _Other
    p = start + 1 + (b >> 1)
    seq, p = _count(buf, p)
    c0, c1, c2, c3, c4, c5 = buf[p : p + 6]
    if c5 < 0x80 and c0 & c1 & c2 & c3 & c4 & 0x80:  # six bytes, as times from 1970-07 to 2039 are
        z = (c0 & 0x7F) | (c1 & 0x7F) << 7 | (c2 & 0x7F) << 14 | (c3 & 0x7F) << 21 | ((c4 & 0x7F) | c5 << 7) << 28
        time, p = -1 if z & 1 else z >> 1, p + 6
    else:
        time, p = _long(buf, p)
    if time < 0 or buf[p]:  # a negative time; ignorable
        raise _Other
    branch = buf[p + 1]
    p += 2
    prefix = _TYPE_BYTES.get(branch)
    if prefix is None or not buf.startswith(prefix, start):  # its length byte is b: the type is the branch's
        raise _Other
    data: Any
    if branch in (_STEP_START, _STEP_END):
        turn, c = buf[p], buf[p + 1]
        if turn < 0x80 and c < 0x80 and not (turn | c) & 1:  # both below 64: a byte each
            turn, step, p = turn >> 1, c >> 1, p + 2
        else:
            turn, p = _count(buf, p)
            step, p = _count(buf, p)
        data = _step_start(turn, step) if branch == _STEP_START else _step_end(turn, step)
    elif branch == _ASSISTANT:
        id_, p = _string(buf, p)
        content, p = _blocks(buf, p, True)
        usage = None
        if buf[p]:
            if buf[p] != 2:
                raise _Other
            read, p = _count(buf, p + 1)
            written, p = _count(buf, p)
            cache_read, p = _count(buf, p)
            cache_write, p = _count(buf, p)
            usage = _usage(read, written, cache_read, cache_write)
        else:
            p += 1
        stop, p = _optional_string(buf, p)
        if not buf.startswith(_APPENDED, p) or buf[p + 3]:  # appended, no source seqs, no reasoning
            raise _Other
        request_id, p = _optional_string(buf, p + 4)
        message_id, p = _optional_string(buf, p)
        blocks: tuple[ContentBlock, ...] = content
        data = _assistant(id_, blocks, usage, stop, "append", None, request_id, message_id)
    elif branch == _TOOL_CALL:
        turn, p = _count(buf, p)
        step, p = _count(buf, p)
        call_id, p = _string(buf, p)
        name, p = _string(buf, p)
        arguments, p = _string(buf, p)
        data = _tool_call(turn, step, call_id, name, arguments)
    elif branch == _TOOL_RESULT:
        call_id, p = _string(buf, p)
        name, p = _string(buf, p)
        content, p = _blocks(buf, p, False)
        is_error = buf[p]
        if is_error > 1 or not buf.startswith(_APPENDED, p + 1):
            raise _Other
        p += 4
        parts: tuple[ToolResultPart, ...] = content
        data = _tool_result(call_id, name, parts, bool(is_error), "append", None)
    elif branch == _TURN_START:
        turn, p = _count(buf, p)
        data = _turn_start(turn)
    elif branch == _TURN_END:
        turn, p = _count(buf, p)
        reason, p = _string(buf, p)
        if reason not in _REASONS:
            raise _Other
        data = _turn_end(turn, cast(TurnEndReason, reason))
    elif branch == _USER:
        id_, p = _string(buf, p)
        content, p = _blocks(buf, p, True)
        source, p = _string(buf, p)
        if not buf.startswith(_APPENDED, p) or buf[p + 3]:
            raise _Other
        p += 4
        data = _user(id_, content, source, "append", None)
    else:  # request/dispatch
        turn, p = _count(buf, p)
        step, p = _count(buf, p)
        serializer, p = _string(buf, p)
        version, p = _count(buf, p)
        digest, p = _string(buf, p)
        size, p = _count(buf, p)
        hexpart = digest[len(_DIGEST_PREFIX) :]
        if not digest.startswith(_DIGEST_PREFIX) or len(hexpart) != 64 or not _HEX.issuperset(hexpart):
            raise _Other
        data = _dispatch(turn, step, serializer, version, digest, size)
    return _envelope(seq, time, data, False), p


def direct_envelope(body: bytes) -> Envelope | None:
    """The envelope of one body of the schema :data:`DIRECT_FINGERPRINT` names when it is of the shapes read
    here and nothing follows it; ``None`` otherwise (fastavro and :func:`~.datum.avro_to_envelope` then)."""
    try:
        env, end = _record(body, 0)
    except (_Other, IndexError, ValueError):
        return None
    return env if end == len(body) else None


def decode_bodies(buf: bytes, count: int, writer_schema: Any) -> list[Envelope]:
    """The ``count`` records written one after the other in ``buf`` (a container block's bytes) under the
    schema :data:`DIRECT_FINGERPRINT` names (``writer_schema``: it parsed by fastavro).

    Raises what fastavro and :func:`~.datum.avro_to_envelope` raise for a record that does not decode
    (:class:`~foldline.errors.FormatError` and others), and ``ValueError`` when bytes are left over.
    """
    out: list[Envelope] = []
    append = out.append
    record: Callable[[bytes, int], tuple[Envelope, int]] = _record
    p = 0
    view: io.BytesIO | None = None
    for _ in range(count):
        try:
            env, end = record(buf, p)
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
