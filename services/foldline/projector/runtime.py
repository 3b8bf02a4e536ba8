"""The projector runtime base: what both consumer runtimes (confluent-kafka and faust) do, written once.

:class:`ProjectorRuntime` builds the adapters a projector works with unless they are given (the fold
store and the event log through :mod:`foldline.config.factories`, the :class:`~.fold_apply.BatchProjector`,
the dead-letter writer) and owns:

* **the apply-retry loop** — a checked batch is applied with :meth:`BatchProjector.project`; a fold-store
  outage (:class:`~foldline.errors.StoreUnavailable`) keeps the batch and retries it with backoff (50 ms
  doubling up to 2 s), not ready meanwhile; nothing of the batch may be acknowledged until it applied.
  :meth:`ProjectorRuntime._apply_until_done` runs it on the caller's thread,
  :meth:`ProjectorRuntime._apply_until_done_async` on an asyncio loop (the apply itself on a thread);
* **the one dead-letter path** — records the checks refuse and events the store refuses as stale
  (``fenced``) are written by the same :class:`~foldline.adapters.kafka.DeadLetterWriter`: the original
  key, value bytes and headers plus the ``fl-dlq-*`` headers (docs/KAFKA.md). A stale event's record
  is read back from the topic by its partition and offset, so no runtime keeps consumed records past
  the checks;
* **readiness** — assigned partitions (possibly none), the fold store applying, not stopping, no failure
  (``/readyz``), and the one-time ``on_ready`` announcement;
* **lag and totals** — per partition, from its end offset and how far the runtime got; the metrics server;
* **a fold store that lost its data** — each assigned partition carries a mark beside the folds
  (:class:`~foldline.ports.partition_marks.PartitionMarks`), checked about every second
  (:meth:`ProjectorRuntime._check_marks`).
  A store that lost its data (Redis flushed, or restarted without persistence) lost the marks with the
  folds; a partition the group already consumed past its start is then re-read from its start up to its
  end — on a thread of its own, while the group's consumption goes on — and folded again (the folds
  apply from seq 0; a session whose first events Kafka no longer holds meets a gap and is rebuilt from
  the log and its archive). Only then is the partition marked ``done``. A partition whose mark vanished
  again meanwhile is re-read again.

Each runtime subclasses it and feeds it from its own consumer: :mod:`.confluent_runtime` (the default)
and :mod:`.faust_runtime`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Generic, Self, TypedDict, TypeVar

from ..adapters.kafka import (
    ConsumedEvent,
    ConsumedItem,
    DeadLetterWriter,
    KafkaClients,
    KafkaEventLog,
    RecordChecker,
    archive_progress,
    dlq_topic,
    fetch_records,
    read_partition_span,
    wait_for_topic,
)
from ..backoff import OUTAGE, Pauses
from ..config import Config
from ..config.factories import content_sealer, fold_store, kafka_log, partition_marks
from ..errors import FencedError, StoreUnavailable, TransientError
from ..ports.event_log import EventLog
from ..ports.fold_store import FoldStore
from ..ports.partition_marks import PartitionMarks
from .fold_apply import BatchProjector, BatchReport

if TYPE_CHECKING:
    from ..metrics import ProjectorMetrics
    from ..metrics_server import HealthServer

__all__ = ["ProjectorRuntime", "RuntimeOptions", "WorkerSettings"]

_LOG = logging.getLogger("foldline.projector")
_MARKS_EVERY_S = 1.0  # how often the partition marks are checked
MARK_DONE = "done"  # a partition's mark: the store holds the folds of everything the group consumed there


@dataclass(frozen=True, slots=True)
class WorkerSettings:
    """A projector's configuration — where it reads from and writes to, how it batches, its metrics
    endpoint, all in ``config`` (:class:`~foldline.config.Config`) — and two knobs of its own."""

    config: Config
    journal: bool = False  # keep the fold store's change journal (audits, crash tests)
    # a poll returns with its first record (consume_ready), so this bounds only an idle poll: how often an
    # idle projector wakes (its marks, lag and stop checks)
    poll_timeout_s: float = 0.1

    @property
    def bootstrap(self) -> str:
        return self.config.kafka.bootstrap

    @property
    def topic(self) -> str:
        return self.config.kafka.topic

    @property
    def group(self) -> str:
        return self.config.kafka.group

    @property
    def partitions(self) -> int:
        return self.config.kafka.partitions  # the topic's partition count (checked by the event log)

    @property
    def max_batch(self) -> int:
        return self.config.projector.max_batch  # records per poll and per apply

    @property
    def commit_interval_s(self) -> float:
        return self.config.projector.commit_interval_s  # offset commits at most this often, after the apply

    @property
    def registry_url(self) -> str | None:
        return self.config.kafka.registry_url

    @property
    def client_config(self) -> Mapping[str, str]:
        return self.config.kafka.librdkafka()  # librdkafka properties of every client, security included

    @property
    def metrics_port(self) -> int | None:
        return self.config.metrics.port  # serve /metrics, /healthz, /readyz (0 picks a free port)

    @property
    def metrics_host(self) -> str:
        return self.config.metrics.host


_R = TypeVar("_R", bound="ProjectorRuntime")


class RuntimeOptions(TypedDict, Generic[_R], total=False):
    """The keyword arguments of :class:`ProjectorRuntime`, for a runtime that adds its own."""

    store: FoldStore | None
    marks: PartitionMarks | None
    log: EventLog | None
    projector: BatchProjector | None
    metrics: ProjectorMetrics | None
    on_batch: Callable[[BatchReport], None] | None
    on_ready: Callable[[_R], None] | None


class ProjectorRuntime(ABC):
    """One projector: a consumer-group member folding the topic into the fold store; see the module docstring.

    ``store`` and ``log`` (or a ready ``projector``, which brings both) and the partition ``marks`` (which must
    live with the store's folds) are built from ``settings.config`` by the adapter factories
    (:mod:`foldline.config.factories`) when not given, and then closed by the runtime.
    ``on_batch`` sees every applied batch's report; ``on_ready`` is called once, the first time the runtime
    is ready.
    """

    runtime_name: ClassVar[str]
    _on_ready: Callable[[Self], None] | None

    def __init__(
        self,
        settings: WorkerSettings,
        *,
        store: FoldStore | None = None,
        marks: PartitionMarks | None = None,
        log: EventLog | None = None,
        projector: BatchProjector | None = None,
        metrics: ProjectorMetrics | None = None,
        on_batch: Callable[[BatchReport], None] | None = None,
        on_ready: Callable[[Self], None] | None = None,
    ) -> None:
        self.settings = settings
        self._owns_store = store is None and projector is None
        self._owns_marks = marks is None
        self.marks = marks if marks is not None else partition_marks(settings.config)
        self._owns_log = log is None and projector is None
        if projector is None:
            if store is None:
                store = fold_store(settings.config, journal=settings.journal)
            if log is None:  # it opens sealed content (read-only: a projector never seals)
                log = kafka_log(settings.config, sealer=content_sealer(settings.config, read_only=True))
            projector = BatchProjector(store, log, metrics=metrics)
        self.projector = projector
        self.store = projector.store
        self.log = projector.log
        self.metrics = metrics if metrics is not None else projector.metrics
        self.dead_letters = DeadLetterWriter(
            settings.bootstrap, dlq_topic(settings.topic), client_config=settings.client_config
        )
        self._clients = KafkaClients(settings.bootstrap, client_config=settings.client_config)
        self.totals = BatchReport()
        self.failure: BaseException | None = None  # what stopped the runtime, if anything did
        self._on_batch = on_batch
        self._on_ready = on_ready
        self._announced = False
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._assigned: set[int] | None = None  # None until the first assignment
        self._store_ok = True
        self._last_offsets: dict[int, int] = {}
        self._last_times: dict[int, int] = {}
        self._server: HealthServer | None = None
        self._marks_due = 0.0  # when the partition marks are checked next (monotonic)
        self.reread_partitions = 0  # partitions re-read from their start because the store lost their folds
        self._seen_done: set[int] = set()  # partitions this runtime saw marked done (a mark gone since: lost)
        # partitions to re-read (bounds and mark as found), in order; the one under way stays until it ends
        self._rereads: dict[int, tuple[int, int, str | None]] = {}
        self._rereader: threading.Thread | None = None  # re-reads them one after another, beside consumption

    @abstractmethod
    def run(self) -> BatchReport:
        """Consume, fold and acknowledge until stopped; returns the totals (raises what stopped it, if anything)."""

    # ---------------------------------------------------------------- state

    def ready(self) -> bool:
        """True while the runtime holds its partition assignment and the fold store applies (``/readyz``)."""
        with self._lock:
            return self._ready()

    def readiness(self) -> dict[str, Callable[[], bool]]:
        """What ``/readyz`` checks, by name: Kafka (the partitions are assigned), Redis (the fold store
        applies) and the projector itself (running, not failed)."""

        def kafka() -> bool:
            with self._lock:
                return self._assigned is not None

        def redis() -> bool:
            with self._lock:
                return self._store_ok

        def projector() -> bool:
            return not self._stop.is_set() and self.failure is None

        return {"projector": projector, "kafka": kafka, "redis": redis}

    def stop(self) -> None:
        self._stop.set()

    @property
    def stopped(self) -> bool:
        return self._stop.is_set()

    def assigned_partitions(self) -> list[int]:
        with self._lock:
            return sorted(self._assigned or ())

    @property
    def metrics_url(self) -> str | None:
        return None if self._server is None else self._server.url

    def _ready(self) -> bool:
        return self._assigned is not None and self._store_ok and not self._stop.is_set() and self.failure is None

    def _maybe_announce(self: Self) -> None:
        """Call ``on_ready`` the first time the runtime is ready."""
        with self._lock:
            if self._announced or not self._ready():
                return
            self._announced = True
        _LOG.info("projector ready (group %s, %s runtime)", self.settings.group, self.runtime_name)
        if self._on_ready is not None:
            self._on_ready(self)

    # ---------------------------------------------------------------- partitions

    def _partitions_assigned(self, parts: set[int], *, store_ok: bool | None = None) -> None:
        with self._lock:
            self._assigned = set(parts)
            if store_ok is not None:
                self._store_ok = store_ok
            self._marks_due = 0.0  # check the new partitions' marks at the next round
        _LOG.info("assigned partitions %s", sorted(parts))
        self._maybe_announce()

    def _forget_partitions(self, gone: set[int]) -> None:
        """Partitions revoked: another member reports their lag from now on."""
        with self._lock:
            if self._assigned is not None:
                self._assigned -= gone
        for part in gone:
            self._last_offsets.pop(part, None)
            self._last_times.pop(part, None)
            if self.metrics is not None:
                for gauge in (self.metrics.lag_events, self.metrics.lag_seconds):
                    with contextlib.suppress(KeyError):
                        gauge.remove(str(part))

    def _unassigned(self) -> None:
        """The consumer left the group: not ready until the next assignment."""
        with self._lock:
            self._assigned = None

    # ---------------------------------------------------------------- one batch

    def _apply_until_done(self, batch: Sequence[ConsumedItem], *, reread: bool = False) -> BatchReport | None:
        """Apply ``batch`` on this thread, retrying while the fold store is down; None if stopped first.
        ``reread``: a batch of a partition re-read from its start (its stale events were dead-lettered when
        the group consumed them first)."""
        pauses = OUTAGE.pauses()
        while (report := self._try_apply(batch, pauses, reread=reread)) is None:
            if self._stop.wait(pauses.last):
                return None
        return report

    async def _apply_until_done_async(self, batch: Sequence[ConsumedItem]) -> BatchReport:
        """:meth:`_apply_until_done` on an asyncio loop: each attempt on a thread, the pauses on the loop."""
        pauses = OUTAGE.pauses()
        while (report := await asyncio.to_thread(self._try_apply, batch, pauses)) is None:
            await asyncio.sleep(pauses.last)
        return report

    def _try_apply(self, batch: Sequence[ConsumedItem], pauses: Pauses, *, reread: bool = False) -> BatchReport | None:
        """One attempt: the batch applied and its stale events dead-lettered, or None (store down: retry
        after the next of ``pauses``, which is counted here and named in the log)."""
        try:
            report = self.projector.project(batch)
            if report.fenced and not reread:
                self._dead_letter_fenced(report.fenced)
        except TransientError as exc:  # the store is down: the batch is kept and tried again
            with self._lock:
                self._store_ok = False
            pause = pauses.next()
            _LOG.error("applying a batch of %d records failed (%s); retrying in %.2fs", len(batch), exc, pause)
            return None
        with self._lock:
            self._store_ok = True
        self._maybe_announce()
        return report

    def _dead_letter_fenced(self, fenced: Sequence[ConsumedEvent]) -> None:
        """Events the store refused (older writer epoch than the fold's) go to the DLQ as records the checks
        refuse do: the original records, read back from the topic (the runtimes do not keep consumed records
        past the checks), the reason naming the fold's epoch."""
        epochs: dict[str, int] = {}
        for sid in {ev.session_id for ev in fenced}:
            fold = self.store.get(sid)
            if fold is not None:
                epochs[sid] = fold.epoch
        records = fetch_records(self._clients, self.settings.topic, [(ev.partition, ev.offset) for ev in fenced])
        self.dead_letters.write_all(
            (record, FencedError(ev.session_id, ev.epoch, epochs.get(ev.session_id, ev.epoch + 1)))
            for record, ev in zip(records, fenced, strict=True)
        )

    def _observe(self, items: Sequence[ConsumedItem], report: BatchReport) -> None:
        """Count an applied batch and remember, per partition, how far it reached."""
        self.totals.merge(report)
        for item in items:
            if isinstance(item, ConsumedEvent):
                self._last_offsets[item.partition] = item.offset
                self._last_times[item.partition] = item.event.time
        if self._on_batch is not None:
            self._on_batch(report)

    # ---------------------------------------------------------------- a fold store that lost its data

    def _check_marks(self) -> None:
        """About every second (at once after an assignment, before anything newly assigned is applied):
        re-read, from their start, the assigned partitions whose folds the store no longer vouches for — an
        unmarked partition the group committed past its start, or one this runtime saw marked before (see
        the module docstring); an unmarked partition nothing consumed yet is only marked. The check runs on
        the caller's thread; the re-reads on a thread of their own (:meth:`_reread_queued`), so the group's
        consumption — and every fold a dispatcher waits for — goes on while a large partition is read again
        (a session with new events meets a gap and is rebuilt from the log at once). A store or broker that
        does not answer defers the check to the next round."""
        now = time.monotonic()
        if now < self._marks_due:
            return
        self._marks_due = now + _MARKS_EVERY_S
        s = self.settings
        parts = self.assigned_partitions()
        if not parts:
            return
        try:
            marks = self.marks.marks(s.topic, parts)
            unmarked = [p for p in parts if marks.get(p) != MARK_DONE]
            self._seen_done.update(p for p in parts if marks.get(p) == MARK_DONE)
            if not unmarked:
                return
            progress = {p.partition: p for p in archive_progress(self._clients, s.group, s.topic, s.partitions)}
        except StoreUnavailable as exc:
            _LOG.warning("checking the partition marks failed (%s); checking again in %.0fs", exc, _MARKS_EVERY_S)
            return
        for part in unmarked:
            if self.stopped:
                return
            p = progress.get(part)
            consumed = p is not None and p.committed is not None and p.committed > p.low
            try:
                if not consumed and part not in self._seen_done:
                    # nothing consumed here yet: the group reads the partition from its start anyway
                    self.marks.set_mark(s.topic, part, MARK_DONE)
                    self._seen_done.add(part)
                    continue
                assert p is not None
                self._queue_reread(part, p.low, p.high, marks.get(part))
            except StoreUnavailable as exc:
                _LOG.warning("re-reading partition %d failed (%s); trying again in %.0fs", part, exc, _MARKS_EVERY_S)
                return

    def _queue_reread(self, part: int, low: int, high: int, mark: str | None) -> None:
        """Have ``part`` re-read by the re-reading thread (started when none runs); once while queued or under way."""
        with self._lock:
            if part in self._rereads or self._stop.is_set():
                return
            self._rereads[part] = (low, high, mark)
            if self._rereader is None:
                self._rereader = threading.Thread(
                    target=self._reread_queued, name=f"foldline-projector-reread-{self.settings.group}", daemon=True
                )
                self._rereader.start()

    def _reread_queued(self) -> None:
        """The re-reading thread: each queued partition in turn, until none is left or the runtime stops."""
        while True:
            with self._lock:
                if not self._rereads or self._stop.is_set():
                    self._rereads.clear()
                    self._rereader = None
                    return
                part, (low, high, mark) = next(iter(self._rereads.items()))
            try:
                self._reread(part, low, high, mark)
            except StoreUnavailable as exc:
                _LOG.warning("re-reading partition %d failed (%s); trying again in %.0fs", part, exc, _MARKS_EVERY_S)
            except Exception:  # a bug must not end re-reading for good: the next check queues it again
                _LOG.exception("re-reading partition %d failed unexpectedly", part)
            finally:
                with self._lock:
                    self._rereads.pop(part, None)

    def _still_mine(self, part: int) -> bool:
        with self._lock:
            return not self._stop.is_set() and self._assigned is not None and part in self._assigned

    def _reread(self, part: int, low: int, high: int, mark: str | None) -> None:
        """Fold ``topic[part]`` again from ``low`` to ``high``; mark it done unless its mark moved meanwhile."""
        s = self.settings
        token = f"rereading:{uuid.uuid4().hex}"
        _LOG.warning(
            "the fold store has no mark for partition %d (%s): its folds were lost (Redis flushed, or restarted "
            "without persistence); re-reading offsets %d..%d to fold them again",
            part,
            "none" if mark is None else repr(mark),
            low,
            high,
        )
        self.marks.set_mark(s.topic, part, token)
        # its own rule state, from each session's first event; records the checks refuse were dead-lettered
        # when the group consumed them, so they are only skipped here
        checker = RecordChecker(self.dead_letters, topic=s.topic, registry_url=s.registry_url, log=self.log)
        started = time.monotonic()
        report = BatchReport()
        for records in read_partition_span(self._clients, s.topic, part, start=low, end=high, chunk=s.max_batch):
            if not self._still_mine(part):  # stopping, or revoked: its next owner re-reads it (not marked done)
                _LOG.info("re-reading partition %d stopped: no longer assigned here", part)
                return
            done = self._apply_until_done([checker.item(r) for r in records], reread=True)
            if done is None:  # stopped
                return
            report.merge(done)
        if self.marks.set_mark(s.topic, part, MARK_DONE, expect=token):
            with self._lock:
                self._seen_done.add(part)
                self.reread_partitions += 1
            _LOG.warning(
                "partition %d re-read in %.1fs: %d events, %d newly folded, %d sessions rebuilt",
                part,
                time.monotonic() - started,
                report.events,
                report.applied,
                len(report.rebuilt),
            )
        else:  # the store lost the mark again while the partition was re-read: the next round re-reads it
            _LOG.warning("the fold store lost the mark of partition %d again while it was re-read", part)
            self._marks_due = 0.0

    # ---------------------------------------------------------------- lag, metrics, lifecycle

    def _publish_lag(self, part: int, high: int, position: int | None) -> None:
        """Lag of one partition from its end offset and the consumer's fetch position.

        The fetch position skips transaction markers; ``last applied offset + 1`` would stay one short of
        the end forever on this transactional topic, and the lag in seconds would then grow while the
        runtime is idle and caught up. Without a position the last applied offset is the fallback.
        """
        if self.metrics is None:
            return
        done = self._last_offsets.get(part)
        if position is not None:
            behind = max(0, high - position)
        else:
            behind = max(0, high - (done + 1)) if done is not None else 0
        seen = self._last_times.get(part)
        age = max(0.0, time.time() - seen / 1000) if seen is not None and behind else 0.0
        self.metrics.set_lag(events=behind, seconds=age, partition=str(part))

    def _start_metrics_server(self) -> None:
        s = self.settings
        if s.metrics_port is None:
            return
        from ..metrics import ProjectorMetrics, new_registry
        from ..metrics_server import serve

        if self.metrics is None:
            self.metrics = ProjectorMetrics(new_registry())
            self.projector.metrics = self.metrics
        self._server = serve(s.metrics_port, self.metrics.registry, ready=self.readiness(), host=s.metrics_host)
        _LOG.info("metrics on %s/metrics", self._server.url)

    def _wait_for_topic(self) -> None:
        """Not ready until the topic exists (writers create it on their first append); then check its settings:
        a topic that could delete events not yet archived is refused before anything is folded."""
        s = self.settings
        wait_for_topic(
            s.bootstrap, s.topic, client_config=s.client_config, stopped=self._stop.is_set, pause=self._stop.wait
        )
        if isinstance(self.log, KafkaEventLog) and not self._stop.is_set():
            self.log.check_topics()

    def _shutdown(self) -> None:
        """Stop serving, flush the dead letters, close the adapters this runtime built."""
        self._stop.set()
        rereader = self._rereader
        if rereader is not None:  # it stops between two chunks of its partition
            rereader.join(timeout=30)
        if self._server is not None:
            self._server.close()
            self._server = None
        try:
            self.dead_letters.close()
        finally:
            if self._owns_store:
                self.store.close()
            if self._owns_marks:
                self.marks.close()
            if self._owns_log:
                self.log.close()
                if self.log.sealer is not None:
                    self.log.sealer.close()
