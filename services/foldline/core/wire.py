"""Envelope <-> plain JSON objects (the logged field names), and canonical event bytes: the entry points.

This is the single mapping between the frozen dataclasses and the logged form documented in
docs/FORMAT.md, in three parts by role: :mod:`~foldline.core.wire_encode` writes events as JSON and canonical
bytes; :mod:`~foldline.core.wire_read` is the validating reader, which checks shape and types and raises
:class:`~foldline.errors.FormatError` (or :class:`~foldline.errors.ValidationError` for rule breaks such as a
legacy event) naming the seq; :mod:`~foldline.core.wire_fast` decodes the common shapes without it. The
decoders here try the fast path first, and every public name of the three is importable from here.
"""

from __future__ import annotations

from typing import Any

from ..errors import FormatError
from . import codec
from .events import Envelope
from .wire_encode import (
    block_to_json,
    config_to_json,
    encode_event,
    envelope_to_json,
    header_to_json,
    image_to_json,
    tool_spec_to_json,
    usage_to_json,
)
from .wire_fast import fast_envelope
from .wire_read import (
    KNOWN_TYPES,
    LEGACY_TYPES,
    block_from_json,
    content_from_json,
    header_from_json,
    read_envelope,
    usage_from_json,
    usage_from_plain,
)

__all__ = [
    "KNOWN_TYPES",
    "LEGACY_TYPES",
    "block_from_json",
    "block_to_json",
    "config_to_json",
    "content_from_json",
    "decode_canonical",
    "decode_event",
    "encode_event",
    "envelope_from_json",
    "envelope_to_json",
    "header_from_json",
    "header_to_json",
    "image_to_json",
    "tool_spec_to_json",
    "usage_from_json",
    "usage_from_plain",
    "usage_to_json",
]


def envelope_from_json(value: Any) -> Envelope:
    """Decode one logged envelope object; raises FormatError / ValidationError naming the seq."""
    fast = fast_envelope(value)
    if fast is not None:
        return fast
    return read_envelope(value)


def decode_canonical(raw: bytes | str) -> tuple[Envelope, bytes]:
    """Decode one event, with the canonical bytes of what it decoded to (``encode_event`` of the result).

    The text is canonical exactly when those bytes equal it. For the shapes the fast path takes they are the
    canonical JSON of the parsed value itself (the fast path takes only what the encoder writes), which
    spares building the event's JSON again."""
    try:
        value = codec.loads(raw)
    except ValueError as exc:
        raise FormatError("format", str(exc)) from exc
    fast = fast_envelope(value)
    if fast is not None:
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
