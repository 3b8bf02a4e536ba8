"""One factory per process kind: the adapters a process runs on, built from a :class:`~foldline.config.Config`.

Nothing else builds an adapter from settings; everything else receives its ports as arguments.

* loops and the CLI commands on a log (``foldline demo``, ``verify``, ``sessions``, ``show``, ...):
  :func:`open_stores` — the event log, the attachment store and, on the distributed backend, the folds;
  the loop's end of the step stream is :func:`step_client`;
* dispatchers (``foldline dispatcher``, or in-process for the demo): :func:`open_dispatcher`;
* projectors (``foldline projector``, either runtime): :func:`open_projector`.

A secured Kafka connection (``security.protocol`` other than ``PLAINTEXT``) is checked before any client
starts (:func:`~foldline.adapters.kafka_preflight.check_kafka_access`): wrong credentials or a wrong CA
fail at once with :class:`~foldline.errors.AuthenticationFailed`.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .config import Config, KafkaConfig
from .errors import ConfigError

if TYPE_CHECKING:
    from .adapters.kafka import KafkaEventLog
    from .adapters.redis_folds import RedisFoldStore
    from .adapters.s3_attachments import S3AttachmentStore
    from .dispatcher import Dispatcher, RedisStepClient
    from .metrics import DispatcherMetrics
    from .ports.attachments import AttachmentStore
    from .ports.event_log import EventLog
    from .ports.fold_store import FoldStore
    from .projector import WorkerSettings
    from .providers.base import Provider

__all__ = [
    "ProjectorParts",
    "Stores",
    "attachment_store",
    "emulated_providers",
    "fold_store",
    "kafka_log",
    "open_dispatcher",
    "open_dispatcher_stores",
    "open_projector",
    "open_stores",
    "providers",
    "step_client",
]


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


# ------------------------------------------------------------------ single adapters


def kafka_log(config: Config, **tuning: Any) -> KafkaEventLog:
    """The Kafka event log of ``config.kafka`` (``tuning``: the adapter's own knobs, e.g. ``max_writers``)."""
    from .adapters.kafka import KafkaEventLog

    k = config.kafka
    check_kafka(k)
    return KafkaEventLog(
        k.bootstrap,
        topic=k.topic,
        partitions=k.partitions,
        replication_factor=k.replication_factor,
        timeout_s=k.timeout_s,
        registry_url=k.registry_url,
        transaction_timeout_ms=int(k.transaction_timeout_s * 1000),
        client_config=k.librdkafka(),
        **tuning,
    )


def check_kafka(kafka: KafkaConfig) -> None:
    """Fail now, with a typed error, if a secured Kafka connection would be refused (a no-op on PLAINTEXT)."""
    if kafka.security_protocol == "PLAINTEXT":
        return
    from .adapters.kafka_preflight import check_kafka_access

    check_kafka_access(kafka.bootstrap, kafka.librdkafka(), kafka.timeout_s)


def fold_store(config: Config, *, journal: bool = False) -> RedisFoldStore:
    from .adapters.redis_folds import RedisFoldStore

    return RedisFoldStore(config.redis, prefix=config.folds.prefix, journal=journal)


def attachment_store(config: Config) -> S3AttachmentStore:
    from .adapters.s3_attachments import S3AttachmentStore

    return S3AttachmentStore(config.s3)


def step_client(config: Config, *, stream: str | None = None) -> RedisStepClient:
    """The loop's end of the step stream: hands steps to ``foldline dispatcher`` processes."""
    from .dispatcher import RedisStepClient

    return RedisStepClient(
        config.redis, stream=stream or config.dispatch.stream, timeout_s=config.dispatch.handover_timeout_s
    )


# ------------------------------------------------------------------ loops and CLI commands


def open_stores(config: Config) -> Stores:
    """The event log and attachment store the configuration names (and the folds, on ``distributed``)."""
    from .adapters.fs_attachments import FilesystemAttachmentStore
    from .adapters.sqlite_log import SqliteEventLog

    if config.backend == "embedded":
        return Stores(SqliteEventLog(config.data_dir), FilesystemAttachmentStore(config.data_dir / "attachments"))
    if config.backend == "kafka":
        return Stores(kafka_log(config), FilesystemAttachmentStore(config.data_dir / "attachments"))
    if config.backend == "distributed":
        log = kafka_log(config)
        try:
            return Stores(log, attachment_store(config), fold_store(config))
        except BaseException:
            log.close()
            raise
    raise ConfigError(f"backend {config.backend!r} is not available in this build")


# ------------------------------------------------------------------ dispatchers


def emulated_providers() -> dict[str, Provider]:
    """Both wire formats answered by one in-process emulator (one prompt cache, like one provider account)."""
    from .providers.emulated import emulated_provider
    from .providers.emulator import Emulator

    emulator = Emulator()
    return {
        "anthropic": emulated_provider("anthropic", emulator=emulator),
        "openai": emulated_provider("openai", emulator=emulator),
    }


def providers(config: Config) -> dict[str, Provider]:
    """Real adapters for the providers with a base URL (keys from the configuration), the in-process
    emulator for the others (one shared prompt cache)."""
    import httpx

    from .providers.anthropic import AnthropicProvider
    from .providers.openai import OpenAIProvider

    p = config.providers
    chosen = emulated_providers()
    if p.anthropic_url:
        chosen["anthropic"] = AnthropicProvider(httpx.AsyncHTTPTransport(), p.anthropic_api_key, p.anthropic_url)
    if p.openai_url:
        chosen["openai"] = OpenAIProvider(httpx.AsyncHTTPTransport(), p.openai_api_key, p.openai_url)
    return chosen


def open_dispatcher_stores(config: Config) -> Stores:
    """A dispatcher process's stores: the configured backend's, which must have folds (distributed)."""
    check_dispatch_pool(config)
    stores = open_stores(config)
    if stores.folds is None:
        stores.close()
        raise ConfigError(
            f"foldline dispatcher builds requests from projected folds; the {config.backend!r} backend has none — "
            "use --backend distributed (Kafka log, Redis folds, S3 attachments) with `foldline projector` running"
        )
    return stores


def check_dispatch_pool(config: Config) -> None:
    if config.redis.max_connections <= config.dispatch.concurrency:
        raise ConfigError(
            f"FOLDLINE_REDIS_MAX_CONNECTIONS ({config.redis.max_connections}) must exceed "
            f"FOLDLINE_DISPATCH_CONCURRENCY ({config.dispatch.concurrency}): every step in flight waits for its "
            "fold on a Redis connection of its own"
        )


def open_dispatcher(
    config: Config,
    stores: Stores,
    *,
    providers_by_name: dict[str, Provider] | None = None,
    metrics: DispatcherMetrics | None = None,
) -> Dispatcher:
    """A dispatcher on ``stores`` (which must have folds) with ``config.dispatch``'s bounds; providers from
    the configuration unless given."""
    from .dispatcher import Dispatcher

    if stores.folds is None:
        raise ConfigError(
            f"a dispatcher builds requests from projected folds; the {config.backend!r} backend has none — "
            "use --backend distributed (Kafka log, Redis folds, S3 attachments) with `foldline projector` running"
        )
    check_dispatch_pool(config)
    d = config.dispatch
    return Dispatcher(
        stores.log,
        stores.folds,
        providers_by_name if providers_by_name is not None else providers(config),
        attachments=stores.attachments,
        invariant=d.invariant,
        fold_timeout_s=d.fold_timeout_s,
        max_concurrency=d.concurrency,
        metrics=metrics,
    )


# ------------------------------------------------------------------ projectors


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
    from .projector import WorkerSettings

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


def aiokafka_credentials(kafka: KafkaConfig) -> Any:
    """The faust (aiokafka) credentials for ``kafka.client_properties``' security settings (``None`` on
    PLAINTEXT). librdkafka-only properties other than these have no aiokafka equivalent: ConfigError."""
    from faust.auth import SASLCredentials, SSLCredentials

    props = dict(kafka.client_properties)
    protocol = kafka.security_protocol
    translated = {
        "security.protocol",
        "sasl.mechanism",
        "sasl.mechanisms",
        "sasl.username",
        "sasl.password",
        "ssl.ca.location",
        "ssl.ca.pem",
        "ssl.certificate.location",
        "ssl.key.location",
        "ssl.key.password",
        "ssl.endpoint.identification.algorithm",
    }
    other = sorted(set(props) - translated)
    if other:
        raise ConfigError(
            f"the faust projector runtime cannot apply the librdkafka client properties {', '.join(other)}; "
            "remove them or use the confluent runtime (FOLDLINE_PROJECTOR_RUNTIME=confluent)"
        )
    context = _ssl_context(props) if protocol in ("SSL", "SASL_SSL") else None
    if protocol == "PLAINTEXT":
        return None
    if protocol == "SSL":
        return SSLCredentials(context)
    mechanism = (props.get("sasl.mechanism") or props.get("sasl.mechanisms") or "").upper()
    return SASLCredentials(
        username=props.get("sasl.username"),
        password=props.get("sasl.password"),
        ssl_context=context,
        mechanism=mechanism,
    )


def _ssl_context(props: dict[str, str]) -> ssl.SSLContext:
    """The TLS context librdkafka's ``ssl.*`` properties describe, for a Python (aiokafka) client."""
    try:
        context = ssl.create_default_context(
            cafile=props.get("ssl.ca.location") or None, cadata=props.get("ssl.ca.pem") or None
        )
        if props.get("ssl.certificate.location"):
            context.load_cert_chain(
                props["ssl.certificate.location"], props.get("ssl.key.location"), props.get("ssl.key.password")
            )
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(
            f"cannot load the Kafka TLS files (ssl.ca.location / ssl.certificate.location): {exc}"
        ) from exc
    if props.get("ssl.endpoint.identification.algorithm", "https").lower() == "none":
        context.check_hostname = False
    return context
