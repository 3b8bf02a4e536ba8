"""The adapters a :class:`~foldline.config.Config` names, built here and nowhere else.

* :func:`open_stores` — the factory of loops and the CLI commands on a log (``foldline demo``, ``verify``,
  ``sessions``, ...): the event log (sealing and opening content with the key store), the attachment store and,
  on the distributed backend, the folds;
* :func:`sqlite_log`, :func:`kafka_log`, :func:`fold_store`, :func:`partition_marks`, :func:`attachment_store`,
  :func:`archive_store`, :func:`session_archive`, :func:`key_store`, :func:`content_sealer`, :func:`providers` —
  one adapter each, for the factories of the worker processes (:func:`foldline.projector.factory.open_projector`,
  :func:`foldline.dispatcher.factory.open_dispatcher`, :func:`foldline.archiver.factory.open_archiver`) and
  for tests.

The Kafka log reads below each session's archive watermark from the archive when one is configured
(``config.archive``), and its topics are created with and checked against :func:`topic_policy`: a
process that opens stores on Kafka checks the topic before anything is written (a retention that could
delete unarchived events is :class:`~foldline.errors.UnsafeRetention`).

A secured Kafka connection (``security.protocol`` other than ``PLAINTEXT``) is checked before any client
starts (:func:`~foldline.adapters.kafka.check_kafka_access`): wrong credentials or an untrusted
certificate fail at once with :class:`~foldline.errors.AuthenticationFailed`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError
from .extras import require
from .settings import Config, KafkaConfig

if TYPE_CHECKING:
    import ssl

    from mypy_boto3_s3 import S3Client

    from ..adapters.archive import SessionArchive
    from ..adapters.kafka import KafkaEventLog, TopicPolicy
    from ..adapters.redis_folds import RedisFoldStore, RedisPartitionMarks
    from ..adapters.s3_attachments import S3AttachmentStore
    from ..adapters.sealing import ContentSealer
    from ..adapters.sqlite_log import SqliteEventLog
    from ..ports.archive import ArchiveStore
    from ..ports.attachments import AttachmentStore
    from ..ports.event_log import EventLog
    from ..ports.fold_store import FoldStore
    from ..ports.key_store import KeyStore
    from ..providers.base import Provider

__all__ = [
    "Stores",
    "aiokafka_credentials",
    "archive_store",
    "attachment_store",
    "check_data_dir",
    "check_kafka",
    "content_sealer",
    "emulated_providers",
    "fold_store",
    "kafka_log",
    "key_store",
    "open_stores",
    "partition_marks",
    "providers",
    "s3",
    "session_archive",
    "sqlite_log",
    "topic_policy",
]


@dataclass(slots=True)
class Stores:
    log: EventLog
    attachments: AttachmentStore
    folds: FoldStore | None = None  # the distributed backend's fold store (Redis), fed by projectors
    sealer: ContentSealer | None = None  # seals and opens the log's content; its key store (docs/ERASURE.md)

    def close(self) -> None:
        self.log.close()
        self.attachments.close()
        if self.folds is not None:
            self.folds.close()
        if self.sealer is not None:
            self.sealer.close()


# ------------------------------------------------------------------ one adapter each


def sqlite_log(config: Config, *, read_only: bool = False, sealer: ContentSealer | None = None) -> SqliteEventLog:
    """The embedded log: ``foldline.db`` in ``config.data_dir``, waiting ``embedded.busy_timeout_s`` for another
    writer's lock. ``read_only`` (audits, listings, ``foldline doctor``) opens it for reading and never creates
    the data directory: a missing one is a :class:`ConfigError` (:func:`check_data_dir`). ``sealer`` seals and
    opens content (:func:`content_sealer`; without one, sealed content is opened with the keys beside the log)."""
    from ..adapters.sqlite_log import DB_NAME, SqliteEventLog

    check_data_dir(config, read_only=read_only)
    return SqliteEventLog(
        config.data_dir / DB_NAME, busy_timeout_s=config.embedded.busy_timeout_s, read_only=read_only, sealer=sealer
    )


def kafka_log(
    config: Config, *, archive: bool = True, sealer: ContentSealer | None = None, **tuning: Any
) -> KafkaEventLog:
    """The Kafka event log of ``config.kafka``, reading the configured archive below each session's archive
    watermark (``archive=False``: Kafka only, as ``foldline restore`` writes and compares); ``sealer`` seals
    and opens content (:func:`content_sealer`; without one, events are moved as stored); ``tuning``: the
    adapter's own knobs, e.g. ``max_writers``. Its topics are checked on first use (:meth:`check_topics`)."""
    require("kafka", what="the Kafka log")
    from ..adapters.kafka import KafkaEventLog

    k = config.kafka
    check_kafka(k)
    reader = session_archive(config) if archive and config.archive.enabled else None
    return KafkaEventLog(
        k.bootstrap,
        topic=k.topic,
        partitions=k.partitions,
        timeout_s=k.timeout_s,
        registry_url=k.registry_url,
        transaction_timeout_ms=int(k.transaction_timeout_s * 1000),
        client_config=k.librdkafka(),
        archive=reader,
        policy=topic_policy(config),
        sealer=sealer,
        **tuning,
    )


