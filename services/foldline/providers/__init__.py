"""Provider port and adapters: exact wire serialization, sending, and response parsing.

Importing this package registers every serializer version (see :mod:`foldline.providers.registry`).
"""

from . import registry
from .anthropic import AnthropicMessagesSerializer, AnthropicMessagesV2Serializer, AnthropicProvider
from .base import (
    SERIALIZERS,
    Body,
    BodyParts,
    Provider,
    ProviderResponse,
    Serializer,
    register_serializer,
    serializer_for,
)
from .openai import OpenAIChatSerializer, OpenAIProvider
from .openai_responses import OpenAIResponsesProvider, OpenAIResponsesSerializer
from .reasoning_chat import ReasoningChatProvider, ReasoningChatSerializer

__all__ = [
    "SERIALIZERS",
    "AnthropicMessagesSerializer",
    "AnthropicMessagesV2Serializer",
    "AnthropicProvider",
    "Body",
    "BodyParts",
    "OpenAIChatSerializer",
    "OpenAIProvider",
    "OpenAIResponsesProvider",
    "OpenAIResponsesSerializer",
    "Provider",
    "ProviderResponse",
    "ReasoningChatProvider",
    "ReasoningChatSerializer",
    "Serializer",
    "register_serializer",
    "registry",
    "serializer_for",
]
