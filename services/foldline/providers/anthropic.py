"""Anthropic Messages adapter: the ``anthropic-messages`` serializers (v1 to v5) and :class:`AnthropicProvider`.

docs/FORMAT.md §9 specifies each byte for byte; v2 is v1 plus reasoning pass-back, thinking and effort and the
logged cache TTL (:class:`AnthropicMessagesV2Serializer`), v3 adds streaming, v4 sends the tool schemas and the
tool-call inputs in their author's key order (:class:`AnthropicMessagesV4Serializer`), and v5 (the provider's
default) adds structured output (:class:`AnthropicMessagesV5Serializer`).

Wire mapping of serializer v1 (``POST /v1/messages``; canonical JSON, so object keys are sorted — the
prompt order the API caches on is tools → system → messages whatever the key order):

* ``config.model`` → ``model``; ``config.max_tokens`` → ``max_tokens`` (the API requires it; absent means
  :data:`DEFAULT_MAX_TOKENS` = 1024); ``stop`` → ``stop_sequences``.
* ``temperature`` is sent only when set (the API takes 0..1; a higher value raises
  :class:`~foldline.errors.ProviderError`). The ``anthropic`` SDK's request types no longer declare it (SDK users
  send it via ``extra_body``); models before Claude Opus 4.7 take it, later ones refuse it, and no model takes
  one other than 1 while thinking — :mod:`foldline.providers.model_rules` holds the rules and the loop refuses
  such a config when an agent is built (:class:`~foldline.errors.UnsupportedSetting`), so the bytes stay as
  specified and no refused request is ever logged.
* ``config.reasoning_effort`` is **not sent** by v1, and v1 leaves every reasoning block out (it predates
  them); v2 sends both. The value stays in the logged header, so a change still shows up as a header change.
* ``system`` → one text block; ``tools`` → ``{name, description?, input_schema}`` (an empty schema becomes
  ``{"type": "object", "properties": {}}``; an empty description is omitted).
* Messages: ``user`` → role user; ``assistant`` → role assistant; our ``tool`` messages become
  ``tool_result`` blocks in a user message. Consecutive messages of the same wire role merge into one wire
  message (consecutive tool results, and a user message after tool results), so roles alternate.
  ``TextBlock`` → ``text`` (an empty text is dropped: the API rejects empty text blocks; a message left
  with no blocks is dropped); ``ImageBlock`` → ``image`` with a base64 source read and verified through the
  AttachmentStore; ``ToolCallBlock`` → ``tool_use`` whose ``input`` is the parsed raw arguments (they must
  be a JSON object text, else ProviderError); ``ToolResultBlock`` → ``tool_result {tool_use_id, content?,
  is_error?}`` (``is_error`` only when true; no ``content`` when the result has no parts). A tool call in a
  user message, or an image or tool result in an assistant message, raises ProviderError.

Prompt caching — three breakpoints, all byte-stable while the header is unchanged:

1. ``cache_control`` on the last tool (caches the tool prefix: survives a system prompt change);
2. ``cache_control`` on the system block (caches tools + system);
3. the top-level ``cache_control`` (Anthropic's automatic caching): the API places the breakpoint on the
   last cacheable block and moves it forward as the conversation grows, with the documented 20-block
   lookback for reads.

No marker sits inside the message list, so a request whose messages extend the previous request's shares
the previous body's bytes up to where its message list closes (``…]`` then ``,"model"…``): the messages
of the earlier body are a byte prefix of the later body's message list. The one exception is the merge of
wire messages: when the previous request *ended* with a user (or tool-result) message and the next one
appends another user-side message directly after it (no assistant answer in between, e.g. after a failed
call), the two merge and the shared prefix ends inside that last wire message's content list. The loop's
normal flow (every request ends on the user side and is answered before anything is appended) never hits it.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any, ClassVar, Final, Literal, TypeVar, assert_never

import httpx

from ..core.codec import canonical_json
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
)
from ..core.header import CallConfig, ToolSpec
from ..core.projection import Message
from ..core.request import GenerateOptions
from ..errors import ProviderError
from ..ports.attachments import AttachmentStore
from ._answer_parsing import answer_shape, messages_usage
from .base import STOP_REASONS, ProviderResponse
from .encoding import image_base64, misplaced_block, tool_input, tool_schema
from .http import JsonHttpProvider
from .json_body import JsonBodySerializer
from .settings import TransportSettings
from .streaming import AnthropicMessagesStream, StreamAssembler

__all__ = [
    "ANTHROPIC_EFFORTS",
    "ANTHROPIC_MESSAGES_V1",
    "ANTHROPIC_MESSAGES_V2",
    "ANTHROPIC_MESSAGES_V3",
    "ANTHROPIC_MESSAGES_V4",
    "ANTHROPIC_MESSAGES_V5",
    "ANTHROPIC_VERSION",
    "DEFAULT_MAX_TOKENS",
    "MESSAGES_PATH",
    "AnthropicMessagesSerializer",
    "AnthropicMessagesV2Serializer",
    "AnthropicMessagesV3Serializer",
    "AnthropicMessagesV4Serializer",
    "AnthropicMessagesV5Serializer",
    "AnthropicProvider",
    "parse_response",
]

PROVIDER: Final = "anthropic"
API: Final = "Messages API"
MESSAGES_PATH: Final = "/v1/messages"
ANTHROPIC_VERSION: Final = "2023-06-01"
DEFAULT_MAX_TOKENS: Final = 1024  # serializer v1 only; v2 requires config.maxTokens
#: ``output_config.effort`` values the Messages API documents (anthropic SDK ``OutputConfigParam``).
ANTHROPIC_EFFORTS: Final = frozenset({"low", "medium", "high", "xhigh", "max"})
_EPHEMERAL: Final = {"type": "ephemeral"}

WireRole = Literal["user", "assistant"]
T = TypeVar("T")


def _wire_role(message: Message) -> WireRole:
    return "assistant" if message.role == "assistant" else "user"


def _image(ref: ImageRef, attachments: AttachmentStore | None) -> dict[str, Any]:
    data = image_base64(ref, attachments, PROVIDER)
    return {"source": {"data": data, "media_type": ref.media_type, "type": "base64"}, "type": "image"}


def _sent(block: ContentBlock, reasoning: bool) -> bool:
    """Whether ``block`` appears on the wire at all (before role checks): empty texts and, in v1 or without a
    signature, reasoning blocks are left out."""
    match block:
        case TextBlock(text=text):
            return bool(text)
        case ImageBlock() | ToolCallBlock() | ToolResultBlock():
            return True
        case ReasoningBlock(signature=signature):
            return reasoning and signature is not None
        case RedactedReasoningBlock():
            return reasoning
        case EncryptedReasoningBlock():
            return False
        case _:
            assert_never(block)


def _block(
    block: ContentBlock,
    index: int,
    role: str,
    attachments: AttachmentStore | None,
    reasoning: bool,
    ordered: bool = False,
) -> dict[str, Any] | None:
    """One content block as a plain JSON dict, or None when it is dropped (see :func:`_sent`); ``ordered``: a tool
    call's ``input`` keeps the key order of its arguments."""
    match block:
        case TextBlock(text=text):
            return {"text": text, "type": "text"} if text else None
        case ImageBlock(image=ref):
            if role == "assistant":
                raise misplaced_block(PROVIDER, f"the {API}", "image", index, role)
            return _image(ref, attachments)
        case ToolCallBlock(id=call_id, name=name, arguments=arguments):
            if role != "assistant":
                raise misplaced_block(PROVIDER, f"the {API}", "tool-call", index, role)
            arguments_object = tool_input(arguments, call_id, PROVIDER, ordered=ordered)
            return {"id": call_id, "input": arguments_object, "name": name, "type": "tool_use"}
        case ToolResultBlock(tool_call_id=call_id, content=parts, is_error=is_error):
            if role == "assistant":
                raise misplaced_block(PROVIDER, f"the {API}", "tool-result", index, role)
            out: dict[str, Any] = {"tool_use_id": call_id, "type": "tool_result"}
            items: list[dict[str, Any]] = []
            for part in parts:
                match part:
                    case TextBlock(text=text):
                        if text:
                            items.append({"text": text, "type": "text"})
                    case ImageBlock(image=ref):
                        items.append(_image(ref, attachments))
                    case _:
                        assert_never(part)
            if items:
                out["content"] = items
            if is_error:
                out["is_error"] = True
            return out
        case ReasoningBlock() | RedactedReasoningBlock() | EncryptedReasoningBlock():
            if not reasoning:
                return None
            if role != "assistant":
                raise misplaced_block(PROVIDER, f"the {API}", block.kind, index, role)
            if isinstance(block, ReasoningBlock):
                if block.signature is None:
                    return None
                return {"signature": block.signature, "thinking": block.text, "type": "thinking"}
            if isinstance(block, RedactedReasoningBlock):
                return {"data": block.data, "type": "redacted_thinking"}
            return None
        case _:
            assert_never(block)


