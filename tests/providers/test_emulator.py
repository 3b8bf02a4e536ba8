"""The emulator: deterministic answers, token counting and both prefix-cache models, through real adapters."""

from __future__ import annotations

import asyncio
import itertools
import json
import math
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import anthropic.types
import openai.types.chat
import pytest

from foldline.adapters.memory_attachments import MemoryAttachmentStore
from foldline.core import TextBlock, ToolCallBlock, ToolResultBlock, Usage
from foldline.core.codec import canonical_json
from foldline.core.projection import Message
from foldline.errors import ProviderError, ProviderStatusError
from foldline.providers import AnthropicProvider, OpenAIProvider
from foldline.providers.base import Provider
from foldline.providers.emulator import (
    AnthropicCachePolicy,
    Conversation,
    Emulator,
    EmulatorTransport,
    Reply,
    ScriptedCall,
    ToolLoopScript,
    count_tokens,
)
from foldline.providers.registry import ANTHROPIC_MESSAGES_V1

from .helpers import LONG_SYSTEM, FakeClock, drive, image_block, request, user

T = TypeVar("T")


def run(make: Callable[[], Coroutine[Any, Any, T]]) -> T:
    return asyncio.run(make())


def anthropic_on(emulator: Emulator) -> AnthropicProvider:
    # v1: these requests leave maxTokens unset (v1's documented default is 1024; v2 requires it)
    return AnthropicProvider(EmulatorTransport(emulator), base_url="http://emulator", serializer=ANTHROPIC_MESSAGES_V1)


def openai_on(emulator: Emulator) -> OpenAIProvider:
    return OpenAIProvider(EmulatorTransport(emulator), base_url="http://emulator")


def loop(provider: Provider, steps: int, **kwargs: Any) -> tuple[list[Usage], list[Message]]:
    async def go() -> tuple[list[Usage], list[Message]]:
        try:
            return await drive(provider, steps, **kwargs)
        finally:
            await provider.aclose()

    return asyncio.run(go())


# ---------------------------------------------------------------------------- Anthropic-style cache


def test_anthropic_growing_conversation_reads_the_whole_previous_prompt_from_the_second_request_on() -> None:
    usages, _ = loop(anthropic_on(Emulator(clock=FakeClock())), 10)
    first = usages[0]
    assert (first.cache_read, first.input) == (0, 0)
    assert first.cache_write == first.prompt_tokens > 1024  # the automatic breakpoint writes everything
    for before, after in itertools.pairwise(usages):
        assert after.cache_read == before.prompt_tokens
        assert after.cache_write == after.prompt_tokens - before.prompt_tokens
    ratio = sum(u.cache_read for u in usages[1:]) / sum(u.prompt_tokens for u in usages[1:])
    assert ratio > 0.9


def test_anthropic_system_prompt_change_drops_cache_read_to_zero_and_the_model_has_its_own_cache() -> None:
    emulator = Emulator(clock=FakeClock())
    usages, history = loop(anthropic_on(emulator), 3)
    assert usages[-1].cache_read > 0
    changed, _ = loop(anthropic_on(emulator), 1, messages=list(history), system=LONG_SYSTEM + " Be brief.")
    assert changed[0].cache_read == 0
    other_model, _ = loop(anthropic_on(emulator), 1, messages=list(history), model="model-y")
    assert other_model[0].cache_read == 0
    same, _ = loop(anthropic_on(emulator), 1, messages=list(history))
    assert same[0].cache_read > 0


def test_anthropic_cache_expires_after_its_ttl_and_a_hit_refreshes_it() -> None:
    clock = FakeClock()
    emulator = Emulator(clock=clock)
    _, history = loop(anthropic_on(emulator), 2)
    clock.now += 299
    hit, history = loop(anthropic_on(emulator), 1, messages=history)
    assert hit[0].cache_read > 0
    clock.now += 299  # 598 s after the first write, 299 s after the refreshing hit
    hit, history = loop(anthropic_on(emulator), 1, messages=history)
    assert hit[0].cache_read > 0
    clock.now += 301
    expired, _ = loop(anthropic_on(emulator), 1, messages=history)
    assert expired[0].cache_read == 0
    assert expired[0].cache_write == expired[0].prompt_tokens


