"""Envelope <-> plain JSON objects (the logged field names), and canonical event bytes.

This is the single mapping between the frozen dataclasses and the logged form documented in
docs/FORMAT.md. Decoding checks shape and types and raises :class:`~foldline.errors.FormatError`
(or :class:`~foldline.errors.ValidationError` for rule breaks such as a legacy event) naming the seq.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NoReturn, TypeGuard, assert_never

from ..errors import FormatError, ValidationError
from . import codec
from .content import (
    ContentBlock,
    EncryptedReasoningBlock,
    ImageBlock,
    ImageRef,
    ReasoningBlock,
    RedactedReasoningBlock,
    TextBlock,
    ToolCallBlock,
    ToolResultBlock,
    ToolResultPart,
    Usage,
)
from .events import (
    MAX_INT,
    MAX_TIME_MS,
    SURFACE_TYPES,
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
    ReplaceOp,
    RequestDispatch,
    RequestHeader,
    SessionEndSeed,
    StepEnd,
    StepStart,
    SurfaceOp,
    ToolCall,
    ToolResult,
    TurnEnd,
    TurnEndReason,
    TurnStart,
    UnknownEvent,
    UserMessage,
)
from .frozen import FrozenDict, freeze_json, thaw_json
from .header import HEADER_REASONS, CallConfig, EpochHeader, HeaderReason, ToolSpec

__all__ = [
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
    "usage_from_json",
    "usage_from_plain",
    "usage_to_json",
]

LEGACY_TYPES: frozenset[str] = frozenset({"request/header-delta"})
_HEX = "0123456789abcdef"


# ---------------------------------------------------------------- to JSON


def usage_to_json(u: Usage) -> dict[str, int]:
    return {"input": u.input, "output": u.output, "cacheRead": u.cache_read, "cacheWrite": u.cache_write}


def image_to_json(ref: ImageRef) -> dict[str, Any]:
    return {
        "attachmentId": ref.attachment_id,
        "mediaType": ref.media_type,
        "bytes": ref.bytes,
        "width": ref.width,
        "height": ref.height,
    }


def block_to_json(block: ContentBlock) -> dict[str, Any]:
    match block:
        case TextBlock(text=text):
            return {"type": "text", "text": text}
        case ImageBlock(image=image):
            return {"type": "image", "attachment": image_to_json(image)}
        case ToolCallBlock(id=id_, name=name, arguments=arguments):
            return {"type": "tool-call", "id": id_, "name": name, "arguments": arguments}
        case ToolResultBlock(tool_call_id=tcid, content=content, is_error=is_error):
            out: dict[str, Any] = {
                "type": "tool-result",
                "toolCallId": tcid,
                "content": [block_to_json(b) for b in content],
            }
            if is_error:
                out["isError"] = True
            return out
        case ReasoningBlock(text=text, signature=signature):
            out = {"type": "reasoning", "text": text}
            if signature is not None:
                out["signature"] = signature
            return out
        case RedactedReasoningBlock(data=data):
            return {"type": "redacted-reasoning", "data": data}
        case EncryptedReasoningBlock(id=id_, summary=summary, encrypted_content=encrypted):
            return {"type": "encrypted-reasoning", "id": id_, "summary": list(summary), "encryptedContent": encrypted}
        case _:
            assert_never(block)


def config_to_json(c: CallConfig) -> dict[str, Any]:
    out: dict[str, Any] = {"provider": c.provider, "model": c.model}
    if c.temperature is not None:
        out["temperature"] = c.temperature
    if c.max_tokens is not None:
        out["maxTokens"] = c.max_tokens
    if c.stop is not None:
        out["stop"] = list(c.stop)
    if c.reasoning_effort is not None:
        out["reasoningEffort"] = c.reasoning_effort
    if c.cache_ttl is not None:
        out["cacheTtl"] = c.cache_ttl
    if c.prompt_cache_key is not None:
        out["promptCacheKey"] = c.prompt_cache_key
    if c.thinking_budget is not None:
        out["thinkingBudget"] = c.thinking_budget
    if c.stream:
        out["stream"] = True
    return out


def tool_spec_to_json(t: ToolSpec) -> dict[str, Any]:
    return {"name": t.name, "description": t.description, "inputSchema": thaw_json(t.input_schema)}


def header_to_json(h: EpochHeader) -> dict[str, Any]:
    out: dict[str, Any] = {"config": config_to_json(h.config)}
    if h.system is not None:
        out["system"] = h.system
    if h.tools is not None:
        out["tools"] = [tool_spec_to_json(t) for t in h.tools]
    return out


def _surface_fields(out: dict[str, Any], op: SurfaceOp, sources: tuple[int, ...] | None) -> dict[str, Any]:
    out["surfaceOp"] = "append" if op == "append" else {"op": "replace", "start": op.start, "end": op.end}
    if sources is not None:
        out["sourceEventSeqs"] = list(sources)
    return out


def data_to_json(data: EventData) -> dict[str, Any]:
    match data:
        case UserMessage():
            return _surface_fields(
                {
                    "id": data.id,
                    "role": "user",
                    "content": [block_to_json(b) for b in data.content],
                    "source": data.source,
                },
                data.surface_op,
                data.source_event_seqs,
            )
        case AssistantMessage():
            out: dict[str, Any] = {
                "id": data.id,
                "role": "assistant",
                "content": [block_to_json(b) for b in data.content],
            }
            if data.usage is not None:
                out["usage"] = usage_to_json(data.usage)
            if data.stop_reason is not None:
                out["stopReason"] = data.stop_reason
            if data.provider_request_id is not None:
                out["providerRequestId"] = data.provider_request_id
            if data.provider_message_id is not None:
                out["providerMessageId"] = data.provider_message_id
            return _surface_fields(out, data.surface_op, data.source_event_seqs)
        case ToolResult():
            out = {"callId": data.call_id, "name": data.name, "content": [block_to_json(b) for b in data.content]}
            if data.is_error:
                out["isError"] = True
            return _surface_fields(out, data.surface_op, data.source_event_seqs)
        case TurnStart():
            return {"turn": data.turn}
        case TurnEnd():
            return {"turn": data.turn, "reason": data.reason}
        case StepStart() | StepEnd():
            return {"turn": data.turn, "step": data.step}
        case ToolCall():
            return {
                "turn": data.turn,
                "step": data.step,
                "callId": data.call_id,
                "name": data.name,
                "arguments": data.arguments,
            }
        case RequestHeader():
            return {"header": header_to_json(data.header), "reason": data.reason}
        case RequestDispatch():
            return {
                "turn": data.turn,
                "step": data.step,
                "serializer": data.serializer,
                "serializerVersion": data.serializer_version,
                "digest": data.digest,
                "bytes": data.bytes,
            }
        case SessionEndSeed():
            out = {}
            if data.parent_id is not None:
                out["parentId"] = data.parent_id
            if data.seed_length is not None:
                out["seedLength"] = data.seed_length
            return out
        case CompactionStart():
            return {"start": data.start, "end": data.end, "estimatedTokens": data.estimated_tokens}
        case CompactionSummary():
            out = {
                "summary": data.summary,
                "provider": data.provider,
                "model": data.model,
                "maxTokens": data.max_tokens,
            }
            if data.usage is not None:
                out["usage"] = usage_to_json(data.usage)
            if data.serializer is not None:
                out["serializer"] = data.serializer
            if data.serializer_version is not None:
                out["serializerVersion"] = data.serializer_version
            if data.input_digest is not None:
                out["inputDigest"] = data.input_digest
            if data.prompt_version is not None:
                out["promptVersion"] = data.prompt_version
            return out
        case CompactionEnd():
            return {}
        case AttachmentQuarantine():
            return {"attachmentId": data.attachment_id, "failure": data.failure, "recovery": data.recovery}
        case LlmRetry():
            out = {
                "turn": data.turn,
                "step": data.step,
                "attempt": data.attempt,
                "errorType": data.error_type,
                "receivedBytes": data.received_bytes,
            }
            if data.status is not None:
                out["status"] = data.status
            if data.wait_ms is not None:
                out["waitMs"] = data.wait_ms
            if data.provider_request_id is not None:
                out["providerRequestId"] = data.provider_request_id
            return out
        case AssistantChunk():
            out = {
                "turn": data.turn,
                "step": data.step,
                "attempt": data.attempt,
                "index": data.index,
                "data": data.data,
            }
            if data.event is not None:
                out["event"] = data.event
            return out
        case UnknownEvent():
            return data.data.to_dict()
        case _:
            assert_never(data)


def envelope_to_json(env: Envelope) -> dict[str, Any]:
    out: dict[str, Any] = {"type": env.type, "seq": env.seq, "time": env.time, "data": data_to_json(env.data)}
    if env.ignorable:
        out["ignorable"] = True
    return out


def encode_event(env: Envelope) -> bytes:
    """The canonical bytes of one event: what the log stores and the export writes per line."""
    return codec.canonical_json(envelope_to_json(env))


# ---------------------------------------------------------------- from JSON


def _is_turn_end_reason(value: str) -> TypeGuard[TurnEndReason]:
    return value in TURN_END_REASONS


def _is_header_reason(value: str) -> TypeGuard[HeaderReason]:
    return value in HEADER_REASONS


class _Reader:
    """Typed field access that fails with the seq and the field path."""

    __slots__ = ("seq",)

    def __init__(self, seq: int | None) -> None:
        self.seq = seq

    def fail(self, message: str, rule: str = "format") -> NoReturn:
        raise FormatError(rule, message, seq=self.seq)

    def obj(self, value: Any, path: str) -> Mapping[str, Any]:
        if not isinstance(value, dict):
            self.fail(f"{path} must be an object, got {type(value).__name__}")
        return value

    def only(self, d: Mapping[str, Any], path: str, allowed: frozenset[str]) -> None:
        extra = set(d) - allowed
        if extra:
            self.fail(f"{path} has unknown field(s) {sorted(extra)}; allowed: {sorted(allowed)}")

    def str_(self, d: Mapping[str, Any], key: str, path: str) -> str:
        v = d.get(key)
        if not isinstance(v, str):
            self.fail(f"{path}.{key} must be a string, got {_tname(v)}")
        return v

    def opt_str(self, d: Mapping[str, Any], key: str, path: str) -> str | None:
        return None if key not in d else self.str_(d, key, path)

    def int_(self, d: Mapping[str, Any], key: str, path: str, minimum: int = 0) -> int:
        v = d.get(key)
        if not isinstance(v, int) or isinstance(v, bool):
            self.fail(f"{path}.{key} must be an integer, got {_tname(v)}")
        if v < minimum:
            self.fail(f"{path}.{key} must be >= {minimum}, got {v}")
        if v > MAX_INT:
            self.fail(f"{path}.{key} must fit in a signed 64-bit integer (at most {MAX_INT}), got {v}", "value-range")
        return v

    def opt_int(self, d: Mapping[str, Any], key: str, path: str, minimum: int = 0) -> int | None:
        return None if key not in d else self.int_(d, key, path, minimum)

    def bool_(self, d: Mapping[str, Any], key: str, path: str) -> bool:
        v = d.get(key, False)
        if not isinstance(v, bool):
            self.fail(f"{path}.{key} must be a boolean, got {_tname(v)}")
        return v

    def list_(self, d: Mapping[str, Any], key: str, path: str) -> list[Any]:
        v = d.get(key)
        if not isinstance(v, list):
            self.fail(f"{path}.{key} must be an array, got {_tname(v)}")
        return v


def _tname(v: Any) -> str:
    return "missing" if v is None else type(v).__name__


def usage_from_json(r: _Reader, value: Any, path: str) -> Usage:
    d = r.obj(value, path)
    r.only(d, path, frozenset({"input", "output", "cacheRead", "cacheWrite"}))
    return Usage(
        input=r.int_(d, "input", path),
        output=r.int_(d, "output", path),
        cache_read=r.int_(d, "cacheRead", path),
        cache_write=r.int_(d, "cacheWrite", path),
    )


def _image_from_json(r: _Reader, value: Any, path: str) -> ImageRef:
    d = r.obj(value, path)
    r.only(d, path, frozenset({"attachmentId", "mediaType", "bytes", "width", "height"}))
    try:
        return ImageRef(
            attachment_id=r.str_(d, "attachmentId", path),
            media_type=r.str_(d, "mediaType", path),
            bytes=r.int_(d, "bytes", path),
            width=r.int_(d, "width", path, 1),
            height=r.int_(d, "height", path, 1),
        )
    except ValueError as exc:
        r.fail(f"{path}: {exc}")


def block_from_json(r: _Reader, value: Any, path: str) -> ContentBlock:
    d = r.obj(value, path)
    kind = d.get("type")
    if kind == "text":
        r.only(d, path, frozenset({"type", "text"}))
        return TextBlock(r.str_(d, "text", path))
    if kind == "image":
        r.only(d, path, frozenset({"type", "attachment"}))
        return ImageBlock(_image_from_json(r, d.get("attachment"), path + ".attachment"))
    if kind == "tool-call":
        r.only(d, path, frozenset({"type", "id", "name", "arguments"}))
        return ToolCallBlock(r.str_(d, "id", path), r.str_(d, "name", path), r.str_(d, "arguments", path))
    if kind == "tool-result":
        r.only(d, path, frozenset({"type", "toolCallId", "content", "isError"}))
        return ToolResultBlock(
            r.str_(d, "toolCallId", path),
            _parts(r, r.list_(d, "content", path), path + ".content"),
            r.bool_(d, "isError", path),
        )
    if kind == "reasoning":
        r.only(d, path, frozenset({"type", "text", "signature"}))
        return ReasoningBlock(r.str_(d, "text", path), r.opt_str(d, "signature", path))
    if kind == "redacted-reasoning":
        r.only(d, path, frozenset({"type", "data"}))
        return RedactedReasoningBlock(r.str_(d, "data", path))
    if kind == "encrypted-reasoning":
        r.only(d, path, frozenset({"type", "id", "summary", "encryptedContent"}))
        summary = r.list_(d, "summary", path)
        if not all(isinstance(s, str) for s in summary):
            r.fail(f"{path}.summary must be an array of strings")
        return EncryptedReasoningBlock(r.str_(d, "id", path), tuple(summary), r.str_(d, "encryptedContent", path))
    r.fail(
        f"{path}.type must be one of text, image, tool-call, tool-result, reasoning, redacted-reasoning, "
        f"encrypted-reasoning; got {kind!r}"
    )


def content_from_json(items: Any) -> tuple[ContentBlock, ...]:
    """Content blocks from their logged JSON (a list); FormatError naming the block that is wrong."""
    r = _Reader(None)
    if not isinstance(items, list):
        r.fail(f"content must be a list of blocks, got {type(items).__name__}")
    return _blocks(r, items, "content")


def usage_from_plain(value: Any) -> Usage:
    """Usage from its logged JSON object; FormatError when it is not one."""
    return usage_from_json(_Reader(None), value, "usage")


def _blocks(r: _Reader, items: list[Any], path: str) -> tuple[ContentBlock, ...]:
    return tuple(block_from_json(r, b, f"{path}[{i}]") for i, b in enumerate(items))


def _parts(r: _Reader, items: list[Any], path: str) -> tuple[ToolResultPart, ...]:
    out: list[ToolResultPart] = []
    for i, b in enumerate(items):
        block = block_from_json(r, b, f"{path}[{i}]")
        if not isinstance(block, TextBlock | ImageBlock):
            r.fail(f"{path}[{i}] must be a text or image block inside a tool result")
        out.append(block)
    return tuple(out)


def _surface_op(r: _Reader, d: Mapping[str, Any], path: str) -> tuple[SurfaceOp, tuple[int, ...] | None]:
    raw = d.get("surfaceOp")
    op: SurfaceOp
    if raw == "append":
        op = "append"
    elif isinstance(raw, dict):
        r.only(raw, path + ".surfaceOp", frozenset({"op", "start", "end"}))
        if raw.get("op") != "replace":
            r.fail(f"{path}.surfaceOp.op must be 'replace', got {raw.get('op')!r}", "surface-op")
        op = ReplaceOp(r.int_(raw, "start", path + ".surfaceOp"), r.int_(raw, "end", path + ".surfaceOp"))
    else:
        r.fail(f"{path}.surfaceOp must be 'append' or {{op: 'replace', start, end}}, got {raw!r}", "surface-op")
    sources: tuple[int, ...] | None = None
    if "sourceEventSeqs" in d:
        items = r.list_(d, "sourceEventSeqs", path)
        if not all(isinstance(x, int) and not isinstance(x, bool) and 0 <= x <= MAX_INT for x in items):
            r.fail(f"{path}.sourceEventSeqs must be non-negative 64-bit integers", "surface-op")
        sources = tuple(items)
    return op, sources


def config_from_json(r: _Reader, value: Any, path: str) -> CallConfig:
    d = r.obj(value, path)
    r.only(
        d,
        path,
        frozenset(
            {
                "provider",
                "model",
                "temperature",
                "maxTokens",
                "stop",
                "reasoningEffort",
                "cacheTtl",
                "promptCacheKey",
                "thinkingBudget",
                "stream",
            }
        ),
    )
    temperature = d.get("temperature")
    if temperature is not None and (not isinstance(temperature, int | float) or isinstance(temperature, bool)):
        r.fail(f"{path}.temperature must be a number")
    stop = None
    if "stop" in d:
        items = r.list_(d, "stop", path)
        if not items or not all(isinstance(s, str) for s in items):
            r.fail(f"{path}.stop must be a non-empty array of strings (omit it when empty)", "header-canonical")
        stop = tuple(items)
    stream = r.bool_(d, "stream", path)
    if "stream" in d and not stream:
        r.fail(f"{path}.stream is false; a request that does not stream is written without it", "header-canonical")
    try:
        return CallConfig(
            provider=r.str_(d, "provider", path),
            model=r.str_(d, "model", path),
            temperature=None if temperature is None else float(temperature),
            max_tokens=r.opt_int(d, "maxTokens", path, 1),
            stop=stop,
            reasoning_effort=r.opt_str(d, "reasoningEffort", path),
            cache_ttl=r.opt_str(d, "cacheTtl", path),
            prompt_cache_key=r.opt_str(d, "promptCacheKey", path),
            thinking_budget=r.opt_int(d, "thinkingBudget", path),
            stream=stream,
        )
    except ValueError as exc:
        r.fail(f"{path}: {exc}")


def header_from_json(r: _Reader, value: Any, path: str) -> EpochHeader:
    d = r.obj(value, path)
    r.only(d, path, frozenset({"config", "system", "tools"}))
    system = r.opt_str(d, "system", path)
    if system == "":
        r.fail(f"{path}.system is empty; an empty system prompt is written as absent", "header-canonical")
    tools: tuple[ToolSpec, ...] | None = None
    if "tools" in d:
        raw_tools = r.list_(d, "tools", path)
        if not raw_tools:
            r.fail(f"{path}.tools is empty; an empty tool list is written as absent", "header-canonical")
        specs = []
        for i, t in enumerate(raw_tools):
            tp = f"{path}.tools[{i}]"
            td = r.obj(t, tp)
            r.only(td, tp, frozenset({"name", "description", "inputSchema"}))
            schema = freeze_json(r.obj(td.get("inputSchema"), tp + ".inputSchema"))
            assert isinstance(schema, FrozenDict)
            try:
                specs.append(ToolSpec(r.str_(td, "name", tp), r.str_(td, "description", tp), schema))
            except ValueError as exc:
                r.fail(f"{tp}: {exc}")
        tools = tuple(specs)
    try:
        return EpochHeader(config_from_json(r, d.get("config"), path + ".config"), system, tools)
    except ValueError as exc:
        r.fail(f"{path}: {exc}")


_FIELDS: dict[str, frozenset[str]] = {
    "user/message": frozenset({"id", "role", "content", "source", "surfaceOp", "sourceEventSeqs"}),
    "assistant/message": frozenset(
        {
            "id",
            "role",
            "content",
            "usage",
            "stopReason",
            "surfaceOp",
            "sourceEventSeqs",
            "providerRequestId",
            "providerMessageId",
        }
    ),
    "tool/result": frozenset({"callId", "name", "content", "isError", "surfaceOp", "sourceEventSeqs"}),
    "turn/start": frozenset({"turn"}),
    "turn/end": frozenset({"turn", "reason"}),
    "step/start": frozenset({"turn", "step"}),
    "step/end": frozenset({"turn", "step"}),
    "tool/call": frozenset({"turn", "step", "callId", "name", "arguments"}),
    "request/header": frozenset({"header", "reason"}),
    "request/dispatch": frozenset({"turn", "step", "serializer", "serializerVersion", "digest", "bytes"}),
    "session/end-seed": frozenset({"parentId", "seedLength"}),
    "compaction/start": frozenset({"start", "end", "estimatedTokens"}),
    "compaction/summary": frozenset(
        {
            "summary",
            "provider",
            "model",
            "maxTokens",
            "usage",
            "serializer",
            "serializerVersion",
            "inputDigest",
            "promptVersion",
        }
    ),
    "compaction/end": frozenset(),
    "attachment/quarantine": frozenset({"attachmentId", "failure", "recovery"}),
    "llm/retry": frozenset(
        {"turn", "step", "attempt", "errorType", "status", "waitMs", "providerRequestId", "receivedBytes"}
    ),
    "assistant/chunk": frozenset({"turn", "step", "attempt", "index", "event", "data"}),
}
KNOWN_TYPES: frozenset[str] = frozenset(_FIELDS)


def _check_digest(r: _Reader, digest: str, path: str) -> None:
    hexpart = digest.removeprefix(codec.DIGEST_PREFIX)
    if not digest.startswith(codec.DIGEST_PREFIX) or len(hexpart) != 64 or hexpart.strip(_HEX):
        r.fail(f"{path} must be 'sha256:' + 64 lowercase hex digits, got {digest[:80]!r}")


def _require_ignorable(r: _Reader, etype: str, ignorable: bool) -> None:
    if not ignorable:
        raise ValidationError(
            "ignorable-required",
            f'{etype} must be written with "ignorable": true, so readers that predate it can skip it',
            seq=r.seq,
        )


def data_from_json(r: _Reader, etype: str, value: Any, ignorable: bool) -> EventData:
    p = "data"
    d = r.obj(value, p)
    if etype in LEGACY_TYPES:
        raise ValidationError(
            "legacy-header-delta",
            f"{etype!r} is a removed legacy event; headers are full request/header snapshots. "
            "Such logs are rejected, not migrated.",
            seq=r.seq,
        )
    allowed = _FIELDS.get(etype)
    if allowed is None:
        if not ignorable:
            raise ValidationError(
                "unknown-type",
                f"unknown event type {etype!r}; only events marked ignorable may have unknown types "
                "(is this log from a newer foldline?)",
                seq=r.seq,
            )
        frozen = freeze_json(d)
        assert isinstance(frozen, FrozenDict)
        return UnknownEvent(etype, frozen)
    if etype not in SURFACE_TYPES and ("surfaceOp" in d or "sourceEventSeqs" in d):
        raise ValidationError(
            "surface-fields-only-on-surface",
            f"{etype} carries surfaceOp/sourceEventSeqs; only user/message, assistant/message and tool/result may",
            seq=r.seq,
        )
    r.only(d, p, allowed)
    match etype:
        case "user/message":
            if d.get("role") != "user":
                r.fail("data.role must be 'user'")
            op, src = _surface_op(r, d, p)
            return UserMessage(
                r.str_(d, "id", p),
                _blocks(r, r.list_(d, "content", p), p + ".content"),
                r.str_(d, "source", p),
                op,
                src,
            )
        case "assistant/message":
            if d.get("role") != "assistant":
                r.fail("data.role must be 'assistant'")
            op, src = _surface_op(r, d, p)
            usage = usage_from_json(r, d["usage"], p + ".usage") if "usage" in d else None
            return AssistantMessage(
                r.str_(d, "id", p),
                _blocks(r, r.list_(d, "content", p), p + ".content"),
                usage,
                r.opt_str(d, "stopReason", p),
                op,
                src,
                r.opt_str(d, "providerRequestId", p),
                r.opt_str(d, "providerMessageId", p),
            )
        case "tool/result":
            op, src = _surface_op(r, d, p)
            return ToolResult(
                r.str_(d, "callId", p),
                r.str_(d, "name", p),
                _parts(r, r.list_(d, "content", p), p + ".content"),
                r.bool_(d, "isError", p),
                op,
                src,
            )
        case "turn/start":
            return TurnStart(r.int_(d, "turn", p))
        case "turn/end":
            reason = r.str_(d, "reason", p)
            if not _is_turn_end_reason(reason):
                r.fail(f"data.reason must be one of {sorted(TURN_END_REASONS)}, got {reason!r}", "turn-end-reason")
            return TurnEnd(r.int_(d, "turn", p), reason)
        case "step/start":
            return StepStart(r.int_(d, "turn", p), r.int_(d, "step", p))
        case "step/end":
            return StepEnd(r.int_(d, "turn", p), r.int_(d, "step", p))
        case "tool/call":
            return ToolCall(
                r.int_(d, "turn", p),
                r.int_(d, "step", p),
                r.str_(d, "callId", p),
                r.str_(d, "name", p),
                r.str_(d, "arguments", p),
            )
        case "request/header":
            reason = r.str_(d, "reason", p)
            if reason == "fallback":
                raise ValidationError(
                    "legacy-fallback-reason",
                    "request/header reason 'fallback' was removed; logs carrying it are rejected",
                    seq=r.seq,
                )
            if not _is_header_reason(reason):
                r.fail(f"data.reason must be one of {sorted(HEADER_REASONS)}, got {reason!r}", "header-reason")
            return RequestHeader(header_from_json(r, d.get("header"), p + ".header"), reason)
        case "request/dispatch":
            digest = r.str_(d, "digest", p)
            _check_digest(r, digest, "data.digest")
            return RequestDispatch(
                r.int_(d, "turn", p),
                r.int_(d, "step", p),
                r.str_(d, "serializer", p),
                r.int_(d, "serializerVersion", p),
                digest,
                r.int_(d, "bytes", p),
            )
        case "session/end-seed":
            return SessionEndSeed(r.opt_str(d, "parentId", p), r.opt_int(d, "seedLength", p))
        case "compaction/start":
            return CompactionStart(r.int_(d, "start", p), r.int_(d, "end", p), r.int_(d, "estimatedTokens", p))
        case "compaction/summary":
            usage = usage_from_json(r, d["usage"], p + ".usage") if "usage" in d else None
            input_digest = r.opt_str(d, "inputDigest", p)
            if input_digest is not None:
                _check_digest(r, input_digest, "data.inputDigest")
            version = r.int_(d, "serializerVersion", p, 1) if "serializerVersion" in d else None
            return CompactionSummary(
                r.str_(d, "summary", p),
                r.str_(d, "provider", p),
                r.str_(d, "model", p),
                r.int_(d, "maxTokens", p, 1),
                usage,
                r.opt_str(d, "serializer", p),
                version,
                input_digest,
                r.int_(d, "promptVersion", p, 1) if "promptVersion" in d else None,
            )
        case "compaction/end":
            return CompactionEnd()
        case "attachment/quarantine":
            return AttachmentQuarantine(r.str_(d, "attachmentId", p), r.str_(d, "failure", p), r.str_(d, "recovery", p))
        case "llm/retry":
            _require_ignorable(r, etype, ignorable)
            return LlmRetry(
                r.int_(d, "turn", p),
                r.int_(d, "step", p),
                r.int_(d, "attempt", p, 1),
                r.str_(d, "errorType", p),
                r.opt_int(d, "status", p, 100),
                r.opt_int(d, "waitMs", p),
                r.opt_str(d, "providerRequestId", p),
                r.int_(d, "receivedBytes", p),
            )
        case "assistant/chunk":
            _require_ignorable(r, etype, ignorable)
            return AssistantChunk(
                r.int_(d, "turn", p),
                r.int_(d, "step", p),
                r.int_(d, "attempt", p, 1),
                r.int_(d, "index", p),
                r.str_(d, "data", p),
                r.opt_str(d, "event", p),
            )
    raise AssertionError(f"unhandled known type {etype}")  # pragma: no cover


# ---------------------------------------------------------------- the common shapes, fast

# The validating reader above formats a field path for every value it reads; a log holds millions of
# events of a few plain shapes. ``_fast`` decodes exactly those shapes — every field present with its
# exact JSON type, no optional field the fast path does not know — into the same dataclasses, and answers
# ``None`` for anything else, which then goes through the validating reader (and its precise errors). So
# both paths return equal envelopes for every input they both accept; tests hold them together.

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
        if len(d) != 2 or type(reason) is not str or not _is_turn_end_reason(reason):
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
    if not digest.startswith(codec.DIGEST_PREFIX) or len(hexpart) != 64 or hexpart.strip(_HEX):
        return None
    return RequestDispatch(turn, step, serializer, version, digest, size)


def _fast(value: Any) -> Envelope | None:
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


def envelope_from_json(value: Any) -> Envelope:
    """Decode one logged envelope object; raises FormatError / ValidationError naming the seq."""
    fast = _fast(value)
    if fast is not None:
        return fast
    return _envelope_from_json(value)


def _envelope_from_json(value: Any) -> Envelope:
    """The validating reader for every shape (the fast path above answers the common ones)."""
    if not isinstance(value, dict):
        raise FormatError("format", f"an event must be a JSON object, got {type(value).__name__}")
    raw_seq = value.get("seq")
    seq = raw_seq if isinstance(raw_seq, int) and not isinstance(raw_seq, bool) else None
    r = _Reader(seq)
    r.only(value, "event", frozenset({"type", "seq", "time", "data", "ignorable"}))
    etype = r.str_(value, "type", "event")
    s = r.int_(value, "seq", "event")
    raw_time = value.get("time")
    if type(raw_time) is int and raw_time > MAX_TIME_MS:
        r.fail(
            f"event.time {raw_time} is past 9999-12-31T23:59:59.999Z (at most {MAX_TIME_MS} epoch milliseconds)", "time"
        )
    t = r.int_(value, "time", "event")
    ignorable = r.bool_(value, "ignorable", "event")
    return Envelope(s, t, data_from_json(r, etype, value.get("data"), ignorable), ignorable)


def decode_canonical(raw: bytes | str) -> tuple[Envelope, bytes]:
    """Decode one event, with the canonical bytes of what it decoded to (``encode_event`` of the result).

    The text is canonical exactly when those bytes equal it. For the shapes the fast path takes they are the
    canonical JSON of the parsed value itself (the fast path takes only what the encoder writes), which
    spares building the event's JSON again."""
    try:
        value = codec.loads(raw)
    except ValueError as exc:
        raise FormatError("format", str(exc)) from exc
    fast = _fast(value)
    if fast is not None:
        return fast, codec.canonical_json(value)
    env = _envelope_from_json(value)
    return env, encode_event(env)


def decode_event(raw: bytes | str) -> Envelope:
    """Decode one event from its JSON text."""
    try:
        value = codec.loads(raw)
    except ValueError as exc:
        raise FormatError("format", str(exc)) from exc
    return envelope_from_json(value)
