"""Prometheus metric families of every foldline process (served by :mod:`foldline.metrics_server`).

One :class:`~prometheus_client.CollectorRegistry` per process component (never the global default
registry), so tests and in-process deployments can run several components side by side. Labels are
bounded: ``provider``, ``model``, ``reason``, ``cause``, ``kind`` (an error type) and ``partition`` —
never a session id. Units are base units (tokens, seconds, events); counters end in ``_total``.
``docs/METRICS.md`` lists every metric with its meaning.

Public API::

    registry = new_registry()                       # a fresh registry with process metrics
    loop = LoopMetrics(registry)                     # what the log says about steps
    loop.observe_step(provider, model, usage)        # one model call's token usage
    loop.header_snapshot(reason)                     # a request/header appended (initial|resume|change)
    loop.compaction(); loop.trim()
    loop.cache_read_drop(provider, model, cause, lost_tokens)  # a classified drop (foldline.core.drops)
    loop = LoopMetrics(registry, prices=table)      # with a price table (foldline.config.prices): money too
    loop.observe_cost(priced)                        # one priced step: spend, saved, its drop's cost
    loop.invariant_violation()
    loop.attachment_error(kind)                      # e.g. "AttachmentNotFound"
    loop.append_fenced(session_id)                   # an append refused: a newer writer holds the session
    loop.observe_events(session_id, envelopes)       # all of the above, derived from appended events

    projector = ProjectorMetrics(registry)
    projector.projector_applied(events, seconds)     # one batch applied to the fold store
    projector.set_lag(events=..., seconds=..., partition="0")
    projector.seq_gap(); projector.fenced_write(); projector.duplicate(n); projector.fold_rebuilt()

    dispatcher = DispatcherMetrics(registry)
    dispatcher.dispatch_latency(provider, model, seconds)
    dispatcher.fold_wait(seconds)                    # waiting for the fold to reach the boundary
    dispatcher.dispatch_error(kind)                  # e.g. "ProviderError", "FoldTimeout"

    provider = ProviderMetrics(registry)             # the transport: what RetryingSender reports
    provider.retried(provider, status_class)         # a failed attempt that will be retried (4xx|5xx|transport|stream)
    provider.failed(provider, status_class)          # a request given up on
    provider.first_token(provider, stream, seconds)  # request start to the first token (unstreamed: first byte)
    provider.concurrency(provider, limit, in_flight) # the adaptive limiter's limit and requests in flight

    archiver = ArchiverMetrics(registry)
    archiver.segment_written(events, seconds)        # one segment durable and in its manifest
    archiver.set_backlog(events=..., oldest_seconds=...)  # what is buffered and not yet archived
    archiver.archive_error(kind); archiver.expired(events)  # events Kafka deleted before they were archived

A loop is measured from what it appends: :class:`~foldline.adapters.metered_log.MeteredEventLog`
wraps any event log and feeds every successful append to :meth:`LoopMetrics.observe_events` (and every
append refused with :class:`~foldline.errors.FencedError` to :meth:`LoopMetrics.append_fenced`). Steps a
dispatcher serves are logged, and so counted, by their loop. Invariant
violations are counted through the companion's ``on_violation`` hook
(``AgentOptions(on_invariant_violation=loop.invariant_violation)``).
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Final

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics
from prometheus_client.process_collector import ProcessCollector

from .core.content import Usage
from .core.cost import PricedStep, PriceTable, price_step
from .core.drops import DROP_CAUSES, DropTracker
from .core.events import (
    AttachmentQuarantine,
    CompactionEnd,
    Envelope,
    ReplaceOp,
    RequestHeader,
    ToolResult,
)
from .core.usage import TOKEN_CLASSES

__all__ = [
    "CACHE_READ_RATIO_BUCKETS",
    "LATENCY_BUCKETS",
    "ArchiverMetrics",
    "DispatcherMetrics",
    "LoopMetrics",
    "ProjectorMetrics",
    "ProviderMetrics",
    "new_registry",
]

_log = logging.getLogger("foldline.metrics")
NAMESPACE: Final = "foldline"
CACHE_READ_RATIO_BUCKETS: Final = (0.0, 0.1, 0.25, 0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.95, 0.98, 0.99, 1.0)
LATENCY_BUCKETS: Final = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
HEADER_REASONS: Final = ("initial", "resume", "change")
STATUS_CLASSES: Final = ("4xx", "5xx", "transport", "stream", "other")
TTFT_BUCKETS: Final = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
ATTACHMENT_ERROR_KINDS: Final = ("AttachmentNotFound", "AttachmentCorrupt", "AttachmentReadFailed")

disable_created_metrics()  # type: ignore[no-untyped-call]  # no ``*_created`` series: they double the exposition and no rule reads them


def new_registry(*, process: bool = True) -> CollectorRegistry:
    """A fresh registry for one process component (with the standard ``process_*`` metrics)."""
    registry = CollectorRegistry(auto_describe=True)
    if process:
        ProcessCollector(registry=registry)
    return registry


class LoopMetrics:
    """What the log says about model calls: token usage, header snapshots, compactions, drops — and, given a
    price table, what they cost (:mod:`foldline.core.cost`)."""

    def __init__(self, registry: CollectorRegistry, *, prices: PriceTable | None = None) -> None:
        self.registry = registry
        self.prices = prices
        pm = ("provider", "model")
        self.steps = Counter(
            "steps", "Loop model calls (steps) with reported usage.", pm, namespace=NAMESPACE, registry=registry
        )
        self.input_tokens = Counter(
            "step_input_tokens",
            "Uncached input tokens of loop model calls.",
            pm,
            namespace=NAMESPACE,
            registry=registry,
        )
        self.cache_read_tokens = Counter(
            "step_cache_read_tokens",
            "Input tokens read from the provider's prompt cache.",
            pm,
            namespace=NAMESPACE,
            registry=registry,
        )
        self.cache_write_tokens = Counter(
            "step_cache_write_tokens",
            "Input tokens written to the provider's prompt cache.",
            pm,
            namespace=NAMESPACE,
            registry=registry,
        )
        self.output_tokens = Counter(
            "step_output_tokens", "Output tokens of loop model calls.", pm, namespace=NAMESPACE, registry=registry
        )
        self.cache_read_ratio = Histogram(
            "step_cache_read_ratio",
            "Per step: cache-read tokens / all prompt tokens (uncached + cache read + cache write).",
            pm,
            namespace=NAMESPACE,
            registry=registry,
            buckets=CACHE_READ_RATIO_BUCKETS,
        )
        self.header_snapshots = Counter(
            "request_header_snapshots",
            "request/header snapshots appended, by reason.",
            ("reason",),
            namespace=NAMESPACE,
            registry=registry,
        )
        self.compactions = Counter(
            "compactions", "Completed compactions (compaction/end).", namespace=NAMESPACE, registry=registry
        )
        self.trims = Counter(
            "trims",
            "Tool results replaced in place (single-entry surface replace).",
            namespace=NAMESPACE,
            registry=registry,
        )
        self.drops = Counter(
            "cache_read_drops",
            "Steps whose cache-read tokens dropped against the previous loop request, by cause "
            "(see docs/METRICS.md for the definition).",
            ("cause",),
            namespace=NAMESPACE,
            registry=registry,
        )
        self.drop_tokens = Counter(
            "cache_read_drop_tokens",
            "Cache-read tokens missing against the baseline in dropped steps, by provider, model and cause.",
            ("provider", "model", "cause"),
            namespace=NAMESPACE,
            registry=registry,
        )
        self.invariant_violations = Counter(
            "invariant_violations",
            "Requests refused because they differ from their rebuild from the log.",
            namespace=NAMESPACE,
            registry=registry,
        )
        self.observation_errors = Counter(
            "metrics_observation_errors",
            "Appends whose metrics could not be derived (e.g. the log could not be read); the append itself "
            "succeeded. By error type.",
            ("kind",),
            namespace=NAMESPACE,
            registry=registry,
        )
        self.attachment_errors = Counter(
            "attachment_errors",
            "Attachments that could not be used, by error type.",
            ("kind",),
            namespace=NAMESPACE,
            registry=registry,
        )
        self.fenced_writes = Counter(
            "loop_fenced_writes",
            "Appends refused because a newer writer holds the session (this loop was fenced).",
            namespace=NAMESPACE,
            registry=registry,
        )
        self.spend = Counter(
            "spend",
            "What loop model calls cost, in the price table's currency (the currency label), by token class.",
            ("provider", "model", "token_class", "currency"),
            namespace=NAMESPACE,
            registry=registry,
        )
        self.saved = Counter(
            "saved",
            "What the prompt cache saved: the same calls with no cache read or write, minus their spend "
            "(a call whose cache writes were never read saves a negative amount; counted as 0 here, see "
            "foldline_cache_overspend_total).",
            ("provider", "model", "currency"),
            namespace=NAMESPACE,
            registry=registry,
        )
        self.overspend = Counter(
            "cache_overspend",
            "What cache writes cost beyond an uncached call, for calls where caching cost more than it saved.",
            ("provider", "model", "currency"),
            namespace=NAMESPACE,
            registry=registry,
        )
        self.drop_cost = Counter(
            "drop_cost",
            "What cache-read drops cost over reading the lost tokens from the cache, by cause.",
            ("provider", "model", "cause", "currency"),
            namespace=NAMESPACE,
            registry=registry,
        )
        self.unpriced_steps = Counter(
            "unpriced_steps",
            "Loop model calls of a model the price table has no price for (their cost is unknown, not 0).",
            pm,
            namespace=NAMESPACE,
            registry=registry,
        )
        # Export zeros from the first scrape: increase() cannot see a series' first increment, so an
        # alert on a counter that appears already at 1 would miss it.
        for reason in HEADER_REASONS:
            self.header_snapshots.labels(reason)
        for cause in DROP_CAUSES:
            self.drops.labels(cause)
        for kind in ATTACHMENT_ERROR_KINDS:
            self.attachment_errors.labels(kind)
        self._trackers: OrderedDict[str, DropTracker] = OrderedDict()
        self._lock = threading.Lock()

    # ----------------------------------------------------------------- recorders

    def observe_step(self, provider: str, model: str, usage: Usage) -> None:
        """One loop model call and its normalized usage."""
        self.steps.labels(provider, model).inc()
        self.input_tokens.labels(provider, model).inc(usage.input)
        self.cache_read_tokens.labels(provider, model).inc(usage.cache_read)
        self.cache_write_tokens.labels(provider, model).inc(usage.cache_write)
        self.output_tokens.labels(provider, model).inc(usage.output)
        prompt = usage.prompt_tokens
        if prompt:
            self.cache_read_ratio.labels(provider, model).observe(usage.cache_read / prompt)

    def observe_cost(self, priced: PricedStep) -> None:
        """One priced step: its spend by token class, what caching saved, its drop's cost by cause."""
        verdict = priced.verdict
        provider, model = verdict.provider, verdict.model
        if priced.cost is None or priced.prices is None:
            self.unpriced_steps.labels(provider, model).inc()
            return
        currency = priced.prices.currency
        for token_class in TOKEN_CLASSES:
            amount = priced.cost.by_class[token_class]
            if amount:
                self.spend.labels(provider, model, token_class, currency).inc(float(amount))
        saved = priced.cost.saved
        if saved >= 0:
            self.saved.labels(provider, model, currency).inc(float(saved))
        else:
            self.overspend.labels(provider, model, currency).inc(float(-saved))
        if verdict.drop is not None and priced.drop_cost is not None:
            self.drop_cost.labels(provider, model, verdict.drop.cause, currency).inc(float(priced.drop_cost))

    def header_snapshot(self, reason: str) -> None:
        self.header_snapshots.labels(reason).inc()

    def compaction(self) -> None:
        self.compactions.inc()

    def trim(self) -> None:
        self.trims.inc()

    def cache_read_drop(self, provider: str, model: str, cause: str, lost_tokens: int = 0) -> None:
        """A classified drop (:mod:`foldline.core.drops`) and the cache-read tokens it lost."""
        if cause not in DROP_CAUSES:
            raise ValueError(f"unknown drop cause {cause!r}; expected one of {', '.join(DROP_CAUSES)}")
        self.drops.labels(cause).inc()
        self.drop_tokens.labels(provider, model, cause).inc(max(0, lost_tokens))

    def invariant_violation(self) -> None:
        self.invariant_violations.inc()

    def attachment_error(self, kind: str) -> None:
        self.attachment_errors.labels(kind).inc()

    def append_fenced(self, session_id: str) -> None:
        """An append to ``session_id`` was refused: a newer writer holds the session."""
        self.fenced_writes.inc()

    def observation_failed(self, session_id: str, exc: BaseException) -> None:
        """Deriving metrics from an append failed: count it, log it, and re-read the session next time."""
        with self._lock:
            self._trackers.pop(session_id, None)
        self.observation_errors.labels(type(exc).__name__).inc()
        _log.warning("metrics for an append to session %r not recorded: %s: %s", session_id, type(exc).__name__, exc)

    # ----------------------------------------------------------------- from the log

    def observe_events(
        self,
        session_id: str,
        envelopes: Sequence[Envelope],
        *,
        history: Callable[[int, int], Sequence[Envelope]] | None = None,
        capacity: int = 4096,
    ) -> None:
        """Derive every loop metric from events this process just appended to ``session_id`` (in seq order).

        Step usage is labelled with the provider/model of the header in force; drops are classified
        by :class:`foldline.core.drops.DropTracker`, kept per session (the ``capacity`` most recent).
        Events written by other processes in between (e.g. a dispatcher's answers, another loop's
        turns) are read with ``history(from_seq, to_seq)`` — only the missing range, or the whole
        prefix for a session not tracked yet — and only advance the tracker: whoever appended them
        counts them. Without ``history`` such a gap is an error. The session id never becomes a label.
        """
        if not envelopes:
            return
        first = envelopes[0].seq
        with self._lock:
            tracker = self._trackers.get(session_id)
            if tracker is None or tracker.next_seq > first:
                tracker = DropTracker(session_id)
            if tracker.next_seq < first:
                if history is None:
                    raise ValueError(
                        f"session {session_id!r}: events start at seq {first} but seq {tracker.next_seq}.. were not "
                        "observed and no history was given to read them from"
                    )
                for _ in tracker.feed(history(tracker.next_seq, first)):
                    pass  # counted by the process that appended them
            self._trackers[session_id] = tracker
            self._trackers.move_to_end(session_id)
            while len(self._trackers) > capacity:
                self._trackers.popitem(last=False)
            verdicts = list(tracker.feed(envelopes))
        for env in envelopes:
            data = env.data
            if isinstance(data, RequestHeader):
                self.header_snapshot(data.reason)
            elif isinstance(data, CompactionEnd):
                self.compaction()
            elif isinstance(data, ToolResult) and isinstance(op := data.surface_op, ReplaceOp) and op.start == op.end:
                self.trim()
            elif isinstance(data, AttachmentQuarantine):
                self.attachment_error(data.failure.split(":", 1)[0] or "unknown")
        for verdict in verdicts:
            self.observe_step(verdict.provider, verdict.model, verdict.step.usage)
            if verdict.drop is not None:
                self.cache_read_drop(verdict.provider, verdict.model, verdict.drop.cause, verdict.drop.lost_tokens)
            if self.prices is not None:
                self.observe_cost(price_step(verdict, self.prices))


