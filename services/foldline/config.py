"""Configuration → adapters, in one place. Everything else receives its ports as arguments."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, cast

from .errors import ConfigError
from .ports.attachments import AttachmentStore
from .ports.event_log import EventLog
from .ports.fold_store import FoldStore

__all__ = ["Backend", "Config", "Stores", "open_stores"]

Backend = Literal["embedded", "kafka", "distributed"]
BACKENDS: tuple[str, ...] = ("embedded", "kafka", "distributed")


@dataclass(frozen=True, slots=True)
class Config:
    data_dir: Path
    backend: Backend = "embedded"
    kafka_bootstrap: str = "127.0.0.1:19092"
    kafka_topic: str = "foldline.session-events"
    redis_url: str = "redis://127.0.0.1:16379/0"
    s3_bucket: str = "foldline-attachments"
    fold_prefix: str = "foldline:fold:"  # Redis key prefix of the folds (projectors and dispatchers must agree)

    @staticmethod
    def from_env(data_dir: str | Path | None = None, backend: str | None = None) -> Config:
        name = backend or os.environ.get("FOLDLINE_BACKEND", "embedded")
        if name not in BACKENDS:
            raise ConfigError(f"unknown backend {name!r}; choose one of {', '.join(BACKENDS)}")
        chosen = cast(Backend, name)
        return Config(
            data_dir=Path(data_dir or os.environ.get("FOLDLINE_DATA_DIR") or "foldline-data"),
            backend=chosen,
            kafka_bootstrap=os.environ.get("FOLDLINE_KAFKA_BOOTSTRAP", "127.0.0.1:19092"),
            kafka_topic=os.environ.get("FOLDLINE_KAFKA_TOPIC", "foldline.session-events"),
            redis_url=os.environ.get("FOLDLINE_REDIS_URL", "redis://127.0.0.1:16379/0"),
            s3_bucket=os.environ.get("FOLDLINE_S3_BUCKET", "foldline-attachments"),
            fold_prefix=os.environ.get("FOLDLINE_FOLD_PREFIX", "foldline:fold:"),
        )


@dataclass(slots=True)
class Stores:
    log: EventLog
    attachments: AttachmentStore
    folds: FoldStore | None = None  # the distributed backend's fold store (Redis), fed by projectors

    def close(self) -> None:
        self.log.close()
        self.attachments.close()
        if self.folds is not None:
            self.folds.close()


def open_stores(config: Config) -> Stores:
    """The event log and attachment store the configuration names."""
    from .adapters.fs_attachments import FilesystemAttachmentStore
    from .adapters.sqlite_log import SqliteEventLog

    if config.backend == "embedded":
        return Stores(SqliteEventLog(config.data_dir), FilesystemAttachmentStore(config.data_dir / "attachments"))
    if config.backend == "kafka":
        from .adapters.kafka import KafkaEventLog

        log: EventLog = KafkaEventLog(bootstrap=config.kafka_bootstrap, topic=config.kafka_topic)
        return Stores(log, FilesystemAttachmentStore(config.data_dir / "attachments"))
    if config.backend == "distributed":
        return _distributed_stores(config)
    raise ConfigError(f"backend {config.backend!r} is not available in this build")


def _distributed_stores(config: Config) -> Stores:
    """Kafka log, Redis folds, S3 attachments (bucket from the config; prefix, endpoint and credentials
    from the environment and boto3's standard chain — see :meth:`S3AttachmentStore.from_env`)."""
    from .adapters.kafka import KafkaEventLog
    from .adapters.redis_folds import RedisFoldStore
    from .adapters.s3_attachments import S3AttachmentStore

    attachments = S3AttachmentStore.from_env({**os.environ, "FOLDLINE_S3_BUCKET": config.s3_bucket})
    log = KafkaEventLog(bootstrap=config.kafka_bootstrap, topic=config.kafka_topic)
    return Stores(log, attachments, RedisFoldStore(config.redis_url, prefix=config.fold_prefix))