def _tool(spec: ToolSpec, last: bool, marker: dict[str, str], ordered: bool) -> dict[str, Any]:
    out: dict[str, Any] = {"input_schema": tool_schema(spec.input_schema, ordered=ordered), "name": spec.name}
    if spec.description:
        out["description"] = spec.description
    if last:
        out["cache_control"] = marker
    return out


def _merge(items: Iterator[tuple[WireRole, T]]) -> Iterator[tuple[WireRole, list[T]]]:
    """Runs of consecutive items with the same wire role (callers drop empty messages first)."""
    role: WireRole | None = None
    run: list[T] = []
    for r, item in items:
        if r != role and run:
            assert role is not None
            yield role, run
            run = []
        role = r
        run.append(item)
    if run:
        assert role is not None
        yield role, run


def _temperature(config: CallConfig) -> float | None:
    if config.temperature is not None and config.temperature > 1.0:
        raise ProviderError(
            f"{PROVIDER}: temperature {config.temperature} is outside the Messages API range 0..1; "
            "change config.temperature (a header change)"
        )
    return config.temperature


class AnthropicMessagesSerializer(JsonBodySerializer):
    """``anthropic-messages`` v1: GenerateOptions → exact Messages API body bytes.

    Written as frame + one chunk per wire message (:mod:`foldline.providers.json_body`), so
    :class:`~foldline.providers.framing.IncrementalBody` can reuse the chunks of a session's earlier messages.
    v1 predates reasoning blocks: it leaves every one of them out.
    """

    name: str = "anthropic-messages"
    version: int = 1
    reasoning: ClassVar[bool] = False  # whether thinking blocks are passed back

    def _message_blocks(
        self, message: Message, index: int, attachments: AttachmentStore | None
    ) -> list[dict[str, Any]]:
        out = []
        for block in message.content:
            item = _block(block, index, message.role, attachments, self.reasoning, self.ordered_schemas)
            if item is not None:
                out.append(item)
        return out

    def wire_messages(
        self, messages: Sequence[Message], start: int, attachments: AttachmentStore | None
    ) -> list[dict[str, Any]]:
        items = ((_wire_role(m), self._message_blocks(m, start + i, attachments)) for i, m in enumerate(messages))
        runs = _merge((role, blocks) for role, blocks in items if blocks)
        return [{"content": [b for blocks in run for b in blocks], "role": role} for role, run in runs]

    def _visible(self, message: Message) -> bool:
        """False when every block of the message is dropped on the wire."""
        return any(_sent(b, self.reasoning) for b in message.content)

    def boundary(self, prev: Message, nxt: Message) -> bool:
        """Consecutive messages of one wire role merge, and an empty message is dropped from between them."""
        return _wire_role(prev) != _wire_role(nxt) and self._visible(prev) and self._visible(nxt)

    def _max_tokens(self, config: CallConfig) -> int:
        return config.max_tokens if config.max_tokens is not None else DEFAULT_MAX_TOKENS

    def _marker(self, config: CallConfig) -> dict[str, str]:
        """The ``cache_control`` value of every breakpoint."""
        return _EPHEMERAL

    def top_level(self, request: GenerateOptions) -> dict[str, Any]:
        config = request.config
        max_tokens = self._max_tokens(config)
        marker = self._marker(config)
        out: dict[str, Any] = {"cache_control": marker, "max_tokens": max_tokens, "model": config.model}
        temperature = _temperature(config)
        if temperature is not None:
            out["temperature"] = temperature
        if config.stop:
            out["stop_sequences"] = list(config.stop)
        if request.system:
            out["system"] = [{"cache_control": marker, "text": request.system, "type": "text"}]
        if request.tools:
            last = len(request.tools) - 1
            out["tools"] = [_tool(t, i == last, marker, self.ordered_schemas) for i, t in enumerate(request.tools)]
        return out