class ProjectorMetrics:
    """A projector process: fold applies, lag, seq gaps, fenced writes."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.events_applied = Counter(
            "projector_events_applied",
            "Events applied to folds (redeliveries excluded).",
            namespace=NAMESPACE,
            registry=registry,
        )
        self.batches_applied = Counter(
            "projector_batches_applied",
            "Batches applied atomically to the fold store.",
            namespace=NAMESPACE,
            registry=registry,
        )
        self.apply_seconds = Histogram(
            "projector_apply_duration_seconds",
            "Time to apply one batch to the fold store.",
            namespace=NAMESPACE,
            registry=registry,
            buckets=LATENCY_BUCKETS,
        )
        self.lag_events = Gauge(
            "projector_lag_events",
            "Events in the log not yet applied (end offset - committed), per partition.",
            ("partition",),
            namespace=NAMESPACE,
            registry=registry,
        )
        self.lag_seconds = Gauge(
            "projector_lag_seconds",
            "Age of the newest applied event when it was applied, per partition.",
            ("partition",),
            namespace=NAMESPACE,
            registry=registry,
        )
        self.seq_gaps = Counter(
            "projector_seq_gaps",
            "Seq gaps detected (an event arrived past the fold's next seq).",
            namespace=NAMESPACE,
            registry=registry,
        )
        self.fenced_writes = Counter(
            "projector_fenced_writes",
            "Fold writes refused because a newer writer epoch owns the session.",
            namespace=NAMESPACE,
            registry=registry,
        )
        self.duplicates = Counter(
            "projector_duplicate_events",
            "Redelivered events recognised by seq and skipped.",
            namespace=NAMESPACE,
            registry=registry,
        )
        self.fold_rebuilds = Counter(
            "projector_fold_rebuilds",
            "Session folds rebuilt (surface replace, missing fold, --rebuild).",
            namespace=NAMESPACE,
            registry=registry,
        )

    def projector_applied(self, events: int, seconds: float) -> None:
        """One batch of ``events`` events applied in ``seconds``."""
        self.batches_applied.inc()
        self.events_applied.inc(events)
        self.apply_seconds.observe(seconds)

    def set_lag(self, *, events: int, seconds: float, partition: str = "all") -> None:
        self.lag_events.labels(partition).set(events)
        self.lag_seconds.labels(partition).set(seconds)

    def seq_gap(self, count: int = 1) -> None:
        self.seq_gaps.inc(count)

    def fenced_write(self) -> None:
        self.fenced_writes.inc()

    def duplicate(self, count: int = 1) -> None:
        self.duplicates.inc(count)

    def fold_rebuilt(self) -> None:
        self.fold_rebuilds.inc()


class DispatcherMetrics:
    """A dispatcher process: how long steps take, how long they wait for their fold, and what fails.

    A dispatcher appends nothing to the log: the steps, tokens and drops of the steps it serves are counted
    by the loop that logs them (:class:`LoopMetrics` through
    :class:`~foldline.adapters.metered_log.MeteredEventLog`)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.dispatch_seconds = Histogram(
            "dispatch_duration_seconds",
            "A handed-over send: the provider call of one attempt, per provider and model.",
            ("provider", "model"),
            namespace=NAMESPACE,
            registry=registry,
            buckets=LATENCY_BUCKETS,
        )
        self.fold_wait_seconds = Histogram(
            "dispatcher_fold_wait_seconds",
            "Time waiting for the fold to reach the step boundary.",
            namespace=NAMESPACE,
            registry=registry,
            buckets=LATENCY_BUCKETS,
        )
        self.errors = Counter(
            "dispatch_errors",
            "Dispatches that failed, by error type.",
            ("kind",),
            namespace=NAMESPACE,
            registry=registry,
        )

    def dispatch_latency(self, provider: str, model: str, seconds: float) -> None:
        self.dispatch_seconds.labels(provider, model).observe(seconds)

    def fold_wait(self, seconds: float) -> None:
        self.fold_wait_seconds.observe(seconds)

    def dispatch_error(self, kind: str | BaseException) -> None:
        """Count a failed dispatch; pass the exception or its type name (e.g. ``"ProviderError"``)."""
        self.errors.labels(kind if isinstance(kind, str) else type(kind).__name__).inc()


