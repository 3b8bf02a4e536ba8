"""Usage normalized once: the one form every cost, metric and trace figure reads (docs/FORMAT.md §3.6).

Providers disagree on what their input count holds: Anthropic reports cache reads and writes apart from
``input_tokens``; OpenAI (Chat and Responses), DeepSeek and Gemini count them inside the prompt count. The log
keeps each answer's counts as the adapter read them (:class:`~foldline.core.content.Usage`, §3.3: ``input`` is
already the uncached part). This module turns one logged usage, with the call config it was sent with, into
disjoint token classes — every prompt token in exactly one — so that pricing is a sum of classes and no figure
has to know a provider's convention again:

``input``          prompt tokens neither read from nor written to the cache (a DeepSeek cache miss);
``cache-read``     prompt tokens read from the cache (a hit);
``cache-write-5m`` prompt tokens written to the cache with the provider's short TTL;
``cache-write-1h`` prompt tokens written with the 1-hour TTL;
``output``         output tokens that are not reasoning;
``reasoning``      output tokens the model spent reasoning (when the provider counts them; else 0 and all of the
                   output is ``output``).

The 1-hour part of the writes is the logged ``cacheWrite1h`` when the answer gave it; without it, the writes of
a request whose logged config asked for ``cacheTtl: 1h`` are 1-hour writes and every other write is a short one.

Pure: no I/O, no clock.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from .content import Usage

__all__ = ["TOKEN_CLASSES", "NormalizedUsage", "normalize_usage"]

#: The disjoint token classes, in the order a prompt holds its input classes (read, 1-hour writes, short writes,
#: then the rest; Anthropic requires longer-lived cache breakpoints before shorter ones) and then the output.
TOKEN_CLASSES: Final = ("cache-read", "cache-write-1h", "cache-write-5m", "input", "output", "reasoning")


@dataclass(frozen=True, slots=True)
class NormalizedUsage:
    """One request's tokens by class (see the module docstring); every count is ≥ 0."""

    input: int
    cache_read: int
    cache_write_5m: int
    cache_write_1h: int
    output: int  # not reasoning
    reasoning: int

    @property
    def prompt(self) -> int:
        """Every input token of the request, cached or not (OpenTelemetry's ``gen_ai.usage.input_tokens``)."""
        return self.input + self.cache_read + self.cache_write_5m + self.cache_write_1h

    @property
    def cache_write(self) -> int:
        return self.cache_write_5m + self.cache_write_1h

    @property
    def completion(self) -> int:
        """Every output token, reasoning included (``gen_ai.usage.output_tokens``)."""
        return self.output + self.reasoning

    def by_class(self) -> dict[str, int]:
        """Tokens per class of :data:`TOKEN_CLASSES`, in that order."""
        return {
            "cache-read": self.cache_read,
            "cache-write-1h": self.cache_write_1h,
            "cache-write-5m": self.cache_write_5m,
            "input": self.input,
            "output": self.output,
            "reasoning": self.reasoning,
        }


def normalize_usage(usage: Usage, cache_ttl: str | None = None) -> NormalizedUsage:
    """The token classes of one logged usage; ``cache_ttl`` is the logged ``config.cacheTtl`` of its request."""
    if usage.cache_write_1h is not None:
        long_writes = usage.cache_write_1h
    else:
        long_writes = usage.cache_write if cache_ttl == "1h" else 0
    reasoning = min(usage.reasoning_tokens or 0, usage.output)
    return NormalizedUsage(
        input=usage.input,
        cache_read=usage.cache_read,
        cache_write_5m=usage.cache_write - long_writes,
        cache_write_1h=long_writes,
        output=usage.output - reasoning,
        reasoning=reasoning,
    )
