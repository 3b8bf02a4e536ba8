"""The common event shapes decoded fast, exactly as the encoder writes them; anything else is the validating
reader's (:mod:`~foldline.core.wire_read`)."""

from __future__ import annotations

from typing import Any

from . import codec
from .content import ReasoningBlock, TextBlock, ToolCallBlock, Usage
from .events import (
    MAX_INT,
    MAX_TIME_MS,
    AssistantMessage,
    Envelope,
    EventData,
    RequestDispatch,
    StepEnd,
    StepStart,
    ToolCall,
    ToolResult,
    TurnEnd,
    TurnStart,
    UserMessage,
)
from .wire_read import HEX_DIGITS, is_turn_end_reason

__all__ = ["fast_envelope"]


# The validating reader formats a field path for every value it reads; a log holds millions of events of a few
# plain shapes. ``fast_envelope`` decodes exactly those shapes — every field present with its exact JSON type, no
# optional field the fast path does not know — into the same dataclasses, and answers ``None`` for anything else,
# which then goes through the validating reader (and its precise errors). So both paths return equal envelopes
# for every input they both accept; tests hold them together.

_APPEND_USER = frozenset({"id", "role", "content", "source", "surfaceOp"})
_APPEND_ASSISTANT = frozenset(
    {"id", "role", "content", "usage", "stopReason", "surfaceOp", "providerRequestId", "providerMessageId"}
)
_APPEND_RESULT = frozenset({"callId", "name", "content", "isError", "surfaceOp"})
_USAGE = frozenset({"input", "output", "cacheRead", "cacheWrite"})


def _nat(v: Any) -> bool:
    return type(v) is int and 0 <= v <= MAX_INT


def _fast_blocks(items: Any, *, parts: bool = False) -> tuple[Any, ...] | None:
    """Text, tool-call and reasoning blocks (text only for tool-result parts); None for anything else."""
    if type(items) is not list:
        return None
    out: list[Any] = []
    for d in items:
        if type(d) is not dict:
            return None
        kind = d.get("type")
        if kind == "text" and len(d) == 2:
            text = d.get("text")
            if type(text) is not str:
                return None
            out.append(TextBlock(text))
        elif kind == "tool-call" and len(d) == 4 and not parts:
            id_, name, arguments = d.get("id"), d.get("name"), d.get("arguments")
            if type(id_) is not str or type(name) is not str or type(arguments) is not str:
                return None
            out.append(ToolCallBlock(id_, name, arguments))
        elif kind == "reasoning" and not parts and 2 <= len(d) <= 3:
            text, signature = d.get("text"), d.get("signature")
            if type(text) is not str or (signature is not None and type(signature) is not str):
                return None
            if len(d) == 3 and signature is None:
                return None
            out.append(ReasoningBlock(text, signature))
        else:
            return None
    return tuple(out)


def _fast_data(etype: Any, d: Any) -> EventData | None:
    if type(d) is not dict:
        return None
    if etype == "user/message":
        if d.keys() != _APPEND_USER or d["role"] != "user" or d["surfaceOp"] != "append":
            return None
        id_, source, content = d["id"], d["source"], _fast_blocks(d["content"])
        if type(id_) is not str or type(source) is not str or content is None:
            return None
        return UserMessage(id_, content, source)
    if etype == "assistant/message":
        if not d.keys() <= _APPEND_ASSISTANT or d.get("role") != "assistant" or d.get("surfaceOp") != "append":
            return None
        id_, content = d.get("id"), _fast_blocks(d.get("content"))
        if type(id_) is not str or content is None:
            return None
        usage: Usage | None = None
        if "usage" in d:
            u = d["usage"]
            if type(u) is not dict or u.keys() != _USAGE or not all(_nat(x) for x in u.values()):
                return None
            usage = Usage(u["input"], u["output"], u["cacheRead"], u["cacheWrite"])
        # An optional string is absent or a string; an explicit null is the validating reader's to refuse.
        optional = ("stopReason", "providerRequestId", "providerMessageId")
        if any(key in d and type(d[key]) is not str for key in optional):
            return None
        stop, request_id, message_id = d.get("stopReason"), d.get("providerRequestId"), d.get("providerMessageId")
        return AssistantMessage(id_, content, usage, stop, "append", None, request_id, message_id)
    if etype == "tool/result":
        if not d.keys() <= _APPEND_RESULT or d.get("surfaceOp") != "append":
            return None
        call_id, name, parts = d.get("callId"), d.get("name"), _fast_blocks(d.get("content"), parts=True)
        is_error = d.get("isError", False)
        if type(call_id) is not str or type(name) is not str or parts is None or type(is_error) is not bool:
            return None
        if "isError" in d and not is_error:  # the encoder writes only isError: true; false is not canonical
            return None
        return ToolResult(call_id, name, parts, is_error)
    if etype in ("turn/start", "turn/end", "step/start", "step/end", "tool/call", "request/dispatch"):
        return _fast_other(etype, d)
    return None


def _fast_other(etype: str, d: dict[str, Any]) -> EventData | None:
    turn: Any = d.get("turn")
    if type(turn) is not int or not 0 <= turn <= MAX_INT:
        return None
    if etype == "turn/start":
        return TurnStart(turn) if len(d) == 1 else None
    if etype == "turn/end":
        reason = d.get("reason")
        if len(d) != 2 or type(reason) is not str or not is_turn_end_reason(reason):
            return None
        return TurnEnd(turn, reason)
    step: Any = d.get("step")
    if type(step) is not int or not 0 <= step <= MAX_INT:
        return None
    if etype in ("step/start", "step/end"):
        if len(d) != 2:
            return None
        return StepStart(turn, step) if etype == "step/start" else StepEnd(turn, step)
    if etype == "tool/call":
        call_id, name, arguments = d.get("callId"), d.get("name"), d.get("arguments")
        if len(d) != 5 or type(call_id) is not str or type(name) is not str or type(arguments) is not str:
            return None
        return ToolCall(turn, step, call_id, name, arguments)
    serializer, digest = d.get("serializer"), d.get("digest")
    version: Any = d.get("serializerVersion")
    size: Any = d.get("bytes")
    if len(d) != 6 or type(serializer) is not str or not _nat(version) or not _nat(size) or type(digest) is not str:
        return None
    hexpart = digest[len(codec.DIGEST_PREFIX) :]
    if not digest.startswith(codec.DIGEST_PREFIX) or len(hexpart) != 64 or hexpart.strip(HEX_DIGITS):
        return None
    return RequestDispatch(turn, step, serializer, version, digest, size)


def fast_envelope(value: Any) -> Envelope | None:
    """The common shapes, exactly as :func:`encode_event` writes them (every field it writes, none it omits,
    the exact JSON types): whatever this returns, ``envelope_to_json`` of it equals ``value``. Anything
    else is None, for the validating reader."""
    if type(value) is not dict or len(value) != 4:  # an "ignorable" event takes the validating path
        return None
    seq: Any = value.get("seq")
    time: Any = value.get("time")
    if type(seq) is not int or not 0 <= seq <= MAX_INT or type(time) is not int or not 0 <= time <= MAX_TIME_MS:
        return None
    data = _fast_data(value.get("type"), value.get("data"))
    if data is None:
        return None
    return Envelope(seq, time, data)