class ProviderMetrics:
    """The provider transport of a process (loop or dispatcher): retries and failures by provider and status
    class, time to first token, requests in flight and the adaptive concurrency limit. It is the
    :class:`~foldline.providers.retry.TransportObserver` a :class:`~foldline.providers.retry.RetryingSender`
    reports to. Labels: ``provider``, ``status_class`` (4xx | 5xx | transport | stream | other) and ``stream``."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.retries = Counter(
            "provider_retries",
            "Failed provider attempts that were retried (each is an llm/retry event in the session log).",
            ("provider", "status_class"),
            namespace=NAMESPACE,
            registry=registry,
        )
        self.failures = Counter(
            "provider_failures",
            "Provider requests given up on (final failure or retries exhausted).",
            ("provider", "status_class"),
            namespace=NAMESPACE,
            registry=registry,
        )
        self.ttft = Histogram(
            "provider_time_to_first_token_seconds",
            "From a successful attempt's start to its first token (unstreamed answers: their first byte).",
            ("provider", "stream"),
            namespace=NAMESPACE,
            registry=registry,
            buckets=TTFT_BUCKETS,
        )
        self.in_flight = Gauge(
            "provider_requests_in_flight",
            "Provider requests being sent or answered right now.",
            ("provider",),
            namespace=NAMESPACE,
            registry=registry,
        )
        self.limit = Gauge(
            "provider_concurrency_limit",
            "The adaptive concurrency limit of each provider (halves on 429/529, grows back on success).",
            ("provider",),
            namespace=NAMESPACE,
            registry=registry,
        )

    def retried(self, provider: str, status_class: str) -> None:
        self.retries.labels(provider, status_class).inc()

    def failed(self, provider: str, status_class: str) -> None:
        self.failures.labels(provider, status_class).inc()

    def first_token(self, provider: str, stream: bool, seconds: float) -> None:
        self.ttft.labels(provider, "true" if stream else "false").observe(max(0.0, seconds))

    def concurrency(self, provider: str, limit: float, in_flight: int) -> None:
        self.limit.labels(provider).set(int(limit))
        self.in_flight.labels(provider).set(in_flight)


class ArchiverMetrics:
    """An archiver process: segments written, the backlog not yet archived, events lost to retention."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.events_archived = Counter(
            "archive_events",
            "Events written to the archive (in segments their manifests list).",
            namespace=NAMESPACE,
            registry=registry,
        )
        self.segments = Counter(
            "archive_segments",
            "Segments made durable and committed to their session's manifest.",
            namespace=NAMESPACE,
            registry=registry,
        )
        self.segment_seconds = Histogram(
            "archive_segment_duration_seconds",
            "Time to archive one segment (intent, object, commit).",
            namespace=NAMESPACE,
            registry=registry,
            buckets=LATENCY_BUCKETS,
        )
        self.backlog_events = Gauge(
            "archive_backlog_events",
            "Events read by this archiver and not yet archived.",
            namespace=NAMESPACE,
            registry=registry,
        )
        self.oldest_seconds = Gauge(
            "archive_oldest_unarchived_seconds",
            "Age of the oldest event this archiver read and has not archived yet (0 when none).",
            namespace=NAMESPACE,
            registry=registry,
        )
        self.errors = Counter(
            "archive_errors",
            "Segment writes that failed (retried), by error type.",
            ("kind",),
            namespace=NAMESPACE,
            registry=registry,
        )
        self.expired_events = Counter(
            "archive_expired_events",
            "Events Kafka deleted before they were archived (the retention outran the archiver).",
            namespace=NAMESPACE,
            registry=registry,
        )
        self.merges = Counter(
            "archive_merges",
            "Merges committed: adjacent segments of a session replaced by one holding their events.",
            namespace=NAMESPACE,
            registry=registry,
        )
        self.merged_events = Counter(
            "archive_merged_events",
            "Events written again into merged segments (the archive's write amplification beside archive_events).",
            namespace=NAMESPACE,
            registry=registry,
        )
        self.retired_deleted = Counter(
            "archive_retired_deleted",
            "Segments merges replaced, deleted once their grace period was over.",
            namespace=NAMESPACE,
            registry=registry,
        )

    def merged(self, merges: int, events: int) -> None:
        self.merges.inc(merges)
        self.merged_events.inc(events)

    def segment_written(self, events: int, seconds: float) -> None:
        self.segments.inc()
        self.events_archived.inc(events)
        self.segment_seconds.observe(seconds)

    def set_backlog(self, *, events: int, oldest_seconds: float) -> None:
        self.backlog_events.set(events)
        self.oldest_seconds.set(oldest_seconds)

    def archive_error(self, kind: str) -> None:
        self.errors.labels(kind).inc()

    def expired(self, events: int) -> None:
        self.expired_events.inc(events)
