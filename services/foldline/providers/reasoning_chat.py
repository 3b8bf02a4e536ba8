"""Chat Completions with ``reasoning_content`` (DeepSeek; vLLM and SGLang serve the same shape): the
``reasoning-chat`` serializers (v1 to v4) and :class:`ReasoningChatProvider`.

v2 adds streaming (docs/FORMAT.md §9.7). v3, the provider's default, follows DeepSeek's documented request schema
where v1 departs from it (§9.9): tool schemas in their author's key order; every text-only content is one string
(DeepSeek documents ``content`` as a string), its texts joined by :data:`TEXT_SEPARATOR`; an assistant message with
only tool calls carries ``"content": null`` (required, nullable); and a logged effort always sends the thinking
switch, ``thinking: {"type": "enabled"}`` beside ``reasoning_effort``, so a server whose default differs still
thinks as logged.

Serializer v1 is ``openai-chat`` v1 (docs/FORMAT.md §9.3) with these differences (§9.5):

* every assistant message that has text or tool calls carries ``reasoning_content``: the texts of its
  ``reasoning`` blocks concatenated in order, present when it has at least one. DeepSeek's thinking-mode guide
  says reasoning of a turn without tool calls is ignored when passed back and reasoning of a turn with tool
  calls must be passed back in every later request, so passing back all of it is always right and keeps each
  body an append-extension of the one before; redacted and encrypted reasoning (other providers' state) is
  left out;
* ``maxTokens`` → ``max_tokens`` (DeepSeek's name; vLLM and SGLang take it too);
* ``reasoningEffort`` ``off`` → ``thinking: {"type": "disabled"}`` (DeepSeek's switch); any other effort →
  ``reasoning_effort`` as logged (DeepSeek maps minimal/low → low, medium/high/xhigh → high, max → max).

Answers: ``reasoning_content`` → a ReasoningBlock before the text; usage ``prompt_cache_hit_tokens`` →
cache read (``prompt_cache_miss_tokens`` is the uncached input), or vLLM's ``prompt_tokens_details``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar, Final

import httpx

from ..core.codec import canonical_json
from ..core.request import GenerateOptions
from ._openai_http import bearer_headers
from .base import ProviderResponse
from .encoding import tool_schema
from .http import JsonHttpProvider
from .openai import OpenAIChatSerializer, parse_response
from .settings import TransportSettings
from .streaming import OpenAIChatStream, StreamAssembler

__all__ = [
    "REASONING_CHAT_PATH",
    "REASONING_CHAT_V1",
    "REASONING_CHAT_V2",
    "REASONING_CHAT_V3",
    "REASONING_CHAT_V4",
    "TEXT_SEPARATOR",
    "ReasoningChatProvider",
    "ReasoningChatSerializer",
    "ReasoningChatV2Serializer",
    "ReasoningChatV3Serializer",
    "ReasoningChatV4Serializer",
]

PROVIDER: Final = "deepseek"
REASONING_CHAT_PATH: Final = "/chat/completions"
#: What separates the texts of one message when ``reasoning-chat`` v3 sends them as one string: a blank line, so
#: two blocks never run together and each stays a paragraph of its own (docs/FORMAT.md §9.9).
TEXT_SEPARATOR: Final = "\n\n"


class ReasoningChatSerializer(OpenAIChatSerializer):
    """``reasoning-chat`` v1: ``openai-chat`` v1 plus ``reasoning_content`` pass-back and DeepSeek's knobs."""

    name: str = "reasoning-chat"
    version: int = 1
    reasoning_content: ClassVar[bool] = True
    max_tokens_key: ClassVar[str] = "max_tokens"

    def effort_fields(self, effort: str) -> dict[str, Any]:
        """DeepSeek's switch for ``off``; any other effort as logged."""
        return {"thinking": {"type": "disabled"}} if effort == "off" else {"reasoning_effort": effort}


class ReasoningChatV2Serializer(ReasoningChatSerializer):
    """``reasoning-chat`` v2: v1's bytes, plus ``stream`` and ``stream_options.include_usage`` when the config
    streams (§9.7)."""

    version: int = 2
    stream_fields: ClassVar[Mapping[str, Any] | None] = {"stream": True, "stream_options": {"include_usage": True}}


