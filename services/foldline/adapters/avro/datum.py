"""Envelope <-> fastavro datum: the record each event is in the event schema, and the envelope of a decoded datum.

Encoding goes through the logged JSON form (:func:`foldline.core.wire.envelope_to_json`); decoding takes a
direct path for the common shapes (:func:`_fast_envelope`) and otherwise goes back through
:func:`foldline.core.wire.envelope_from_json`, so every shape rule of the core is checked on decode.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, assert_never

from ...core import codec
from ...core.content import (
    REASONING_KINDS,
    ContentBlock,
    EncryptedReasoningBlock,
    ImageBlock,
    ReasoningBlock,
    RedactedReasoningBlock,
    TextBlock,
    ToolCallBlock,
    ToolResultBlock,
    ToolResultPart,
    Usage,
)
from ...core.events import (
    TURN_END_REASONS,
    AssistantChunk,
    AssistantMessage,
    AttachmentQuarantine,
    CompactionEnd,
    CompactionStart,
    CompactionSummary,
    Envelope,
    EventData,
    LlmRetry,
    RequestDispatch,
    RequestHeader,
    SessionEndSeed,
    StepEnd,
    StepStart,
    ToolCall,
    ToolResult,
    TurnEnd,
    TurnStart,
    UnknownEvent,
    UserMessage,
)
from ...core.wire import envelope_from_json, envelope_to_json, image_to_json
from ...errors import AvroDecodeError
from .schemas import NAMESPACE as _NS

__all__ = ["avro_to_envelope", "envelope_to_avro"]


def _part_to_avro(part: ToolResultPart) -> tuple[str, dict[str, Any]]:
    match part:
        case TextBlock(text=text):
            return (_NS + "TextBlock", {"text": text})
        case ImageBlock(image=ref):
            return (_NS + "ImageBlock", {"attachment": image_to_json(ref)})
        case _:
            assert_never(part)


def _block_to_avro(block: ContentBlock) -> tuple[str, dict[str, Any]]:
    match block:
        case TextBlock() | ImageBlock():
            return _part_to_avro(block)
        case ToolCallBlock(id=id_, name=name, arguments=arguments):
            return (_NS + "ToolCallBlock", {"id": id_, "name": name, "arguments": arguments})
        case ToolResultBlock(tool_call_id=tcid, content=parts, is_error=is_error):
            return (
                _NS + "ToolResultBlock",
                {"toolCallId": tcid, "content": [_part_to_avro(p) for p in parts], "isError": is_error},
            )
        case ReasoningBlock(text=text, signature=signature):
            return (_NS + "ReasoningBlock", {"text": text, "signature": signature})
        case RedactedReasoningBlock(data=data):
            return (_NS + "RedactedReasoningBlock", {"data": data})
        case EncryptedReasoningBlock(id=id_, summary=summary, encrypted_content=encrypted):
            return (
                _NS + "EncryptedReasoningBlock",
                {"id": id_, "summary": list(summary), "encryptedContent": encrypted},
            )
        case _:
            assert_never(block)


def _surface_to_avro(d: dict[str, Any], content: Sequence[ContentBlock]) -> dict[str, Any]:
    # Reasoning blocks travel in the ``reasoning`` field with their position, so a reader of a schema from before
    # they existed (FULL_TRANSITIVE) still reads the record; the rest keeps its order in ``content``.
    blocks: list[tuple[str, dict[str, Any]]] = []
    reasoning: list[dict[str, Any]] = []
    for at, b in enumerate(content):
        if b.kind in REASONING_KINDS:
            reasoning.append({"at": at, "block": _block_to_avro(b)})
        else:
            blocks.append(_block_to_avro(b))
    d["content"] = blocks
    if "role" in d:  # user and assistant messages carry reasoning; a tool result cannot
        d["reasoning"] = reasoning or None
    d.pop("role", None)
    op = d["surfaceOp"]
    d["surfaceOp"] = "append" if op == "append" else (_NS + "ReplaceOp", {"start": op["start"], "end": op["end"]})
    d.setdefault("sourceEventSeqs", None)
    return d


_RECORD_NAMES = {
    "user/message": "UserMessage",
    "assistant/message": "AssistantMessage",
    "tool/result": "ToolResult",
    "turn/start": "TurnStart",
    "turn/end": "TurnEnd",
    "step/start": "StepStart",
    "step/end": "StepEnd",
    "tool/call": "ToolCall",
    "request/header": "RequestHeader",
    "request/dispatch": "RequestDispatch",
    "session/end-seed": "SessionEndSeed",
    "compaction/start": "CompactionStart",
    "compaction/summary": "CompactionSummary",
    "compaction/end": "CompactionEnd",
    "attachment/quarantine": "AttachmentQuarantine",
}
_TYPES_BY_RECORD = {_NS + v: k for k, v in _RECORD_NAMES.items()}


def _data_to_avro(event: EventData, data: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The ``data`` union branch of an event: its record name and value, from its logged JSON ``data``."""
    match event:
        case UserMessage() | AssistantMessage() | ToolResult():
            return (_NS + _RECORD_NAMES[event.TYPE], _surface_to_avro(data, event.content))
        case RequestHeader():
            header = data["header"]
            if "tools" in header:
                header["tools"] = [
                    {**t, "inputSchema": codec.canonical_json(t["inputSchema"]).decode()} for t in header["tools"]
                ]
            return (_NS + "RequestHeader", data)
        case (
            TurnStart()
            | TurnEnd()
            | StepStart()
            | StepEnd()
            | ToolCall()
            | RequestDispatch()
            | SessionEndSeed()
            | CompactionStart()
            | CompactionSummary()
            | CompactionEnd()
            | AttachmentQuarantine()
        ):
            return (_NS + _RECORD_NAMES[event.TYPE], data)
        case LlmRetry() | AssistantChunk() | UnknownEvent():
            # always ignorable (docs/SCHEMAS.md rule 4): they travel as UnknownEvent, and readers that know
            # the type decode its JSON data into the event again
            return (_NS + "UnknownEvent", {"json": codec.canonical_json(data).decode()})
        case _:
            assert_never(event)


