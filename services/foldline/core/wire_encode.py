"""Events → their logged JSON objects (the field names of docs/FORMAT.md), and canonical event bytes."""

from __future__ import annotations

from typing import Any, assert_never

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
    Usage,
)
from .events import (
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
    SurfaceOp,
    ToolCall,
    ToolResult,
    TurnEnd,
    TurnStart,
    UnknownEvent,
    UserMessage,
)
from .frozen import thaw_json
from .header import CallConfig, EpochHeader, ToolSpec

__all__ = [
    "block_to_json",
    "config_to_json",
    "data_to_json",
    "encode_event",
    "envelope_to_json",
    "header_to_json",
    "image_to_json",
    "tool_spec_to_json",
    "usage_to_json",
]


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
