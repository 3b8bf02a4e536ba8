"""OpenAI Responses adapter: the ``openai-responses`` serializers (v1 to v4) and :class:`OpenAIResponsesProvider`.

v2 adds streaming (docs/FORMAT.md §9.7); v3, the provider's default, sends each tool's ``parameters`` in its
author's key order (§9.8). The mapping below is v1's, which both keep.

Wire mapping of serializer v1 (``POST /v1/responses``; canonical JSON, keys sorted; docs/FORMAT.md §9.4 is
the byte-level specification):

* ``include: ["reasoning.encrypted_content"]`` and ``store: false`` always: nothing is kept at the provider,
  every request carries the whole conversation, and reasoning state comes back as encrypted items.
* ``config.model`` → ``model``; ``maxTokens`` → ``max_output_tokens``; ``temperature`` as is; ``stop`` is
  refused (the Responses API has no stop sequences); ``reasoningEffort`` → ``reasoning: {"effort": e,
  "summary": "auto"}`` (``off`` → ``{"effort": "none"}``); ``promptCacheKey`` → ``prompt_cache_key``;
  ``cacheTtl`` → ``prompt_cache_retention`` (``5m`` → ``in_memory``, ``24h`` → ``24h``; ``1h`` is refused).
* ``system`` → ``instructions``; ``tools`` → ``{"name", "description"?, "parameters", "strict": false,
  "type": "function"}``.
* The ``input`` list, one or more items per message and never an item spanning two messages:
  ``user`` → ``{"content": [parts], "role": "user", "type": "message"}`` with ``input_text`` and
  ``input_image`` (a base64 data URL, ``detail: "auto"``) parts; ``assistant`` → its blocks in order: each
  non-empty text → ``{"content": text, "role": "assistant", "type": "message"}``, each tool call →
  ``{"arguments", "call_id", "name", "type": "function_call"}``, each ``encrypted-reasoning`` block →
  ``{"encrypted_content", "id", "summary": [{"text", "type": "summary_text"}…], "type": "reasoning"}``
  verbatim; plain and redacted reasoning blocks are left out (they carry no state this API can read);
  ``tool`` → ``{"call_id", "output", "type": "function_call_output"}`` whose output is the result's only
  text as a string, ``""`` for no parts, else a list of ``input_text`` / ``input_image`` parts.

Every reasoning item of every earlier turn goes back: the API decides which ones it renders to the model
(``reasoning.context``), and an unchanged item list keeps each body an append-extension of the one before.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Final, assert_never

from ..core.content import (
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
from ..core.header import ToolSpec
from ..core.projection import Message
from ..core.request import GenerateOptions
from ..errors import ProviderError
from ..ports.attachments import AttachmentStore
from ._answer_parsing import answer_shape, part_count, token_count
from ._openai_http import OpenAIHttpProvider
from .base import ProviderResponse
from .encoding import image_base64, misplaced_block, tool_results, tool_schema
from .json_body import JsonBodySerializer
from .openai import json_schema_format, openai_effort
from .streaming import OpenAIResponsesStream, StreamAssembler

__all__ = [
    "OPENAI_RESPONSES_V1",
    "OPENAI_RESPONSES_V2",
    "OPENAI_RESPONSES_V3",
    "OPENAI_RESPONSES_V4",
    "RESPONSES_PATH",
    "OpenAIResponsesProvider",
    "OpenAIResponsesSerializer",
    "OpenAIResponsesV2Serializer",
    "OpenAIResponsesV3Serializer",
    "OpenAIResponsesV4Serializer",
    "parse_response",
]

PROVIDER: Final = "openai"
API: Final = "the Responses API"
RESPONSES_PATH: Final = "/v1/responses"
_RETENTION: Final = {"5m": "in_memory", "24h": "24h"}


def _image(ref: ImageRef, attachments: AttachmentStore | None) -> dict[str, Any]:
    data = image_base64(ref, attachments, PROVIDER)
    return {"detail": "auto", "image_url": f"data:{ref.media_type};base64,{data}", "type": "input_image"}


def _user(message: Message, index: int, attachments: AttachmentStore | None) -> list[dict[str, Any]]:
    parts: list[dict[str, Any]] = []
    for block in message.content:
        match block:
            case TextBlock(text=text):
                parts.append({"text": text, "type": "input_text"})
            case ImageBlock(image=ref):
                parts.append(_image(ref, attachments))
            case (
                ToolCallBlock()
                | ToolResultBlock()
                | ReasoningBlock()
                | RedactedReasoningBlock()
                | EncryptedReasoningBlock()
            ):
                raise misplaced_block(PROVIDER, API, block.kind, index, message.role)
            case _:
                assert_never(block)
    return [{"content": parts, "role": "user", "type": "message"}] if parts else []


def _assistant(message: Message, index: int) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    for block in message.content:
        match block:
            case TextBlock(text=text):
                if text:
                    items.append({"content": text, "role": "assistant", "type": "message"})
            case ToolCallBlock(id=call_id, name=name, arguments=arguments):
                items.append({"arguments": arguments, "call_id": call_id, "name": name, "type": "function_call"})
            case EncryptedReasoningBlock(id=item_id, summary=summary, encrypted_content=encrypted):
                items.append(
                    {
                        "encrypted_content": encrypted,
                        "id": item_id,
                        "summary": [{"text": s, "type": "summary_text"} for s in summary],
                        "type": "reasoning",
                    }
                )
            case ReasoningBlock() | RedactedReasoningBlock():
                pass  # no state the Responses API can take back
            case ImageBlock() | ToolResultBlock():
                raise misplaced_block(PROVIDER, API, block.kind, index, message.role)
            case _:
                assert_never(block)
    return items


def _tool_output(message: Message, index: int, attachments: AttachmentStore | None) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    for result in tool_results(message, index, PROVIDER, API):
        content = result.content
        output: str | list[dict[str, Any]]
        if not content:
            output = ""
        elif len(content) == 1 and isinstance(content[0], TextBlock):
            output = content[0].text
        else:
            parts: list[dict[str, Any]] = []
            for part in content:
                match part:
                    case TextBlock(text=text):
                        parts.append({"text": text, "type": "input_text"})
                    case ImageBlock(image=ref):
                        parts.append(_image(ref, attachments))
                    case _:
                        assert_never(part)
            output = parts
        items.append({"call_id": result.tool_call_id, "output": output, "type": "function_call_output"})
    return items


def _function(spec: ToolSpec, ordered: bool) -> dict[str, Any]:
    out: dict[str, Any] = {
        "name": spec.name,
        "parameters": tool_schema(spec.input_schema, ordered=ordered),
        "strict": False,
        "type": "function",
    }
    if spec.description:
        out["description"] = spec.description
    return out


class OpenAIResponsesSerializer(JsonBodySerializer):
    """``openai-responses`` v1: GenerateOptions → exact Responses API body bytes (frame + one chunk per item)."""

    name: str = "openai-responses"
    version: int = 1
    list_key: ClassVar[str] = "input"

    def top_level(self, request: GenerateOptions) -> dict[str, Any]:
        config = request.config
        if config.stop:
            raise ProviderError(
                f"{PROVIDER}: the Responses API has no stop sequences; remove config.stop (a header change)"
            )
        out: dict[str, Any] = {
            "include": ["reasoning.encrypted_content"],
            "model": config.model,
            "store": False,
        }
        if config.max_tokens is not None:
            out["max_output_tokens"] = config.max_tokens
        if config.temperature is not None:
            out["temperature"] = config.temperature
        if config.reasoning_effort is not None:
            effort = openai_effort(config.reasoning_effort)
            out["reasoning"] = {"effort": effort} if effort == "none" else {"effort": effort, "summary": "auto"}
        if config.prompt_cache_key is not None:
            out["prompt_cache_key"] = config.prompt_cache_key
        if config.cache_ttl is not None:
            retention = _RETENTION.get(config.cache_ttl)
            if retention is None:
                raise ProviderError(
                    f"{PROVIDER}: cacheTtl {config.cache_ttl!r} has no Responses API retention (5m → in_memory, 24h)"
                )
            out["prompt_cache_retention"] = retention
        if request.system:
            out["instructions"] = request.system
        if request.tools:
            out["tools"] = [_function(t, self.ordered_schemas) for t in request.tools]
        return out

    def wire_messages(
        self, messages: Sequence[Message], start: int, attachments: AttachmentStore | None
    ) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for i, message in enumerate(messages, start):
            match message.role:
                case "user":
                    out.extend(_user(message, i, attachments))
                case "assistant":
                    out.extend(_assistant(message, i))
                case "tool":
                    out.extend(_tool_output(message, i, attachments))
                case _:
                    assert_never(message.role)
        return out

    def boundary(self, prev: Message, nxt: Message) -> bool:
        """No item spans two messages."""
        return True


class OpenAIResponsesV2Serializer(OpenAIResponsesSerializer):
    """``openai-responses`` v2: v1's bytes, plus ``"stream":true`` when the logged config streams (§9.7)."""

    version: int = 2
    stream_fields: ClassVar[Mapping[str, Any] | None] = {"stream": True}


