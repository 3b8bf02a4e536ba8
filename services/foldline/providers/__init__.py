"""Provider port and adapters: exact wire serialization, sending, and response parsing.

Importing this package registers every serializer version (see :mod:`foldline.providers.registry`). The
adapters (``AnthropicProvider``, ``OpenAIProvider``, ``OpenAIResponsesProvider``, ``ReasoningChatProvider``)
send with the newest version of their family (``AnthropicMessagesV3Serializer``, ...); the earlier versions
stay here so old logs replay. ``emulated_provider`` is an adapter answered by the in-process emulator;
``TransportSettings`` holds the pool, timeouts, retries and concurrency of real ones.
"""

import typing

from . import registry
from .anthropic import (
    AnthropicMessagesSerializer,
    AnthropicMessagesV2Serializer,
    AnthropicMessagesV3Serializer,
    AnthropicProvider,
)
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
from .openai import OpenAIChatSerializer, OpenAIChatV2Serializer, OpenAIProvider
from .openai_responses import OpenAIResponsesProvider, OpenAIResponsesSerializer, OpenAIResponsesV2Serializer
from .reasoning_chat import ReasoningChatProvider, ReasoningChatSerializer, ReasoningChatV2Serializer
from .settings import TransportSettings

if typing.TYPE_CHECKING:
    from .emulated import emulated_provider


def __getattr__(name: str) -> object:
    """``emulated_provider`` is imported on first use: the emulator is not what every importer needs."""
    if name != "emulated_provider":
        raise AttributeError(f"module 'foldline.providers' has no attribute {name!r}")
    from .emulated import emulated_provider

    globals()[name] = emulated_provider
    return emulated_provider


__all__ = [
    "SERIALIZERS",
    "AnthropicMessagesSerializer",
    "AnthropicMessagesV2Serializer",
    "AnthropicMessagesV3Serializer",
    "AnthropicProvider",
    "Body",
    "BodyParts",
    "OpenAIChatSerializer",
    "OpenAIChatV2Serializer",
    "OpenAIProvider",
    "OpenAIResponsesProvider",
    "OpenAIResponsesSerializer",
    "OpenAIResponsesV2Serializer",
    "Provider",
    "ProviderResponse",
    "ReasoningChatProvider",
    "ReasoningChatSerializer",
    "ReasoningChatV2Serializer",
    "Serializer",
    "TransportSettings",
    "emulated_provider",
    "register_serializer",
    "registry",
    "serializer_for",
]
