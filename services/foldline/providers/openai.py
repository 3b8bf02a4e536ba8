"""OpenAI Chat Completions adapter: the ``openai-chat`` serializers (v1 to v4) and :class:`OpenAIProvider`.

v2 adds streaming (docs/FORMAT.md §9.7); v3, the provider's default, sends each tool's ``parameters`` in its
author's key order (§9.8). The mapping below is v1's, which both keep.

Wire mapping of serializer v1 (``POST /v1/chat/completions``; canonical JSON, keys sorted):

* ``config.model`` → ``model``; ``max_tokens`` → ``max_completion_tokens`` (omitted when absent);
  ``temperature``; ``stop`` → ``stop`` (a list); ``reasoning_effort`` → ``reasoning_effort`` as is, except
  ``off`` → ``none``. Reasoning blocks are left out (v1 predates them).
* ``tools`` → ``{"type": "function", "function": {name, description?, parameters}}`` (an empty schema
  becomes ``{"type": "object", "properties": {}}``).
* ``system`` → the first message, ``{"role": "system", "content": <text>}``.
* ``user`` → ``{"role": "user", "content": …}``: a single text block is sent as a string, anything else as
  parts — ``{"type": "text"}`` and ``{"type": "image_url", "image_url": {"url": "data:<type>;base64,…"}}``
  (image bytes read and verified through the AttachmentStore).
* ``assistant`` → text as ``content`` (a string for one block, text parts for several, absent when there
  is none) and ``ToolCallBlock`` → ``tool_calls: [{"id", "type": "function", "function": {"name",
  "arguments": <the raw logged string, unchanged>}}]``.
* ``tool`` → ``{"role": "tool", "tool_call_id", "content"}`` with the result's text (one text part → a
  string; several → text parts; none → ``""``). ``is_error`` has no Chat Completions field; the result text
  carries the error. Tool messages cannot carry images, so the images of the tool results in a run of
  consecutive tool messages follow that run as **one** user message: for each result with images, a text
  part ``"Images returned by tool call <id>:"`` then its ``image_url`` parts (the run is kept whole
  because the API wants every tool message right after the assistant message that called it).
* A message with no content (a user message without blocks, an assistant message without text or tool
  calls) is dropped. Images or tool results in an assistant message, or tool calls in a user message, raise
  :class:`~foldline.errors.ProviderError`.

Prefix stability: the message list is append-only on the wire as long as a request never ends in the middle
of a run of tool results whose images are pending (the loop sends only after all results of a step are
logged), so a request whose messages extend the previous one shares the previous body's bytes up to where
its message list closes. OpenAI caches automatically; there are no markers.
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
from .streaming import OpenAIChatStream, StreamAssembler

__all__ = [
    "CHAT_COMPLETIONS_PATH",
    "OPENAI_CHAT_V1",
    "OPENAI_CHAT_V2",
    "OPENAI_CHAT_V3",
    "OPENAI_CHAT_V4",
    "json_schema_format",
    "OpenAIChatSerializer",
    "OpenAIChatV2Serializer",
    "OpenAIChatV3Serializer",
    "OpenAIChatV4Serializer",
    "OpenAIProvider",
    "chat_usage",
    "openai_effort",
    "parse_response",
]

PROVIDER: Final = "openai"
API: Final = "Chat Completions"
CHAT_COMPLETIONS_PATH: Final = "/v1/chat/completions"


def _image_part(ref: ImageRef, attachments: AttachmentStore | None) -> dict[str, Any]:
    data = image_base64(ref, attachments, PROVIDER)
    return {"image_url": {"url": f"data:{ref.media_type};base64,{data}"}, "type": "image_url"}


def _text_content(texts: list[str]) -> str | list[dict[str, Any]]:
    if len(texts) == 1:
        return texts[0]
    return [{"text": t, "type": "text"} for t in texts]


def _joined(texts: list[str], separator: str) -> str:
    """Texts as one string: the non-empty ones joined by ``separator`` (``""`` when none is non-empty)."""
    return separator.join(t for t in texts if t)


def _user(
    message: Message, index: int, attachments: AttachmentStore | None, separator: str | None = None
) -> dict[str, Any] | None:
    """A user message; with ``separator``, one that holds only texts is one string (:func:`_joined`)."""
    parts: list[dict[str, Any]] = []
    for block in message.content:
        match block:
            case TextBlock(text=text):
                parts.append({"text": text, "type": "text"})
            case ImageBlock(image=ref):
                parts.append(_image_part(ref, attachments))
            case ToolCallBlock():
                raise misplaced_block(PROVIDER, API, "tool-call", index, message.role)
            case ToolResultBlock():
                raise misplaced_block(PROVIDER, API, "tool-result", index, message.role)
            case ReasoningBlock() | RedactedReasoningBlock() | EncryptedReasoningBlock():
                pass  # v1 predates reasoning blocks and leaves them out
            case _:
                assert_never(block)
    if not parts:
        return None
    if len(parts) == 1 and parts[0]["type"] == "text":
        return {"content": parts[0]["text"], "role": "user"}
    if separator is not None and all(p["type"] == "text" for p in parts):
        return {"content": _joined([p["text"] for p in parts], separator), "role": "user"}
    return {"content": parts, "role": "user"}


def _assistant(
    message: Message, index: int, reasoning_content: bool = False, separator: str | None = None
) -> dict[str, Any] | None:
    """An assistant message; with ``reasoning_content`` its reasoning texts go back concatenated in that field; with
    ``separator`` its texts are one string (:func:`_joined`) and a message without text says ``"content": null``."""
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    thoughts: list[str] = []
    for block in message.content:
        match block:
            case TextBlock(text=text):
                texts.append(text)
            case ToolCallBlock(id=call_id, name=name, arguments=arguments):
                calls.append({"function": {"arguments": arguments, "name": name}, "id": call_id, "type": "function"})
            case ImageBlock():
                raise misplaced_block(PROVIDER, API, "image", index, message.role)
            case ToolResultBlock():
                raise misplaced_block(PROVIDER, API, "tool-result", index, message.role)
            case ReasoningBlock(text=text):
                thoughts.append(text)
            case RedactedReasoningBlock() | EncryptedReasoningBlock():
                pass  # another provider's opaque state: never sent in a chat message
            case _:
                assert_never(block)
    if not texts and not calls:
        return None
    out: dict[str, Any] = {"role": "assistant"}
    if reasoning_content and thoughts:
        out["reasoning_content"] = "".join(thoughts)
    if separator is not None:
        out["content"] = _joined(texts, separator) if texts else None
    elif texts:
        out["content"] = _text_content(texts)
    if calls:
        out["tool_calls"] = calls
    return out


def _tool(
    message: Message, index: int, attachments: AttachmentStore | None, separator: str | None = None
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The tool messages of ``message`` and the user-message parts carrying their images; with ``separator`` a
    result's texts are one string (:func:`_joined`)."""
    tool_messages: list[dict[str, Any]] = []
    image_parts: list[dict[str, Any]] = []
    for result in tool_results(message, index, PROVIDER, API):
        call_id = result.tool_call_id
        texts: list[str] = []
        images: list[dict[str, Any]] = []
        for part in result.content:
            match part:
                case TextBlock(text=text):
                    texts.append(text)
                case ImageBlock(image=ref):
                    images.append(_image_part(ref, attachments))
                case _:
                    assert_never(part)
        if separator is not None:
            content: str | list[dict[str, Any]] = _joined(texts, separator)
        else:
            content = _text_content(texts) if texts else ""
        tool_messages.append({"content": content, "role": "tool", "tool_call_id": call_id})
        if images:
            image_parts.append({"text": f"Images returned by tool call {call_id}:", "type": "text"})
            image_parts.extend(images)
    return tool_messages, image_parts


