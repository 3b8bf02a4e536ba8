"""How foldline talks HTTP to model providers: pool, timeouts, HTTP/2, retries, concurrency, answer size.

:class:`TransportSettings` is one frozen value with an explicit default for every field, so a central
configuration can carry it as one section and a test can state exactly what it changes. The defaults are
sized for a fleet process: at least 1,000 requests in flight over one connection pool.

Why these values (httpx's own defaults, checked in the installed httpx 0.28, are a 100-connection pool with
20 keep-alive connections kept 5 s, HTTP/1.1, and one 5 s timeout for connect, read, write and pool — far
too small for a fleet and far too short for a model answer):

* ``max_connections`` / ``max_keepalive_connections`` 1,100: room for ``concurrency_max`` (1,024) requests
  plus the slack of connections still closing, split over ``pool_shards`` (32) independent httpx pools: httpcore
  matches waiting requests to connections by scanning both on every request start and end, which costs
  O(connections * requests) — measured, 90% of a loop process's CPU at 1,000 sessions over HTTP/1.1 in one
  pool. Thirty-two pools of ~35 connections each, a request going to the one with the fewest in flight, cut
  that share to about a tenth (docs/BENCHMARKS.md, transport). With HTTP/2 (``http2``, on by default; it needs the
  ``h2`` package that ``httpx[http2]`` installs) one connection multiplexes many requests, so the pool is
  rarely the limit against HTTPS providers; over plain ``http://`` (the emulator) httpx speaks HTTP/1.1.
* ``connect_timeout_s`` 10 s: a provider that does not accept a connection in 10 s is down for us; the
  attempt fails before any byte and is retried.
* ``read_timeout_s`` 600 s: the longest silence allowed between two bytes of an answer. A streamed answer
  sends bytes (events, pings) all along, so this only fires on a stalled stream; an unstreamed answer sends
  nothing until it is complete, which is why long answers should stream (``CallConfig.stream``).
* ``write_timeout_s`` 60 s for sending a body; ``pool_timeout_s`` 60 s waiting for a free connection.
* Retries (see :mod:`foldline.providers.retry`): ``max_attempts`` 8 in all, exponential backoff from
  ``initial_backoff_s`` 0.5 s doubling to ``max_backoff_s`` 8 s (the official SDKs use the same two
  numbers), each wait multiplied by a jitter in ``[1 - jitter, 1]`` (0.25, as the SDKs do), a provider's
  ``retry-after`` honoured up to ``max_retry_after_s`` 120 s (a longer one is not retried), and no attempt
  started after ``retry_deadline_s`` 900 s from the first.
* Concurrency per provider (see :mod:`foldline.providers.limiter`): starts at ``concurrency_initial`` — unset,
  the ceiling ``concurrency_max`` (1,024) — and grows per success while in slow start, until the first
  429/529, which halves it (never below ``concurrency_min``); from then it grows back by one per window of
  successes, up to ``concurrency_max``. Starting at the ceiling: a provider says when a process asks too much
  (one 429 burst halves the limit once), while a start below the fleet's size made the sessions behind a
  model of seconds wait one answer time per doubling (docs/TRANSPORT.md).
* ``max_answer_bytes`` 64 MiB: an answer (streamed or not) larger than this is refused with a typed error.
* ``log_chunks`` off: when on, every server-sent event of a streamed answer is appended to the session log
  as an ``assistant/chunk`` event.
* ``retry_cut_streams`` on: a streamed answer whose connection breaks after its first byte (or that ends
  before its final event) is sent again — the same bytes, as one more logged attempt under the limits above.
  Nothing of a cut answer was logged as an answer or acted on, so the request is as unanswered as before it
  left; the provider bills the output it had streamed (docs/TRANSPORT.md, "A stream cut in the middle").
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import httpx

from ..backoff import Backoff

__all__ = ["ShardedTransport", "TransportSettings"]


@dataclass(frozen=True, slots=True)
class TransportSettings:
    """Pool, timeouts, HTTP/2, retry policy, adaptive concurrency and answer limits of provider requests."""

    connect_timeout_s: float = 10.0
    read_timeout_s: float = 600.0
    write_timeout_s: float = 60.0
    pool_timeout_s: float = 60.0
    max_connections: int = 1100
    max_keepalive_connections: int = 1100
    keepalive_expiry_s: float = 30.0
    pool_shards: int = 32
    http2: bool = True
    max_attempts: int = 8
    initial_backoff_s: float = 0.5
    max_backoff_s: float = 8.0
    jitter: float = 0.25
    max_retry_after_s: float = 120.0
    retry_deadline_s: float = 900.0
    concurrency_initial: int | None = None  # None: start at concurrency_max
    concurrency_min: int = 1
    concurrency_max: int = 1024
    max_answer_bytes: int = 64 * 1024 * 1024
    log_chunks: bool = False
    retry_cut_streams: bool = True

    def __post_init__(self) -> None:
        positive = {
            "connect_timeout_s": self.connect_timeout_s,
            "read_timeout_s": self.read_timeout_s,
            "write_timeout_s": self.write_timeout_s,
            "pool_timeout_s": self.pool_timeout_s,
            "max_connections": self.max_connections,
            "pool_shards": self.pool_shards,
            "max_attempts": self.max_attempts,
            "concurrency_min": self.concurrency_min,
            "max_answer_bytes": self.max_answer_bytes,
            "retry_deadline_s": self.retry_deadline_s,
        }
        for name, value in positive.items():
            if value <= 0:
                raise ValueError(f"TransportSettings.{name} must be positive, got {value!r}")
        if not 0 <= self.jitter < 1:
            raise ValueError(f"TransportSettings.jitter must be within [0, 1), got {self.jitter!r}")
        if not 0 < self.initial_backoff_s <= self.max_backoff_s:
            raise ValueError("TransportSettings needs 0 < initial_backoff_s <= max_backoff_s")
        if not self.concurrency_min <= self.initial_limit <= self.concurrency_max:
            raise ValueError("TransportSettings needs concurrency_min <= concurrency_initial <= concurrency_max")
        if self.max_keepalive_connections > self.max_connections:
            raise ValueError("TransportSettings.max_keepalive_connections cannot exceed max_connections")

    @property
    def initial_limit(self) -> int:
        """The limit a provider's concurrency starts at: ``concurrency_initial``, or the ceiling when unset."""
        return self.concurrency_max if self.concurrency_initial is None else self.concurrency_initial

    @property
    def backoff(self) -> Backoff:
        """The wait after a failed attempt whose answer names none: ``initial_backoff_s`` doubling to
        ``max_backoff_s``, each cut at random by up to ``jitter`` of it."""
        return Backoff(self.initial_backoff_s, self.max_backoff_s, jitter=self.jitter)

    def timeout(self) -> httpx.Timeout:
        """Separate connect, read, write and pool timeouts."""
        return httpx.Timeout(
            connect=self.connect_timeout_s,
            read=self.read_timeout_s,
            write=self.write_timeout_s,
            pool=self.pool_timeout_s,
        )

    def limits(self) -> httpx.Limits:
        """The limits of one pool shard (the totals divided over ``pool_shards``, rounded up)."""
        shards = self.pool_shards
        return httpx.Limits(
            max_connections=-(-self.max_connections // shards),
            max_keepalive_connections=-(-self.max_keepalive_connections // shards),
            keepalive_expiry=self.keepalive_expiry_s,
        )

    def http_transport(self) -> httpx.AsyncBaseTransport:
        """The network transport these settings describe: ``pool_shards`` pools with the limits above and
        HTTP/2; httpx's own retries off (foldline's retry layer decides, and logs every attempt)."""
        pools = [
            httpx.AsyncHTTPTransport(limits=self.limits(), http2=self.http2, retries=0) for _ in range(self.pool_shards)
        ]
        return pools[0] if len(pools) == 1 else ShardedTransport(pools)


class ShardedTransport(httpx.AsyncBaseTransport):
    """Several httpx transports (connection pools) as one: each request goes to the pool with the fewest
    requests in flight. Single event loop."""

    def __init__(self, pools: list[httpx.AsyncHTTPTransport]) -> None:
        if not pools:
            raise ValueError("a sharded transport needs at least one pool")
        self.pools = pools
        self._in_flight = [0] * len(pools)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        counts = self._in_flight
        index = counts.index(min(counts))
        counts[index] += 1
        try:
            response = await self.pools[index].handle_async_request(request)
        except BaseException:
            counts[index] -= 1
            raise
        return httpx.Response(
            response.status_code,
            headers=response.headers,
            stream=_Released(response.stream, lambda: counts.__setitem__(index, counts[index] - 1)),
            extensions=response.extensions,
        )

    async def aclose(self) -> None:
        for pool in self.pools:
            await pool.aclose()


class _Released(httpx.AsyncByteStream):
    """A response body that gives its pool's slot back once it is closed."""

    def __init__(self, inner: httpx.AsyncByteStream | httpx.SyncByteStream, release: Callable[[], None]) -> None:
        self._inner = inner
        self._release: Callable[[], None] | None = release

    async def __aiter__(self) -> AsyncIterator[bytes]:
        assert isinstance(self._inner, httpx.AsyncByteStream)
        async for chunk in self._inner:
            yield chunk

    async def aclose(self) -> None:
        try:
            if isinstance(self._inner, httpx.AsyncByteStream):
                await self._inner.aclose()
        finally:
            if self._release is not None:
                self._release()
                self._release = None