def envelope_to_avro(env: Envelope) -> dict[str, Any]:
    """The Avro datum of an envelope (fastavro tuple notation selects each union branch)."""
    j = envelope_to_json(env)
    return {
        "type": j["type"],
        "seq": env.seq,
        "time": env.time,
        "ignorable": env.ignorable,
        "data": _data_to_avro(env.data, j["data"]),
    }


def _drop_nulls(d: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in d.items() if v is not None}


def _block_from_avro(value: Any) -> dict[str, Any]:
    name, d = value
    match name:
        case "foldline.TextBlock":
            return {"type": "text", "text": d["text"]}
        case "foldline.ImageBlock":
            return {"type": "image", "attachment": d["attachment"]}
        case "foldline.ToolCallBlock":
            return {"type": "tool-call", **d}
        case "foldline.ToolResultBlock":
            out = {
                "type": "tool-result",
                "toolCallId": d["toolCallId"],
                "content": [_block_from_avro(b) for b in d["content"]],
            }
            if d.get("isError"):
                out["isError"] = True
            return out
        case "foldline.ReasoningBlock":
            out = {"type": "reasoning", "text": d["text"]}
            if d.get("signature") is not None:
                out["signature"] = d["signature"]
            return out
        case "foldline.RedactedReasoningBlock":
            return {"type": "redacted-reasoning", "data": d["data"]}
        case "foldline.EncryptedReasoningBlock":
            return {"type": "encrypted-reasoning", **d}
    raise ValueError(f"unknown content block record {name!r}")