class AnthropicMessagesV2Serializer(AnthropicMessagesSerializer):
    """``anthropic-messages`` v2: v1's message mapping plus reasoning, thinking and effort, and the logged cache TTL.

    * every signed ``reasoning`` block → ``thinking {signature, thinking}`` and every ``redacted-reasoning`` →
      ``redacted_thinking {data}``, unmodified and in their place in the assistant message, in every assistant
      message of the request (the API keeps or strips earlier turns' thinking itself); an unsigned reasoning block
      and an ``encrypted-reasoning`` block (another provider's state) are left out;
    * ``config.maxTokens`` is required (no default): it caps thinking plus text;
    * ``thinking``: ``{"budget_tokens": thinkingBudget, "type": "enabled"}`` when ``thinkingBudget`` is set (it must
      be below ``maxTokens``); else ``{"type": "disabled"}`` for ``reasoningEffort`` ``off``; else
      ``{"type": "adaptive"}`` when ``reasoningEffort`` is set; else absent (the model's default);
    * ``output_config``: ``{"effort": reasoningEffort}`` for ``low`` | ``medium`` | ``high`` | ``xhigh`` | ``max``;
      absent for ``off`` or no effort; ``minimal`` is refused (the API has no such level);
    * every ``cache_control`` marker carries ``"ttl": cacheTtl`` when ``cacheTtl`` is logged (``5m`` | ``1h``;
      ``24h`` is refused).
    """

    version: int = 2
    reasoning: ClassVar[bool] = True

    def _max_tokens(self, config: CallConfig) -> int:
        if config.max_tokens is None:
            raise ProviderError(
                f"{PROVIDER}: anthropic-messages v2 needs config.maxTokens (the API requires max_tokens, which caps "
                "thinking plus text); set it in the request header"
            )
        return config.max_tokens

    def _marker(self, config: CallConfig) -> dict[str, str]:
        if config.cache_ttl is None:
            return _EPHEMERAL
        if config.cache_ttl not in ("5m", "1h"):
            raise ProviderError(f"{PROVIDER}: cacheTtl {config.cache_ttl!r} is not a Messages API cache TTL (5m or 1h)")
        return {**_EPHEMERAL, "ttl": config.cache_ttl}

    def top_level(self, request: GenerateOptions) -> dict[str, Any]:
        out = super().top_level(request)
        config = request.config
        max_tokens = out["max_tokens"]
        effort = config.reasoning_effort
        if config.thinking_budget is not None:
            if effort == "off":
                raise ProviderError(f"{PROVIDER}: thinkingBudget is set but reasoningEffort is 'off'; drop one")
            if config.thinking_budget >= max_tokens:
                raise ProviderError(
                    f"{PROVIDER}: thinkingBudget {config.thinking_budget} must be below maxTokens {max_tokens}"
                )
            out["thinking"] = {"budget_tokens": config.thinking_budget, "type": "enabled"}
        elif effort == "off":
            out["thinking"] = {"type": "disabled"}
        elif effort is not None:
            out["thinking"] = {"type": "adaptive"}
        if effort is not None and effort != "off":
            if effort not in ANTHROPIC_EFFORTS:
                raise ProviderError(
                    f"{PROVIDER}: reasoningEffort {effort!r} has no Messages API equivalent "
                    f"(output_config.effort takes {', '.join(sorted(ANTHROPIC_EFFORTS))}, or 'off' for no thinking)"
                )
            out["output_config"] = {"effort": effort}
        return out