def function_tool(spec: ToolSpec, ordered: bool = False) -> dict[str, Any]:
    function: dict[str, Any] = {"name": spec.name, "parameters": tool_schema(spec.input_schema, ordered=ordered)}
    if spec.description:
        function["description"] = spec.description
    return {"function": function, "type": "function"}


class OpenAIChatSerializer(JsonBodySerializer):
    """``openai-chat`` v1: GenerateOptions → exact Chat Completions body bytes.

    Written as frame + one chunk per wire message (:mod:`foldline.providers.json_body`); the system prompt is
    the lead message.
    """

    name: str = "openai-chat"
    version: int = 1
    reasoning_content: ClassVar[bool] = False  # v1 leaves reasoning out; the reasoning-chat serializer sends it
    max_tokens_key: ClassVar[str] = "max_completion_tokens"  # the top-level key of config.maxTokens
    #: None: text-only content as OpenAI documents it (one text a string, several a list of text parts). A string:
    #: every text-only content is one string, its non-empty texts joined by it, and an assistant message without
    #: text says ``"content": null`` (DeepSeek's documented shapes: ``reasoning-chat`` v3, docs/FORMAT.md §9.9).
    text_separator: ClassVar[str | None] = None

    def effort_fields(self, effort: str) -> dict[str, Any]:
        """The top-level keys of a logged reasoning effort."""
        return {"reasoning_effort": openai_effort(effort)}

    def top_level(self, request: GenerateOptions) -> dict[str, Any]:
        config = request.config
        out: dict[str, Any] = {"model": config.model}
        if config.max_tokens is not None:
            out[self.max_tokens_key] = config.max_tokens
        if config.temperature is not None:
            out["temperature"] = config.temperature
        if config.stop:
            out["stop"] = list(config.stop)
        if config.reasoning_effort is not None:
            out.update(self.effort_fields(config.reasoning_effort))
        if request.tools:
            out["tools"] = [function_tool(t, self.ordered_schemas) for t in request.tools]
        return out

    def lead_messages(self, request: GenerateOptions) -> list[dict[str, Any]]:
        return [{"content": request.system, "role": "system"}] if request.system else []

    def wire_messages(
        self, messages: Sequence[Message], start: int, attachments: AttachmentStore | None
    ) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        pending_images: list[dict[str, Any]] = []
        for i, message in enumerate(messages, start):
            if message.role != "tool" and pending_images:
                out.append({"content": pending_images, "role": "user"})
                pending_images = []
            match message.role:
                case "user":
                    item = _user(message, i, attachments, self.text_separator)
                    if item is not None:
                        out.append(item)
                case "assistant":
                    item = _assistant(message, i, self.reasoning_content, self.text_separator)
                    if item is not None:
                        out.append(item)
                case "tool":
                    tool_messages, images = _tool(message, i, attachments, self.text_separator)
                    out.extend(tool_messages)
                    pending_images.extend(images)
                case _:
                    assert_never(message.role)
        if pending_images:
            out.append({"content": pending_images, "role": "user"})
        return out

    def boundary(self, prev: Message, nxt: Message) -> bool:
        """A run of tool messages carries its images to the user message after the run, so it must stay whole."""
        return not (prev.role == "tool" and nxt.role == "tool")


