"""The local emulator behind the real adapters: what the demo, the quickstart and the tests talk to.

Requests go through the adapter's real serializer and httpx client into an in-process
:class:`~foldline.providers.emulator.Emulator`, so recorded digests are of real wire bytes and the
path differs from production only by the network.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

from .anthropic import AnthropicProvider
from .base import Provider
from .emulator import Emulator, EmulatorTransport, ToolLoopScript
from .openai import OpenAIProvider

__all__ = ["emulated_provider", "emulated_provider_factory"]

EMULATOR_BASE_URL = "http://emulator.local"


def emulated_provider(kind: Literal["anthropic", "openai"] = "anthropic", emulator: Emulator | None = None) -> Provider:
    transport = EmulatorTransport(emulator or Emulator(ToolLoopScript(tool_steps=2)))
    if kind == "anthropic":
        return AnthropicProvider(transport, base_url=EMULATOR_BASE_URL)
    return OpenAIProvider(transport, base_url=EMULATOR_BASE_URL)


def emulated_provider_factory(
    kind: Literal["anthropic", "openai"] = "anthropic", emulator: Emulator | None = None
) -> Callable[[], Provider]:
    """Providers that share one emulator (one provider backend, one set of prefix caches)."""
    shared = emulator or Emulator(ToolLoopScript(tool_steps=2))
    return lambda: emulated_provider(kind, shared)