def test_anthropic_prompts_below_the_minimum_are_never_cached() -> None:
    emulator = Emulator(clock=FakeClock())
    usages, _ = loop(anthropic_on(emulator), 3, system="Short.")
    assert all(u.prompt_tokens < 1024 for u in usages)
    assert all(u.cache_read == u.cache_write == 0 for u in usages)
    low = Emulator(clock=FakeClock(), anthropic_cache=AnthropicCachePolicy(min_tokens=64))
    usages, _ = loop(anthropic_on(low), 3, system="Short.")
    assert usages[1].cache_read == usages[0].prompt_tokens


def test_anthropic_lookback_window_limits_reads_after_a_wide_step() -> None:
    """A step that appends more than 20 blocks leaves the previous breakpoint outside the lookback."""

    class Wide:
        def reply(self, conversation: Conversation) -> Reply:
            if conversation.turns[-1].role == "user" and len(conversation.turns) > 2:
                return Reply("done")
            return Reply(None, tuple(ScriptedCall("list_dir", {"path": f"d{i}"}) for i in range(12)))

    def run_with(policy: AnthropicCachePolicy) -> list[Usage]:
        emulator = Emulator(Wide(), clock=FakeClock(), anthropic_cache=policy)
        return loop(anthropic_on(emulator), 3)[0]

    narrow = run_with(AnthropicCachePolicy())
    # 12 tool_use + 12 tool_result blocks = 24 new blocks > 20: only the system breakpoint prefix is read.
    system_prefix = narrow[1].cache_read
    assert 1024 < system_prefix < narrow[0].prompt_tokens
    wide = run_with(AnthropicCachePolicy(lookback_blocks=40))
    assert wide[1].cache_read == wide[0].prompt_tokens


def test_more_than_four_breakpoints_is_a_400() -> None:
    emulator = Emulator()
    body = json.loads(anthropic_on(emulator).serializer.serialize(request([user("a"), user("b")]), None))
    for block in body["messages"][0]["content"]:
        block["cache_control"] = {"type": "ephemeral"}
    body["messages"][0]["content"].append({"type": "text", "text": "c", "cache_control": {"type": "ephemeral"}})
    answer = emulator.handle("POST", "/v1/messages", {"anthropic-version": "2023-06-01"}, canonical_json(body))
    assert answer.status == 400
    assert b"A maximum of 4 blocks with cache_control" in answer.body


# ---------------------------------------------------------------------------- OpenAI-style cache


def test_openai_caches_the_previous_prompt_in_128_token_steps_from_1024_on() -> None:
    usages, _ = loop(openai_on(Emulator(clock=FakeClock())), 10)
    assert usages[0].cache_read == 0
    assert usages[0].cache_write == usages[0].prompt_tokens // 128 * 128 > 1024  # every whole 128-token prefix
    for before, after in itertools.pairwise(usages):
        assert after.cache_read == before.prompt_tokens // 128 * 128
        assert after.cache_read % 128 == 0
        assert after.cache_write == after.prompt_tokens // 128 * 128 - after.cache_read  # the prefixes beyond it
        assert after.input == after.prompt_tokens - after.cache_read - after.cache_write


