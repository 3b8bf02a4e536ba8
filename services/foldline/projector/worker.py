"""The projector worker: one consumer-group member that folds the session-event topic into the fold store.

The loop, single-threaded (so no rebalance can happen between an apply and its commit)::

    items = consumer.poll(max_batch)      # decoded + checked; dead letters already in the DLQ topic
    report = projector.project(items)     # one batched apply; rebuilds where a delta cannot apply
    dead-letter report.fenced             # stale-epoch events the store refused
    consumer.commit()                     # offsets acknowledged ONLY now, after the apply succeeded

Delivery is at least once and the apply is idempotent (fenced by seq and epoch in the store), so a crash
anywhere — before the apply, between apply and commit, during a rebalance — only redelivers events that
the store then skips. A fold-store outage (Redis down) keeps the batch and retries it with backoff
without consuming further; nothing is acknowledged until it applied. A consumer failure closes the
consumer and rejoins the group from the committed offsets.

:func:`start_worker` runs a worker on a thread (in-process use, tests); ``foldline projector`` runs one
as a process. Readiness: the worker holds a partition assignment (possibly empty) and the fold store
answers; :meth:`ProjectorWorker.ready` and ``/readyz`` report it.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

from ..adapters.avro import AvroCodec
from ..adapters.kafka_consumer import (
    DLQ_HEADER_ERROR,
    DLQ_HEADER_OFFSET,
    DLQ_HEADER_PARTITION,
    DLQ_HEADER_REASON,
    DLQ_HEADER_TOPIC,
    ConsumedEvent,
    ConsumedItem,
    SessionEventConsumer,
)
from ..adapters.kafka_log import DEFAULT_TOPIC, KafkaEventLog, dlq_topic
from ..errors import FencedError, FoldlineError, StoreUnavailable
from ..ports.event_log import EventLog
from ..ports.fold_store import FoldStore
from .apply import BatchProjector, BatchReport
from .common import ProjectorState, wait_for_topic

if TYPE_CHECKING:
    from ..metrics import ProjectorMetrics

__all__ = ["DEFAULT_GROUP", "ProjectorWorker", "WorkerSettings", "start_worker"]

_LOG = logging.getLogger("foldline.projector")
DEFAULT_GROUP = "foldline-projector"


@dataclass(frozen=True, slots=True)
class WorkerSettings:
    """Where a projector reads from and writes to, and how it batches."""

    bootstrap: str = "127.0.0.1:19092"
    topic: str = DEFAULT_TOPIC
    group: str = DEFAULT_GROUP
    redis_url: str = "redis://127.0.0.1:16379/0"
    redis_prefix: str = "foldline:fold:"
    partitions: int = 12  # the topic's partition count (checked by the event log)
    max_batch: int = 5000  # records per poll and per apply
    poll_timeout_s: float = 0.01
    registry_url: str | None = None
    metrics_port: int | None = None  # serve /metrics, /healthz, /readyz (0 picks a free port)
    metrics_host: str = "127.0.0.1"
    journal: bool = False  # keep the fold store's change journal (tests)
    client_config: Mapping[str, Any] = field(default_factory=dict)


class ProjectorWorker(ProjectorState):
    """One projector; see the module docstring. ``run()`` blocks until :meth:`stop`."""

    def __init__(
        self,
        settings: WorkerSettings,
        *,
        store: FoldStore | None = None,
        log: EventLog | None = None,
        metrics: ProjectorMetrics | None = None,
        on_batch: Callable[[BatchReport], None] | None = None,
        on_ready: Callable[[ProjectorWorker], None] | None = None,
    ) -> None:
        super().__init__(on_batch)
        self.settings = settings
        self._owns_store = store is None
        self._owns_log = log is None
        if store is None:
            from ..adapters.redis_folds import RedisFoldStore

            store = RedisFoldStore(settings.redis_url, prefix=settings.redis_prefix, journal=settings.journal)
        if log is None:
            log = KafkaEventLog(
                settings.bootstrap,
                topic=settings.topic,
                partitions=settings.partitions,
                registry_url=settings.registry_url,
                client_config=settings.client_config,
            )
        self.store = store
        self.log = log
        self.metrics = metrics
        self.projector = BatchProjector(store, log, metrics=metrics)
        self._on_ready = on_ready
        self._announced = False
        self._stop = threading.Event()
        self._store_ok = True
        self._consumer: SessionEventConsumer | None = None
        self._dlq: Producer | None = None
        self._watermarks: Consumer | None = None
        self._lag_at = 0.0

    # ---------------------------------------------------------------- state

    def ready(self) -> bool:
        """True while the worker holds its partition assignment and the fold store applies."""
        with self._lock:
            return self._assigned is not None and self._store_ok and not self._stop.is_set()

    def stop(self) -> None:
        self._stop.set()

    @property
    def stopped(self) -> bool:
        return self._stop.is_set()

    # ---------------------------------------------------------------- the loop

    def run(self) -> BatchReport:
        """Consume, fold and acknowledge until :meth:`stop`; returns the totals."""
        self._start_metrics_server()
        try:
            wait_for_topic(self.settings, self._stop.is_set, self._stop.wait)
            while not self._stop.is_set():
                consumer = self._open_consumer()
                try:
                    self._consume(consumer)
                except StoreUnavailable as exc:
                    if self._stop.is_set():
                        break
                    _LOG.error("consumer failed (%s); rejoining the group from the committed offsets", exc)
                    time.sleep(0.5)
                finally:
                    self._close_consumer(consumer)
        finally:
            self._shutdown()
        return self.totals

    def _consume(self, consumer: SessionEventConsumer) -> None:
        s = self.settings
        while not self._stop.is_set():
            items = consumer.poll(s.max_batch, s.poll_timeout_s)
            if items:
                report = self._apply_until_done(items)
                if report is None:  # stopped while the store was down: acknowledge nothing
                    return
                try:
                    consumer.commit()
                except StoreUnavailable as exc:
                    # e.g. a rebalance took the partitions meanwhile: the new owner gets these events
                    # again from the last commit and the store skips them as duplicates
                    _LOG.warning("offset commit failed after a successful apply (%s); they will be redelivered", exc)
                self._observe(items, report)
            if not self._announced and self.ready():
                self._announced = True
                if self._on_ready is not None:
                    self._on_ready(self)
            self._update_lag()

    def _apply_until_done(self, items: Sequence[ConsumedItem]) -> BatchReport | None:
        pause = 0.05
        while True:
            try:
                report = self.projector.project(items)
                if report.fenced:
                    self._dead_letter_fenced(report.fenced)
                with self._lock:
                    self._store_ok = True
                return report
            except StoreUnavailable as exc:
                with self._lock:
                    self._store_ok = False
                _LOG.error("applying a batch of %d records failed (%s); retrying in %.2fs", len(items), exc, pause)
                if self._stop.wait(pause):
                    return None
                pause = min(pause * 2, 2.0)

    # ---------------------------------------------------------------- consumer lifecycle

    def _open_consumer(self) -> SessionEventConsumer:
        s = self.settings
        consumer = SessionEventConsumer(
            s.bootstrap,
            s.group,
            topic=s.topic,
            registry_url=s.registry_url,
            log=self.log,
            client_config=s.client_config,
            on_assign=self._on_assign,
            on_revoke=self._on_revoke,
        )
        self._consumer = consumer
        return consumer

    def _close_consumer(self, consumer: SessionEventConsumer) -> None:
        with self._lock:
            self._assigned = None
        try:
            consumer.close()
        except KafkaException as exc:
            _LOG.warning("closing the consumer: %s", exc)
        self._consumer = None

    def _on_assign(self, _consumer: Consumer, partitions: list[TopicPartition]) -> None:
        with self._lock:
            first = self._assigned is None
            self._assigned = {tp.partition for tp in partitions}
        _LOG.info("assigned partitions %s", sorted(p.partition for p in partitions))
        if first:
            _LOG.info("projector ready (group %s)", self.settings.group)

    def _on_revoke(self, _consumer: Consumer, partitions: list[TopicPartition]) -> None:
        # Everything polled so far was applied and committed before poll() ran again: nothing to flush.
        self._forget_partitions({tp.partition for tp in partitions})

    # ---------------------------------------------------------------- dead letters for fenced events

    def _dead_letter_fenced(self, events: Sequence[ConsumedEvent]) -> None:
        s = self.settings
        if self._dlq is None:
            self._dlq = Producer(
                {"bootstrap.servers": s.bootstrap, "enable.idempotence": True, "acks": "all", **s.client_config}
            )
        producer = self._dlq
        failures: list[Any] = []
        codec = AvroCodec(registry_url=s.registry_url, subject=f"{s.topic}-value")
        for ev in events:
            reason = (
                f"session {ev.session_id!r}: event seq {ev.event.seq} carries writer epoch {ev.epoch}, older than the "
                "epoch of the session's fold; a newer writer owns the session"
            )
            producer.produce(
                dlq_topic(s.topic),
                key=ev.session_id.encode(),
                value=codec.encode(ev.event),
                headers=[
                    (DLQ_HEADER_REASON, reason.encode()),
                    (DLQ_HEADER_ERROR, FencedError.__name__.encode()),
                    (DLQ_HEADER_TOPIC, s.topic.encode()),
                    (DLQ_HEADER_PARTITION, str(ev.partition).encode()),
                    (DLQ_HEADER_OFFSET, str(ev.offset).encode()),
                ],
                on_delivery=lambda err, _msg: failures.append(err) if err is not None else None,
            )
        if producer.flush(10.0) or failures:
            raise StoreUnavailable(f"the dead-letter topic did not acknowledge {len(events)} fenced event(s)")

    # ---------------------------------------------------------------- metrics

    def _update_lag(self) -> None:
        if self.metrics is None:
            return
        now = time.monotonic()
        if now - self._lag_at < 1.0:
            return
        self._lag_at = now
        s = self.settings
        if self._watermarks is None:
            self._watermarks = Consumer(
                {
                    "bootstrap.servers": s.bootstrap,
                    "group.id": f"foldline-projector-lag-{uuid.uuid4().hex}",
                    "enable.auto.commit": False,
                    **s.client_config,
                }
            )
        assigned = self.assigned_partitions()
        positions = self._consumer.positions(assigned) if self._consumer is not None else {}
        for part in assigned:
            try:
                _low, high = self._watermarks.get_watermark_offsets(TopicPartition(s.topic, part), timeout=1.0)
            except KafkaException as exc:
                _LOG.debug("lag of partition %d unknown: %s", part, exc)
                continue
            self._publish_lag(part, int(high), positions.get(part))

    def _shutdown(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        if self._dlq is not None:
            self._dlq.flush(5.0)
        if self._watermarks is not None:
            self._watermarks.close()
        if self._owns_store:
            self.store.close()
        if self._owns_log:
            self.log.close()


@dataclass
class WorkerHandle:
    """A worker running on a thread (:func:`start_worker`)."""

    worker: ProjectorWorker
    thread: threading.Thread
    errors: list[BaseException]

    def wait_ready(self, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not self.worker.ready():
            if self.errors:
                raise self.errors[0]
            if time.monotonic() > deadline:
                raise StoreUnavailable(
                    f"the projector (group {self.worker.settings.group}) did not become ready within {timeout_s:g}s: "
                    "check Kafka and Redis"
                )
            time.sleep(0.02)

    def stop(self, timeout_s: float = 30.0) -> BatchReport:
        self.worker.stop()
        self.thread.join(timeout_s)
        if self.errors:
            raise self.errors[0]
        return self.worker.totals


def start_worker(settings: WorkerSettings, **kwargs: Any) -> WorkerHandle:
    """Run a :class:`ProjectorWorker` on a daemon thread; ``handle.wait_ready()``, ``handle.stop()``."""
    worker = ProjectorWorker(settings, **kwargs)
    errors: list[BaseException] = []

    def main() -> None:
        try:
            worker.run()
        except BaseException as exc:
            errors.append(exc)
            if not isinstance(exc, FoldlineError):
                _LOG.exception("projector worker crashed")

    thread = threading.Thread(target=main, name=f"foldline-projector-{settings.group}", daemon=True)
    thread.start()
    return WorkerHandle(worker, thread, errors)
