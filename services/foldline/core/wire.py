"""Envelope <-> plain JSON objects (the logged field names), and canonical event bytes.

An envelope with sealed content carries ``"sealed": {"kid", "v"}``; its data decodes like any other (the content
fields hold tokens, ``core/sealing.py``), and opening it is the caller's (``adapters/sealing.py``).

The fields of every event and record are defined once, in ``events.py``, ``content.py`` and ``header.py``;
:mod:`~foldline.core.records` derives their JSON from those definitions. This module adds what belongs to
the log rather than to one record: the envelope ``{type, seq, time, data, ignorable?}``, the event type
that selects the payload's record, and the rules checked while decoding (``unknown-type``, the legacy
forms, ``surface-fields-only-on-surface``, ``ignorable-required``). A decode failure is a
:class:`~foldline.errors.FormatError` (or a :class:`~foldline.errors.ValidationError` for a rule break) that
names the seq and the path of the field that is wrong.
"""

from __future__ import annotations

from typing import Any

from ..errors import FormatError, ValidationError
from . import codec
from .content import (
    ContentBlock,
    EncryptedReasoningBlock,
    ImageBlock,
    ReasoningBlock,
    RedactedReasoningBlock,
    TextBlock,
    ToolCallBlock,
    ToolResultBlock,
    Usage,
)
from .events import (
    ALWAYS_IGNORABLE,
    EVENT_TYPES,
    MAX_TIME_MS,
    SURFACE_TYPES,
    Envelope,
    EventData,
    Seal,
    UnknownEvent,
)
from .frozen import FrozenDict, freeze_json
from .header import EpochHeader
from .records import MAX_INT, fast_decoder, holds_ordered_json, read_json, tagged_union, to_json, union_from_json

__all__ = [
    "CONTENT_BLOCKS",
    "KNOWN_TYPES",
    "LEGACY_TYPES",
    "block_from_json",
    "block_to_json",
    "config_to_json",
    "content_from_json",
    "data_from_json",
    "data_to_json",
    "decode_canonical",
    "decode_event",
    "encode_event",
    "encoded_size",
    "envelope_from_json",
    "envelope_to_json",
    "header_from_json",
    "header_to_json",
    "image_to_json",
    "read_envelope",
    "tool_spec_to_json",
    "usage_from_json",
    "usage_from_plain",
    "usage_to_json",
]

LEGACY_TYPES: frozenset[str] = frozenset({"request/header-delta"})
_BY_TYPE: dict[str, type] = {cls.TYPE: cls for cls in EVENT_TYPES}
KNOWN_TYPES: frozenset[str] = frozenset(_BY_TYPE)
#: Every content block kind, told apart by ``type``.
CONTENT_BLOCKS = tagged_union(
    TextBlock,
    ImageBlock,
    ToolCallBlock,
    ToolResultBlock,
    ReasoningBlock,
    RedactedReasoningBlock,
    EncryptedReasoningBlock,
)
_ENVELOPE_KEYS = frozenset({"type", "seq", "time", "data", "ignorable", "sealed"})
_FAST_SEAL = fast_decoder(Seal)
_FAST = {etype: fast_decoder(cls) for etype, cls in _BY_TYPE.items()}
_FAST_PLAIN = {etype: fn for etype, fn in _FAST.items() if etype not in ALWAYS_IGNORABLE}
#: Event types whose payload can hold an ordered JSON object (a header's tool schemas): their canonical bytes keep
#: that object's key order, so they are not the sorted encoding of the parsed text (docs/FORMAT.md §1.9).
_ORDERED_TYPES = frozenset(etype for etype, cls in _BY_TYPE.items() if holds_ordered_json(cls))

# ------------------------------------------------------------------------------------------ to JSON

#: The logged JSON object of a record (a block, a usage, an image ref, a header, a call config, a tool spec).
block_to_json = usage_to_json = image_to_json = config_to_json = header_to_json = tool_spec_to_json = to_json


def data_to_json(data: EventData) -> dict[str, Any]:
    if type(data) is UnknownEvent:
        return data.data.to_dict()
    return to_json(data)


