"""Archiver processes: a Kafka consumer-group member, or a poller of the embedded log.

:class:`KafkaArchiverWorker` is one member of the archivers' consumer group on the session-event topic
(start several: they share the partitions, like projectors). It polls raw records
(:class:`~foldline.adapters.kafka.ArchiveFeed`), feeds them to the :class:`~.engine.Archiver`, and commits,
every ``commit_interval_s`` and when partitions are revoked, only the offsets
:meth:`~.engine.Archiver.safe_offsets` allows: a member that dies (``kill -9``) leaves its successor
exactly the records not yet archived, and the archive's manifests make re-archiving them a no-op.

When it is assigned partitions it compares the group's committed offsets with the partitions' log start
offsets: a log start past the committed offset means Kafka deleted records this group never archived —
logged as an error and counted (``foldline_archive_expired_events_total``); ``foldline doctor`` reports it.

:class:`LogArchiverWorker` archives the embedded log (a backup), polling it every ``poll_interval_s``.

Both announce ``archiver ready …`` once on stdout, serve ``/metrics``, ``/healthz`` and ``/readyz`` when
given a port, and on :meth:`stop` finish the segments in flight and (Kafka) commit before they return.
"""

from __future__ import annotations

import logging
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..errors import StoreUnavailable
from ..metrics import ArchiverMetrics
from .engine import Archiver
from .log_feed import LogFeed

if TYPE_CHECKING:
    from ..adapters.kafka import ArchiveFeed, TopicPolicy
    from ..metrics_server import HealthServer

__all__ = ["ArchiverWorker", "KafkaArchiverWorker", "LogArchiverWorker"]

_LOG = logging.getLogger("foldline.archiver")


