"""Configuration: every setting and its one default (:mod:`.settings`), and the adapters it names (:mod:`.factories`).

``Config.from_env()`` reads the environment; ``open_stores(config)`` opens the stores of a loop or a
command. The package's ``__all__`` below is its public surface, kept here only: each module lists what it
defines itself. The worker processes build theirs with :func:`foldline.projector.factory.open_projector` and
:func:`foldline.dispatcher.factory.open_dispatcher`, from the same single adapter factories.
"""

from __future__ import annotations

from .environment import (
    ARCHIVE_STORES,
    BACKENDS,
    KAFKA_SECURITY_VARIABLES,
    SETTINGS,
    Backend,
    Setting,
    read_client_properties,
)
from .factories import Stores, open_stores
from .settings import (
    ArchiveConfig,
    Config,
    ConsoleConfig,
    DispatchConfig,
    EmbeddedConfig,
    FoldsConfig,
    KafkaConfig,
    MetricsConfig,
    ProjectorConfig,
    ProvidersConfig,
    RedisConfig,
    S3Config,
    masked,
    masked_url,
)

__all__ = [
    "ARCHIVE_STORES",
    "BACKENDS",
    "KAFKA_SECURITY_VARIABLES",
    "SETTINGS",
    "ArchiveConfig",
    "Backend",
    "Config",
    "ConsoleConfig",
    "DispatchConfig",
    "EmbeddedConfig",
    "FoldsConfig",
    "KafkaConfig",
    "MetricsConfig",
    "ProjectorConfig",
    "ProvidersConfig",
    "RedisConfig",
    "S3Config",
    "Setting",
    "Stores",
    "masked",
    "masked_url",
    "open_stores",
    "read_client_properties",
]