def topic_policy(config: Config) -> TopicPolicy:
    """What the log's topics are created with and checked against (docs/RETENTION.md, "Operator checks")."""
    from ..adapters.kafka import TopicPolicy

    k, a = config.kafka, config.archive
    return TopicPolicy(
        replication_factor=k.replication_factor,
        min_insync_replicas=k.min_insync_replicas,
        archive_max_delay_s=a.max_delay_s if a.enabled else None,
        archive_all_sessions="*" in a.patterns,
        retention_ms=int(k.retention_s * 1000),
    )


def archive_store(config: Config, *, create: bool = True) -> ArchiveStore | None:
    """The store of the session archive ``config.archive`` names (``None`` when it is off). ``create=False``
    (a check): a directory archive that does not exist is StoreUnavailable instead of being created."""
    a = config.archive
    if a.store == "off":
        return None
    require("archive", *(("s3",) if a.store == "s3" else ()), what=f"the session archive (FOLDLINE_ARCHIVE={a.store})")
    if a.store == "dir":
        from ..adapters.dir_archive import DirectoryArchiveStore

        return DirectoryArchiveStore(a.directory(config.data_dir), create=create)
    from ..adapters.s3_archive import S3ArchiveStore

    return S3ArchiveStore(a.bucket, client=s3(config), prefix=a.prefix, max_attempts=config.s3.max_attempts)


def session_archive(config: Config) -> SessionArchive | None:
    """The reader of the session archive (``None`` when it is off)."""
    from ..adapters.archive import SessionArchive

    store = archive_store(config)
    return None if store is None else SessionArchive(store)


def check_kafka(kafka: KafkaConfig) -> None:
    """Fail now, with a typed error, if a secured Kafka connection would be refused (a no-op on PLAINTEXT)."""
    if kafka.security_protocol == "PLAINTEXT":
        return
    require("kafka", what="a Kafka connection")
    from ..adapters.kafka import check_kafka_access

    check_kafka_access(kafka.bootstrap, kafka.librdkafka(), kafka.timeout_s)


def fold_store(config: Config, *, journal: bool = False) -> RedisFoldStore:
    """The Redis fold store (``journal``: keep its per-session change journal, for audits and tests)."""
    require("redis", what="the Redis fold store")
    from ..adapters.redis_folds import RedisFoldStore

    r = config.redis
    return RedisFoldStore(
        r.url,
        prefix=config.folds.prefix,
        socket_timeout_s=r.socket_timeout_s,
        connect_timeout_s=r.connect_timeout_s,
        max_connections=r.max_connections,
        journal=journal,
    )


def partition_marks(config: Config) -> RedisPartitionMarks:
    """The projectors' partition marks, beside the folds of :func:`fold_store` (the same Redis and key prefix)."""
    from ..adapters.redis_folds import RedisPartitionMarks

    r = config.redis
    return RedisPartitionMarks(
        r.url,
        prefix=config.folds.prefix,
        socket_timeout_s=r.socket_timeout_s,
        connect_timeout_s=r.connect_timeout_s,
        max_connections=r.max_connections,
    )


def attachment_store(config: Config, **tuning: Any) -> S3AttachmentStore:
    """The S3 attachment store of ``config.s3`` (``tuning``: ``multipart_threshold``, ``spool_dir``)."""
    require("s3", what="the S3 attachment store")
    from ..adapters.s3_attachments import S3AttachmentStore

    s = config.s3
    return S3AttachmentStore(s.bucket, prefix=s.prefix, client=s3(config), max_attempts=s.max_attempts, **tuning)


