"""The default projector runtime: one confluent-kafka consumer-group member on one thread.

The loop, single-threaded (so no rebalance can happen between an apply and its commit)::

    items = consumer.poll(max_batch)         # decoded + checked; dead letters already in the DLQ topic
    report = apply until done                # one batched apply; rebuilds where a delta cannot apply;
                                             # stale-epoch events the store refused are dead-lettered
    consumer.commit()                        # offsets acknowledged only after the apply succeeded: at
                                             # most once per commit_interval_s, when partitions are
                                             # about to be revoked (inside poll), and when stopping

Delivery is at least once and the apply is idempotent (fenced by seq and epoch in the store), so a crash
anywhere — before the apply, between apply and commit, during a rebalance — only redelivers events that
the store then skips. The apply-retry loop, the dead letters, readiness and lag are those of
:class:`~.runtime.ProjectorRuntime`: a fold-store outage (Redis down) keeps the batch and retries it with
backoff without consuming further; nothing is acknowledged until it applied. A consumer failure closes
the consumer and rejoins the group from the committed offsets.

:func:`start_worker` runs a worker on a thread (in-process use, tests); ``foldline projector`` runs one
as a process. Readiness: the worker holds a partition assignment (possibly empty) and the fold store
answers; :meth:`ProjectorWorker.ready` and ``/readyz`` report it.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Any

from ..adapters.kafka import KafkaClients, SessionEventConsumer, Watermarks
from ..errors import FoldlineError, StoreUnavailable
from .fold_apply import BatchReport
from .runtime import ProjectorRuntime, WorkerSettings

__all__ = ["ProjectorWorker", "WorkerHandle", "start_worker"]

_LOG = logging.getLogger("foldline.projector")
_LAG_EVERY_S = 1.0  # how often the lag gauges are refreshed
_LAG_WAIT_S = 1.0  # bound on asking the broker for the partitions' ends


class ProjectorWorker(ProjectorRuntime):
    """One projector; see the module docstring and :class:`~.runtime.ProjectorRuntime` for the arguments.
    ``run()`` blocks until :meth:`stop`."""

    runtime_name = "confluent"

    _consumer: SessionEventConsumer | None = None  # the group member of the current run, while open
    _ends: Watermarks | None = None  # the partitions' end offsets, for the lag
    _lag_at = 0.0  # when the lag was last published (monotonic)
    _applied = False  # events were applied since the last offset commit

    def run(self) -> BatchReport:
        """Consume, fold and acknowledge until :meth:`stop`; returns the totals."""
        self._start_metrics_server()
        try:
            self._wait_for_topic()
            while not self.stopped:
                consumer = self._open_consumer()
                try:
                    self._consume(consumer)
                except StoreUnavailable as exc:
                    if self.stopped:
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
        every = s.commit_interval_s
        due = time.monotonic() + every
        while not self.stopped:
            items = consumer.poll(s.max_batch, s.poll_timeout_s)
            # before the batch is applied and committed: a partition assigned in this poll is judged by what
            # the group committed before it
            self._check_marks()
            report = self._apply_until_done(items) if items else None
            if items:
                if report is None:  # stopped while the store was down: acknowledge nothing
                    return
                self._applied = True
            if self._applied and time.monotonic() >= due:
                self._commit(consumer)
                due = time.monotonic() + every
            if items and report is not None:
                self._observe(items, report)  # (with commit_interval_s 0: counted once acknowledged)
            self._maybe_announce()
            self._update_lag()
        self._commit(consumer)  # stopping: what was applied is acknowledged before the consumer leaves

    def _commit(self, consumer: SessionEventConsumer) -> None:
        """Acknowledge everything polled so far — all of it applied — if anything was since the last commit."""
        if not self._applied:
            return
        self._applied = False
        try:
            consumer.commit()
        except StoreUnavailable as exc:
            # e.g. a rebalance took the partitions meanwhile: the new owner gets these events
            # again from the last commit and the store skips them as duplicates
            _LOG.warning("offset commit failed after a successful apply (%s); they will be redelivered", exc)

    def _revoking(self, consumer: Any, partitions: list[Any]) -> None:
        """Partitions are about to be revoked (inside poll, so everything polled before was applied): acknowledge
        it now, so their next owner starts after it rather than folding it again."""
        if self._consumer is not None:
            self._commit(self._consumer)

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
            on_assigned=self._partitions_assigned,
            on_revoke=self._revoking,
            on_revoked=self._forget_partitions,
            dead_letters=self.dead_letters,
        )
        self._consumer = consumer
        return consumer

    def _close_consumer(self, consumer: SessionEventConsumer) -> None:
        self._unassigned()
        try:
            consumer.close()
        except StoreUnavailable as exc:
            _LOG.warning("closing the consumer: %s", exc)
        self._consumer = None

    # ---------------------------------------------------------------- lag

    def _update_lag(self) -> None:
        if self.metrics is None:
            return
        now = time.monotonic()
        if now - self._lag_at < _LAG_EVERY_S:
            return
        self._lag_at = now
        s = self.settings
        if self._ends is None:
            self._ends = Watermarks(KafkaClients(s.bootstrap, client_config=s.client_config))
        assigned = self.assigned_partitions()
        positions = self._consumer.positions(assigned) if self._consumer is not None else {}
        for part in assigned:
            try:
                high = self._ends.high(s.topic, part, time.monotonic() + _LAG_WAIT_S)
            except StoreUnavailable as exc:
                _LOG.debug("lag of partition %d unknown: %s", part, exc)
                continue
            self._publish_lag(part, high, positions.get(part))

    def _shutdown(self) -> None:
        try:
            if self._ends is not None:
                self._ends.close()
        finally:
            super()._shutdown()


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