def _content_from_avro(content: list[Any], reasoning: list[Any] | None) -> list[dict[str, Any]]:
    """``content`` with the ``reasoning`` entries put back at their positions."""
    out = [_block_from_avro(b) for b in content]
    if not reasoning:
        return out
    merged: list[dict[str, Any]] = []
    rest = iter(out)
    total = len(out) + len(reasoning)
    entries = iter(reasoning)
    entry = next(entries, None)
    for at in range(total):
        if entry is not None and entry["at"] == at:
            merged.append(_block_from_avro(entry["block"]))
            entry = next(entries, None)
        else:
            block = next(rest, None)
            if block is None:
                raise ValueError(f"reasoning entries out of order at content position {at}")
            merged.append(block)
    if entry is not None:
        raise ValueError(f"reasoning entry at {entry['at']} is outside the {total} content blocks or out of order")
    return merged


_TEXT_BLOCK = _NS + "TextBlock"
_CALL_BLOCK = _NS + "ToolCallBlock"
_PLAIN = frozenset({"turn/start", "turn/end", "step/start", "step/end", "tool/call", "request/dispatch"})
_SURFACE = ("surfaceOp", "sourceEventSeqs")
_USAGE_FIELDS = frozenset({"input", "output", "cacheRead", "cacheWrite"})
# the fields of each record the direct path reads; a record with any other field (a newer schema) takes the
# checked path, so nothing the direct path does not know is ever dropped
_FIELDS: dict[str, frozenset[str]] = {
    "user/message": frozenset({"id", "content", "source", "reasoning", *_SURFACE}),
    "assistant/message": frozenset(
        {"id", "content", "usage", "stopReason", "reasoning", "providerRequestId", "providerMessageId", *_SURFACE}
    ),
    "tool/result": frozenset({"callId", "name", "content", "isError", *_SURFACE}),
    "turn/start": frozenset({"turn"}),
    "turn/end": frozenset({"turn", "reason"}),
    "step/start": frozenset({"turn", "step"}),
    "step/end": frozenset({"turn", "step"}),
    "tool/call": frozenset({"turn", "step", "callId", "name", "arguments"}),
    "request/dispatch": frozenset({"turn", "step", "serializer", "serializerVersion", "digest", "bytes"}),
}


def _fast_blocks(items: Any, *, parts: bool = False) -> tuple[Any, ...] | None:
    """Text and tool-call blocks (text only for tool-result parts); None for anything else."""
    out: list[Any] = []
    for name, d in items:
        if name == _TEXT_BLOCK:
            out.append(TextBlock(d["text"]))
        elif name == _CALL_BLOCK and not parts:
            out.append(ToolCallBlock(d["id"], d["name"], d["arguments"]))
        else:
            return None
    return tuple(out)


def _fast_plain(etype: str, d: Mapping[str, Any]) -> EventData | None:
    """Turn, step, tool-call and dispatch records: the values the core's readers accept, else None."""
    turn = d["turn"]
    if turn < 0:
        return None
    if etype == "turn/start":
        return TurnStart(turn)
    if etype == "turn/end":
        reason = d["reason"]
        return TurnEnd(turn, reason) if reason in TURN_END_REASONS else None
    step = d["step"]
    if step < 0:
        return None
    if etype == "step/start":
        return StepStart(turn, step)
    if etype == "step/end":
        return StepEnd(turn, step)
    if etype == "tool/call":
        return ToolCall(turn, step, d["callId"], d["name"], d["arguments"])
    digest, version, size = d["digest"], d["serializerVersion"], d["bytes"]
    hexpart = digest[len(codec.DIGEST_PREFIX) :]
    if (
        version < 0
        or size < 0
        or not digest.startswith(codec.DIGEST_PREFIX)
        or len(hexpart) != 64
        or hexpart.strip("0123456789abcdef")
    ):
        return None
    return RequestDispatch(turn, step, d["serializer"], version, digest, size)


