"""What both projector runtimes (the confluent-kafka worker and the faust app) do the same way.

:class:`ProjectorState` holds the per-process bookkeeping — the partition assignment, the last applied
offset and event time per partition, the metrics server — and turns it into readiness, lag and totals.
Each runtime subclasses it and feeds it from its own consumer callbacks.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from ..adapters.kafka_consumer import ConsumedEvent, ConsumedItem
from .apply import BatchProjector, BatchReport

if TYPE_CHECKING:
    from ..metrics import ProjectorMetrics
    from ..metrics_server import HealthServer
    from .worker import WorkerSettings

__all__ = ["ProjectorState", "wait_for_topic"]

_LOG = logging.getLogger("foldline.projector")


def wait_for_topic(settings: WorkerSettings, stopped: Callable[[], bool], pause: Callable[[float], object]) -> None:
    """Block (not ready) until the topic exists: writers create it on their first append, and a group
    member subscribed to a missing topic would only see it at its next metadata refresh."""
    admin = AdminClient({"bootstrap.servers": settings.bootstrap, **settings.client_config})
    warned = False
    while not stopped():
        try:
            if settings.topic in admin.list_topics(timeout=5.0).topics:
                return
        except KafkaException as exc:
            _LOG.warning("listing Kafka topics failed: %s", exc)
        if not warned:
            _LOG.warning("waiting for topic %s to exist (writers create it on their first append)", settings.topic)
            warned = True
        pause(0.5)


class ProjectorState(ABC):
    """Bookkeeping shared by the runtimes. Subclasses set ``settings``, ``projector`` and ``metrics``."""

    settings: WorkerSettings
    projector: BatchProjector
    metrics: ProjectorMetrics | None

    def __init__(self, on_batch: Callable[[BatchReport], None] | None) -> None:
        self.totals = BatchReport()
        self._on_batch = on_batch
        self._lock = threading.Lock()
        self._assigned: set[int] | None = None  # None until the first assignment
        self._last_offsets: dict[int, int] = {}
        self._last_times: dict[int, int] = {}
        self._server: HealthServer | None = None

    def assigned_partitions(self) -> list[int]:
        with self._lock:
            return sorted(self._assigned or ())

    @property
    def metrics_url(self) -> str | None:
        return None if self._server is None else self._server.url

    @abstractmethod
    def ready(self) -> bool:
        """Whether the runtime is consuming and its fold store answers (``/readyz``)."""

    def _observe(self, items: Sequence[ConsumedItem], report: BatchReport) -> None:
        """Count an applied batch and remember, per partition, how far it reached."""
        self.totals.merge(report)
        for item in items:
            if isinstance(item, ConsumedEvent):
                self._last_offsets[item.partition] = item.offset
                self._last_times[item.partition] = item.event.time
        if self._on_batch is not None:
            self._on_batch(report)

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

    def _publish_lag(self, part: int, high: int, position: int | None) -> None:
        """Lag of one partition from its end offset and the consumer's fetch position.

        The fetch position skips transaction markers; ``last applied offset + 1`` would stay one short of
        the end forever on this transactional topic, and the lag in seconds would then grow while the
        worker is idle and caught up. Without a position the last applied offset is the fallback.
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
        self._server = serve(s.metrics_port, self.metrics.registry, ready=self.ready, host=s.metrics_host)
        _LOG.info("metrics on %s/metrics", self._server.url)
