"""Providers wired to the in-process emulator: the real adapter (serializer + HTTP code) minus the network.

This is what the embedded default (``foldline demo``, the quickstart, the loop tests) uses: the digests the loop
records are of the real wire bytes an adapter would send to Anthropic or OpenAI.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

from .anthropic import AnthropicProvider
from .base import Provider
from .emulator import Emulator, EmulatorTransport
from .openai import OpenAIProvider
from .openai_responses import OpenAIResponsesProvider
from .reasoning_chat import ReasoningChatProvider

__all__ = ["EMULATOR_BASE_URL", "emulated_provider", "emulated_provider_factory", "wire_format_of"]

EMULATOR_BASE_URL = "http://emulator.invalid"
WireFormat = Literal["anthropic", "openai", "openai-responses", "deepseek"]


_WIRE_OF_SERIALIZER: dict[str, WireFormat] = {
    "anthropic-messages": "anthropic",
    "openai-chat": "openai",
    "openai-responses": "openai-responses",
    "reasoning-chat": "deepseek",
}


def wire_format_of(serializer: str | None, provider: str) -> WireFormat:
    """The emulated wire format a session continues on: that of its last dispatch's serializer, else the provider's."""
    if serializer in _WIRE_OF_SERIALIZER:
        return _WIRE_OF_SERIALIZER[serializer]
    return "anthropic" if provider == "anthropic" else "deepseek" if provider == "deepseek" else "openai"


def emulated_provider(wire: WireFormat = "anthropic", *, emulator: Emulator | None = None) -> Provider:
    """An adapter whose transport is an in-process emulator: Anthropic Messages (default), OpenAI Chat
    Completions, the OpenAI Responses API or DeepSeek's ``reasoning_content`` chat."""
    transport = EmulatorTransport(emulator if emulator is not None else Emulator())
    if wire == "anthropic":
        return AnthropicProvider(transport, None, EMULATOR_BASE_URL)
    if wire == "openai-responses":
        return OpenAIResponsesProvider(transport, None, EMULATOR_BASE_URL)
    if wire == "deepseek":
        return ReasoningChatProvider(transport, None, EMULATOR_BASE_URL)
    return OpenAIProvider(transport, None, EMULATOR_BASE_URL)


def emulated_provider_factory(
    wire: WireFormat = "anthropic", *, emulator: Emulator | None = None
) -> Callable[[], Provider]:
    """A factory of such providers sharing one emulator (one prompt cache, like one provider account)."""
    shared = emulator if emulator is not None else Emulator()
    return lambda: emulated_provider(wire, emulator=shared)
