"""Canonical encoding: the only place in foldline that turns values into bytes.

Canonical JSON (used for stored events, export lines, fold entries and digests) is UTF-8, object keys
sorted by code point, no insignificant whitespace, integers without exponent, non-finite floats
rejected. ``orjson`` does the work; it is a pure encoder (no I/O), so the core may use it.

The one exception to sorting is an :class:`~foldline.core.frozen.OrderedObject` (a tool's input schema): its
keys keep their document order at every depth (docs/FORMAT.md §1.9); its pre-encoded text is spliced into the
sorted encoding as an ``orjson.Fragment``. A plain ``dict`` is always sorted, so whoever must sort an ordered
value writes its :meth:`~foldline.core.frozen.FrozenDict.to_dict`.
"""

from __future__ import annotations

import hashlib
from typing import Any

import orjson

from .frozen import FrozenDict, OrderedObject

__all__ = ["DIGEST_PREFIX", "canonical_json", "digest_bytes", "json_default", "loads"]

DIGEST_PREFIX = "sha256:"
_OPTS = orjson.OPT_SORT_KEYS


def json_default(value: Any) -> Any:
    """orjson's ``default`` for the core's frozen values: an ordered object as its document-order text (an
    ``orjson.Fragment``), any other frozen object as a plain ``dict`` (sorted when the encoder sorts)."""
    if isinstance(value, OrderedObject):
        return orjson.Fragment(value.json)
    if isinstance(value, FrozenDict):
        return value.to_dict()
    raise TypeError(f"cannot encode {type(value).__name__} canonically")


def canonical_json(value: Any) -> bytes:
    """Encode ``value`` as canonical JSON bytes."""
    try:
        return orjson.dumps(value, default=json_default, option=_OPTS)
    except orjson.JSONEncodeError as exc:  # pragma: no cover - message passthrough
        raise TypeError(str(exc)) from exc


def loads(data: bytes | str) -> Any:
    """Decode JSON text; raises ``ValueError`` on malformed input."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise ValueError(f"malformed JSON: {exc}") from exc


def digest_bytes(data: bytes) -> str:
    """The ``sha256:<hex>`` digest foldline records for a byte string."""
    return DIGEST_PREFIX + hashlib.sha256(data).hexdigest()