class AnthropicMessagesV3Serializer(AnthropicMessagesV2Serializer):
    """``anthropic-messages`` v3: v2's bytes, plus ``"stream":true`` when the logged config streams (§9.7)."""

    version: int = 3
    stream_fields: ClassVar[Mapping[str, Any] | None] = {"stream": True}


class AnthropicMessagesV4Serializer(AnthropicMessagesV3Serializer):
    """``anthropic-messages`` v4: v3, with each tool's ``input_schema`` in its author's key order and each tool call's
    ``input`` in the key order of its logged arguments (§9.8): the model reads a schema's properties, and its own
    earlier calls, in the order they were written."""

    version: int = 4
    ordered_schemas: ClassVar[bool] = True


class AnthropicMessagesV5Serializer(AnthropicMessagesV4Serializer):
    """``anthropic-messages`` v5: v4, plus structured output (§9.10): a logged ``outputSchema`` is sent as
    ``output_config.format`` ``{"schema": <the schema, in its author's key order>, "type": "json_schema"}``, beside
    ``output_config.effort`` when an effort is logged (the Messages API's structured outputs; it takes no name)."""

    version: int = 5
    structured_output: ClassVar[bool] = True

    def output_fields(self, out: dict[str, Any], name: str, schema: Mapping[str, Any]) -> None:
        fmt = {"schema": tool_schema(schema, ordered=True), "type": "json_schema"}
        out["output_config"] = {**out.get("output_config", {}), "format": fmt}


