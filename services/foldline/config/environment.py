"""The environment: every ``FOLDLINE_*`` variable foldline reads, its parser and the field it sets.

:data:`SETTINGS` is the table :meth:`foldline.config.Config.from_env` walks (an unset or empty variable
leaves the field's default, written only in :mod:`.settings`); :func:`kafka_properties` gathers the Kafka
client's librdkafka properties from the file named by ``FOLDLINE_KAFKA_CLIENT_PROPERTIES`` and the
dedicated security variables. The values a choice may take (:data:`BACKENDS`, :data:`RUNTIMES`,
:data:`ARCHIVE_STORES`, :data:`KEY_STORES`) live here with the parsers that check them.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from ..errors import ConfigError

__all__ = [
    "ARCHIVE_STORES",
    "BACKENDS",
    "KEY_STORES",
    "BUILT_IN_PROVIDERS",
    "KAFKA_SECURITY_VARIABLES",
    "PROVIDER_KINDS",
    "RUNTIMES",
    "SETTINGS",
    "ArchiveStoreKind",
    "Backend",
    "KeyStoreKind",
    "ProjectorRuntime",
    "Setting",
    "kafka_properties",
    "key_variable",
    "read_client_properties",
    "servers",
]

Backend = Literal["embedded", "kafka", "distributed"]
BACKENDS: tuple[str, ...] = ("embedded", "kafka", "distributed")
ProjectorRuntime = Literal["confluent", "faust"]
RUNTIMES: tuple[str, ...] = ("confluent", "faust")
ArchiveStoreKind = Literal["off", "s3", "dir"]
ARCHIVE_STORES: tuple[str, ...] = ("off", "s3", "dir")
KeyStoreKind = Literal["auto", "dir", "s3"]
KEY_STORES: tuple[str, ...] = ("auto", "dir", "s3")


@dataclass(frozen=True, slots=True)
class Setting:
    """One environment variable and the field it sets."""

    env: str
    path: str  # "section.field" (or a top-level field)
    parse: Callable[[str], Any]
    doc: str
    fallbacks: tuple[str, ...] = ()  # read when the variable itself is unset
    secret: bool = False  # masked by :meth:`Config.describe`
    empty_ok: bool = False  # an empty value is a value, not "unset"


def _text(raw: str) -> str:
    if not raw:
        raise ValueError("it is empty")
    return raw


def _positive_int(raw: str) -> int:
    value = int(raw)
    if value < 1:
        raise ValueError("it must be at least 1")
    return value


def _port(raw: str) -> int:
    value = int(raw)
    if not 0 <= value <= 65535:
        raise ValueError("a port is 0..65535")
    return value


def _seconds(raw: str) -> float:
    value = float(raw)
    if not value > 0:
        raise ValueError("a duration in seconds must be positive")
    return value


def _non_negative_seconds(raw: str) -> float:
    value = float(raw)
    if not value >= 0:
        raise ValueError("a duration in seconds must be 0 or more")
    return value


def _fraction(raw: str) -> float:
    value = float(raw)
    if not 0 <= value < 1:
        raise ValueError("it must be within [0, 1)")
    return value


def _bool(raw: str) -> bool:
    lowered = raw.lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ValueError("use true or false")


#: The kinds of provider API a server under a name of its own may speak, and the variable listing them.
PROVIDER_KINDS: dict[str, str] = {
    "anthropic": "FOLDLINE_ANTHROPIC_COMPATIBLE",  # Anthropic Messages (a gateway, a proxy)
    "openai": "FOLDLINE_OPENAI_COMPATIBLE",  # OpenAI Chat Completions (vLLM, SGLang, a gateway, DeepSeek)
    "deepseek": "FOLDLINE_DEEPSEEK_COMPATIBLE",  # Chat Completions with DeepSeek's reasoning_content
}
#: A provider name given to a server: it is also the prefix of its key's variable (``<NAME>_API_KEY``).
PROVIDER_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
BUILT_IN_PROVIDERS = ("anthropic", "openai")  # FOLDLINE_ANTHROPIC_URL, FOLDLINE_OPENAI_URL


def key_variable(provider: str) -> str:
    """The variable holding the API key of the server named ``provider``: ``<NAME>_API_KEY`` (``-`` and ``.``
    become ``_``), as ``ANTHROPIC_API_KEY``, ``OPENAI_API_KEY`` and ``DEEPSEEK_API_KEY`` already are."""
    return re.sub(r"[^A-Z0-9]", "_", provider.upper()) + "_API_KEY"


def servers(raw: str) -> list[tuple[str, str]]:
    """``name=base-url`` entries, separated by commas or whitespace, as ``(name, url)`` pairs."""
    out: list[tuple[str, str]] = []
    for entry in re.split(r"[,\s]+", raw.strip()):
        if not entry:
            continue
        name, sep, url = entry.partition("=")
        if not sep or not url:
            raise ValueError(f"{entry!r} is not name=base-url (e.g. vllm=http://gpu-1:8000/v1)")
        if not PROVIDER_NAME_RE.fullmatch(name):
            raise ValueError(f"the provider name {name!r} must be letters, digits, '.', '_' or '-' (at most 64)")
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"the base URL of {name!r} must start with http:// or https://, not {url!r}")
        if name in BUILT_IN_PROVIDERS:
            raise ValueError(f"{name!r} is set by FOLDLINE_{name.upper()}_URL; give this server another name")
        out.append((name, url))
    if not out:
        raise ValueError("it names no server")
    return out


def _servers(raw: str) -> str:
    """The list checked and written back in one form (``name=url,name=url``)."""
    return ",".join(f"{n}={u}" for n, u in servers(raw))


def _choice(options: tuple[str, ...]) -> Callable[[str], str]:
    def parse(raw: str) -> str:
        if raw not in options:
            raise ValueError(f"choose one of {', '.join(options)}")
        return raw

    return parse


SETTINGS: tuple[Setting, ...] = (
    Setting("FOLDLINE_BACKEND", "backend", _choice(BACKENDS), "embedded, kafka or distributed"),
    Setting("FOLDLINE_DATA_DIR", "data_dir", Path, "the embedded log and attachments; the demo's process logs"),
    Setting(
        "FOLDLINE_DEMO_MCP_SERVER",
        "demo_mcp_server",
        Path,
        "server-everything's entry script, run by demo-mcp with node (unset: npx; off: no demo-mcp)",
    ),
    Setting(
        "FOLDLINE_OUTAGE_SECONDS",
        "outage_s",
        _seconds,
        "seconds a dependency that does not answer (Kafka, Redis, S3) is waited out before a step fails",
    ),
    Setting(
        "FOLDLINE_SQLITE_BUSY_TIMEOUT",
        "embedded.busy_timeout_s",
        _seconds,
        "seconds to wait for another writer's lock on the embedded log",
    ),
    Setting("FOLDLINE_KAFKA_BOOTSTRAP", "kafka.bootstrap", _text, "Kafka bootstrap servers"),
    Setting("FOLDLINE_KAFKA_TOPIC", "kafka.topic", _text, "session-event topic (also <topic>.index, <topic>.dlq)"),
    Setting("FOLDLINE_KAFKA_PARTITIONS", "kafka.partitions", _positive_int, "the topic's partition count"),
    Setting(
        "FOLDLINE_KAFKA_REPLICATION_FACTOR",
        "kafka.replication_factor",
        _positive_int,
        "replication factor of the topics the log creates",
    ),
    Setting("FOLDLINE_KAFKA_REGISTRY_URL", "kafka.registry_url", _text, "Schema Registry (Confluent framing)"),
    Setting(
        "FOLDLINE_PROJECTOR_GROUP",
        "kafka.projector_group",
        _text,
        "projectors' consumer group (unset: <topic>.projectors)",
    ),
    Setting("FOLDLINE_KAFKA_TIMEOUT", "kafka.timeout_s", _seconds, "seconds any one broker wait may take"),
    Setting(
        "FOLDLINE_KAFKA_TRANSACTION_TIMEOUT",
        "kafka.transaction_timeout_s",
        _seconds,
        "seconds a writer transaction may stay open",
    ),
    Setting(
        "FOLDLINE_KAFKA_MIN_INSYNC_REPLICAS",
        "kafka.min_insync_replicas",
        _positive_int,
        "min.insync.replicas of the topics the log creates (and at least this on existing ones)",
    ),
    Setting(
        "FOLDLINE_KAFKA_RETENTION",
        "kafka.retention_s",
        _seconds,
        "seconds the event topic keeps events when an archive is configured (created topics; else forever)",
    ),
    Setting("FOLDLINE_REDIS_URL", "redis.url", _text, "Redis of the folds and the step stream", secret=True),
    Setting("FOLDLINE_REDIS_SOCKET_TIMEOUT", "redis.socket_timeout_s", _seconds, "seconds one Redis command may take"),
    Setting("FOLDLINE_REDIS_CONNECT_TIMEOUT", "redis.connect_timeout_s", _seconds, "seconds to connect to Redis"),
    Setting("FOLDLINE_REDIS_MAX_CONNECTIONS", "redis.max_connections", _positive_int, "Redis connections per process"),
    Setting("FOLDLINE_FOLD_PREFIX", "folds.prefix", _text, "Redis key prefix of the folds"),
    Setting("FOLDLINE_S3_BUCKET", "s3.bucket", _text, "attachment bucket"),
    Setting("FOLDLINE_S3_PREFIX", "s3.prefix", str, "key prefix of the attachment objects", empty_ok=True),
    Setting(
        "FOLDLINE_S3_ENDPOINT", "s3.endpoint", _text, "S3 endpoint (unset: AWS)", fallbacks=("AWS_ENDPOINT_URL_S3",)
    ),
    Setting("FOLDLINE_S3_REGION", "s3.region", _text, "S3 region (unset: boto3's chain, e.g. AWS_DEFAULT_REGION)"),
    Setting("FOLDLINE_S3_CONNECT_TIMEOUT", "s3.connect_timeout_s", _seconds, "seconds to connect to S3"),
    Setting("FOLDLINE_S3_READ_TIMEOUT", "s3.read_timeout_s", _seconds, "seconds an S3 response may take"),
    Setting("FOLDLINE_S3_MAX_ATTEMPTS", "s3.max_attempts", _positive_int, "tries per S3 request"),
    Setting("FOLDLINE_S3_MAX_CONNECTIONS", "s3.max_connections", _positive_int, "S3 connections per process"),
    Setting("FOLDLINE_DISPATCH_STREAM", "dispatch.stream", _text, "Redis stream loops hand steps to"),
    Setting("FOLDLINE_DISPATCH_GROUP", "dispatch.group", _text, "dispatchers' consumer group on the stream"),
    Setting("FOLDLINE_DISPATCH_CONCURRENCY", "dispatch.concurrency", _positive_int, "steps in flight per dispatcher"),
    Setting("FOLDLINE_DISPATCH_FOLD_TIMEOUT", "dispatch.fold_timeout_s", _seconds, "seconds to wait for a step's fold"),
    Setting(
        "FOLDLINE_DISPATCH_HANDOVER_TIMEOUT",
        "dispatch.handover_timeout_s",
        _seconds,
        "seconds a loop waits for a prepared step (the fold wait included)",
    ),
    Setting(
        "FOLDLINE_DISPATCH_ANSWER_TIMEOUT",
        "dispatch.answer_timeout_s",
        _seconds,
        "seconds a loop waits for the answer to a step a dispatcher took",
    ),
    Setting(
        "FOLDLINE_DISPATCH_CLAIM_IDLE",
        "dispatch.claim_idle_s",
        _seconds,
        "seconds before a dead dispatcher's hand-over is taken over",
    ),
    Setting("FOLDLINE_PROJECTOR_RUNTIME", "projector.runtime", _choice(RUNTIMES), "confluent or faust"),
    Setting("FOLDLINE_PROJECTOR_MAX_BATCH", "projector.max_batch", _positive_int, "records per poll and apply"),
    Setting(
        "FOLDLINE_PROJECTOR_COMMIT_INTERVAL",
        "projector.commit_interval_s",
        _seconds,
        "seconds between a projector's offset commits (0: after every batch)",
    ),
    Setting("FOLDLINE_ANTHROPIC_URL", "providers.anthropic_url", _text, "Anthropic base URL (unset: emulator)"),
    Setting("FOLDLINE_OPENAI_URL", "providers.openai_url", _text, "OpenAI base URL (unset: emulator)"),
    Setting(
        "FOLDLINE_EMULATOR_LATENCY",
        "providers.emulator_latency_s",
        _non_negative_seconds,
        "seconds the in-process emulator takes to answer (a model's time; 0: at once)",
    ),
    Setting(
        "FOLDLINE_EMULATOR_LATENCY_SPREAD",
        "providers.emulator_latency_spread",
        _fraction,
        "each emulated answer takes (1 ± this) x the latency, evenly spread",
    ),
    Setting(
        "FOLDLINE_ANTHROPIC_COMPATIBLE",
        "providers.anthropic_compatible",
        _servers,
        "other servers of the Anthropic Messages API as name=base-URL, comma-separated (key: <NAME>_API_KEY)",
    ),
    Setting(
        "FOLDLINE_OPENAI_COMPATIBLE",
        "providers.openai_compatible",
        _servers,
        "other servers of the OpenAI Chat Completions API (vLLM, a gateway) as name=base-URL (key: <NAME>_API_KEY)",
    ),
    Setting(
        "FOLDLINE_DEEPSEEK_COMPATIBLE",
        "providers.deepseek_compatible",
        _servers,
        "servers of DeepSeek's reasoning_content chat as name=base-URL (key: <NAME>_API_KEY)",
    ),
    Setting("ANTHROPIC_API_KEY", "providers.anthropic_api_key", _text, "Anthropic API key", secret=True),
    Setting("OPENAI_API_KEY", "providers.openai_api_key", _text, "OpenAI API key", secret=True),
    Setting(
        "FOLDLINE_PROVIDER_CONNECT_TIMEOUT", "transport.connect_timeout_s", _seconds, "seconds to connect to a provider"
    ),
    Setting(
        "FOLDLINE_PROVIDER_READ_TIMEOUT",
        "transport.read_timeout_s",
        _seconds,
        "seconds allowed between two bytes of an answer",
    ),
    Setting("FOLDLINE_PROVIDER_WRITE_TIMEOUT", "transport.write_timeout_s", _seconds, "seconds to send a request body"),
    Setting(
        "FOLDLINE_PROVIDER_POOL_TIMEOUT", "transport.pool_timeout_s", _seconds, "seconds to wait for a free connection"
    ),
    Setting(
        "FOLDLINE_PROVIDER_MAX_CONNECTIONS",
        "transport.max_connections",
        _positive_int,
        "provider connections per process",
    ),
    Setting(
        "FOLDLINE_PROVIDER_MAX_KEEPALIVE",
        "transport.max_keepalive_connections",
        _positive_int,
        "idle provider connections kept open",
    ),
    Setting(
        "FOLDLINE_PROVIDER_KEEPALIVE_EXPIRY",
        "transport.keepalive_expiry_s",
        _seconds,
        "seconds an idle connection is kept",
    ),
    Setting(
        "FOLDLINE_PROVIDER_POOL_SHARDS",
        "transport.pool_shards",
        _positive_int,
        "connection pools the connections are split over",
    ),
    Setting("FOLDLINE_PROVIDER_HTTP2", "transport.http2", _bool, "HTTP/2 to the providers (needs h2)"),
    Setting("FOLDLINE_PROVIDER_MAX_ATTEMPTS", "transport.max_attempts", _positive_int, "attempts per provider request"),
    Setting(
        "FOLDLINE_PROVIDER_INITIAL_BACKOFF",
        "transport.initial_backoff_s",
        _seconds,
        "first retry wait when the answer names none",
    ),
    Setting(
        "FOLDLINE_PROVIDER_MAX_BACKOFF",
        "transport.max_backoff_s",
        _seconds,
        "longest retry wait when the answer names none",
    ),
    Setting("FOLDLINE_PROVIDER_JITTER", "transport.jitter", _fraction, "share of a retry wait drawn at random (0..1)"),
    Setting(
        "FOLDLINE_PROVIDER_MAX_RETRY_AFTER",
        "transport.max_retry_after_s",
        _seconds,
        "longest retry-after honoured; longer: give up",
    ),
    Setting(
        "FOLDLINE_PROVIDER_RETRY_DEADLINE",
        "transport.retry_deadline_s",
        _seconds,
        "no attempt starts later than this after the first",
    ),
    Setting(
        "FOLDLINE_PROVIDER_CONCURRENCY",
        "transport.concurrency_initial",
        _positive_int,
        "starting concurrency limit per provider",
    ),
    Setting(
        "FOLDLINE_PROVIDER_CONCURRENCY_MIN", "transport.concurrency_min", _positive_int, "the adaptive limit's floor"
    ),
    Setting(
        "FOLDLINE_PROVIDER_CONCURRENCY_MAX", "transport.concurrency_max", _positive_int, "the adaptive limit's ceiling"
    ),
    Setting(
        "FOLDLINE_PROVIDER_MAX_ANSWER_BYTES",
        "transport.max_answer_bytes",
        _positive_int,
        "largest answer kept, streamed or not",
    ),
    Setting(
        "FOLDLINE_PROVIDER_LOG_CHUNKS", "transport.log_chunks", _bool, "append each streamed event as assistant/chunk"
    ),
    Setting(
        "FOLDLINE_PROVIDER_RETRY_CUT_STREAMS",
        "transport.retry_cut_streams",
        _bool,
        "send a streamed answer cut after its first byte again (a logged attempt)",
    ),
    Setting(
        "FOLDLINE_PRICES", "prices", Path, "a CSV price table whose rows override or extend the shipped one (Cost)"
    ),
    Setting("FOLDLINE_METRICS_PORT", "metrics.port", _port, "serve /metrics, /healthz, /readyz (0: any port)"),
    Setting("FOLDLINE_METRICS_HOST", "metrics.host", _text, "address the metrics endpoint binds to"),
    Setting("FOLDLINE_CONSOLE_PORT", "console.port", _port, "port of foldline console (0: any port)"),
    Setting(
        "FOLDLINE_CONSOLE_BIND", "console.bind", _text, "address foldline console binds to (not loopback: a token)"
    ),
    Setting(
        "FOLDLINE_CONSOLE_TOKEN",
        "console.token",
        _text,
        "the token every console request must carry; required to bind beyond loopback",
        secret=True,
    ),
    Setting("FOLDLINE_ARCHIVE", "archive.store", _choice(ARCHIVE_STORES), "session archive: off, s3 or dir"),
    Setting("FOLDLINE_ARCHIVE_BUCKET", "archive.bucket", _text, "bucket of the session archive (s3)"),
    Setting("FOLDLINE_ARCHIVE_PREFIX", "archive.prefix", str, "key prefix of the archive's objects", empty_ok=True),
    Setting(
        "FOLDLINE_ARCHIVE_DIR",
        "archive.dir",
        Path,
        "directory of the session archive (dir; default <data dir>/archive)",
    ),
    Setting("FOLDLINE_ARCHIVE_SESSIONS", "archive.sessions", _text, "comma-separated patterns of archived session ids"),
    Setting(
        "FOLDLINE_ARCHIVE_IDLE", "archive.idle_s", _seconds, "seconds a session idles after turn/end before archiving"
    ),
    Setting(
        "FOLDLINE_ARCHIVE_MAX_DELAY", "archive.max_delay_s", _seconds, "seconds within which every event is archived"
    ),
    Setting(
        "FOLDLINE_ARCHIVE_SEGMENT_EVENTS",
        "archive.segment_events",
        _positive_int,
        "events waiting that start a segment at once",
    ),
    Setting("FOLDLINE_ARCHIVE_GROUP", "archive.group", _text, "archivers' consumer group (unset: <topic>.archivers)"),
    Setting("FOLDLINE_ARCHIVE_CONCURRENCY", "archive.concurrency", _positive_int, "segments written at once"),
    Setting(
        "FOLDLINE_ARCHIVE_MAX_SEGMENTS",
        "archive.max_segments",
        _positive_int,
        "segments per session above which the archiver merges them",
    ),
    Setting(
        "FOLDLINE_ARCHIVE_GRACE",
        "archive.grace_s",
        _seconds,
        "seconds a segment a merge replaced is kept for readers before it is deleted",
    ),
    Setting("FOLDLINE_ENCRYPTION", "encryption.enabled", _bool, "seal new content under per-session keys (erasable)"),
    Setting("FOLDLINE_KEY_STORE", "encryption.store", _choice(KEY_STORES), "where data keys live: auto, dir or s3"),
    Setting("FOLDLINE_KEY_DIR", "encryption.key_dir", Path, "directory of keys.sqlite3 (dir; unset: the data dir)"),
    Setting("FOLDLINE_KEYS_BUCKET", "encryption.bucket", _text, "bucket of the key store (s3)"),
    Setting("FOLDLINE_KEYS_PREFIX", "encryption.prefix", str, "key prefix of the key store's objects", empty_ok=True),
    Setting("FOLDLINE_KEY_CACHE_TTL", "encryption.cache_ttl_s", _seconds, "seconds a process keeps a data key it read"),
    Setting(
        "FOLDLINE_KEY_ENCRYPTION_KEY",
        "encryption.key_encryption_key",
        _text,
        "wraps every data key in the store (32 bytes, base64 or hex)",
        secret=True,
    ),
)

#: Variables that set one librdkafka property each; they override the client-properties file.
KAFKA_SECURITY_VARIABLES: dict[str, str] = {
    "FOLDLINE_KAFKA_SECURITY_PROTOCOL": "security.protocol",
    "FOLDLINE_KAFKA_SASL_MECHANISM": "sasl.mechanism",
    "FOLDLINE_KAFKA_SASL_USERNAME": "sasl.username",
    "FOLDLINE_KAFKA_SASL_PASSWORD": "sasl.password",
    "FOLDLINE_KAFKA_SSL_CA_LOCATION": "ssl.ca.location",
    "FOLDLINE_KAFKA_SSL_CA_PEM": "ssl.ca.pem",
    "FOLDLINE_KAFKA_SSL_CERTIFICATE_LOCATION": "ssl.certificate.location",
    "FOLDLINE_KAFKA_SSL_KEY_LOCATION": "ssl.key.location",
    "FOLDLINE_KAFKA_SSL_KEY_PASSWORD": "ssl.key.password",
}


def read_client_properties(path: str | Path) -> dict[str, str]:
    """librdkafka properties from a file of ``key=value`` lines (``#`` / ``!`` comments, blank lines)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(
            f"cannot read the Kafka client-properties file {path} (FOLDLINE_KAFKA_CLIENT_PROPERTIES): "
            f"{exc.strerror or exc}"
        ) from exc
    props: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if not stripped or stripped.startswith(("#", "!")):
            continue
        key, sep, value = stripped.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"{path}:{number}: expected a key=value line (librdkafka property), not {stripped!r}")
        props[key.strip()] = value.strip()
    return props


def kafka_properties(env: Mapping[str, str]) -> dict[str, str]:
    props: dict[str, str] = {}
    path = env.get("FOLDLINE_KAFKA_CLIENT_PROPERTIES")
    if path:
        props.update(read_client_properties(path))
    for name, key in KAFKA_SECURITY_VARIABLES.items():
        value = env.get(name)
        if value:
            props[key] = value
    return props