class ReasoningChatV3Serializer(ReasoningChatV2Serializer):
    """``reasoning-chat`` v3: v2 in DeepSeek's documented request schema (§9.9).

    * tool schemas in their author's key order (§9.8);
    * ``content`` of a user, assistant or tool message that holds only texts: one string, the non-empty texts
      joined by :data:`TEXT_SEPARATOR` (DeepSeek's chat completion reference types every message's ``content``
      as a string; joining here keeps what the model reads under foldline's rule instead of a server's);
    * an assistant message with tool calls and no text: ``"content": null`` (the reference lists the assistant
      ``content`` as required and nullable);
    * ``reasoningEffort`` other than ``off``: ``thinking: {"type": "enabled"}`` and ``reasoning_effort`` (DeepSeek's
      thinking-mode switch and its effort; v1 left the switch to the server's default).
    """

    version: int = 3
    ordered_schemas: ClassVar[bool] = True
    text_separator: ClassVar[str | None] = TEXT_SEPARATOR

    def effort_fields(self, effort: str) -> dict[str, Any]:
        """The thinking switch, always explicit; the effort as logged beside it."""
        if effort == "off":
            return {"thinking": {"type": "disabled"}}
        return {"reasoning_effort": effort, "thinking": {"type": "enabled"}}


#: What ``reasoning-chat`` v4 tells the model of a logged output schema (DeepSeek's JSON mode takes no schema, and
#: asks for the word "json" and the wanted shape in the prompt): this line, then the schema's compact JSON.
OUTPUT_INSTRUCTION: Final = "Answer with one JSON object that matches this JSON Schema ({name}):\n"


class ReasoningChatV4Serializer(ReasoningChatV3Serializer):
    """``reasoning-chat`` v4: v3, plus structured output in DeepSeek's JSON mode (§9.10).

    A logged ``outputSchema`` is sent as ``response_format: {"type": "json_object"}`` (the API's only structured
    mode: valid JSON, no schema), and the schema is told to the model in the system message: its text is the
    logged system prompt, :data:`TEXT_SEPARATOR`, then :data:`OUTPUT_INSTRUCTION` with ``outputName`` followed by
    the schema's JSON (compact, in its author's key order) — or that instruction alone when no system prompt is
    logged.
    """

    version: int = 4
    structured_output: ClassVar[bool] = True

    def output_fields(self, out: dict[str, Any], name: str, schema: Mapping[str, Any]) -> None:
        out["response_format"] = {"type": "json_object"}

    def lead_messages(self, request: GenerateOptions) -> list[dict[str, Any]]:
        config = request.config
        if config.output_schema is None or config.output_name is None:
            return super().lead_messages(request)
        schema = canonical_json(tool_schema(config.output_schema, ordered=True)).decode("utf-8")
        instruction = OUTPUT_INSTRUCTION.format(name=config.output_name) + schema
        text = f"{request.system}{TEXT_SEPARATOR}{instruction}" if request.system else instruction
        return [{"content": text, "role": "system"}]


# Every version stays replayable (foldline.providers.registry registers them); the adapter sends with the last.
REASONING_CHAT_V1: Final = ReasoningChatSerializer()
REASONING_CHAT_V2: Final = ReasoningChatV2Serializer()  # v1 + streaming
REASONING_CHAT_V3: Final = ReasoningChatV3Serializer()  # v2 in DeepSeek's documented schema
REASONING_CHAT_V4: Final = ReasoningChatV4Serializer()  # v3 + JSON mode: what the adapter sends with


class ReasoningChatProvider(JsonHttpProvider, name=PROVIDER, path=REASONING_CHAT_PATH):
    """Posts to ``{base_url}/chat/completions`` (DeepSeek's path; give ``base_url=".../v1"`` for vLLM or SGLang).

    Streamed answers are chat chunks whose deltas carry ``reasoning_content`` beside ``content``
    (:class:`~foldline.providers.streaming.OpenAIChatStream`). ``Authorization: Bearer <key>`` is sent only when
    ``api_key`` is given.
    """

    request_id_headers = ("x-request-id", "request-id", "x-ds-trace-id")

    def __init__(
        self,
        transport: httpx.AsyncBaseTransport | None = None,
        api_key: str | None = None,
        base_url: str = "https://api.deepseek.com",
        *,
        serializer: ReasoningChatSerializer | None = None,  # default: v4 (DeepSeek's schema, streaming, JSON mode)
        timeout: float | httpx.Timeout | None = None,
        settings: TransportSettings | None = None,
        name: str | None = None,  # another server of this dialect: the provider name its CallConfig gives
    ) -> None:
        self.serializer = serializer or REASONING_CHAT_V4
        headers = bearer_headers(api_key)
        super().__init__(transport, api_key, base_url, headers=headers, timeout=timeout, settings=settings, name=name)

    def parse(self, payload: dict[str, Any]) -> ProviderResponse:
        return parse_response(payload, PROVIDER)

    def assembler(self) -> StreamAssembler:
        return OpenAIChatStream(PROVIDER)