# Every version stays replayable (foldline.providers.registry registers them); the adapter sends with the last.
ANTHROPIC_MESSAGES_V1: Final = AnthropicMessagesSerializer()
ANTHROPIC_MESSAGES_V2: Final = AnthropicMessagesV2Serializer()
ANTHROPIC_MESSAGES_V3: Final = AnthropicMessagesV3Serializer()  # v2 + streaming
ANTHROPIC_MESSAGES_V4: Final = AnthropicMessagesV4Serializer()  # v3 + author key order
ANTHROPIC_MESSAGES_V5: Final = AnthropicMessagesV5Serializer()  # v4 + structured output: what the adapter sends with


# ---------------------------------------------------------------------- responses


def parse_response(payload: dict[str, Any]) -> ProviderResponse:
    """A Messages API answer → content blocks, normalized usage and stop reason.

    ``text`` → TextBlock; ``tool_use`` → ToolCallBlock whose arguments are the compact canonical JSON of
    ``input``; ``thinking`` → ReasoningBlock(thinking, signature); ``redacted_thinking`` →
    RedactedReasoningBlock(data) — kept byte for byte, in order; any other block type raises ProviderError.
    Usage: ``input_tokens`` is already the uncached input; ``cache_creation.ephemeral_1h_input_tokens``, when the
    answer breaks its cache writes down by TTL, is the part of ``cache_creation_input_tokens`` written for an hour.
    """
    with answer_shape(PROVIDER, API):
        content: list[ContentBlock] = []
        for item in payload["content"]:
            kind = item["type"]
            if kind == "text":
                content.append(TextBlock(str(item["text"])))
            elif kind == "tool_use":
                arguments = canonical_json(item["input"]).decode("utf-8")
                content.append(ToolCallBlock(str(item["id"]), str(item["name"]), arguments))
            elif kind == "thinking":
                signature = item.get("signature")
                content.append(ReasoningBlock(str(item["thinking"]), None if signature is None else str(signature)))
            elif kind == "redacted_thinking":
                content.append(RedactedReasoningBlock(str(item["data"])))
            else:
                raise ProviderError(f"{PROVIDER}: the answer has a {kind!r} content block foldline cannot log")
        usage = messages_usage(payload["usage"])
        stop = payload.get("stop_reason")
    return ProviderResponse(tuple(content), usage, stop if stop in STOP_REASONS else "other")


class AnthropicProvider(JsonHttpProvider, name=PROVIDER, path=MESSAGES_PATH):
    """Posts serialized bodies to ``{base_url}/v1/messages`` (``base_url`` may end in ``/v1`` or not:
    :func:`~foldline.providers.http.post_url`) over the given httpx transport (``None``: the network, with the
    pool and HTTP/2 of ``settings``). ``name``: the provider name of another server of the Messages API
    (a gateway), as its CallConfig gives it; default ``anthropic``. Streamed answers are assembled by
    :class:`~foldline.providers.streaming.AnthropicMessagesStream`; the request id is the ``request-id`` header.

    ``x-api-key`` is sent only when ``api_key`` is given (the emulator needs none).
    """

    request_id_headers = ("request-id", "x-request-id")

    def __init__(
        self,
        transport: httpx.AsyncBaseTransport | None = None,
        api_key: str | None = None,
        base_url: str = "https://api.anthropic.com",
        *,
        anthropic_version: str = ANTHROPIC_VERSION,
        serializer: AnthropicMessagesSerializer
        | None = None,  # default: ANTHROPIC_MESSAGES_V5 (v4 + structured output)
        timeout: float | httpx.Timeout | None = None,
        settings: TransportSettings | None = None,
        name: str | None = None,  # another server of this API: the provider name its CallConfig gives
    ) -> None:
        self.serializer = serializer or ANTHROPIC_MESSAGES_V5
        headers = {"anthropic-version": anthropic_version}
        if api_key:
            headers["x-api-key"] = api_key
        super().__init__(transport, api_key, base_url, headers=headers, timeout=timeout, settings=settings, name=name)

    def parse(self, payload: dict[str, Any]) -> ProviderResponse:
        return parse_response(payload)

    def assembler(self) -> StreamAssembler:
        return AnthropicMessagesStream()
