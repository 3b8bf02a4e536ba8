"""Per-provider adaptive concurrency: slow start, then AIMD on overload answers (TCP's congestion control).

One :class:`AdaptiveLimiter` per provider (per process) bounds the requests in flight to it. Its limit starts
at ``initial`` and is in **slow start** until the first overload answer: each success adds one (the limit
doubles per window of successes), so a process whose sessions wait on a model for seconds reaches the
concurrency it needs in a few round trips — with one more request per window only, a thousand sessions
behind a limit of 64 would wait for hundreds of thousands of answers first. A 429 or 529 halves the limit
(never below ``minimum``) and ends slow start for good; from then a success adds ``1 / limit`` (one more
request per window of successes — congestion avoidance), up to ``maximum``. Only an overload answer to a
request that was *started* under the current limit lowers it: the burst of 429s that one overload causes
(every request already in flight) halves the limit once, not once per request. The limit grows only while it
is used — requests wait for a slot, or at least half the slots are in use when one ends (RFC 7661's test of a
validated window) — so a spell of few requests never raises it past what was tried. Waiters are served in order.

Single event loop: the limiter is asyncio-only (a fleet process runs its sessions as tasks of one loop).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from typing import Literal, TypeAlias

__all__ = ["AdaptiveLimiter", "Outcome"]

Outcome: TypeAlias = Literal["success", "overload", "other"]


class AdaptiveLimiter:
    """At most ``limit`` requests in flight; the limit adapts to overload answers (see the module docstring)."""

    def __init__(
        self,
        initial: int,
        minimum: int = 1,
        maximum: int = 1024,
        *,
        on_change: Callable[[float, int], None] | None = None,
    ) -> None:
        if not 1 <= minimum <= initial <= maximum:
            raise ValueError("AdaptiveLimiter needs 1 <= minimum <= initial <= maximum")
        self.minimum = minimum
        self.maximum = maximum
        self._limit = float(initial)
        self._slow_start = True  # until the first overload answer
        self._in_flight = 0
        self._generation = 0
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._on_change = on_change  # (limit, in flight) after every change: the metrics gauges

    @property
    def limit(self) -> int:
        return int(self._limit)

    @property
    def slow_start(self) -> bool:
        """Whether no overload answer was seen yet (each success while limited adds one to the limit)."""
        return self._slow_start

    @property
    def in_flight(self) -> int:
        return self._in_flight

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    async def acquire(self) -> int:
        """Wait for a slot; returns the generation the request starts under (give it back to :meth:`release`)."""
        if self._in_flight < self.limit and not self._waiters:
            self._in_flight += 1
            self._changed()
            return self._generation
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await waiter  # woken with a slot already counted for it
        except BaseException:
            if waiter.done() and not waiter.cancelled():  # granted a slot it will not use: give it back
                self._in_flight -= 1
                self._wake()
                self._changed()
            elif waiter in self._waiters:
                self._waiters.remove(waiter)
            raise
        return self._generation

    def release(self, generation: int, outcome: Outcome) -> None:
        """The request started under ``generation`` ended with ``outcome``."""
        limited = bool(self._waiters) or 2 * self._in_flight >= self._limit  # at least half the slots in use
        self._in_flight -= 1
        if outcome == "success":
            if limited:
                step = 1.0 if self._slow_start else 1.0 / self._limit
                self._limit = min(float(self.maximum), self._limit + step)
        elif outcome == "overload" and generation == self._generation:
            self._slow_start = False
            self._limit = max(float(self.minimum), self._limit / 2.0)
            self._generation += 1
        self._wake()
        self._changed()

    def _wake(self) -> None:
        while self._waiters and self._in_flight < self.limit:
            waiter = self._waiters.popleft()
            if not waiter.done():
                self._in_flight += 1
                waiter.set_result(None)

    def _changed(self) -> None:
        if self._on_change is not None:
            self._on_change(self._limit, self._in_flight)
