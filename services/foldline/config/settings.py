"""Every setting a foldline process reads, each with its one default, and where it comes from.

:class:`Config` is a tree of frozen sections — ``kafka``, ``redis``, ``folds``, ``s3``, ``dispatch``, ``transport``
(:class:`~foldline.providers.settings.TransportSettings`: provider HTTP, retries, adaptive concurrency),
``projector``, ``providers``, ``metrics``, ``archive``, ``encryption`` (sealed content and its key store) — plus the
backend and the data directory.
:meth:`Config.from_env` reads the ``FOLDLINE_*`` variables listed in :data:`SETTINGS` (and, for Kafka, an
optional librdkafka client-properties file); an unset variable leaves the field's default, which is
written only here. Command-line options override single fields (:meth:`Config.overridden`); they carry no
defaults of their own. :mod:`foldline.config.factories` turns a Config into adapters.

Secrets never show: ``repr()`` of any section masks the Kafka client's passwords and keys, the Redis URL's
password and the provider API keys (:func:`masked`).

Kafka security (SASL and TLS) lives in ``kafka.client_properties``, librdkafka's property names and
values: read first from the file named by ``FOLDLINE_KAFKA_CLIENT_PROPERTIES`` (``key=value`` lines,
``#`` comments), then overridden by the dedicated variables (``FOLDLINE_KAFKA_SECURITY_PROTOCOL``,
``FOLDLINE_KAFKA_SASL_USERNAME``, ...). The same properties reach every librdkafka client and are
translated for the faust runtime's aiokafka client (:func:`foldline.config.factories.aiokafka_credentials`).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from ..errors import ConfigError
from ..ports.archive import MANIFEST_MAX_AGE_S, MAX_BACKOFF_S, longest_read_s
from ..providers.settings import TransportSettings
from .environment import (
    ARCHIVE_STORES,
    BACKENDS,
    KEY_STORES,
    PROVIDER_KINDS,
    RUNTIMES,
    SETTINGS,
    ArchiveStoreKind,
    Backend,
    KeyStoreKind,
    ProjectorRuntime,
    kafka_properties,
    key_variable,
    servers,
)

__all__ = [
    "ArchiveConfig",
    "Config",
    "DispatchConfig",
    "EmbeddedConfig",
    "EncryptionConfig",
    "FoldsConfig",
    "KafkaConfig",
    "MetricsConfig",
    "ProjectorConfig",
    "ProvidersConfig",
    "RedisConfig",
    "S3Config",
    "masked",
    "masked_url",
]

SECURITY_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")

MASK = "***"
# librdkafka properties foldline sets itself (they decide correctness or come from another setting)
_OWNED_PROPERTIES = {
    "bootstrap.servers": "FOLDLINE_KAFKA_BOOTSTRAP",
    "group.id": "FOLDLINE_PROJECTOR_GROUP",
    "transactional.id": None,
    "enable.idempotence": None,
    "acks": None,
    "isolation.level": None,
    "enable.auto.commit": None,
}


def _is_secret_property(key: str) -> bool:
    k = key.lower()
    return "password" in k or "secret" in k or k in ("ssl.key.pem", "ssl_key", "sasl.oauthbearer.config")


def masked(properties: Mapping[str, str]) -> dict[str, str]:
    """Client properties with every password, secret and private key replaced by ``***``."""
    return {k: (MASK if _is_secret_property(k) and v else v) for k, v in properties.items()}


def masked_url(url: str) -> str:
    """A URL without its password (``redis://user:***@host:port/db``)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.hostname or ""
    port = f":{parts.port}" if parts.port else ""
    return urlunsplit((parts.scheme, f"{user}:{MASK}@{host}{port}", parts.path, parts.query, parts.fragment))


# ------------------------------------------------------------------ sections


@dataclass(frozen=True, slots=True)
class KafkaConfig:
    """The session-event log on Kafka, and how every Kafka client of a process connects."""

    bootstrap: str = "127.0.0.1:19092"
    topic: str = "foldline.session-events"
    partitions: int = 12  # must match the topic: sessions map to partitions by this count
    replication_factor: int = 1  # of the topics the log creates (checked at start-up: at least this)
    min_insync_replicas: int = 1  # of the topics the log creates (checked at start-up: at least this)
    retention_s: float = 604_800.0  # the event topic's retention when an archive keeps the log (created topics)
    registry_url: str | None = None  # Confluent Schema Registry; unset: Avro single-object encoding
    projector_group: str | None = None  # unset: "<topic>.projectors" (see :attr:`group`)
    timeout_s: float = 10.0  # bounds every broker wait of one call (metadata, take-over, reads)
    transaction_timeout_s: float = 5.0  # the group writer's transactions
    # librdkafka properties of every client: security (security.protocol, sasl.*, ssl.*) and tuning
    client_properties: Mapping[str, str] = field(default_factory=dict)

    @property
    def group(self) -> str:
        """The projectors' consumer group: one per topic unless named."""
        return self.projector_group or f"{self.topic}.projectors"

    @property
    def security_protocol(self) -> str:
        return self.client_properties.get("security.protocol", "PLAINTEXT").upper()

    def librdkafka(self) -> dict[str, str]:
        """The client properties to pass to a confluent-kafka client (secrets included)."""
        return dict(self.client_properties)

    def __repr__(self) -> str:
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        fields["client_properties"] = masked(self.client_properties)
        return "KafkaConfig(" + ", ".join(f"{k}={v!r}" for k, v in fields.items()) + ")"


@dataclass(frozen=True, slots=True)
class RedisConfig:
    """Redis: the folds, and the step stream between loops and dispatchers.

    ``socket_timeout_s`` bounds one command (a batch apply included); a blocking wait (a loop waiting for
    its dispatcher's reply) adds its own wait to it. ``max_connections`` bounds each process's pool (a
    command waits for a free connection up to ``socket_timeout_s``, then fails naming the setting); fold
    waits share one watcher, so a dispatcher's steps in flight (``dispatch.concurrency``) need no connection
    each.
    """

    url: str = "redis://127.0.0.1:16379/0"
    socket_timeout_s: float = 10.0
    connect_timeout_s: float = 5.0
    max_connections: int = 128

    def __repr__(self) -> str:
        return (
            f"RedisConfig(url={masked_url(self.url)!r}, socket_timeout_s={self.socket_timeout_s!r}, "
            f"connect_timeout_s={self.connect_timeout_s!r}, max_connections={self.max_connections!r})"
        )


@dataclass(frozen=True, slots=True)
class FoldsConfig:
    prefix: str = "foldline:fold:"  # Redis key prefix of the folds: projectors and dispatchers must agree


@dataclass(frozen=True, slots=True)
class S3Config:
    """The attachment bucket. Credentials come only from boto3's standard chain, never from here."""

    bucket: str = "foldline-attachments"
    prefix: str = "attachments/"
    endpoint: str | None = None  # unset: AWS (or boto3's AWS_ENDPOINT_URL_S3)
    region: str | None = None  # unset: boto3's chain (AWS_DEFAULT_REGION, profile)
    connect_timeout_s: float = 2.0
    read_timeout_s: float = 30.0
    max_attempts: int = 5  # per request, botocore's standard retry mode
    max_connections: int = 128  # the HTTP pool; a dispatcher resolves attachments of concurrent steps


@dataclass(frozen=True, slots=True)
class DispatchConfig:
    """Loops hand steps to dispatchers over a Redis stream (docs/DISPATCHER.md)."""

    stream: str = "foldline:dispatch:steps"
    group: str = "foldline-dispatchers"
    concurrency: int = 1024  # hand-overs in flight per dispatcher process, across sessions
    fold_timeout_s: float = 60.0  # wait for the fold to reach a step's boundary (a projector restart fits)
    handover_timeout_s: float = 120.0  # a loop waits this long for a prepared step (fold wait included)
    answer_timeout_s: float = 600.0  # ... and this long for the provider's answer to a taken send
    claim_idle_s: float = 15.0  # a hand-over its dispatcher left this long is taken over by another


@dataclass(frozen=True, slots=True)
class ProjectorConfig:
    runtime: ProjectorRuntime = "confluent"
    max_batch: int = 5000  # records per poll and per apply
    # offsets are committed after the apply, at most this often (0: after every batch); a restart or a
    # rebalance folds again at most this much, which the store skips as duplicates
    commit_interval_s: float = 1.0


@dataclass(frozen=True, slots=True)
class ProvidersConfig:
    """Model providers of the dispatcher. A provider without a base URL is answered by the emulator, which
    holds each answer ``emulator_latency_s`` before its first byte (a model's time; 0: at once), within
    ``± emulator_latency_spread`` of it (a model's time varies with what it writes).

    ``*_compatible``: other servers of each kind of API under names of their own (``name=url,...``: a
    CallConfig naming ``name`` is sent there), each with its key from ``<NAME>_API_KEY`` (``server_api_keys``).
    """

    anthropic_url: str | None = None
    openai_url: str | None = None
    emulator_latency_s: float = 0.0
    emulator_latency_spread: float = 0.5
    anthropic_api_key: str | None = field(default=None, repr=False)
    openai_api_key: str | None = field(default=None, repr=False)
    anthropic_compatible: str | None = None
    openai_compatible: str | None = None
    deepseek_compatible: str | None = None
    server_api_keys: tuple[tuple[str, str], ...] = field(default=(), repr=False)  # (name, key) of those servers

    def servers(self) -> list[tuple[str, str, str]]:
        """Every server under a name of its own, as ``(kind, name, base URL)``; kind: anthropic | openai | deepseek."""
        lists = {"anthropic": self.anthropic_compatible, "openai": self.openai_compatible}
        lists["deepseek"] = self.deepseek_compatible
        return [(kind, n, u) for kind, raw in lists.items() if raw for n, u in servers(raw)]

    def api_key(self, name: str) -> str | None:
        """The API key of the server named ``name`` (``<NAME>_API_KEY``), if one is set."""
        return dict(self.server_api_keys).get(name)

    def configured_variables(self) -> list[str]:
        """The variables that send some provider's requests to a server rather than the emulator."""
        chosen = [("FOLDLINE_ANTHROPIC_URL", self.anthropic_url), ("FOLDLINE_OPENAI_URL", self.openai_url)]
        chosen += [(PROVIDER_KINDS["anthropic"], self.anthropic_compatible)]
        chosen += [(PROVIDER_KINDS["openai"], self.openai_compatible)]
        chosen += [(PROVIDER_KINDS["deepseek"], self.deepseek_compatible)]
        return [name for name, value in chosen if value]

    def __repr__(self) -> str:
        def key(value: str | None) -> str | None:
            return MASK if value else None

        keys = {name: MASK for name, _ in self.server_api_keys}
        return (
            f"ProvidersConfig(anthropic_url={self.anthropic_url!r}, openai_url={self.openai_url!r}, "
            f"emulator_latency_s={self.emulator_latency_s!r}, "
            f"emulator_latency_spread={self.emulator_latency_spread!r}, "
            f"anthropic_api_key={key(self.anthropic_api_key)!r}, openai_api_key={key(self.openai_api_key)!r}, "
            f"anthropic_compatible={self.anthropic_compatible!r}, openai_compatible={self.openai_compatible!r}, "
            f"deepseek_compatible={self.deepseek_compatible!r}, server_api_keys={keys!r})"
        )


@dataclass(frozen=True, slots=True)
class MetricsConfig:
    port: int | None = None  # serve /metrics, /healthz, /readyz; 0 picks a free port; unset: off
    host: str = "127.0.0.1"


@dataclass(frozen=True, slots=True)
class ConsoleConfig:
    """The operator console (``foldline console``): where it listens and the token it asks for.

    It binds to loopback unless told otherwise; any other address needs ``token`` (it refuses to start
    without one), and then every request must carry it."""

    port: int = 8765
    bind: str = "127.0.0.1"
    token: str | None = None

    def __repr__(self) -> str:
        token = MASK if self.token else None
        return f"ConsoleConfig(port={self.port!r}, bind={self.bind!r}, token={token!r})"


@dataclass(frozen=True, slots=True)
class ArchiveConfig:
    """The session archive (docs/RETENTION.md): where it is, which sessions go there, and when.

    ``store`` is ``off`` (no archive: the topic must keep events forever), ``s3`` (``bucket`` under
    ``prefix``, through the ``s3`` section's endpoint, region and timeouts) or ``dir`` (``dir``, default
    ``<data dir>/archive``: the embedded backend's backup). An event is archived at the latest
    ``max_delay_s`` after it was written; a session's events go sooner once it has been idle ``idle_s``
    after a ``turn/end``, or when ``segment_events`` of them wait. A session's segments are merged while it
    has more than ``max_segments``; the segments a merge replaced are deleted ``grace_s`` after it.
    """

    store: ArchiveStoreKind = "off"
    bucket: str = "foldline-archive"
    prefix: str = "archive/"
    dir: Path | None = None
    sessions: str = "*"  # comma-separated fnmatch patterns of the session ids archived
    idle_s: float = 60.0
    max_delay_s: float = 3600.0
    segment_events: int = 10_000
    group: str | None = None  # the archivers' consumer group; unset: "<topic>.archivers"
    concurrency: int = 16  # segments written at once per archiver process
    max_segments: int = 4  # a session's segments are merged while it has more (docs/RETENTION.md, "Merging")
    grace_s: float = 3600.0  # a segment a merge replaced is deleted this long after it

    @property
    def enabled(self) -> bool:
        return self.store != "off"

    @property
    def patterns(self) -> tuple[str, ...]:
        return tuple(p.strip() for p in self.sessions.split(",") if p.strip())

    def group_for(self, topic: str) -> str:
        return self.group or f"{topic}.archivers"

    def directory(self, data_dir: Path) -> Path:
        return self.dir if self.dir is not None else data_dir / "archive"


@dataclass(frozen=True, slots=True)
class EncryptionConfig:
    """Sealed content and its keys (docs/ERASURE.md).

    ``enabled``: new content is sealed under a data key per session (on by default: a session written without it
    cannot be erased by destroying a key later). ``store`` says where the keys live: ``dir`` (``keys.sqlite3`` in
    ``key_dir``, default the data directory), ``s3`` (``bucket`` under ``prefix``, through the ``s3`` section's
    endpoint), or ``auto``: ``s3`` on the distributed backend, ``dir`` otherwise. ``cache_ttl_s`` bounds how long
    a process keeps a key it read (and so how long after an erasure it could still read the session).
    ``key_encryption_key`` wraps every data key in the store (32 bytes, base64 or hex).
    """

    enabled: bool = True
    store: KeyStoreKind = "auto"
    key_dir: Path | None = None
    bucket: str = "foldline-keys"
    prefix: str = "keys/"
    cache_ttl_s: float = 30.0
    key_encryption_key: str | None = field(default=None, repr=False)

    def store_for(self, backend: str) -> str:
        """The key store this configuration names on ``backend``: ``dir`` or ``s3``."""
        if self.store != "auto":
            return self.store
        return "s3" if backend == "distributed" else "dir"

    def directory(self, data_dir: Path) -> Path:
        return self.key_dir if self.key_dir is not None else data_dir


@dataclass(frozen=True, slots=True)
class EmbeddedConfig:
    """The embedded backend's SQLite log."""

    busy_timeout_s: float = 10.0  # another writer's lock: wait this long, then StoreBusy (nothing written)


@dataclass(frozen=True, slots=True)
class Config:
    """Everything a foldline process is configured with; see the module docstring."""

    data_dir: Path = Path("foldline-data")  # the embedded backend's log and attachments; demo logs
    backend: Backend = "embedded"
    outage_s: float = 60.0  # a dependency that does not answer (Kafka, Redis, S3) is waited out this long
    # the entry script of @modelcontextprotocol/server-everything the demo's demo-mcp session runs with node
    # (deploy/local/mcp.sh installs one; unset: npx runs the pinned version)
    demo_mcp_server: Path | None = None
    embedded: EmbeddedConfig = field(default_factory=EmbeddedConfig)
    kafka: KafkaConfig = field(default_factory=KafkaConfig)
    redis: RedisConfig = field(default_factory=RedisConfig)
    folds: FoldsConfig = field(default_factory=FoldsConfig)
    s3: S3Config = field(default_factory=S3Config)
    dispatch: DispatchConfig = field(default_factory=DispatchConfig)
    projector: ProjectorConfig = field(default_factory=ProjectorConfig)
    providers: ProvidersConfig = field(default_factory=ProvidersConfig)
    transport: TransportSettings = field(default_factory=TransportSettings)  # provider HTTP, retries, limits
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    console: ConsoleConfig = field(default_factory=ConsoleConfig)
    archive: ArchiveConfig = field(default_factory=ArchiveConfig)
    encryption: EncryptionConfig = field(default_factory=EncryptionConfig)
    prices: Path | None = None  # a user price table over the shipped one (foldline.config.prices)

    def __post_init__(self) -> None:
        _validate(self)

    @staticmethod
    def from_env(environ: Mapping[str, str] | None = None) -> Config:
        """The configuration the environment describes (``os.environ`` by default); see :data:`SETTINGS`."""
        env = os.environ if environ is None else environ
        changes: dict[str, Any] = {}
        for s in SETTINGS:
            # an empty variable counts as unset (rendered templates often leave one empty), unless empty
            # is a value of the setting
            found = [
                (name, env[name]) for name in (s.env, *s.fallbacks) if env.get(name) or (s.empty_ok and name in env)
            ]
            if not found:
                continue
            name, raw = found[0]
            try:
                changes[s.path] = s.parse(raw.strip())
            except ValueError as exc:
                raise ConfigError(f"{name}={raw!r} is not valid: {exc}") from exc
        changes["kafka.client_properties"] = kafka_properties(env)
        config = Config()._replaced(changes)
        # each server under a name of its own has its key in <NAME>_API_KEY
        named = [(name, env.get(key_variable(name), "").strip()) for _, name, _ in config.providers.servers()]
        return config._replaced({"providers.server_api_keys": tuple((n, k) for n, k in named if k)})

    def overridden(self, **changes: Any) -> Config:
        """A copy with fields replaced; ``None`` means "not given" and keeps the field. A section's field is
        named ``section__field`` (``kafka__bootstrap="host:9092"``)."""
        return self._replaced({name.replace("__", "."): v for name, v in changes.items() if v is not None})

    def _replaced(self, changes: Mapping[str, Any]) -> Config:
        top: dict[str, Any] = {}
        nested: dict[str, dict[str, Any]] = {}
        names = {f.name for f in dataclasses.fields(self)}
        for path, value in changes.items():
            section, _, name = path.partition(".")
            if section not in names or (
                name and name not in {f.name for f in dataclasses.fields(getattr(self, section))}
            ):
                raise ConfigError(f"no configuration field {path!r}")
            if name:
                nested.setdefault(section, {})[name] = value
            else:
                top[section] = Path(value) if section == "data_dir" else value
        for section, values in nested.items():
            top[section] = dataclasses.replace(getattr(self, section), **values)
        return dataclasses.replace(self, **top)

    def to_env(self) -> dict[str, str]:
        """The variables :meth:`from_env` reads back into this configuration (secrets included: for child
        processes, never for printing). The Kafka client properties are not among them; a child inherits
        the variables and the file they came from."""
        out: dict[str, str] = {}
        for s in SETTINGS:
            value = self._get(s.path)
            if value is None:
                continue
            out[s.env] = ("true" if value else "false") if isinstance(value, bool) else str(value)
        for name, key in self.providers.server_api_keys:
            out[key_variable(name)] = key
        return out

    def describe(self) -> list[tuple[str, str, str]]:
        """Every setting as ``(variable, field, value)`` with secrets masked, for ``foldline config``."""
        rows = []
        for s in SETTINGS:
            value = self._get(s.path)
            shown = "" if value is None else str(value)
            if s.secret and value:
                shown = masked_url(shown) if s.path == "redis.url" else MASK
            rows.append((s.env, s.path, shown))
        for _, name, _ in self.providers.servers():
            key = self.providers.api_key(name)
            rows.append((key_variable(name), f"providers.server_api_keys[{name}]", MASK if key else ""))
        props = masked(self.kafka.client_properties)
        rows.append(("FOLDLINE_KAFKA_CLIENT_PROPERTIES", "kafka.client_properties", _format_properties(props)))
        return rows

    def _get(self, path: str) -> Any:
        section, _, name = path.partition(".")
        value = getattr(self, section)
        return getattr(value, name) if name else value


def _format_properties(props: Mapping[str, str]) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(props.items()))