class OpenAIChatV2Serializer(OpenAIChatSerializer):
    """``openai-chat`` v2: v1's bytes, plus ``stream`` and ``stream_options.include_usage`` when the config
    streams (§9.7)."""

    version: int = 2
    stream_fields: ClassVar[Mapping[str, Any] | None] = {"stream": True, "stream_options": {"include_usage": True}}


class OpenAIChatV3Serializer(OpenAIChatV2Serializer):
    """``openai-chat`` v3: v2, with each tool's ``parameters`` in its author's key order (§9.8): the model reads the
    properties in the order they were declared."""

    version: int = 3
    ordered_schemas: ClassVar[bool] = True


class OpenAIChatV4Serializer(OpenAIChatV3Serializer):
    """``openai-chat`` v4: v3, plus structured output (§9.10): a logged ``outputSchema`` is sent as
    ``response_format`` ``{"json_schema": {"name": outputName, "schema": <the schema, in its author's key order>,
    "strict": true}, "type": "json_schema"}``."""

    version: int = 4
    structured_output: ClassVar[bool] = True

    def output_fields(self, out: dict[str, Any], name: str, schema: Mapping[str, Any]) -> None:
        out["response_format"] = {"json_schema": json_schema_format(name, schema), "type": "json_schema"}


def json_schema_format(name: str, schema: Mapping[str, Any]) -> dict[str, Any]:
    """The OpenAI APIs' strict JSON-schema format: name, the schema in its author's key order, ``strict: true``."""
    return {"name": name, "schema": tool_schema(schema, ordered=True), "strict": True}


# Every version stays replayable (foldline.providers.registry registers them); the adapter sends with the last.
OPENAI_CHAT_V1: Final = OpenAIChatSerializer()
OPENAI_CHAT_V2: Final = OpenAIChatV2Serializer()  # v1 + streaming
OPENAI_CHAT_V3: Final = OpenAIChatV3Serializer()  # v2 + author key order
OPENAI_CHAT_V4: Final = OpenAIChatV4Serializer()  # v3 + structured output: what the adapter sends with