class ArchiverWorker(ABC):
    """What both archiver processes share: stopping, readiness, the metrics endpoint, the announcement."""

    def __init__(
        self,
        archiver: Archiver,
        *,
        metrics_port: int | None = None,
        metrics_host: str = "127.0.0.1",
        on_ready: Callable[[ArchiverWorker], None] | None = None,
    ) -> None:
        self.archiver = archiver
        self.metrics = archiver.metrics
        self._stop = threading.Event()
        self._ready = False
        self._announced = False
        self._on_ready = on_ready
        self._metrics_port = metrics_port
        self._metrics_host = metrics_host
        self._server: HealthServer | None = None

    @property
    def metrics_url(self) -> str | None:
        return None if self._server is None else self._server.url

    @property
    def stopped(self) -> bool:
        return self._stop.is_set()

    def stop(self) -> None:
        self._stop.set()

    def ready(self) -> bool:
        return self._ready and not self._stop.is_set()

    def readiness(self) -> dict[str, Callable[[], bool]]:
        """What ``/readyz`` checks, by name: the archiver runs, and its archive store answers."""
        store = self.archiver.appender.store

        def archive_answers() -> bool:
            store.ping()  # one quick request; StoreUnavailable says why not
            return True

        return {"archiver": self.ready, "archive": archive_answers}

    @abstractmethod
    def run(self) -> None:
        """Archive until :meth:`stop`; then finish the segments in flight."""

    def _set_ready(self) -> None:
        self._ready = True
        if not self._announced:
            self._announced = True
            if self._on_ready is not None:
                self._on_ready(self)

    def _start_metrics_server(self) -> None:
        if self._metrics_port is None:
            return
        from ..metrics import new_registry
        from ..metrics_server import serve

        if self.metrics is None:
            self.metrics = self.archiver.metrics = ArchiverMetrics(new_registry())
        self._server = serve(self._metrics_port, self.metrics.registry, ready=self.readiness(), host=self._metrics_host)

    def _close_server(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None


class KafkaArchiverWorker(ArchiverWorker):
    """One archiver of the consumer group; see the module docstring. ``feed`` is the group member, opened
    with :meth:`on_assigned` and :meth:`on_revoked` as its rebalance callbacks; ``policy`` what the topic is
    checked against before anything is archived."""

    def __init__(
        self,
        archiver: Archiver,
        feed: ArchiveFeed,
        policy: TopicPolicy,
        *,
        max_batch: int = 5000,
        poll_timeout_s: float = 0.05,
        commit_interval_s: float = 1.0,
        metrics_port: int | None = None,
        metrics_host: str = "127.0.0.1",
        on_ready: Callable[[ArchiverWorker], None] | None = None,
    ) -> None:
        super().__init__(archiver, metrics_port=metrics_port, metrics_host=metrics_host, on_ready=on_ready)
        self.feed = feed
        self.policy = policy
        self.max_batch = max_batch
        self.poll_timeout_s = poll_timeout_s
        self.commit_interval_s = commit_interval_s
        self._to_check: set[int] = set()

    def on_assigned(self, partitions: set[int]) -> None:
        self._to_check |= partitions

    def on_revoked(self, partitions: set[int]) -> None:
        """Commit what is safe for the revoked partitions, then let their next owner read the rest again."""
        safe = {p: o for p, o in self.archiver.safe_offsets().items() if p in partitions}
        if safe:
            try:
                self.feed.commit(safe)
            except StoreUnavailable as exc:  # the next owner reads from the last commit: more to skip, nothing lost
                _LOG.warning("committing revoked partitions %s failed: %s", sorted(partitions), exc)
        self.archiver.forget_partitions(partitions)
        self._to_check -= partitions

    def run(self) -> None:
        """Archive until :meth:`stop`; then finish the segments in flight and commit."""
        self._start_metrics_server()
        feed = self.feed
        archiver = self.archiver
        try:
            feed.wait_for_topic(stopped=self._stop.is_set, pause=self._stop.wait)
            if not self.stopped:
                feed.check_topics(self.policy)  # a topic that could lose the log is refused at start-up
            next_commit = time.monotonic() + self.commit_interval_s
            while not self.stopped:
                events, ends = feed.poll(self.max_batch, self.poll_timeout_s)
                archiver.offer(events, ends)
                archiver.step()
                if self._to_check:
                    self._check_deleted(feed, self._to_check)
                    self._to_check = set()
                self._set_ready()  # polled, the topic checked: a member without partitions is ready too
                if time.monotonic() >= next_commit:
                    feed.commit(archiver.safe_offsets())
                    next_commit = time.monotonic() + self.commit_interval_s
            archiver.collect(wait=True)
            feed.commit(archiver.safe_offsets())
        finally:
            try:
                archiver.close()
                feed.close()
            finally:
                self._close_server()

    def _check_deleted(self, feed: ArchiveFeed, partitions: set[int]) -> None:
        """Did Kafka delete records of these partitions that the group never archived? (logged and counted)"""
        committed = feed.committed(partitions)
        for part, (low, _high) in sorted(feed.bounds(partitions).items()):
            at = committed.get(part)
            if at is not None and at < low:
                _LOG.error(
                    "%s[%d]: Kafka deleted offsets %d..%d before this archiver group archived them; events of the "
                    "sessions there are neither in Kafka nor in the archive (docs/RETENTION.md, 'When the archiver "
                    "falls behind')",
                    feed.topic,
                    part,
                    at,
                    low - 1,
                )
                if self.metrics is not None:
                    self.metrics.expired(low - at)
            elif at is None and low > 0:
                _LOG.warning(
                    "%s[%d] starts at offset %d and this archiver group never committed on it: records before it "
                    "were deleted before the group first read the partition",
                    feed.topic,
                    part,
                    low,
                )


class LogArchiverWorker(ArchiverWorker):
    """Archives the embedded log every ``poll_interval_s``; see the module docstring."""

    def __init__(
        self,
        archiver: Archiver,
        feed: LogFeed,
        *,
        poll_interval_s: float = 1.0,
        metrics_port: int | None = None,
        metrics_host: str = "127.0.0.1",
        on_ready: Callable[[ArchiverWorker], None] | None = None,
    ) -> None:
        super().__init__(archiver, metrics_port=metrics_port, metrics_host=metrics_host, on_ready=on_ready)
        self.feed = feed
        self.poll_interval_s = poll_interval_s

    def run(self) -> None:
        """Archive until :meth:`stop`; then finish the segments in flight."""
        self._start_metrics_server()
        try:
            while not self.stopped:
                self.archiver.offer(self.feed.poll())
                self.archiver.step()
                self._set_ready()
                self._stop.wait(self.poll_interval_s)
            self.archiver.collect(wait=True)
        finally:
            try:
                self.archiver.close()
                self.feed.close()
            finally:
                self._close_server()
