"""Provider port and adapters: exact wire serialization, sending, and response parsing.

Importing this package registers every serializer version (see :mod:`foldline.providers.registry`).
"""

from . import registry
from .anthropic import AnthropicMessagesSerializer, AnthropicProvider
from .base import (
    SERIALIZERS,
    Provider,
    ProviderResponse,
    Serializer,
    register_serializer,
    serializer_for,
)
from .openai import OpenAIChatSerializer, OpenAIProvider

__all__ = [
    "SERIALIZERS",
    "AnthropicMessagesSerializer",
    "AnthropicProvider",
    "OpenAIChatSerializer",
    "OpenAIProvider",
    "Provider",
    "ProviderResponse",
    "Serializer",
    "register_serializer",
    "registry",
    "serializer_for",
]