def test_openai_minimum_is_1024_tokens_and_prefixes_match_in_128_token_blocks() -> None:
    emulator = Emulator(clock=FakeClock())
    serializer = openai_on(emulator).serializer
    totals = []
    for size in (2000, 6000, 6100):
        body = serializer.serialize(request([user("hi")], system="x" * size, provider="openai", model=f"m{size}"), None)
        emulator.openai_chat(json.loads(body))
        usage = emulator.openai_chat(json.loads(body))["usage"]
        total = usage["prompt_tokens"]
        totals.append(total)
        assert usage["prompt_tokens_details"]["cached_tokens"] == (total // 128 * 128 if total >= 1024 else 0)
    assert min(totals) < 1024 < max(totals)
    # Two prompts that differ only in the last message share the 128-token blocks before it.
    first = json.loads(serializer.serialize(request([user("a")], system="y" * 6000, provider="openai"), None))
    second = json.loads(serializer.serialize(request([user("b")], system="y" * 6000, provider="openai"), None))
    total = emulator.openai_chat(first)["usage"]["prompt_tokens"]
    cached = emulator.openai_chat(second)["usage"]["prompt_tokens_details"]["cached_tokens"]
    last_block = math.ceil((len(b'{"role":"user"}') + len(canonical_json({"text": "a", "type": "text"}))) / 4)
    shared = total - last_block
    assert cached == shared // 128 * 128
    assert cached > 1024


def test_openai_short_prompts_never_hit_and_the_cache_expires() -> None:
    clock = FakeClock()
    emulator = Emulator(clock=clock)
    short, _ = loop(openai_on(emulator), 3, system="Short.")
    assert all(u.cache_read == 0 for u in short)
    _, history = loop(openai_on(emulator), 2)
    clock.now += 301
    expired, _ = loop(openai_on(emulator), 1, messages=history)
    assert expired[0].cache_read == 0


# ---------------------------------------------------------------------------- answers


def test_default_script_calls_tools_then_answers_and_is_deterministic() -> None:
    script = ToolLoopScript(tool_steps=3)
    first, history = loop(anthropic_on(Emulator(script, clock=FakeClock())), 5)
    again, history2 = loop(anthropic_on(Emulator(script, clock=FakeClock())), 5)
    assert first == again
    assert history == history2
    kinds = [
        "tools" if any(isinstance(b, ToolCallBlock) for b in m.content) else "text"
        for m in history
        if m.role == "assistant"
    ]
    assert kinds == ["tools", "tools", "tools", "text", "tools"]
    call = next(b for b in history[1].content if isinstance(b, ToolCallBlock))
    args = json.loads(call.arguments)
    assert call.name in {"read_file", "list_dir", "now"}
    assert all(isinstance(v, str | int) for v in args.values())
    other, _ = loop(anthropic_on(Emulator(script, clock=FakeClock())), 1, messages=[user("A different task.")])
    assert other[0] != first[0]


def test_no_tools_means_a_direct_answer_and_stop_sequences_and_max_tokens_cut_the_answer() -> None:
    emulator = Emulator(clock=FakeClock())
    provider = anthropic_on(emulator)
    plain = request([user("hello")], tools=None)
    answer = run(lambda: provider.send(provider.serializer.serialize(plain, None)))
    assert answer.stop_reason == "end_turn"
    (text,) = answer.content
    assert isinstance(text, TextBlock)
    assert "hello" in text.text
    stopped = request([user("hello")], tools=None, stop=("tool",))
    cut = run(lambda: provider.send(provider.serializer.serialize(stopped, None)))
    assert cut.stop_reason == "stop_sequence"
    assert isinstance(cut.content[0], TextBlock)
    assert "tool" not in cut.content[0].text
    short = request([user("hello")], tools=None, max_tokens=3)
    capped = run(lambda: provider.send(provider.serializer.serialize(short, None)))
    assert capped.stop_reason == "max_tokens"
    assert capped.usage.output <= 3


def test_emulator_answers_validate_against_the_sdk_response_models() -> None:
    emulator = Emulator(clock=FakeClock())
    for provider_name in ("anthropic", "openai"):
        req = request([user("go")], provider=provider_name)
        if provider_name == "anthropic":
            body = anthropic_on(emulator).serializer.serialize(req, None)
            answer = emulator.handle("POST", "/v1/messages", {"anthropic-version": "2023-06-01"}, body)
            message = anthropic.types.Message.model_validate_json(answer.body)
            assert message.stop_reason == "tool_use"
        else:
            body = openai_on(emulator).serializer.serialize(req, None)
            answer = emulator.handle("POST", "/v1/chat/completions", {}, body)
            completion = openai.types.chat.ChatCompletion.model_validate_json(answer.body)
            assert completion.choices[0].finish_reason == "tool_calls"
        assert answer.status == 200


def test_token_counting_is_four_bytes_per_token_per_block_and_images_count_by_area() -> None:
    block = {"text": "abcdefgh", "type": "text"}
    assert count_tokens(block) == math.ceil(len(canonical_json(block)) / 4)
    # The same text-only conversation counts the same in both formats.
    emulator = Emulator(clock=FakeClock())
    history = [user("hi"), Message("assistant", (TextBlock("hello"),)), user("more")]
    a, _ = loop(anthropic_on(emulator), 1, messages=list(history))
    o, _ = loop(openai_on(emulator), 1, messages=list(history))
    assert a[0].prompt_tokens == o[0].prompt_tokens
    store = MemoryAttachmentStore()
    with_image = [Message("user", (TextBlock("see"), image_block(store)))]
    i, _ = loop(anthropic_on(emulator), 1, messages=with_image, store=store, system=None)
    t, _ = loop(anthropic_on(emulator), 1, messages=[user("see")], system=None)
    assert i[0].prompt_tokens > t[0].prompt_tokens


# ---------------------------------------------------------------------------- the emulator checks what it is sent


def _bad(emulator: Emulator, path: str, body: dict[str, Any], headers: dict[str, str] | None = None) -> str:
    answer = emulator.handle("POST", path, headers or {"anthropic-version": "2023-06-01"}, canonical_json(body))
    assert answer.status == 400, answer.body
    return str(json.loads(answer.body))


def test_emulator_rejects_invalid_requests_like_the_apis() -> None:
    emulator = Emulator()
    base = {"model": "m", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]}
    assert "Extra inputs" in _bad(emulator, "/v1/messages", {**base, "tool_config": 1})
    orphan = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "nope"}]}
    assert "tool_use_id" in _bad(emulator, "/v1/messages", {**base, "messages": [orphan]})
    assert "anthropic-version" in _bad(emulator, "/v1/messages", base, headers={"x": "y"})
    assert "max_tokens" in _bad(emulator, "/v1/messages", {"model": "m", "messages": base["messages"]})
    oa = {"model": "m", "messages": [{"role": "tool", "tool_call_id": "x", "content": "r"}]}
    assert "tool" in _bad(emulator, "/v1/chat/completions", oa)
    unanswered = {
        "model": "m",
        "messages": [
            {"role": "user", "content": "go"},
            {
                "role": "assistant",
                "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
            },
            {"role": "user", "content": "?"},
        ],
    }
    assert "tool_call_id" in _bad(emulator, "/v1/chat/completions", unanswered)
    assert emulator.handle("POST", "/v1/other", {}, b"{}").status == 404
    assert emulator.handle("POST", "/v1/messages", {"anthropic-version": "1"}, b"{not json").status == 400


