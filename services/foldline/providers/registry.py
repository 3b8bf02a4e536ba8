"""Every serializer version this build can replay, registered in :data:`foldline.providers.base.SERIALIZERS`.

Importing :mod:`foldline.providers` imports this module. A new wire format version is a new serializer
instance registered here next to the old one (old logs keep replaying with the version that wrote them),
plus its golden fixtures under ``tests/fixtures/golden/<name>/v<version>/``.
"""

from __future__ import annotations

from .anthropic import AnthropicMessagesSerializer
from .base import register_serializer
from .openai import OpenAIChatSerializer

__all__ = ["ANTHROPIC_MESSAGES_V1", "OPENAI_CHAT_V1"]

ANTHROPIC_MESSAGES_V1 = AnthropicMessagesSerializer()
OPENAI_CHAT_V1 = OpenAIChatSerializer()

register_serializer(ANTHROPIC_MESSAGES_V1)
register_serializer(OPENAI_CHAT_V1)
