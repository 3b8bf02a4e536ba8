"""The projector process's factory: its settings, the log it reads and the folds it writes, from a Config.

``foldline projector`` (either runtime) is built here. The adapters come from :mod:`foldline.config.factories`
— the same functions a runtime uses when it is started without them (:func:`~.start_worker`) — and every Kafka
client, faust's included, gets the client properties (security included) of ``config.kafka``.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..adapters.kafka import KafkaEventLog
from ..adapters.redis_folds import RedisFoldStore, RedisPartitionMarks
from ..config import Config
from ..config.factories import content_sealer, fold_store, kafka_log, partition_marks
from .runtime import WorkerSettings

__all__ = ["ProjectorParts", "open_projector"]


@dataclass(slots=True)
class ProjectorParts:
    """What a projector process runs on: its worker settings, the log it reads, the folds it writes and the
    partition marks beside them."""

    settings: WorkerSettings
    log: KafkaEventLog
    store: RedisFoldStore
    marks: RedisPartitionMarks

    def close(self) -> None:
        self.marks.close()
        self.store.close()
        self.log.close()
        if self.log.sealer is not None:
            self.log.sealer.close()


def open_projector(config: Config, *, journal: bool = False) -> ProjectorParts:
    """A projector's settings, event log, fold store and partition marks (``journal``: keep the store's change
    journal)."""
    sealer = content_sealer(config, read_only=True)  # a projector opens content; it never seals any
    log = kafka_log(config, sealer=sealer)
    try:
        store = fold_store(config, journal=journal)
    except BaseException:
        log.close()
        sealer.close()
        raise
    return ProjectorParts(WorkerSettings(config, journal=journal), log, store, partition_marks(config))
