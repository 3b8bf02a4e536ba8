"""What a change costs in prompt cache, at the request where it first differs.

At a divergence the changed request is compared with the recorded one in prompt order
(:func:`~foldline.core.request_diff.shared_prompt_prefix`): tools, system prompt, messages, whole elements,
up to the first that differs — nothing when the model differs. That prefix is what a provider's cache could
still serve. The recording says what the cache did serve at that request (``usage.cacheRead``); the change
costs the difference, written to the cache again:

    cache-write tokens = max(0, recorded cache-read tokens - cacheable tokens)

Tokens are the provider's own counts when the recorded answer carries usage (the estimated share of the
prefix, scaled to the recorded prompt's size); otherwise the estimate of ``core/compaction.py`` throughout,
with what the previous recorded request had already sent standing for what was cached. A session that stays
identical costs nothing.

Money: :func:`cache_write_money` prices those tokens with the price table (:mod:`foldline.config.prices`: the shipped
table, ``FOLDLINE_PRICES`` over it) at today's prices, as ``foldline cost`` prices a drop: what writing them again
costs over reading them from the cache (the short-TTL write price, or the 1-hour one for a request that asked for
``cacheTtl: 1h``, minus the cache-read price). A model the table does not price gives ``None`` and the reports name
it as unpriced.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Iterable
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from ..core.content import Usage
from ..core.cost import MILLION, PriceTable
from ..core.request import GenerateOptions
from ..core.request_diff import PromptPrefix, shared_prompt_prefix

__all__ = ["ChangeCost", "CostSummary", "cache_write_money", "change_cost", "summarize_costs"]


def cache_write_money(
    provider: str,
    model: str,
    tokens: int,
    *,
    cache_ttl: str | None = None,
    table: PriceTable | None = None,
    at_ms: int | None = None,
) -> Decimal | None:
    """What writing ``tokens`` to ``provider``/``model``'s prompt cache again costs over reading them from it, at the
    prices in force at ``at_ms`` (default: now) in ``table`` (default: the configured one); ``None``: no price."""
    if tokens <= 0:
        return Decimal(0)
    prices = (table or _configured_table()).prices_for(
        provider, model, at_ms if at_ms is not None else time.time_ns() // 1_000_000
    )
    if prices is None:
        return None
    written = "cache-write-1h" if cache_ttl == "1h" else "cache-write-5m"
    return tokens * (prices.rate(written) - prices.rate("cache-read")) / MILLION


@functools.lru_cache(maxsize=1)
def _configured_table() -> PriceTable:
    from ..config import Config
    from ..config.prices import load_price_table

    return load_price_table(Config.from_env().prices)


@dataclass(frozen=True, slots=True)
class ChangeCost:
    """The prompt-cache cost of a change at the request where it first differs."""

    prefix: PromptPrefix  # the shared prompt-order prefix, in estimated tokens and bytes
    prompt_tokens: int  # the recorded request's prompt size
    cache_read_tokens: int  # what the recording read from the cache at that request
    cacheable_tokens: int  # of the prompt, what the changed request could still read
    cache_write_tokens: int  # what the change makes the provider write again
    measured: bool  # True: the provider's counts (recorded usage); False: estimates
    provider: str
    model: str

    cache_ttl: str | None = None  # the changed request's logged cacheTtl

    @property
    def money(self) -> Decimal | None:
        return cache_write_money(self.provider, self.model, self.cache_write_tokens, cache_ttl=self.cache_ttl)

    def to_json(self) -> dict[str, Any]:
        money = self.money
        return {
            "prefix": self.prefix.to_json(),
            "promptTokens": self.prompt_tokens,
            "cacheReadTokens": self.cache_read_tokens,
            "cacheableTokens": self.cacheable_tokens,
            "cacheWriteTokens": self.cache_write_tokens,
            "measured": self.measured,
            "money": str(money) if money is not None else None,
        }


def change_cost(
    recorded: GenerateOptions, changed: GenerateOptions, usage: Usage | None, previous: GenerateOptions | None
) -> ChangeCost:
    """The cost of ``changed`` standing where ``recorded`` was sent (``usage``: the recorded answer's)."""
    prefix = shared_prompt_prefix(recorded, changed)
    own = shared_prompt_prefix(recorded, recorded)
    if usage is not None and usage.prompt_tokens > 0:
        prompt, read, measured = usage.prompt_tokens, usage.cache_read, True
        scale = prompt / own.total_tokens if own.total_tokens else 0.0
        cacheable = min(prompt, round(prefix.shared_tokens * scale))
    else:
        prompt, measured = own.total_tokens, False
        read = shared_prompt_prefix(previous, recorded).shared_tokens if previous is not None else 0
        cacheable = prefix.shared_tokens
    config = changed.config
    return ChangeCost(
        prefix,
        prompt,
        read,
        cacheable,
        max(0, read - cacheable),
        measured,
        config.provider,
        config.model,
        config.cache_ttl,
    )


@dataclass(frozen=True, slots=True)
class CostSummary:
    """The change's cache-write cost over the replayed sessions, per session and per 1,000 sessions."""

    sessions: int
    diverged: int
    cache_write_tokens: int
    money: Decimal | None

    @property
    def per_session(self) -> float:
        return self.cache_write_tokens / self.sessions if self.sessions else 0.0

    @property
    def per_1000_sessions(self) -> float:
        return self.per_session * 1000

    def to_json(self) -> dict[str, Any]:
        return {
            "sessions": self.sessions,
            "diverged": self.diverged,
            "cacheWriteTokens": self.cache_write_tokens,
            "cacheWriteTokensPerSession": round(self.per_session, 3),
            "cacheWriteTokensPer1000Sessions": round(self.per_1000_sessions),
            "money": str(self.money) if self.money is not None else None,
        }


def summarize_costs(sessions: int, costs: Iterable[ChangeCost | None]) -> CostSummary:
    """The summary over ``sessions`` replayed sessions, of which the diverged ones gave ``costs`` (a divergence
    with no cost, e.g. in a compaction, counts as diverged). Money only when every cost has a price."""
    tokens = diverged = 0
    prices: list[Decimal | None] = []
    for cost in costs:
        diverged += 1
        if cost is not None:
            tokens += cost.cache_write_tokens
            prices.append(cost.money)
    money = sum((p for p in prices if p is not None), Decimal(0)) if prices and None not in prices else None
    return CostSummary(sessions, diverged, tokens, money)