class OpenAIResponsesV3Serializer(OpenAIResponsesV2Serializer):
    """``openai-responses`` v3: v2, with each tool's ``parameters`` in its author's key order (§9.8)."""

    version: int = 3
    ordered_schemas: ClassVar[bool] = True


class OpenAIResponsesV4Serializer(OpenAIResponsesV3Serializer):
    """``openai-responses`` v4: v3, plus structured output (§9.10): a logged ``outputSchema`` is sent as ``text``
    ``{"format": {"name": outputName, "schema": <the schema, in its author's key order>, "strict": true,
    "type": "json_schema"}}``."""

    version: int = 4
    structured_output: ClassVar[bool] = True

    def output_fields(self, out: dict[str, Any], name: str, schema: Mapping[str, Any]) -> None:
        out["text"] = {"format": {**json_schema_format(name, schema), "type": "json_schema"}}


# Every version stays replayable (foldline.providers.registry registers them); the adapter sends with the last.
OPENAI_RESPONSES_V1: Final = OpenAIResponsesSerializer()
OPENAI_RESPONSES_V2: Final = OpenAIResponsesV2Serializer()  # v1 + streaming
OPENAI_RESPONSES_V3: Final = OpenAIResponsesV3Serializer()  # v2 + author key order
OPENAI_RESPONSES_V4: Final = OpenAIResponsesV4Serializer()  # v3 + structured output: what the adapter sends with


