"""replayer/cost.py: the cache-write cost of a change, from the provider's counts or from estimates."""

from __future__ import annotations

from decimal import Decimal

import msgspec

from foldline.core import CallConfig
from foldline.core.content import TextBlock, Usage
from foldline.core.header import EpochHeader, ToolSpec
from foldline.core.projection import Message
from foldline.core.request import build_request
from foldline.core.request_diff import shared_prompt_prefix
from foldline.replayer.cost import cache_write_money, change_cost, summarize_costs

HEADER = EpochHeader(
    CallConfig("anthropic", "m", max_tokens=100), "Be careful. " * 40, (ToolSpec("read", "Read a file.", {}),)
)
MESSAGES = tuple(Message("user" if i % 2 == 0 else "assistant", (TextBlock(f"message {i} " * 20),)) for i in range(6))
RECORDED = build_request(MESSAGES, HEADER)
PREVIOUS = build_request(MESSAGES[:4], HEADER)
CHANGED = build_request(MESSAGES, msgspec.structs.replace(HEADER, system="Be bold."))


def test_with_recorded_usage_the_cost_is_in_the_providers_counts() -> None:
    usage = Usage(input=20, output=7, cache_read=1000, cache_write=80)  # a prompt of 1,100 tokens, 1,000 cached
    cost = change_cost(RECORDED, CHANGED, usage, PREVIOUS)
    assert cost.measured
    assert (cost.prompt_tokens, cost.cache_read_tokens) == (1100, 1000)
    own = shared_prompt_prefix(RECORDED, RECORDED).total_tokens
    assert cost.cacheable_tokens == round(cost.prefix.shared_tokens * 1100 / own)  # the tool, scaled
    assert cost.cache_write_tokens == 1000 - cost.cacheable_tokens > 0
    assert (cost.provider, cost.model, cost.money) == ("anthropic", "m", None)
    # a change after everything the cache held costs nothing
    grown = build_request((*MESSAGES, Message("user", (TextBlock("more"),))), HEADER)
    assert change_cost(RECORDED, grown, usage, PREVIOUS).cache_write_tokens == 0


def test_without_usage_the_previous_request_stands_for_the_cache() -> None:
    cost = change_cost(RECORDED, CHANGED, None, PREVIOUS)
    assert not cost.measured
    assert cost.cache_read_tokens == shared_prompt_prefix(PREVIOUS, RECORDED).shared_tokens > 0
    assert cost.cacheable_tokens == shared_prompt_prefix(RECORDED, CHANGED).shared_tokens
    assert cost.cache_write_tokens == cost.cache_read_tokens - cost.cacheable_tokens > 0
    assert change_cost(RECORDED, CHANGED, None, None).cache_write_tokens == 0  # a first request: nothing was cached


def test_the_summary_over_sessions_and_the_money_seam() -> None:
    cost = change_cost(RECORDED, CHANGED, None, PREVIOUS)
    summary = summarize_costs(4, [cost, cost, None])  # two priced divergences, one without a cost, one identical
    assert (summary.sessions, summary.diverged) == (4, 3)
    assert summary.cache_write_tokens == 2 * cost.cache_write_tokens
    assert summary.per_session == summary.cache_write_tokens / 4
    assert summary.per_1000_sessions == summary.per_session * 1000
    assert summary.money is None
    assert cache_write_money("anthropic", "m", 1000) is None  # a model without a price
    # the configured table's prices: writing again over reading, 5-minute writes unless the request asked for 1h
    at = 1_767_225_600_000  # 2026-01-01
    assert cache_write_money("anthropic", "claude-sonnet-4-5", 1000, at_ms=at) == Decimal("0.00345")  # 3.75 - 0.30
    assert cache_write_money("anthropic", "claude-sonnet-4-5", 1000, cache_ttl="1h", at_ms=at) == Decimal("0.0057")
    assert cache_write_money("openai", "gpt-5", 1000, at_ms=at) == Decimal("0.001125")  # written at 1.25, read 0.125
    assert summarize_costs(2, []).to_json()["cacheWriteTokens"] == 0
