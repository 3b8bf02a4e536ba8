"""Decoding a fold's message bytes fast (the dispatcher's hot path).

:meth:`FoldState.decoded_messages` decodes through the core's validating reader, which formats a field
path for every block it reads. A dispatcher decodes whole sessions per step, so
:func:`decode_fold_messages` parses each message with ``orjson.loads`` and builds the blocks directly
when each has exactly the shape :func:`~foldline.core.fold.encode_message` writes. Anything else — an
image block, an unknown field, a wrong type — goes through :func:`~foldline.core.fold.decode_message`,
which accepts or rejects it with its precise error; so both paths return equal messages for every input
(tests compare them), and the invariant companion still checks the whole request against a rebuild from
the raw log before anything is sent.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import orjson

from ..core.content import ContentBlock, TextBlock, ToolCallBlock, ToolResultBlock, ToolResultPart
from ..core.fold import decode_message
from ..core.projection import Message

__all__ = ["MessageCache", "decode_fold_messages"]

_ROLES = frozenset({"user", "assistant", "tool"})


def _text(d: Any) -> TextBlock | None:
    if type(d) is dict and len(d) == 2 and d.get("type") == "text":
        text = d.get("text")
        if type(text) is str:
            return TextBlock(text)
    return None


def _block(d: Any) -> ContentBlock | None:
    if type(d) is not dict:
        return None
    kind = d.get("type")
    if kind == "text":
        return _text(d)
    if kind == "tool-call" and len(d) == 4:
        id_, name, arguments = d.get("id"), d.get("name"), d.get("arguments")
        if type(id_) is str and type(name) is str and type(arguments) is str:
            return ToolCallBlock(id_, name, arguments)
        return None
    if kind == "tool-result":
        call_id, content = d.get("toolCallId"), d.get("content")
        is_error = d.get("isError", False)
        if type(call_id) is not str or type(content) is not list or type(is_error) is not bool:
            return None
        if len(d) != (4 if "isError" in d else 3):
            return None
        parts: list[ToolResultPart] = []
        for part in content:
            text = _text(part)
            if text is None:
                return None
            parts.append(text)
        return ToolResultBlock(call_id, tuple(parts), is_error)
    return None


def _message(value: Any) -> Message | None:
    if type(value) is not dict:
        return None
    role, content = value.get("role"), value.get("content")
    if role not in _ROLES or type(content) is not list:
        return None
    blocks: list[ContentBlock] = []
    for d in content:
        block = _block(d)
        if block is None:
            return None
        blocks.append(block)
    return Message(role, tuple(blocks))


def decode_fold_messages(raw: tuple[bytes, ...]) -> tuple[Message, ...]:
    """Decode a fold's message bytes; equal to ``tuple(decode_message(m) for m in raw)``."""
    out: list[Message] = []
    for m in raw:
        try:
            message = _message(orjson.loads(m))
        except orjson.JSONDecodeError:
            message = None
        out.append(message if message is not None else decode_message(m))  # the slow path names the problem
    return tuple(out)


class MessageCache:
    """Decoded fold messages by their exact bytes (an LRU of at most ``capacity`` messages).

    Decoding is a pure function of the bytes, so equal bytes always decode to an equal message: a hit is
    the same answer :func:`decode_fold_messages` would give. A dispatcher serving a session step after
    step then decodes only the messages appended since its last step.
    """

    def __init__(self, capacity: int = 20_000) -> None:
        self.capacity = capacity
        self._entries: OrderedDict[bytes, Message] = OrderedDict()
        self.hits = 0
        self.misses = 0

    def decode(self, raw: tuple[bytes, ...]) -> tuple[Message, ...]:
        entries = self._entries
        out: list[Message] = []
        missing: list[int] = []
        for i, m in enumerate(raw):
            hit = entries.get(m)
            if hit is None:
                missing.append(i)
                out.append(_PLACEHOLDER)
            else:
                entries.move_to_end(m)
                out.append(hit)
        if missing:
            decoded = decode_fold_messages(tuple(raw[i] for i in missing))
            for i, message in zip(missing, decoded, strict=True):
                out[i] = message
                entries[raw[i]] = message
            while len(entries) > self.capacity:
                entries.popitem(last=False)
        self.hits += len(raw) - len(missing)
        self.misses += len(missing)
        return tuple(out)


_PLACEHOLDER = Message("user", ())
