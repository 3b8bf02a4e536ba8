"""Chat Completions with ``reasoning_content`` (DeepSeek; vLLM and SGLang serve the same shape): the
``reasoning-chat`` serializer (v1) and :class:`ReasoningChatProvider`.

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

from ._openai_http import bearer_headers
from .base import ProviderResponse
from .http import JsonHttpProvider
from .openai import OpenAIChatSerializer, parse_response
from .settings import TransportSettings
from .streaming import OpenAIChatStream, StreamAssembler

__all__ = [
    "REASONING_CHAT_PATH",
    "REASONING_CHAT_V1",
    "REASONING_CHAT_V2",
    "ReasoningChatProvider",
    "ReasoningChatSerializer",
    "ReasoningChatV2Serializer",
]

PROVIDER: Final = "deepseek"
REASONING_CHAT_PATH: Final = "/chat/completions"


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


# Every version stays replayable (foldline.providers.registry registers them); the adapter sends with the last.
REASONING_CHAT_V1: Final = ReasoningChatSerializer()
REASONING_CHAT_V2: Final = ReasoningChatV2Serializer()  # v1 + streaming: what the adapter sends with


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
        serializer: ReasoningChatSerializer | None = None,  # default: v2 (v1 and streaming)
        timeout: float | httpx.Timeout | None = None,
        settings: TransportSettings | None = None,
        name: str | None = None,  # another server of this dialect: the provider name its CallConfig gives
    ) -> None:
        self.serializer = serializer or REASONING_CHAT_V2
        headers = bearer_headers(api_key)
        super().__init__(transport, api_key, base_url, headers=headers, timeout=timeout, settings=settings, name=name)

    def parse(self, payload: dict[str, Any]) -> ProviderResponse:
        return parse_response(payload, PROVIDER)

    def assembler(self) -> StreamAssembler:
        return OpenAIChatStream(PROVIDER)