def envelope_to_json(env: Envelope) -> dict[str, Any]:
    data = env.data
    out: dict[str, Any] = {
        "type": env.type,
        "seq": env.seq,
        "time": env.time,
        "data": data.data.to_dict() if type(data) is UnknownEvent else to_json(data),
    }
    if env.ignorable:
        out["ignorable"] = True
    if env.sealed is not None:
        out["sealed"] = to_json(env.sealed)
    return out


def encode_event(env: Envelope) -> bytes:
    """The canonical bytes of one event: what the log stores and the export writes per line."""
    return codec.canonical_json(envelope_to_json(env))


def encoded_size(env: Envelope) -> int:
    """The length of :func:`encode_event` of ``env`` (what the event-size limit is on)."""
    return len(codec.canonical_json(envelope_to_json(env)))


# ------------------------------------------------------------------------------------------ from JSON


def block_from_json(value: Any, path: str = "block", seq: int | None = None) -> ContentBlock:
    """One content block from its logged JSON; FormatError naming ``path`` when it is not one."""
    block: ContentBlock = union_from_json(CONTENT_BLOCKS, value, path, seq)
    return block


def content_from_json(items: Any) -> tuple[ContentBlock, ...]:
    """Content blocks from their logged JSON (a list); FormatError naming the block that is wrong."""
    if not isinstance(items, list):
        raise FormatError("format", f"content must be a list of blocks, got {type(items).__name__}")
    return tuple(block_from_json(b, f"content[{i}]") for i, b in enumerate(items))


def usage_from_json(value: Any, path: str = "usage", seq: int | None = None) -> Usage:
    usage: Usage = read_json(Usage, value, path, seq)
    return usage


def usage_from_plain(value: Any) -> Usage:
    """Usage from its logged JSON object; FormatError when it is not one."""
    return usage_from_json(value)


def header_from_json(value: Any, path: str = "header", seq: int | None = None) -> EpochHeader:
    header: EpochHeader = read_json(EpochHeader, value, path, seq)
    return header


def _fast_envelope(value: Any) -> Envelope | None:
    """The envelope of ``value`` when it is exactly as :func:`encode_event` writes it (the generated decoders
    take only that); ``None`` for anything else, which :func:`read_envelope` then reads and judges."""
    if type(value) is not dict:
        return None
    ignorable = value.get("ignorable", False)
    sealed = value.get("sealed")
    keys = 4 if sealed is None else 5
    if ignorable is True:
        if len(value) != keys + 1:
            return None
        table = _FAST
    elif len(value) == keys:
        table = _FAST_PLAIN
    else:
        return None
    seq: Any = value.get("seq")
    time: Any = value.get("time")
    if type(seq) is not int or not 0 <= seq <= MAX_INT or type(time) is not int or not 0 <= time <= MAX_TIME_MS:
        return None
    etype = value.get("type")
    decode = table.get(etype) if type(etype) is str else None
    if decode is None:
        return None
    try:
        data = decode(value["data"])
        seal = None if sealed is None else _FAST_SEAL(sealed)
    except Exception:  # anything the generated decoder does not take: the validating reader's
        return None
    return Envelope(seq, time, data, ignorable, seal)


def _require_ignorable(etype: str, ignorable: bool, seq: int | None) -> None:
    if not ignorable:
        raise ValidationError(
            "ignorable-required",
            f'{etype} must be written with "ignorable": true, so readers that predate it can skip it',
            seq=seq,
        )


def data_from_json(etype: str, value: Any, ignorable: bool, seq: int | None) -> EventData:
    """The payload of an event of type ``etype``, with the log rules checked while decoding."""
    if not isinstance(value, dict):
        raise FormatError("format", f"data must be an object, got {type(value).__name__}", seq=seq)
    if etype in LEGACY_TYPES:
        raise ValidationError(
            "legacy-header-delta",
            f"{etype!r} is a removed legacy event; headers are full request/header snapshots. "
            "Such logs are rejected, not migrated.",
            seq=seq,
        )
    cls = _BY_TYPE.get(etype)
    if cls is None:
        if not ignorable:
            raise ValidationError(
                "unknown-type",
                f"unknown event type {etype!r}; only events marked ignorable may have unknown types "
                "(is this log from a newer foldline?)",
                seq=seq,
            )
        frozen = freeze_json(value)
        assert isinstance(frozen, FrozenDict)
        return UnknownEvent(etype, frozen)
    if etype not in SURFACE_TYPES and ("surfaceOp" in value or "sourceEventSeqs" in value):
        raise ValidationError(
            "surface-fields-only-on-surface",
            f"{etype} carries surfaceOp/sourceEventSeqs; only user/message, assistant/message and tool/result may",
            seq=seq,
        )
    if etype == "request/header" and value.get("reason") == "fallback":
        raise ValidationError(
            "legacy-fallback-reason",
            "request/header reason 'fallback' was removed; logs carrying it are rejected",
            seq=seq,
        )
    if etype in ALWAYS_IGNORABLE:
        _require_ignorable(etype, ignorable, seq)
    data: EventData = read_json(cls, value, "data", seq)
    return data


