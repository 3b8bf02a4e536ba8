"""The projector process's factory: its settings, the log it reads and the folds it writes, from a Config.

``foldline projector`` (either runtime) is built here; the adapters come from
:mod:`foldline.config.factories`, the Kafka client properties (security included) from ``config.kafka``.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..adapters.kafka import KafkaEventLog
from ..adapters.redis_folds import RedisFoldStore
from ..config import Config
from ..config.factories import fold_store, kafka_log
from .runtime import WorkerSettings

__all__ = ["ProjectorParts", "open_projector", "projector_settings"]


@dataclass(slots=True)
class ProjectorParts:
    """What a projector process runs on: its worker settings, the log it reads and the folds it writes."""

    settings: WorkerSettings
    log: KafkaEventLog
    store: RedisFoldStore

    def close(self) -> None:
        self.store.close()
        self.log.close()


def projector_settings(config: Config, *, journal: bool = False) -> WorkerSettings:
    k = config.kafka
    return WorkerSettings(
        bootstrap=k.bootstrap,
        topic=k.topic,
        group=k.group,
        redis_url=config.redis.url,
        redis_prefix=config.folds.prefix,
        partitions=k.partitions,
        max_batch=config.projector.max_batch,
        registry_url=k.registry_url,
        metrics_port=config.metrics.port,
        metrics_host=config.metrics.host,
        journal=journal,
        client_config=k.librdkafka(),
    )


def open_projector(config: Config, *, journal: bool = False) -> ProjectorParts:
    """A projector's settings, event log and fold store (``journal``: keep the store's change journal)."""
    log = kafka_log(config)
    try:
        store = fold_store(config, journal=journal)
    except BaseException:
        log.close()
        raise
    return ProjectorParts(projector_settings(config, journal=journal), log, store)
