"""Every serializer version this build can replay, registered in :data:`foldline.providers.base.SERIALIZERS`.

Importing :mod:`foldline.providers` imports this module. A new wire format version is a new serializer
instance registered here next to the old one (old logs keep replaying with the version that wrote them),
plus its golden fixtures under ``tests/fixtures/golden/<name>/v<version>/``.
"""

from __future__ import annotations

from .anthropic import AnthropicMessagesSerializer, AnthropicMessagesV2Serializer
from .base import register_serializer
from .openai import OpenAIChatSerializer
from .openai_responses import OpenAIResponsesSerializer
from .reasoning_chat import ReasoningChatSerializer

__all__ = [
    "ANTHROPIC_MESSAGES_V1",
    "ANTHROPIC_MESSAGES_V2",
    "OPENAI_CHAT_V1",
    "OPENAI_RESPONSES_V1",
    "REASONING_CHAT_V1",
]

ANTHROPIC_MESSAGES_V1 = AnthropicMessagesSerializer()
ANTHROPIC_MESSAGES_V2 = AnthropicMessagesV2Serializer()
OPENAI_CHAT_V1 = OpenAIChatSerializer()
OPENAI_RESPONSES_V1 = OpenAIResponsesSerializer()
REASONING_CHAT_V1 = ReasoningChatSerializer()

for _serializer in (
    ANTHROPIC_MESSAGES_V1,
    ANTHROPIC_MESSAGES_V2,
    OPENAI_CHAT_V1,
    OPENAI_RESPONSES_V1,
    REASONING_CHAT_V1,
):
    register_serializer(_serializer)