def test_a_rejected_request_surfaces_as_a_provider_status_error() -> None:
    emulator = Emulator()
    provider = anthropic_on(emulator)
    orphan = request([user("go"), Message("tool", (ToolResultBlock("never-called", (TextBlock("r"),)),))])
    with pytest.raises(ProviderStatusError) as info:
        run(lambda: provider.send(provider.serializer.serialize(orphan, None)))
    assert info.value.status == 400
    assert isinstance(info.value, ProviderError)


def test_emulated_providers_share_one_emulator_per_factory() -> None:
    from foldline.providers.emulated import emulated_provider, emulated_provider_factory

    make = emulated_provider_factory()
    _, history = loop(make(), 2)
    again, _ = loop(make(), 1, messages=history)
    assert again[0].cache_read > 0  # the second provider saw the first one's cache
    assert isinstance(make(), AnthropicProvider)
    assert isinstance(emulated_provider("openai"), OpenAIProvider)


def test_an_emulator_with_a_latency_holds_every_model_answer_that_long_and_refusals_not_at_all() -> None:
    """``latency_s`` is a model's time to answer: each answer of a model route waits that long before its first
    byte; an injected status fault (a provider's refusal) and a request to no model route come at once."""
    from foldline.providers.emulator import Fault, FaultPlan

    emulator = Emulator(latency_s=0.3, faults=FaultPlan(by_index={1: Fault.rate_limited(retry_after_s=1.0)}))
    provider = anthropic_on(emulator)
    body = provider.serializer.serialize(request([user("hello")]), None)

    async def timed() -> tuple[float, int]:
        began = asyncio.get_running_loop().time()
        status = 200
        try:
            await provider.send(body)
        except ProviderStatusError as exc:
            status = exc.status
        return asyncio.get_running_loop().time() - began, status

    (answered, ok), (refused, limited) = run(timed), run(timed)
    assert (ok, limited) == (200, 429)
    assert 0.3 <= answered < 1.5
    assert refused < 0.2
    assert emulator.handle("POST", "/v1/other", {}, b"{}").delay_s == 0.0
    with pytest.raises(ValueError, match=">= 0"):
        Emulator(latency_s=-1)


def test_a_latency_spread_holds_answers_evenly_within_its_bounds_fixed_by_the_request_index() -> None:
    spread = Emulator(latency_s=2.0, latency_spread=0.5)
    held = [spread.latency_for(i) for i in range(1000)]
    assert all(1.0 <= h < 3.0 for h in held)
    assert 1.9 < sum(held) / len(held) < 2.1  # the mean is the latency
    assert sum(h < 1.5 for h in held) > 200  # evenly spread, not bunched at the middle
    assert sum(h >= 2.5 for h in held) > 200
    assert held == [Emulator(latency_s=2.0, latency_spread=0.5).latency_for(i) for i in range(1000)]
    assert Emulator(latency_s=2.0).latency_for(7) == 2.0
    with pytest.raises(ValueError, match="spread"):
        Emulator(latency_s=1, latency_spread=1.0)
