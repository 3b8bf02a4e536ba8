"""The validating reader: logged JSON → events, checking every field's shape and type.

Each failure is a :class:`~foldline.errors.FormatError` (or :class:`~foldline.errors.ValidationError` for a rule
break such as a legacy event) that names the seq and the path of the field that is wrong.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NoReturn, TypeGuard

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
from .frozen import FrozenDict, freeze_json
from .header import HEADER_REASONS, CallConfig, EpochHeader, HeaderReason, ToolSpec

__all__ = [
    "KNOWN_TYPES",
    "LEGACY_TYPES",
    "Reader",
    "block_from_json",
    "config_from_json",
    "content_from_json",
    "data_from_json",
    "header_from_json",
    "is_turn_end_reason",
    "read_envelope",
    "usage_from_json",
    "usage_from_plain",
]

LEGACY_TYPES: frozenset[str] = frozenset({"request/header-delta"})
HEX_DIGITS = "0123456789abcdef"


def is_turn_end_reason(value: str) -> TypeGuard[TurnEndReason]:
    return value in TURN_END_REASONS


def _is_header_reason(value: str) -> TypeGuard[HeaderReason]:
    return value in HEADER_REASONS


class Reader:
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


def usage_from_json(r: Reader, value: Any, path: str) -> Usage:
    d = r.obj(value, path)
    r.only(d, path, frozenset({"input", "output", "cacheRead", "cacheWrite"}))
    return Usage(
        input=r.int_(d, "input", path),
        output=r.int_(d, "output", path),
        cache_read=r.int_(d, "cacheRead", path),
        cache_write=r.int_(d, "cacheWrite", path),
    )


def _image_from_json(r: Reader, value: Any, path: str) -> ImageRef:
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


def block_from_json(r: Reader, value: Any, path: str) -> ContentBlock:
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
    r = Reader(None)
    if not isinstance(items, list):
        r.fail(f"content must be a list of blocks, got {type(items).__name__}")
    return _blocks(r, items, "content")


def usage_from_plain(value: Any) -> Usage:
    """Usage from its logged JSON object; FormatError when it is not one."""
    return usage_from_json(Reader(None), value, "usage")


def _blocks(r: Reader, items: list[Any], path: str) -> tuple[ContentBlock, ...]:
    return tuple(block_from_json(r, b, f"{path}[{i}]") for i, b in enumerate(items))


def _parts(r: Reader, items: list[Any], path: str) -> tuple[ToolResultPart, ...]:
    out: list[ToolResultPart] = []
    for i, b in enumerate(items):
        block = block_from_json(r, b, f"{path}[{i}]")
        if not isinstance(block, TextBlock | ImageBlock):
            r.fail(f"{path}[{i}] must be a text or image block inside a tool result")
        out.append(block)
    return tuple(out)


def _surface_op(r: Reader, d: Mapping[str, Any], path: str) -> tuple[SurfaceOp, tuple[int, ...] | None]:
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


def config_from_json(r: Reader, value: Any, path: str) -> CallConfig:
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


def header_from_json(r: Reader, value: Any, path: str) -> EpochHeader:
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


def _check_digest(r: Reader, digest: str, path: str) -> None:
    hexpart = digest.removeprefix(codec.DIGEST_PREFIX)
    if not digest.startswith(codec.DIGEST_PREFIX) or len(hexpart) != 64 or hexpart.strip(HEX_DIGITS):
        r.fail(f"{path} must be 'sha256:' + 64 lowercase hex digits, got {digest[:80]!r}")


def _require_ignorable(r: Reader, etype: str, ignorable: bool) -> None:
    if not ignorable:
        raise ValidationError(
            "ignorable-required",
            f'{etype} must be written with "ignorable": true, so readers that predate it can skip it',
            seq=r.seq,
        )


def data_from_json(r: Reader, etype: str, value: Any, ignorable: bool) -> EventData:
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
            if not is_turn_end_reason(reason):
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


def read_envelope(value: Any) -> Envelope:
    """The validating reader for every shape (:mod:`~foldline.core.wire_fast` answers the common ones first)."""
    if not isinstance(value, dict):
        raise FormatError("format", f"an event must be a JSON object, got {type(value).__name__}")
    raw_seq = value.get("seq")
    seq = raw_seq if isinstance(raw_seq, int) and not isinstance(raw_seq, bool) else None
    r = Reader(seq)
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