# ------------------------------------------------------------------ checks


_AT_LEAST_ONE = {
    "partitions",
    "replication_factor",
    "min_insync_replicas",
    "max_connections",
    "max_attempts",
    "concurrency",
    "max_batch",
    "segment_events",
}

_ZERO_OR_MORE_SECONDS = {"emulator_latency_s", "commit_interval_s"}  # durations where 0 means "none"


def _validate(config: Config) -> None:
    if config.backend not in BACKENDS:
        raise ConfigError(f"unknown backend {config.backend!r}; choose one of {', '.join(BACKENDS)}")
    if config.projector.runtime not in RUNTIMES:
        raise ConfigError(f"projector runtime must be confluent or faust, not {config.projector.runtime!r}")
    for s in SETTINGS:
        value = config._get(s.path)
        name = s.path.rpartition(".")[2]
        if name in _ZERO_OR_MORE_SECONDS:
            if not value >= 0:
                raise ConfigError(f"{s.path} ({s.env}) must be 0 or more seconds, not {value!r}")
        elif name.endswith("_s") and not value > 0:
            raise ConfigError(f"{s.path} ({s.env}) must be a positive number of seconds, not {value!r}")
        if name in _AT_LEAST_ONE and not value >= 1:
            raise ConfigError(f"{s.path} ({s.env}) must be at least 1, not {value!r}")
    for what, value in (
        ("FOLDLINE_S3_BUCKET (the attachment bucket)", config.s3.bucket),
        ("FOLDLINE_FOLD_PREFIX (the fold key prefix)", config.folds.prefix),
        ("FOLDLINE_KAFKA_TOPIC", config.kafka.topic),
        ("FOLDLINE_KAFKA_BOOTSTRAP", config.kafka.bootstrap),
        ("FOLDLINE_REDIS_URL", config.redis.url),
    ):
        if not value:
            raise ConfigError(f"{what} is empty; set it or leave it unset for the default")
    if config.encryption.store not in KEY_STORES:
        raise ConfigError(f"FOLDLINE_KEY_STORE must be one of {', '.join(KEY_STORES)}, not {config.encryption.store!r}")
    if config.encryption.store_for(config.backend) == "s3" and not config.encryption.bucket:
        raise ConfigError("FOLDLINE_KEYS_BUCKET is empty; name the bucket of the key store")
    if config.archive.store not in ARCHIVE_STORES:
        raise ConfigError(f"FOLDLINE_ARCHIVE must be one of {', '.join(ARCHIVE_STORES)}, not {config.archive.store!r}")
    if not config.archive.patterns:
        raise ConfigError("FOLDLINE_ARCHIVE_SESSIONS names no session pattern; use * to archive every session")
    if config.archive.store == "s3" and not config.archive.bucket:
        raise ConfigError("FOLDLINE_ARCHIVE_BUCKET is empty; name the bucket of the session archive")
    if config.archive.max_segments < 2:
        raise ConfigError(
            f"FOLDLINE_ARCHIVE_MAX_SEGMENTS must be at least 2, not {config.archive.max_segments} (with one, every "
            "archived turn would rewrite the whole session)"
        )
    s3 = config.s3
    read_s = longest_read_s(s3.max_attempts, s3.connect_timeout_s, s3.read_timeout_s)
    least = MANIFEST_MAX_AGE_S + read_s
    if config.archive.grace_s < least:
        raise ConfigError(
            f"FOLDLINE_ARCHIVE_GRACE ({config.archive.grace_s:g} s) must be at least {least:g} s: "
            f"a reader uses a manifest for up to {MANIFEST_MAX_AGE_S:g} s and a segment read may take "
            f"{read_s:g} s ({s3.max_attempts} attempts of up to {s3.connect_timeout_s:g} + {s3.read_timeout_s:g} s "
            f"and {MAX_BACKOFF_S:g} s between them), so a merged-away segment deleted sooner could still be needed"
        )
    if config.kafka.min_insync_replicas > config.kafka.replication_factor:
        raise ConfigError(
            f"FOLDLINE_KAFKA_MIN_INSYNC_REPLICAS ({config.kafka.min_insync_replicas}) exceeds "
            f"FOLDLINE_KAFKA_REPLICATION_FACTOR ({config.kafka.replication_factor}): every append would be refused"
        )
    _validate_kafka_properties(config.kafka.client_properties)
    _validate_servers(config.providers)


