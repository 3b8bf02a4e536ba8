"""Every serializer version this build can replay, registered in :data:`foldline.providers.base.SERIALIZERS`.

Importing :mod:`foldline.providers` imports this module. A new wire format version is a new serializer
instance registered here next to the old one (old logs keep replaying with the version that wrote them),
plus its golden fixtures under ``tests/fixtures/golden/<name>/v<version>/``.
"""

from __future__ import annotations

from .anthropic import AnthropicMessagesSerializer, AnthropicMessagesV2Serializer, AnthropicMessagesV3Serializer
from .base import register_serializer
from .openai import OpenAIChatSerializer, OpenAIChatV2Serializer
from .openai_responses import OpenAIResponsesSerializer, OpenAIResponsesV2Serializer
from .reasoning_chat import ReasoningChatSerializer, ReasoningChatV2Serializer

__all__ = [
    "ANTHROPIC_MESSAGES_V1",
    "ANTHROPIC_MESSAGES_V2",
    "ANTHROPIC_MESSAGES_V3",
    "OPENAI_CHAT_V1",
    "OPENAI_CHAT_V2",
    "OPENAI_RESPONSES_V1",
    "OPENAI_RESPONSES_V2",
    "REASONING_CHAT_V1",
    "REASONING_CHAT_V2",
]

ANTHROPIC_MESSAGES_V1 = AnthropicMessagesSerializer()
ANTHROPIC_MESSAGES_V2 = AnthropicMessagesV2Serializer()
ANTHROPIC_MESSAGES_V3 = AnthropicMessagesV3Serializer()  # v2 + streaming: what the adapter sends with
OPENAI_CHAT_V1 = OpenAIChatSerializer()
OPENAI_CHAT_V2 = OpenAIChatV2Serializer()  # v1 + streaming: what the adapter sends with
OPENAI_RESPONSES_V1 = OpenAIResponsesSerializer()
OPENAI_RESPONSES_V2 = OpenAIResponsesV2Serializer()  # v1 + streaming: what the adapter sends with
REASONING_CHAT_V1 = ReasoningChatSerializer()
REASONING_CHAT_V2 = ReasoningChatV2Serializer()  # v1 + streaming: what the adapter sends with

for _serializer in (
    ANTHROPIC_MESSAGES_V1,
    ANTHROPIC_MESSAGES_V2,
    ANTHROPIC_MESSAGES_V3,
    OPENAI_CHAT_V1,
    OPENAI_CHAT_V2,
    OPENAI_RESPONSES_V1,
    OPENAI_RESPONSES_V2,
    REASONING_CHAT_V1,
    REASONING_CHAT_V2,
):
    register_serializer(_serializer)