def s3(config: Config) -> S3Client:
    """A boto3 S3 client with the ``config.s3`` endpoint, region, retries, timeouts and pool."""
    require("s3", what="an S3 client")
    from ..adapters.s3_attachments import s3_client

    s = config.s3
    return s3_client(
        endpoint_url=s.endpoint,
        region=s.region,
        max_attempts=s.max_attempts,
        connect_timeout_s=s.connect_timeout_s,
        read_timeout_s=s.read_timeout_s,
        max_connections=s.max_connections,
    )


def key_store(config: Config, *, read_only: bool = False) -> KeyStore:
    """The key store ``config.encryption`` names: ``keys.sqlite3`` in the key directory (the data directory by
    default) or the S3 key bucket (docs/ERASURE.md, "Where keys live"). ``read_only``: nothing is created."""
    from ..adapters.sealing import kek_from_text

    e = config.encryption
    kek = kek_from_text(e.key_encryption_key) if e.key_encryption_key else None
    if e.store_for(config.backend) == "dir":
        from ..adapters.sqlite_keys import KEYS_NAME, SqliteKeyStore

        return SqliteKeyStore(
            e.directory(config.data_dir) / KEYS_NAME,
            read_only=read_only,
            kek=kek,
            busy_timeout_s=config.embedded.busy_timeout_s,
        )
    require("s3", what="the S3 key store")
    from ..adapters.s3_keys import S3KeyStore

    return S3KeyStore(e.bucket, client=s3(config), prefix=e.prefix, kek=kek)


def content_sealer(config: Config, *, read_only: bool = False) -> ContentSealer:
    """What seals new content (when ``FOLDLINE_ENCRYPTION`` is on and the process writes) and opens stored content,
    over :func:`key_store`."""
    from ..adapters.sealing import ContentSealer

    e = config.encryption
    return ContentSealer(
        key_store(config, read_only=read_only), seal_new=e.enabled and not read_only, cache_ttl_s=e.cache_ttl_s
    )


def emulated_providers(latency_s: float = 0.0, latency_spread: float = 0.0) -> dict[str, Provider]:
    """Both wire formats answered by one in-process emulator (one prompt cache, like one provider account)
    that takes ``latency_s`` (± ``latency_spread`` of it) to answer."""
    from ..providers.emulated import emulated_provider
    from ..providers.emulator import Emulator

    emulator = Emulator(latency_s=latency_s, latency_spread=latency_spread)
    return {
        "anthropic": emulated_provider("anthropic", emulator=emulator),
        "openai": emulated_provider("openai", emulator=emulator),
    }


def providers(config: Config) -> dict[str, Provider]:
    """Real adapters for the providers with a base URL (keys from the configuration; pools, timeouts and
    HTTP/2 from ``config.transport``), the in-process emulator for the others (one shared prompt cache); and
    an adapter of its kind for each server under a name of its own (``FOLDLINE_*_COMPATIBLE``), by that name."""
    from ..providers.anthropic import AnthropicProvider
    from ..providers.http import JsonHttpProvider
    from ..providers.openai import OpenAIProvider
    from ..providers.reasoning_chat import ReasoningChatProvider

    p, transport = config.providers, config.transport
    chosen = emulated_providers(p.emulator_latency_s, p.emulator_latency_spread)
    if p.anthropic_url:
        chosen["anthropic"] = AnthropicProvider(None, p.anthropic_api_key, p.anthropic_url, settings=transport)
    if p.openai_url:
        chosen["openai"] = OpenAIProvider(None, p.openai_api_key, p.openai_url, settings=transport)
    for kind, name, url in p.servers():
        key = p.api_key(name)
        server: JsonHttpProvider
        if kind == "anthropic":
            server = AnthropicProvider(None, key, url, settings=transport, name=name)
        elif kind == "deepseek":
            server = ReasoningChatProvider(None, key, url, settings=transport, name=name)
        else:
            server = OpenAIProvider(None, key, url, settings=transport, name=name)
        chosen[name] = server
    return chosen


# ------------------------------------------------------------------ loops and CLI commands