def _int(value: dict[str, Any], key: str, seq: int | None) -> int:
    v = value.get(key)
    where = f"event.{key}"
    if not isinstance(v, int) or isinstance(v, bool):
        raise FormatError(
            "format", f"{where} must be an integer, got {'missing' if v is None else type(v).__name__}", seq=seq
        )
    if v < 0:
        raise FormatError("format", f"{where} must be >= 0, got {v}", seq=seq)
    if key == "time" and v > MAX_TIME_MS:
        raise FormatError(
            "time",
            f"event.time {v} is past 9999-12-31T23:59:59.999Z (at most {MAX_TIME_MS} epoch milliseconds)",
            seq=seq,
        )
    if v > MAX_INT:
        raise FormatError(
            "value-range", f"{where} must fit in a signed 64-bit integer (at most {MAX_INT}), got {v}", seq=seq
        )
    return v


def read_envelope(value: Any) -> Envelope:
    """The validating reader for every shape: FormatError / ValidationError naming the seq and the field."""
    if not isinstance(value, dict):
        raise FormatError("format", f"an event must be a JSON object, got {type(value).__name__}")
    raw_seq = value.get("seq")
    seq = raw_seq if isinstance(raw_seq, int) and not isinstance(raw_seq, bool) else None
    extra = set(value) - _ENVELOPE_KEYS
    if extra:
        raise FormatError(
            "format", f"event has unknown field(s) {sorted(extra)}; allowed: {sorted(_ENVELOPE_KEYS)}", seq=seq
        )
    etype = value.get("type")
    if not isinstance(etype, str):
        raise FormatError("format", f"event.type must be a string, got {type(etype).__name__}", seq=seq)
    s = _int(value, "seq", seq)
    t = _int(value, "time", seq)
    ignorable = value.get("ignorable", False)
    if not isinstance(ignorable, bool):
        raise FormatError("format", f"event.ignorable must be a boolean, got {type(ignorable).__name__}", seq=seq)
    seal: Seal | None = None
    if "sealed" in value:
        seal = read_json(Seal, value["sealed"], "event.sealed", seq)
    return Envelope(s, t, data_from_json(etype, value.get("data"), ignorable, seq), ignorable, seal)


def envelope_from_json(value: Any) -> Envelope:
    """Decode one logged envelope object; raises FormatError / ValidationError naming the seq."""
    fast = _fast_envelope(value)
    if fast is not None:
        return fast
    return read_envelope(value)


def decode_canonical(raw: bytes | str) -> tuple[Envelope, bytes]:
    """Decode one event, with the canonical bytes of what it decoded to (``encode_event`` of the result).

    The text is canonical exactly when those bytes equal it. For the shapes the generated decoders take they
    are the canonical JSON of the parsed value itself (those decoders take only what the encoder writes),
    which spares building the event's JSON again — except for an event that can hold an ordered object, whose
    order the sorted encoding of the parsed value would lose."""
    try:
        value = codec.loads(raw)
    except ValueError as exc:
        raise FormatError("format", str(exc)) from exc
    fast = _fast_envelope(value)
    if fast is not None:
        if fast.type in _ORDERED_TYPES:
            return fast, encode_event(fast)
        return fast, codec.canonical_json(value)
    env = read_envelope(value)
    return env, encode_event(env)


def decode_event(raw: bytes | str) -> Envelope:
    """Decode one event from its JSON text."""
    try:
        value = codec.loads(raw)
    except ValueError as exc:
        raise FormatError("format", str(exc)) from exc
    return envelope_from_json(value)