# ---------------------------------------------------------------------- responses

_FINISH: Final = {
    "stop": "end_turn",
    "tool_calls": "tool_use",
    "function_call": "tool_use",
    "length": "max_tokens",
    "content_filter": "refusal",
}


def openai_effort(effort: str) -> str:
    """A logged reasoning effort in OpenAI's words: ``off`` is ``none``; the others are OpenAI's own."""
    return "none" if effort == "off" else effort


def chat_usage(u: Any) -> Usage:
    """Chat Completions usage. ``prompt_tokens`` *includes* the cached tokens and the tokens written to the
    cache, so input = prompt - cached - written. Cache reads: ``prompt_tokens_details.cached_tokens`` or, from
    DeepSeek, ``prompt_cache_hit_tokens``; cache writes: ``prompt_tokens_details.cache_write_tokens``; reasoning
    (a part of ``completion_tokens``): ``completion_tokens_details.reasoning_tokens`` (OpenAI and DeepSeek)."""
    prompt = token_count(u["prompt_tokens"])
    details = u.get("prompt_tokens_details") or {}
    cached = token_count(details.get("cached_tokens"))
    if "prompt_cache_hit_tokens" in u:
        cached = token_count(u["prompt_cache_hit_tokens"])
    written = token_count(details.get("cache_write_tokens"))
    if cached + written > prompt:
        raise TypeError(f"cached {cached} + written {written} tokens exceed prompt_tokens {prompt}")
    output = token_count(u.get("completion_tokens"))
    reasoning = part_count(u.get("completion_tokens_details"), "reasoning_tokens", output, "completion_tokens")
    return Usage(prompt - cached - written, output, cached, written, reasoning)


def parse_response(payload: dict[str, Any], provider: str = PROVIDER) -> ProviderResponse:
    """A Chat Completions answer → content blocks, normalized usage and stop reason.

    ``message.reasoning_content`` (DeepSeek, SGLang, vLLM; vLLM >= 0.10 also ``reasoning``) → one
    ReasoningBlock first; ``message.content`` → one TextBlock (a ``refusal`` also becomes text, stop reason
    ``refusal``); ``tool_calls`` → ToolCallBlocks with the raw ``arguments`` string as the model produced it.
    Usage: :func:`chat_usage`.
    """
    with answer_shape(provider, API):
        choice = payload["choices"][0]
        message = choice["message"]
        content: list[ContentBlock] = []
        thought = message.get("reasoning_content", message.get("reasoning"))
        if thought:
            content.append(ReasoningBlock(str(thought)))
        text = message.get("content")
        if text:
            content.append(TextBlock(str(text)))
        refusal = message.get("refusal")
        if refusal:
            content.append(TextBlock(str(refusal)))
        for call in message.get("tool_calls") or ():
            if call.get("type", "function") != "function":
                raise ProviderError(f"{provider}: the answer has a {call.get('type')!r} tool call foldline cannot log")
            function = call["function"]
            content.append(ToolCallBlock(str(call["id"]), str(function["name"]), str(function["arguments"])))
        usage = chat_usage(payload["usage"])
        finish = choice.get("finish_reason")
    stop = "refusal" if refusal else _FINISH.get(str(finish), "other")
    return ProviderResponse(tuple(content), usage, stop)


class OpenAIProvider(OpenAIHttpProvider[OpenAIChatSerializer], name=PROVIDER, path=CHAT_COMPLETIONS_PATH):
    """Posts serialized bodies to ``{base_url}/v1/chat/completions`` over the given httpx transport (``None``:
    the network, with the pool and HTTP/2 of ``settings``). Streamed answers are assembled by
    :class:`~foldline.providers.streaming.OpenAIChatStream`; the request id is the ``x-request-id`` header.

    ``Authorization: Bearer <key>`` is sent only when ``api_key`` is given.
    """

    def default_serializer(self) -> OpenAIChatSerializer:
        return OPENAI_CHAT_V4  # v4: v1, streaming, ordered schemas and structured output

    def parse(self, payload: dict[str, Any]) -> ProviderResponse:
        return parse_response(payload)

    def assembler(self) -> StreamAssembler:
        return OpenAIChatStream()
