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

Money is not computed yet: :func:`cache_write_money` is the one place a dated price table will turn tokens into
an amount; until then it answers ``None`` and the reports say so.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from ..core.content import Usage
from ..core.request import GenerateOptions
from ..core.request_diff import PromptPrefix, shared_prompt_prefix

__all__ = ["ChangeCost", "CostSummary", "cache_write_money", "change_cost", "summarize_costs"]


def cache_write_money(provider: str, model: str, tokens: int) -> Decimal | None:
    """The price of writing ``tokens`` to ``provider``/``model``'s prompt cache; ``None``: no price table yet."""
    return None


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

    @property
    def money(self) -> Decimal | None:
        return cache_write_money(self.provider, self.model, self.cache_write_tokens)

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
        prefix, prompt, read, cacheable, max(0, read - cacheable), measured, config.provider, config.model
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