def _fast_envelope(datum: Mapping[str, Any]) -> Envelope | None:
    """The envelope of a datum of the common shapes, built directly (the schema already guarantees every
    field's type); ``None`` for anything else, which :func:`avro_to_envelope` then reads through the logged
    JSON form and the core's validating reader. Both return equal envelopes (tests hold them together)."""
    etype, seq, time = datum["type"], datum["seq"], datum["time"]
    if datum.get("ignorable") or seq < 0 or time < 0:
        return None
    name, d = datum["data"]
    fields = _FIELDS.get(etype)
    if fields is None or name != _NS + _RECORD_NAMES[etype] or d.keys() != fields:
        return None
    if etype in _PLAIN:
        data = _fast_plain(etype, d)
        return None if data is None else Envelope(seq, time, data)
    op = d["surfaceOp"]
    if type(op) is tuple:  # (the enum's record name, its symbol): the union also holds ReplaceOp
        op = op[1]
    if op != "append" or d["sourceEventSeqs"] is not None:
        return None
    if d.get("reasoning"):  # reasoning blocks woven back into the content: the checked path
        return None
    if etype == "user/message":
        content = _fast_blocks(d["content"])
        return None if content is None else Envelope(seq, time, UserMessage(d["id"], content, d["source"]))
    if etype == "assistant/message":
        content = _fast_blocks(d["content"])
        u = d["usage"]
        if content is None or (u is not None and (u.keys() != _USAGE_FIELDS or min(u.values()) < 0)):
            return None
        usage = None if u is None else Usage(u["input"], u["output"], u["cacheRead"], u["cacheWrite"])
        message = AssistantMessage(
            d["id"],
            content,
            usage,
            d["stopReason"],
            provider_request_id=d["providerRequestId"],
            provider_message_id=d["providerMessageId"],
        )
        return Envelope(seq, time, message)
    parts = _fast_blocks(d["content"], parts=True)
    if parts is None:
        return None
    return Envelope(seq, time, ToolResult(d["callId"], d["name"], parts, bool(d["isError"])))


def avro_to_envelope(datum: Mapping[str, Any]) -> Envelope:
    """Rebuild the envelope from a decoded datum (``return_record_name`` form); every core rule applies."""
    try:
        fast = _fast_envelope(datum)
    except (KeyError, TypeError, ValueError, AttributeError):
        fast = None
    return fast if fast is not None else _checked_envelope(datum)


def _checked_envelope(datum: Mapping[str, Any]) -> Envelope:
    """The envelope of any datum, through the logged JSON form and the core's validating reader."""
    seq = datum.get("seq")
    try:
        etype = datum["type"]
        name, data = datum["data"]
        data = dict(data)
        if name == _NS + "UnknownEvent":
            data = codec.loads(data["json"])
        else:
            expected = _TYPES_BY_RECORD.get(name)
            if expected != etype:
                raise AvroDecodeError(
                    f"envelope type {etype!r} does not match its data record {name!r}",
                    seq=seq if isinstance(seq, int) else None,
                )
            if "content" in data:
                data["content"] = _content_from_avro(data["content"], data.pop("reasoning", None))
            if "surfaceOp" in data:
                op = data["surfaceOp"]
                if isinstance(op, tuple):  # (record name, value): the union also holds the named enum
                    op = op[1]
                data["surfaceOp"] = (
                    "append" if op == "append" else {"op": "replace", "start": op["start"], "end": op["end"]}
                )
                if etype == "user/message":
                    data["role"] = "user"
                elif etype == "assistant/message":
                    data["role"] = "assistant"
                if not data.get("isError", True):
                    del data["isError"]
            if etype == "request/header":
                header = _drop_nulls(data["header"])
                header["config"] = _drop_nulls(header["config"])
                if "tools" in header:
                    header["tools"] = [{**t, "inputSchema": codec.loads(t["inputSchema"])} for t in header["tools"]]
                data["header"] = header
            data = _drop_nulls(data)
        value: dict[str, Any] = {"type": etype, "seq": datum["seq"], "time": datum["time"], "data": data}
    except (KeyError, TypeError, ValueError) as exc:
        raise AvroDecodeError(f"malformed event datum: {exc!r}", seq=seq if isinstance(seq, int) else None) from exc
    if datum.get("ignorable"):
        value["ignorable"] = True
    return envelope_from_json(value)