def _validate_servers(p: ProvidersConfig) -> None:
    try:
        named = p.servers()
    except ValueError as exc:
        raise ConfigError(f"a list of provider servers is not valid: {exc}") from exc
    seen: dict[str, str] = {}
    for kind, name, _ in named:
        if name in seen:
            raise ConfigError(
                f"the provider name {name!r} is given twice ({PROVIDER_KINDS[seen[name]]} and {PROVIDER_KINDS[kind]}); "
                "each server needs a name of its own"
            )
        seen[name] = kind


def _validate_kafka_properties(props: Mapping[str, str]) -> None:
    for key, instead in _OWNED_PROPERTIES.items():
        if key in props:
            where = f"set {instead} instead" if instead else "foldline sets it itself"
            raise ConfigError(f"the Kafka client property {key!r} cannot be configured ({where})")
    protocol = props.get("security.protocol", "PLAINTEXT").upper()
    if protocol not in SECURITY_PROTOCOLS:
        raise ConfigError(
            f"Kafka security.protocol {props['security.protocol']!r} is unknown; "
            f"choose one of {', '.join(SECURITY_PROTOCOLS)} (FOLDLINE_KAFKA_SECURITY_PROTOCOL)"
        )
    if protocol.startswith("SASL_"):
        mechanism = props.get("sasl.mechanism") or props.get("sasl.mechanisms") or ""
        if mechanism.upper() not in SASL_MECHANISMS:
            raise ConfigError(
                f"Kafka security.protocol {protocol} needs sasl.mechanism, one of {', '.join(SASL_MECHANISMS)} "
                f"(FOLDLINE_KAFKA_SASL_MECHANISM), not {mechanism or 'nothing'!r}"
            )
        missing = [k for k in ("sasl.username", "sasl.password") if not props.get(k)]
        if missing:
            names = " and ".join(f"FOLDLINE_KAFKA_{k.upper().replace('.', '_')}" for k in missing)
            raise ConfigError(f"Kafka SASL ({mechanism.upper()}) needs {' and '.join(missing)}; set {names}")
