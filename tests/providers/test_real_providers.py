"""Against the real Anthropic and OpenAI APIs — run only when the key is in the environment; every one streams.

A tool turn and a follow-up turn through the production adapters over the network. Every request after
the first must read from the provider's prefix cache (positive cache-read tokens), and ``verify`` must
rebuild every request from the log to the recorded digest. Models come from ``FOLDLINE_ANTHROPIC_MODEL`` /
``FOLDLINE_OPENAI_MODEL`` (defaults below). The system prompt is long enough for every model's minimum
cacheable prefix.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from foldline.adapters.sqlite_log import SqliteEventLog
from foldline.core import AssistantMessage, CallConfig
from foldline.demo import SYSTEM_PROMPT, demo_toolset
from foldline.loop import Agent, AgentOptions
from foldline.providers.anthropic import AnthropicProvider
from foldline.providers.base import Provider
from foldline.providers.emulated import WireFormat, emulated_provider
from foldline.providers.openai import OpenAIProvider
from foldline.providers.openai_responses import OpenAIResponsesProvider
from foldline.replay.verify import verify_events

LONG_SYSTEM = "\n\n".join([SYSTEM_PROMPT] * 6)  # ~5,000 tokens: above every minimum cacheable length


def _run(provider: Provider, config: CallConfig, data_dir: Path, *, reasoning: str | None = None) -> None:
    """``reasoning``: the block kind every answer of a reasoning model must carry (and that goes back)."""
    log = SqliteEventLog(data_dir)
    agent = Agent("real", log, provider, AgentOptions(config=config, system=LONG_SYSTEM, tools=demo_toolset()))

    async def main() -> list[int]:
        try:
            first = await agent.run_turn("Use the word_count tool on 'prefix caches keep hitting', then answer.")
            second = await agent.run_turn("Now say in one sentence what the count was.")
        finally:
            await provider.aclose()
        return [s.usage.cache_read for s in (*first.steps, *second.steps)]

    cache_reads = asyncio.run(main())
    assert len(cache_reads) >= 3, "expected a tool step, its follow-up and a second turn"
    assert all(read > 0 for read in cache_reads[1:]), f"cache-read tokens per request: {cache_reads}"
    events = log.read("real")
    report = verify_events("real", events)
    log.close()
    if reasoning is not None:
        answers = [e.data for e in events if isinstance(e.data, AssistantMessage)]
        assert answers
        assert all(any(b.kind == reasoning for b in a.content) for a in answers), answers
    assert report.ok, report.to_json()
    assert report.matched == report.checked == len(cache_reads)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("wire", ["anthropic", "openai"])
def test_the_same_check_passes_against_the_emulator(wire: WireFormat, stream: bool, tmp_path: Path) -> None:
    """The assertions above hold on the emulator's cache model, so a failure against a real API is real."""
    _run(emulated_provider(wire), CallConfig(wire, "emulated", max_tokens=512, stream=stream), tmp_path)


@pytest.mark.skipif(not os.environ.get("ANTHROPIC_API_KEY"), reason="ANTHROPIC_API_KEY is not set")
def test_anthropic_messages_keeps_hitting_the_cache(tmp_path: Path) -> None:
    model = os.environ.get("FOLDLINE_ANTHROPIC_MODEL", "claude-sonnet-4-5")
    provider = AnthropicProvider(None, os.environ["ANTHROPIC_API_KEY"])  # HTTP/2, foldline's retries
    _run(provider, CallConfig("anthropic", model, max_tokens=512, stream=True), tmp_path)


@pytest.mark.skipif(not os.environ.get("OPENAI_API_KEY"), reason="OPENAI_API_KEY is not set")
def test_openai_chat_keeps_hitting_the_cache(tmp_path: Path) -> None:
    model = os.environ.get("FOLDLINE_OPENAI_MODEL", "gpt-4.1-mini")
    provider = OpenAIProvider(None, os.environ["OPENAI_API_KEY"])
    _run(provider, CallConfig("openai", model, max_tokens=512, stream=True), tmp_path)


THINKING_WIRES: list[tuple[WireFormat, CallConfig, str]] = [
    (
        "anthropic",
        CallConfig("anthropic", "claude-thinking-emulated", max_tokens=4096, reasoning_effort="high", stream=True),
        "reasoning",
    ),
    (
        "openai-responses",
        CallConfig("openai", "gpt-reasoning-emulated", max_tokens=4096, reasoning_effort="low", stream=True),
        "encrypted-reasoning",
    ),
]


@pytest.mark.parametrize(("wire", "config", "kind"), THINKING_WIRES, ids=["anthropic", "responses"])
def test_the_reasoning_check_passes_against_the_emulator(
    wire: WireFormat, config: CallConfig, kind: str, tmp_path: Path
) -> None:
    _run(emulated_provider(wire), config, tmp_path, reasoning=kind)


@pytest.mark.skipif(not os.environ.get("ANTHROPIC_API_KEY"), reason="ANTHROPIC_API_KEY is not set")
def test_a_thinking_model_tool_loop_on_anthropic_passes_signed_thinking_back(tmp_path: Path) -> None:
    """Extended thinking with a budget: every continuation must carry the signed thinking back (else 400)."""
    model = os.environ.get("FOLDLINE_ANTHROPIC_THINKING_MODEL", "claude-opus-4-5")
    provider = AnthropicProvider(None, os.environ["ANTHROPIC_API_KEY"])
    config = CallConfig("anthropic", model, max_tokens=8192, thinking_budget=2048, stream=True)
    _run(provider, config, tmp_path, reasoning="reasoning")


@pytest.mark.skipif(not os.environ.get("OPENAI_API_KEY"), reason="OPENAI_API_KEY is not set")
def test_a_reasoning_model_tool_loop_on_the_responses_api_passes_encrypted_items_back(tmp_path: Path) -> None:
    model = os.environ.get("FOLDLINE_OPENAI_REASONING_MODEL", "gpt-5-mini")
    provider = OpenAIResponsesProvider(None, os.environ["OPENAI_API_KEY"])
    config = CallConfig("openai", model, max_tokens=4096, reasoning_effort="low", stream=True)
    _run(provider, config, tmp_path, reasoning="encrypted-reasoning")
