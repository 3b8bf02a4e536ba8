"""Every usage count the providers report reaches the log: through the real loop and adapters against the emulator,
for each wire format, streamed and unstreamed, the ``assistant/message`` usage holds the cache reads and writes, the
1-hour part of Anthropic's cache writes and the reasoning tokens of every API that counts them."""

from __future__ import annotations

import asyncio
from typing import Literal

import pytest

from foldline.adapters.memory_log import MemoryEventLog
from foldline.core.content import Usage
from foldline.core.events import AssistantMessage
from foldline.core.header import CallConfig
from foldline.demo import SYSTEM_PROMPT, demo_toolset
from foldline.loop import Agent, AgentOptions
from foldline.providers.emulated import WireFormat, emulated_provider
from foldline.providers.emulator import Emulator

Case = tuple[WireFormat, CallConfig]
CASES: dict[str, Case] = {
    "anthropic-1h": ("anthropic", CallConfig("anthropic", "claude-emulated", max_tokens=512, cache_ttl="1h")),
    "anthropic-5m": ("anthropic", CallConfig("anthropic", "claude-emulated", max_tokens=512)),
    "openai-chat": ("openai", CallConfig("openai", "gpt-reasoning-emulated", max_tokens=4096, reasoning_effort="high")),
    "responses": (
        "openai-responses",
        CallConfig("openai", "gpt-reasoning-emulated", max_tokens=4096, reasoning_effort="medium"),
    ),
    "deepseek": ("deepseek", CallConfig("deepseek", "deepseek-reasoner", max_tokens=4096)),
}


def _usages(case: str, stream: bool) -> list[Usage]:
    wire, config = CASES[case]
    log = MemoryEventLog()
    provider = emulated_provider(wire, emulator=Emulator())
    options = AgentOptions(config=config.with_overrides(stream=stream), system=SYSTEM_PROMPT, tools=demo_toolset())

    async def run() -> None:
        agent = Agent("usage", log, provider, options)
        await agent.run_turn("What does the team's note say about kafka? Look it up.")
        await agent.run_turn("And about redis?")
        await provider.aclose()

    asyncio.run(run())
    messages = [e.data for e in log.read("usage") if isinstance(e.data, AssistantMessage)]
    usages = [m.usage for m in messages if m.usage is not None]
    assert len(usages) == len(messages) >= 4
    return usages


@pytest.mark.parametrize("stream", [False, True], ids=["unstreamed", "streamed"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_the_log_holds_every_count_the_provider_reported(case: str, stream: bool) -> None:
    usages = _usages(case, stream)
    first = usages[0]
    if case.startswith("anthropic"):
        assert first.cache_write > 0  # the system prompt and tools, written on the first request
        assert first.cache_write_1h == (first.cache_write if case == "anthropic-1h" else 0)
        assert all(u.cache_write_1h is not None for u in usages)
        assert all(u.reasoning_tokens is None for u in usages)  # the Messages API does not count them apart
        assert any(u.cache_read > 0 for u in usages[1:])
    else:
        assert all(u.cache_write_1h is None for u in usages)
        assert all(u.reasoning_tokens is not None and 0 < u.reasoning_tokens <= u.output for u in usages)
        assert any(u.cache_read > 0 for u in usages[1:])


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_streamed_answer_logs_the_same_usage_as_the_unstreamed_one(case: str) -> None:
    assert _usages(case, True) == _usages(case, False)


def test_every_wire_format_is_covered() -> None:
    wires: set[Literal["anthropic", "openai", "openai-responses", "deepseek"]] = {w for w, _ in CASES.values()}
    assert wires == {"anthropic", "openai", "openai-responses", "deepseek"}