def check_data_dir(config: Config, *, read_only: bool = False) -> None:
    """Fail with :class:`ConfigError` unless ``config.data_dir`` can serve: not a file, and (to read) present.

    A read-only command never creates a data directory: a missing one would read as an empty log, so a
    mistyped path would pass an audit; it is an error instead.
    """
    path = config.data_dir
    if path.exists() and not path.is_dir():
        raise ConfigError(
            f"the data directory {path} is a file, not a directory; pass --data-dir (or FOLDLINE_DATA_DIR) naming "
            "a directory"
        )
    if read_only and not path.exists():
        raise ConfigError(
            f"there is no data directory {path} (nothing to read); check --data-dir or FOLDLINE_DATA_DIR "
            f"(now {'set' if 'FOLDLINE_DATA_DIR' in os.environ else 'unset: ./foldline-data is the default'})"
        )


def open_stores(config: Config, *, read_only: bool = False, writer: bool = False) -> Stores:
    """The event log and attachment store the configuration names (and the folds, on ``distributed``).

    ``read_only=True`` (the audits and listings) opens the embedded log and the filesystem attachment store
    for reading: nothing is created or written, and a read-only data directory or copy serves.
    ``writer``: the process runs loops (it writes sessions): a Kafka log then follows the committed stream,
    so the loops' invariant companions read back what they appended without a fetch per read, and with tracing on
    (:mod:`foldline.tracing`) the loops' appends become spans.
    """
    stores = _open_stores(config, read_only=read_only, writer=writer)
    if writer:
        from ..tracing import traced_log

        stores = Stores(traced_log(stores.log), stores.attachments, stores.folds, sealer=stores.sealer)
    return stores


def _open_stores(config: Config, *, read_only: bool, writer: bool) -> Stores:
    from ..adapters.fs_attachments import FilesystemAttachmentStore

    if config.backend == "embedded":
        sealer = content_sealer(config, read_only=read_only)
        try:
            sqlite = sqlite_log(config, read_only=read_only, sealer=sealer)
        except BaseException:
            sealer.close()
            raise
        try:
            attachments = FilesystemAttachmentStore(config.data_dir / "attachments", read_only=read_only)
            return Stores(sqlite, attachments, sealer=sealer)
        except BaseException:
            sqlite.close()
            sealer.close()
            raise
    if config.backend in ("kafka", "distributed"):
        needed = ("kafka", "redis", "s3") if config.backend == "distributed" else ("kafka",)
        require(*needed, what=f"the {config.backend} backend")
        if config.backend == "kafka":
            check_data_dir(config)
        sealer = content_sealer(config, read_only=read_only)
        try:
            log = kafka_log(config, follow=writer, sealer=sealer)
        except BaseException:
            sealer.close()
            raise
        try:
            log.check_topics()  # before anything is written: a topic that could lose the log is refused
            if config.backend == "kafka":
                attachments = FilesystemAttachmentStore(config.data_dir / "attachments", read_only=read_only)
                return Stores(log, attachments, sealer=sealer)
            return Stores(log, attachment_store(config), fold_store(config), sealer=sealer)
        except BaseException:
            log.close()
            sealer.close()
            raise
    raise ConfigError(f"backend {config.backend!r} is not available in this build")


# ------------------------------------------------------------------ the faust runtime's Kafka client

_AIOKAFKA_TRANSLATED = frozenset(
    {
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
)


def aiokafka_credentials(kafka: KafkaConfig) -> Any:
    """faust's (aiokafka's) credentials for the security settings of ``kafka.client_properties`` (``None``
    on PLAINTEXT). Other librdkafka properties have no aiokafka equivalent here: ConfigError."""
    require("faust", what="the faust projector runtime")
    from faust.auth import SASLCredentials, SSLCredentials

    props = dict(kafka.client_properties)
    other = sorted(set(props) - _AIOKAFKA_TRANSLATED)
    if other:
        raise ConfigError(
            f"the faust projector runtime cannot apply the librdkafka client properties {', '.join(other)}; "
            "remove them or use the confluent runtime (FOLDLINE_PROJECTOR_RUNTIME=confluent)"
        )
    protocol = kafka.security_protocol
    if protocol == "PLAINTEXT":
        return None
    context = _ssl_context(props) if protocol in ("SSL", "SASL_SSL") else None
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
    import ssl

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
