"""Retries that keep the promise: every attempt sends the same bytes, and every failed attempt is logged first.

:class:`RetryingSender` makes the attempts of one request through a :class:`~foldline.providers.base.Provider`
(one ``send`` per attempt, always the same ``body`` object — the bytes whose digest the log holds), under the
provider's :class:`~foldline.providers.limiter.AdaptiveLimiter`. After a failed attempt it builds a
:class:`FailedAttempt` and calls ``on_failed_attempt`` with it *before* waiting, so whoever owns the session
log appends it (an ``llm/retry`` event) before the wait and the log explains the latency and the cost. The
last failed attempt of a request that is given up on is reported too, with no wait.

What is retried (:func:`retry_decision`), following the providers' own rules (the official SDKs do the same):

* an answer with ``x-should-retry: true`` — always; ``x-should-retry: false`` — never;
* 408, 409, 429 and every 5xx (529 included), unless the answer marks itself final (a 429 that is a quota or
  spend limit; a context window overflow) — 400, 401, 403, 404, 413, 422 are never retried;
* a transport failure (connect, reset, timeout) *before any answer byte* arrived; after the first byte the
  request reached the model and an answer was under way, so it is not resent — except a streamed answer cut
  in the middle (the connection broke after its first byte, or the stream ended before its final event)
  while ``TransportSettings.retry_cut_streams`` is on (the default, :func:`cut_stream`): nothing of it was
  logged as an answer or acted on, so the same bytes are sent again as one more attempt;
* a stream's ``error`` event of a transient type (overloaded, internal error, rate limit): the provider ended
  the answer itself and says it may be tried again. A stream that is malformed, of an unknown event type,
  over the size limit or ends before its final event is never retried.

How long to wait: the answer's ``retry-after-ms`` / ``retry-after`` when it gives one (a wait longer than
``max_retry_after_s`` is not waited for: the request is given up), else exponential backoff —
``initial_backoff_s · 2^(n-1)`` capped at ``max_backoff_s``, times a jitter drawn from ``[1 - jitter, 1]``.
At most ``max_attempts`` attempts, and none that would start after ``retry_deadline_s`` from the first.
A request given up on after retryable failures raises :class:`~foldline.errors.RetriesExhausted` (the last
failure as its cause); a final failure raises as it is.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

from ..errors import (
    AnswerTooLarge,
    ProviderError,
    ProviderStatusError,
    ProviderStreamError,
    ProviderTransportError,
    RetriesExhausted,
)
from .base import Body, Provider, ProviderResponse
from .limiter import AdaptiveLimiter, Outcome
from .settings import TransportSettings
from .streaming import AnswerProgress

__all__ = ["FailedAttempt", "RetryingSender", "TransportObserver", "cut_stream", "retry_decision", "status_class"]


@dataclass(frozen=True, slots=True)
class FailedAttempt:
    """One failed attempt: what the ``llm/retry`` event records. ``wait_s`` is None when it was the last."""

    attempt: int
    error_type: str
    status: int | None
    wait_s: float | None
    request_id: str | None
    received_bytes: int

    @property
    def wait_ms(self) -> int | None:
        return None if self.wait_s is None else round(self.wait_s * 1000)


class TransportObserver(Protocol):
    """Where the sender reports what metrics need (:class:`foldline.metrics.ProviderMetrics` implements it)."""

    def retried(self, provider: str, status_class: str) -> None: ...

    def failed(self, provider: str, status_class: str) -> None: ...

    def first_token(self, provider: str, stream: bool, seconds: float) -> None: ...

    def concurrency(self, provider: str, limit: float, in_flight: int) -> None: ...


def status_class(exc: BaseException) -> str:
    """A bounded label for a failure: ``4xx``, ``5xx``, ``transport``, ``stream`` or ``other``."""
    if isinstance(exc, ProviderStatusError):
        return f"{exc.status // 100}xx"
    if isinstance(exc, ProviderTransportError):
        return "transport"
    if isinstance(exc, ProviderStreamError | AnswerTooLarge):
        return "stream"
    return "other"


def retry_decision(exc: BaseException) -> bool:
    """Whether the provider allows sending the same bytes again after ``exc`` (see the module docstring): a
    provider's failure that is :attr:`~foldline.errors.FoldlineError.transient` — the error tree holds the
    rules, each failure applying them to what its answer said."""
    return isinstance(exc, ProviderError) and exc.transient


def cut_stream(exc: BaseException) -> bool:
    """Whether ``exc`` is a streamed answer cut in the middle: the connection failed after answer bytes had
    arrived, or the stream ended cleanly before its final event. The model had begun answering; what arrived
    was not logged as an answer and nothing acted on it."""
    if isinstance(exc, ProviderTransportError):
        return exc.received_bytes > 0
    return isinstance(exc, ProviderStreamError) and exc.error_type == "incomplete-stream"


def _describe(exc: BaseException, progress: AnswerProgress) -> tuple[str, int | None, str | None, int]:
    """(error type, status, provider request id, answer bytes received) of a failed attempt."""
    if isinstance(exc, ProviderStatusError):
        return exc.error_type or f"http-{exc.status}", exc.status, exc.request_id, progress.received_bytes
    if isinstance(exc, ProviderTransportError):
        return exc.error_type, None, progress.request_id, exc.received_bytes
    if isinstance(exc, ProviderStreamError):
        return exc.error_type, None, exc.request_id or progress.request_id, exc.received_bytes
    if isinstance(exc, AnswerTooLarge):
        return "answer-too-large", None, progress.request_id, exc.received_bytes
    return type(exc).__name__, None, progress.request_id, progress.received_bytes


class RetryingSender:
    """Sends one request's bytes until an answer arrives, the provider says stop, or the budget runs out.

    One instance per process, shared by every session: it keeps one limiter per provider name. ``sleep``,
    ``clock`` (monotonic seconds) and ``rng`` are injectable for tests.
    """

    def __init__(
        self,
        settings: TransportSettings | None = None,
        *,
        observer: TransportObserver | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
    ) -> None:
        self.settings = settings if settings is not None else TransportSettings()
        self.observer = observer
        self._sleep = sleep
        self._clock = clock
        self._rng = rng if rng is not None else random.Random()
        self._limiters: dict[str, AdaptiveLimiter] = {}

    def limiter(self, provider: str) -> AdaptiveLimiter:
        """The concurrency limiter of ``provider`` (created on first use)."""
        limiter = self._limiters.get(provider)
        if limiter is None:
            s = self.settings
            observer = self.observer

            def report(limit: float, in_flight: int) -> None:
                if observer is not None:
                    observer.concurrency(provider, limit, in_flight)

            limiter = self._limiters[provider] = AdaptiveLimiter(
                s.initial_limit, s.concurrency_min, s.concurrency_max, on_change=report
            )
        return limiter

    def backoff(self, attempt: int) -> float:
        """The wait after failed attempt ``attempt`` (1-based) when the answer names none."""
        return self.settings.backoff.pause(attempt, self._rng)

    async def send(
        self,
        provider: Provider,
        body: Body,
        *,
        stream: bool = False,
        on_failed_attempt: Callable[[FailedAttempt], Awaitable[None] | None] | None = None,
        progress: AnswerProgress | None = None,
    ) -> ProviderResponse:
        """The answer to ``body``, after as many attempts as allowed; every attempt posts these very bytes."""
        s = self.settings
        progress = progress if progress is not None else AnswerProgress()
        limiter = self.limiter(provider.name)
        first = self._clock()
        attempt = 0
        while True:
            attempt += 1
            progress.begin(attempt)
            generation = await limiter.acquire()
            outcome: Outcome = "other"
            failure: ProviderError | None = None
            try:
                response = await provider.send(body, stream=stream, progress=progress)
                outcome = "success"
            except ProviderError as exc:
                if isinstance(exc, ProviderStatusError) and exc.status in (429, 529):
                    outcome = "overload"
                failure = exc
            finally:
                limiter.release(generation, outcome)
            if failure is None:
                self._first_token(provider.name, stream, progress)
                return response
            retryable = retry_decision(failure) or (stream and s.retry_cut_streams and cut_stream(failure))
            wait = self._wait(failure, attempt) if retryable else None
            if wait is not None and (attempt >= s.max_attempts or self._clock() + wait - first > s.retry_deadline_s):
                wait = None
            error_type, status, request_id, received = _describe(failure, progress)
            if on_failed_attempt is not None:  # before the wait: the attempt is recorded before the next leaves
                recorded = on_failed_attempt(FailedAttempt(attempt, error_type, status, wait, request_id, received))
                if recorded is not None:
                    await recorded
            label = status_class(failure)
            if wait is None:
                if self.observer is not None:
                    self.observer.failed(provider.name, label)
                if retryable:
                    raise RetriesExhausted(
                        f"{provider.name}: gave up after {attempt} attempt(s) "
                        f"(max_attempts {s.max_attempts}, deadline {s.retry_deadline_s:g} s): {failure}",
                        attempts=attempt,
                    ) from failure
                raise failure
            if self.observer is not None:
                self.observer.retried(provider.name, label)
            await self._sleep(wait)

    def _wait(self, failure: ProviderError, attempt: int) -> float | None:
        """The wait before the next attempt, or None when the answer asks for more than we wait."""
        asked = failure.retry_after if isinstance(failure, ProviderStatusError) else None
        if asked is None:
            return self.backoff(attempt)
        if asked > self.settings.max_retry_after_s:
            return None
        return asked

    def _first_token(self, provider: str, stream: bool, progress: AnswerProgress) -> None:
        if self.observer is None:
            return
        at = progress.first_token_at if stream else progress.first_byte_at
        if at is not None:
            self.observer.first_token(provider, stream, at - progress.started_at)
