"""The prompt-cache model: both providers' cache policies and the accounting over one store of live prefixes.

**Anthropic-style cache** (explicit): breakpoints are the blocks carrying ``cache_control`` plus, for a
top-level ``cache_control`` (automatic caching), the last block. More than ``max_breakpoints`` (4) is a
400. Read: for each breakpoint, the longest live entry at that block boundary or one of the
``lookback_blocks`` (20) boundaries before it; the request reads the longest of those. Write: every
breakpoint prefix of at least ``min_tokens`` (1024, Sonnet-class; configurable) that is not cached yet is
stored with the breakpoint's TTL (``ttl: "1h"`` → 3600 s, else ``ttl_seconds`` = 300); hits and re-marked
entries are refreshed. Usage: ``cache_read_input_tokens`` = the read prefix, ``cache_creation_input_tokens``
= tokens from there to the furthest newly written breakpoint, ``input_tokens`` = the rest. The written tokens
split by TTL (``cache_creation.ephemeral_1h_input_tokens`` / ``ephemeral_5m_input_tokens``): walking the newly
written breakpoints in prompt order, the tokens from the end of what is already cached (or written) up to each
one count under that breakpoint's TTL.

**OpenAI-style cache** (automatic): every request stores the digests of its token stream at each multiple
of ``granularity`` (128) tokens from ``min_tokens`` (1024) up; ``cached_tokens`` is the longest stored,
live such prefix — so it is 0 below 1024 and grows in 128-token steps; the prefixes stored beyond it are the
request's written tokens (``cache_write_tokens``). Entries live ``ttl_seconds`` (300) after their last use.
``prompt_tokens`` includes the cached and the written tokens, as OpenAI reports it.

Entries are kept per API and model; expired ones are swept every :data:`SWEEP_EVERY` accounted requests.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import accumulate
from typing import Final

from .tokens import BYTES_PER_TOKEN, Block, chain_seed

__all__ = ["SWEEP_EVERY", "AnthropicCachePolicy", "CacheUsage", "OpenAICachePolicy", "PrefixCache"]

SWEEP_EVERY: Final = 256


@dataclass(frozen=True, slots=True)
class AnthropicCachePolicy:
    """Explicit breakpoints: ``min_tokens`` per written prefix (1024 is Sonnet-class), a 5-minute and a
    1-hour TTL, reads looking back ``lookback_blocks`` boundaries from each breakpoint."""

    min_tokens: int = 1024
    ttl_seconds: float = 300.0
    long_ttl_seconds: float = 3600.0
    lookback_blocks: int = 20
    max_breakpoints: int = 4


@dataclass(frozen=True, slots=True)
class OpenAICachePolicy:
    """Automatic prefixes: from ``min_tokens`` up in ``granularity``-token steps, live ``ttl_seconds``."""

    min_tokens: int = 1024
    granularity: int = 128
    ttl_seconds: float = 300.0


@dataclass(frozen=True, slots=True)
class CacheUsage:
    """The prompt tokens one request read from the cache and wrote to it; ``write_1h`` of ``write`` were
    written with the 1-hour TTL (Anthropic's ``ttl: "1h"``), the rest with the short one."""

    read: int = 0
    write: int = 0
    write_1h: int = 0


@dataclass(slots=True)
class _Entry:
    expires: float


class PrefixCache:
    """Live prefix digests with their expiry, per (API, model). Thread-safe; ``requests`` counts accountings."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._entries: dict[tuple[str, str], dict[bytes, _Entry]] = {}
        self.requests = 0

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()

    def _for(self, api: str, model: str) -> dict[bytes, _Entry]:
        """The entries of one API and model; counts the request and sometimes sweeps. Call under the lock."""
        entries = self._entries.setdefault((api, model), {})
        self.requests += 1
        if self.requests % SWEEP_EVERY == 0:
            now = self._clock()
            for c in self._entries.values():
                for key in [k for k, e in c.items() if e.expires <= now]:
                    del c[key]
        return entries

    def account_breakpoints(
        self,
        api: str,
        model: str,
        blocks: Sequence[Block],
        digests: Sequence[bytes],
        policy: AnthropicCachePolicy,
        *,
        breakpoints: Sequence[int] | None = None,
        tokens_through: Callable[[int], int] | None = None,
    ) -> CacheUsage:
        """Explicit caching: read and write at the blocks that carry a TTL (see the module docstring).

        ``breakpoints`` (the indexes of those blocks) and ``tokens_through`` (the prompt's tokens up to and
        including a block) spare a pass over every block when the caller keeps them (a parsed prompt does)."""
        if breakpoints is None:
            breakpoints = [i for i, b in enumerate(blocks) if b.ttl is not None]
        if tokens_through is None:
            cumulative = list(accumulate(b.tokens for b in blocks))

            def tokens_through(i: int) -> int:
                return cumulative[i] if i >= 0 else 0

        with self._lock:
            cache = self._for(api, model)
            now = self._clock()
            read_at = -1
            for p in breakpoints:
                for j in range(p, max(-1, p - policy.lookback_blocks - 1), -1):
                    entry = cache.get(digests[j])
                    if entry is not None and entry.expires > now:
                        read_at = max(read_at, j)
                        break
            read = tokens_through(read_at)
            if read_at >= 0:
                hit = cache[digests[read_at]]
                hit.expires = max(hit.expires, now + policy.ttl_seconds)
            written_to = read_at
            covered = read  # tokens cached before this request or written by it, up to the last breakpoint seen
            write_1h = 0
            for p in breakpoints:
                ttl = blocks[p].ttl
                assert ttl is not None
                entry = cache.get(digests[p])
                if entry is not None and entry.expires > now:
                    entry.expires = max(entry.expires, now + ttl)
                elif tokens_through(p) >= policy.min_tokens:
                    cache[digests[p]] = _Entry(now + ttl)
                    written_to = max(written_to, p)
                    if ttl >= policy.long_ttl_seconds:
                        write_1h += max(0, tokens_through(p) - covered)
                    covered = max(covered, tokens_through(p))
            write = tokens_through(written_to) - read if written_to > read_at else 0
        return CacheUsage(read, write, write_1h)

    def account_automatic(self, api: str, model: str, blocks: Sequence[Block], policy: OpenAICachePolicy) -> CacheUsage:
        """Automatic caching: every ``granularity``-token prefix from ``min_tokens`` up is read and stored."""
        stream = b"".join(b.data for b in blocks)
        step = policy.granularity * BYTES_PER_TOKEN
        h = hashlib.sha256(chain_seed(api, model))
        keys: list[tuple[int, bytes]] = []
        for k in range(1, len(stream) // step + 1):
            h.update(stream[(k - 1) * step : k * step])
            tokens = k * policy.granularity
            if tokens >= policy.min_tokens:
                keys.append((tokens, h.digest()))
        with self._lock:
            cache = self._for(api, model)
            now = self._clock()
            cached = 0
            for tokens, key in reversed(keys):
                entry = cache.get(key)
                if entry is not None and entry.expires > now:
                    cached = tokens
                    break
            for _, key in keys:
                cache[key] = _Entry(now + policy.ttl_seconds)
        stored = keys[-1][0] if keys else 0
        return CacheUsage(read=cached, write=max(0, stored - cached))