# ---------------------------------------------------------------------- responses


def _usage(u: Any) -> Usage:
    """``input_tokens`` includes the cached tokens and those written to the cache
    (``input_tokens_details.cached_tokens`` / ``cache_write_tokens``); ``output_tokens_details.reasoning_tokens``
    is the part of ``output_tokens`` spent reasoning."""
    total = token_count(u["input_tokens"])
    details = u.get("input_tokens_details") or {}
    cached = token_count(details.get("cached_tokens"))
    written = token_count(details.get("cache_write_tokens"))
    if cached + written > total:
        raise TypeError(f"cached {cached} + written {written} tokens exceed input_tokens {total}")
    output = token_count(u["output_tokens"])
    reasoning = part_count(u.get("output_tokens_details"), "reasoning_tokens", output, "output_tokens")
    return Usage(total - cached - written, output, cached, written, reasoning)


def parse_response(payload: dict[str, Any]) -> ProviderResponse:
    """A Responses API answer → content blocks in output order, normalized usage and stop reason.

    ``reasoning`` with ``encrypted_content`` → EncryptedReasoningBlock(id, summary texts, encrypted_content);
    without it → one ReasoningBlock per summary text (nothing to pass back); ``message`` → a TextBlock per
    ``output_text`` or ``refusal`` part; ``function_call`` → ToolCallBlock(call_id, name, raw arguments).
    """
    with answer_shape(PROVIDER, API):
        content: list[ContentBlock] = []
        refused = False
        calls = False
        for item in payload["output"]:
            kind = item["type"]
            if kind == "reasoning":
                summary = tuple(str(s["text"]) for s in item.get("summary") or ())
                encrypted = item.get("encrypted_content")
                if encrypted is not None:
                    content.append(EncryptedReasoningBlock(str(item["id"]), summary, str(encrypted)))
                else:
                    content.extend(ReasoningBlock(s) for s in summary)
            elif kind == "message":
                for part in item["content"]:
                    if part["type"] == "output_text":
                        content.append(TextBlock(str(part["text"])))
                    elif part["type"] == "refusal":
                        content.append(TextBlock(str(part["refusal"])))
                        refused = True
                    else:
                        raise ProviderError(f"{PROVIDER}: the answer has a {part['type']!r} part foldline cannot log")
            elif kind == "function_call":
                content.append(ToolCallBlock(str(item["call_id"]), str(item["name"]), str(item["arguments"])))
                calls = True
            else:
                raise ProviderError(f"{PROVIDER}: the answer has a {kind!r} output item foldline cannot log")
        usage = _usage(payload["usage"])
        status = payload.get("status")
        reason = (payload.get("incomplete_details") or {}).get("reason")
    if refused:
        stop = "refusal"
    elif status == "completed":
        stop = "tool_use" if calls else "end_turn"
    elif status == "incomplete" and reason == "max_output_tokens":
        stop = "max_tokens"
    elif status == "incomplete" and reason == "content_filter":
        stop = "refusal"
    else:
        stop = "other"
    return ProviderResponse(tuple(content), usage, stop)


class OpenAIResponsesProvider(OpenAIHttpProvider[OpenAIResponsesSerializer], name=PROVIDER, path=RESPONSES_PATH):
    """Posts serialized bodies to ``{base_url}/v1/responses`` over the given httpx transport (``None``: the
    network, with the pool and HTTP/2 of ``settings``). Streamed answers are assembled by
    :class:`~foldline.providers.streaming.OpenAIResponsesStream`."""

    def default_serializer(self) -> OpenAIResponsesSerializer:
        return OPENAI_RESPONSES_V4  # v4: v1, streaming, ordered schemas and structured output

    def parse(self, payload: dict[str, Any]) -> ProviderResponse:
        return parse_response(payload)

    def assembler(self) -> StreamAssembler:
        return OpenAIResponsesStream()
