"""Configuration: every setting in one place, read from the environment, documented, with secrets masked."""

from __future__ import annotations

import dataclasses
import json
import re
import ssl
from pathlib import Path
from typing import Any

import certifi
import pytest
from typer.testing import CliRunner

from foldline.cli.main import app
from foldline.config import (
    KAFKA_SECURITY_VARIABLES,
    SETTINGS,
    Config,
    EmbeddedConfig,
    KafkaConfig,
    read_client_properties,
)
from foldline.config.factories import aiokafka_credentials
from foldline.errors import ConfigError
from foldline.projector import WorkerSettings

README = Path(__file__).resolve().parents[1] / "README.md"

# a value for every setting that differs from its default
SAMPLES: dict[str, str] = {
    "FOLDLINE_BACKEND": "distributed",
    "FOLDLINE_DATA_DIR": "/srv/foldline",
    "FOLDLINE_DEMO_MCP_SERVER": "/opt/mcp/server-everything/dist/index.js",
    "FOLDLINE_SQLITE_BUSY_TIMEOUT": "2.5",
    "FOLDLINE_KAFKA_BOOTSTRAP": "kafka-1:9092,kafka-2:9092",
    "FOLDLINE_KAFKA_TOPIC": "prod.events",
    "FOLDLINE_KAFKA_PARTITIONS": "6",
    "FOLDLINE_KAFKA_REPLICATION_FACTOR": "3",
    "FOLDLINE_KAFKA_REGISTRY_URL": "http://registry:8081",
    "FOLDLINE_PROJECTOR_GROUP": "prod-projectors",
    "FOLDLINE_KAFKA_TIMEOUT": "20",
    "FOLDLINE_KAFKA_TRANSACTION_TIMEOUT": "7.5",
    "FOLDLINE_KAFKA_MIN_INSYNC_REPLICAS": "2",
    "FOLDLINE_KAFKA_RETENTION": "1209600",
    "FOLDLINE_REDIS_URL": "redis://:hunter2@redis:6379/1",
    "FOLDLINE_REDIS_SOCKET_TIMEOUT": "3",
    "FOLDLINE_REDIS_CONNECT_TIMEOUT": "1.5",
    "FOLDLINE_REDIS_MAX_CONNECTIONS": "300",
    "FOLDLINE_FOLD_PREFIX": "prod:fold:",
    "FOLDLINE_S3_BUCKET": "prod-attachments",
    "FOLDLINE_S3_PREFIX": "",
    "FOLDLINE_S3_ENDPOINT": "http://minio:9000",
    "FOLDLINE_S3_REGION": "eu-west-1",
    "FOLDLINE_S3_CONNECT_TIMEOUT": "4",
    "FOLDLINE_S3_READ_TIMEOUT": "60",
    "FOLDLINE_S3_MAX_ATTEMPTS": "2",
    "FOLDLINE_S3_MAX_CONNECTIONS": "16",
    "FOLDLINE_DISPATCH_STREAM": "prod:steps",
    "FOLDLINE_DISPATCH_GROUP": "prod-dispatchers",
    "FOLDLINE_DISPATCH_CONCURRENCY": "200",
    "FOLDLINE_DISPATCH_FOLD_TIMEOUT": "2.5",
    "FOLDLINE_DISPATCH_HANDOVER_TIMEOUT": "300",
    "FOLDLINE_DISPATCH_ANSWER_TIMEOUT": "900",
    "FOLDLINE_DISPATCH_CLAIM_IDLE": "20",
    "FOLDLINE_OUTAGE_SECONDS": "45",
    "FOLDLINE_PROJECTOR_RUNTIME": "faust",
    "FOLDLINE_PROJECTOR_MAX_BATCH": "100",
    "FOLDLINE_PROJECTOR_COMMIT_INTERVAL": "0.25",
    "FOLDLINE_ANTHROPIC_URL": "https://api.anthropic.com",
    "FOLDLINE_OPENAI_URL": "https://api.openai.com",
    "FOLDLINE_ANTHROPIC_COMPATIBLE": "gateway=https://llm.example.com/anthropic",
    "FOLDLINE_OPENAI_COMPATIBLE": "vllm=http://gpu-1:8000/v1,gateway-openai=https://llm.example.com/openai/v1",
    "FOLDLINE_DEEPSEEK_COMPATIBLE": "deepseek=https://api.deepseek.com",
    "FOLDLINE_EMULATOR_LATENCY": "1.5",
    "FOLDLINE_EMULATOR_LATENCY_SPREAD": "0.25",
    "ANTHROPIC_API_KEY": "sk-ant-secret-value",
    "OPENAI_API_KEY": "sk-openai-secret-value",
    "FOLDLINE_PROVIDER_CONNECT_TIMEOUT": "7",
    "FOLDLINE_PROVIDER_READ_TIMEOUT": "300",
    "FOLDLINE_PROVIDER_WRITE_TIMEOUT": "30",
    "FOLDLINE_PROVIDER_POOL_TIMEOUT": "20",
    "FOLDLINE_PROVIDER_MAX_CONNECTIONS": "2048",
    "FOLDLINE_PROVIDER_MAX_KEEPALIVE": "1024",
    "FOLDLINE_PROVIDER_KEEPALIVE_EXPIRY": "15",
    "FOLDLINE_PROVIDER_POOL_SHARDS": "8",
    "FOLDLINE_PROVIDER_HTTP2": "false",
    "FOLDLINE_PROVIDER_MAX_ATTEMPTS": "4",
    "FOLDLINE_PROVIDER_INITIAL_BACKOFF": "0.25",
    "FOLDLINE_PROVIDER_MAX_BACKOFF": "4",
    "FOLDLINE_PROVIDER_JITTER": "0.5",
    "FOLDLINE_PROVIDER_MAX_RETRY_AFTER": "30",
    "FOLDLINE_PROVIDER_RETRY_DEADLINE": "120",
    "FOLDLINE_PROVIDER_CONCURRENCY": "32",
    "FOLDLINE_PROVIDER_CONCURRENCY_MIN": "4",
    "FOLDLINE_PROVIDER_CONCURRENCY_MAX": "512",
    "FOLDLINE_PROVIDER_MAX_ANSWER_BYTES": "1048576",
    "FOLDLINE_PROVIDER_LOG_CHUNKS": "true",
    "FOLDLINE_PROVIDER_RETRY_CUT_STREAMS": "false",
    "FOLDLINE_PRICES": "/etc/foldline/prices.csv",
    "FOLDLINE_METRICS_PORT": "9464",
    "FOLDLINE_METRICS_HOST": "0.0.0.0",
    "FOLDLINE_CONSOLE_PORT": "9000",
    "FOLDLINE_CONSOLE_BIND": "10.1.2.3",
    "FOLDLINE_CONSOLE_TOKEN": "console-secret-token",
    "FOLDLINE_ARCHIVE": "s3",
    "FOLDLINE_ARCHIVE_BUCKET": "prod-archive",
    "FOLDLINE_ARCHIVE_PREFIX": "",
    "FOLDLINE_ARCHIVE_DIR": "/srv/archive",
    "FOLDLINE_ARCHIVE_SESSIONS": "team-*,audit-*",
    "FOLDLINE_ARCHIVE_IDLE": "30",
    "FOLDLINE_ARCHIVE_MAX_DELAY": "600",
    "FOLDLINE_ARCHIVE_SEGMENT_EVENTS": "5000",
    "FOLDLINE_ARCHIVE_GROUP": "prod-archivers",
    "FOLDLINE_ARCHIVE_CONCURRENCY": "8",
    "FOLDLINE_ARCHIVE_MAX_SEGMENTS": "6",
    "FOLDLINE_ARCHIVE_GRACE": "7200",
    "FOLDLINE_ENCRYPTION": "false",
    "FOLDLINE_KEY_STORE": "s3",
    "FOLDLINE_KEY_DIR": "/srv/keys",
    "FOLDLINE_KEYS_BUCKET": "prod-keys",
    "FOLDLINE_KEYS_PREFIX": "",
    "FOLDLINE_KEY_CACHE_TTL": "5",
    "FOLDLINE_KEY_ENCRYPTION_KEY": "6b656b2d7365637265742d76616c75652d6f662d33322d62797465732d2d2d21",
}
SECRETS = (
    "hunter2",
    "sk-ant-secret-value",
    "sk-openai-secret-value",
    "kafka-secret-pw",
    "key-secret-pw",
    "vllm-secret-key",
    "6b656b2d7365637265742d76616c75652d6f662d33322d62797465732d2d2d21",
    "console-secret-token",
)
SERVER_KEYS = {"VLLM_API_KEY": "vllm-secret-key"}  # the key of the server named vllm
SASL = {
    "FOLDLINE_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
    "FOLDLINE_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
    "FOLDLINE_KAFKA_SASL_USERNAME": "foldline",
    "FOLDLINE_KAFKA_SASL_PASSWORD": "kafka-secret-pw",
}


def _fields(config: Config) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if dataclasses.is_dataclass(value):
            for g in dataclasses.fields(value):
                out[f"{f.name}.{g.name}"] = getattr(value, g.name)
        else:
            out[f.name] = value
    return out


def test_every_field_has_exactly_one_variable() -> None:
    paths = [s.path for s in SETTINGS]
    assert len(paths) == len(set(paths))
    assert len({s.env for s in SETTINGS}) == len(SETTINGS)
    assert set(paths) | {"kafka.client_properties", "providers.server_api_keys"} == set(_fields(Config()))
    assert set(SAMPLES) == {s.env for s in SETTINGS}


def test_every_variable_reaches_its_field_and_round_trips() -> None:
    config = Config.from_env(SAMPLES)
    defaults = _fields(Config())
    for s in SETTINGS:
        value = config._get(s.path)
        assert value != defaults[s.path], s.env
        assert str(value).lower() == SAMPLES[s.env].lower() or float(value) == float(SAMPLES[s.env]), s.env
    assert config.kafka.partitions == 6  # FOLDLINE_KAFKA_PARTITIONS reaches the configuration (it did not)
    assert Config.from_env(config.to_env()) == config


def test_an_empty_environment_is_the_defaults_and_empty_values_count_as_unset() -> None:
    assert Config.from_env({}) == Config()
    assert Config.from_env({"FOLDLINE_KAFKA_BOOTSTRAP": "", "FOLDLINE_METRICS_PORT": ""}) == Config()
    assert Config.from_env({"FOLDLINE_S3_PREFIX": ""}).s3.prefix == ""  # the bucket's root


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"FOLDLINE_KAFKA_PARTITIONS": "six"}, "FOLDLINE_KAFKA_PARTITIONS='six' is not valid"),
        ({"FOLDLINE_KAFKA_PARTITIONS": "0"}, "at least 1"),
        ({"FOLDLINE_BACKEND": "cloud"}, "choose one of embedded, kafka, distributed"),
        ({"FOLDLINE_DISPATCH_FOLD_TIMEOUT": "-1"}, "positive"),
        ({"FOLDLINE_EMULATOR_LATENCY": "-0.5"}, "0 or more"),
        ({"FOLDLINE_METRICS_PORT": "70000"}, "0..65535"),
        ({"FOLDLINE_KAFKA_SECURITY_PROTOCOL": "TLS"}, "security.protocol 'TLS' is unknown"),
        ({"FOLDLINE_KAFKA_SECURITY_PROTOCOL": "SASL_SSL"}, "needs sasl.mechanism"),
        ({"FOLDLINE_ARCHIVE_MAX_SEGMENTS": "1"}, "FOLDLINE_ARCHIVE_MAX_SEGMENTS must be at least 2"),
        # a reader may use a manifest 60 s and a segment read take 5 x (2 + 30 + 20) s: 320 s at least
        ({"FOLDLINE_ARCHIVE_GRACE": "300"}, "FOLDLINE_ARCHIVE_GRACE (300 s) must be at least 320 s"),
        (
            {"FOLDLINE_KAFKA_SECURITY_PROTOCOL": "SASL_SSL", "FOLDLINE_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512"},
            "FOLDLINE_KAFKA_SASL_USERNAME and FOLDLINE_KAFKA_SASL_PASSWORD",
        ),
    ],
)
def test_bad_values_are_one_line_config_errors(env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)) as info:
        Config.from_env(env)
    assert "\n" not in str(info.value)


def test_the_archive_grace_period_follows_the_s3_request_bounds() -> None:
    """Shorter S3 reads allow a shorter grace: 60 s + 5 x (2 + 10 + 20) s = 220 s."""
    assert Config.from_env({"FOLDLINE_ARCHIVE_GRACE": "300", "FOLDLINE_S3_READ_TIMEOUT": "10"}).archive.grace_s == 300
    with pytest.raises(ConfigError, match=re.escape("must be at least 220 s")):
        Config.from_env({"FOLDLINE_ARCHIVE_GRACE": "200", "FOLDLINE_S3_READ_TIMEOUT": "10"})


def test_client_properties_file_then_variables(tmp_path: Path) -> None:
    path = tmp_path / "client.properties"
    path.write_text(
        "# a managed cluster\n"
        "security.protocol = SASL_SSL\n"
        "sasl.mechanism=SCRAM-SHA-256\n"
        "sasl.username=from-file\n"
        "sasl.password=pa=ss=word\n"
        "\n"
        "! java-style comment\n"
        "socket.keepalive.enable=true\n"
    )
    kafka = Config.from_env(
        {"FOLDLINE_KAFKA_CLIENT_PROPERTIES": str(path), "FOLDLINE_KAFKA_SASL_USERNAME": "from-env"}
    ).kafka
    assert kafka.librdkafka() == {
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-256",
        "sasl.username": "from-env",  # the variable overrides the file
        "sasl.password": "pa=ss=word",
        "socket.keepalive.enable": "true",
    }
    assert kafka.security_protocol == "SASL_SSL"
    path.write_text("security.protocol=SASL_SSL\nthis line has no equals sign\n")
    with pytest.raises(ConfigError, match=r"client.properties:2: expected a key=value line"):
        read_client_properties(path)
    with pytest.raises(ConfigError, match="cannot read the Kafka client-properties file"):
        Config.from_env({"FOLDLINE_KAFKA_CLIENT_PROPERTIES": str(tmp_path / "missing.properties")})


@pytest.mark.parametrize("key", ["bootstrap.servers", "group.id", "isolation.level", "enable.idempotence"])
def test_properties_foldline_sets_itself_are_refused(key: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(repr(key))):
        Config(kafka=KafkaConfig(client_properties={key: "x"}))


def test_secrets_are_never_printed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    env = {**SAMPLES, **SASL, **SERVER_KEYS, "FOLDLINE_KAFKA_SSL_KEY_PASSWORD": "key-secret-pw"}
    config = Config.from_env(env)
    assert config.kafka.librdkafka()["sasl.password"] == "kafka-secret-pw"
    assert config.providers.anthropic_api_key == "sk-ant-secret-value"
    assert config.providers.api_key("vllm") == "vllm-secret-key"
    shown = repr(config) + str(config) + repr(config.describe())
    for secret in SECRETS:
        assert secret not in shown
    assert "redis://:***@redis:6379/1" in repr(config)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    runner = CliRunner()
    for args in (["config"], ["config", "--json"]):
        res = runner.invoke(app, args)
        assert res.exit_code == 0, res.output
        for secret in SECRETS:
            assert secret not in res.output
    described = json.loads(runner.invoke(app, ["config", "--json"]).stdout)
    assert described["kafka.partitions"] == {"env": "FOLDLINE_KAFKA_PARTITIONS", "value": "6"}
    assert described["providers.anthropic_api_key"]["value"] == "***"
    assert described["providers.server_api_keys[vllm]"] == {"env": "VLLM_API_KEY", "value": "***"}
    assert described["providers.server_api_keys[gateway]"] == {"env": "GATEWAY_API_KEY", "value": ""}
    assert "sasl.password=***" in described["kafka.client_properties"]["value"]


def test_servers_under_names_of_their_own_get_an_adapter_of_their_kind_and_their_key() -> None:
    """One setting per kind of API lists servers by name; each becomes an adapter of that name (what a
    CallConfig's provider names), posting to its base URL with the key from <NAME>_API_KEY."""
    from foldline.config.factories import providers
    from foldline.providers import AnthropicProvider, OpenAIProvider
    from foldline.providers.reasoning_chat import ReasoningChatProvider

    config = Config.from_env({**SAMPLES, **SERVER_KEYS, "DEEPSEEK_API_KEY": "ds-key"})
    assert config.providers.servers() == [
        ("anthropic", "gateway", "https://llm.example.com/anthropic"),
        ("openai", "vllm", "http://gpu-1:8000/v1"),
        ("openai", "gateway-openai", "https://llm.example.com/openai/v1"),
        ("deepseek", "deepseek", "https://api.deepseek.com"),
    ]
    assert Config.from_env(config.to_env()) == config  # the keys travel to a child process too
    built = providers(config)
    assert {n: (type(p), p.name) for n, p in built.items()} == {
        "anthropic": (AnthropicProvider, "anthropic"),
        "openai": (OpenAIProvider, "openai"),
        "gateway": (AnthropicProvider, "gateway"),
        "vllm": (OpenAIProvider, "vllm"),
        "gateway-openai": (OpenAIProvider, "gateway-openai"),
        "deepseek": (ReasoningChatProvider, "deepseek"),
    }
    secrets = {name: getattr(built[name], "secrets", None) for name in ("vllm", "deepseek", "gateway")}
    assert secrets == {"vllm": ("vllm-secret-key",), "deepseek": ("ds-key",), "gateway": ()}
    for bad, message in (
        ({"FOLDLINE_OPENAI_COMPATIBLE": "vllm"}, "is not name=base-url"),
        ({"FOLDLINE_OPENAI_COMPATIBLE": "v llm=http://x"}, "is not name=base-url"),
        ({"FOLDLINE_OPENAI_COMPATIBLE": "vllm=gpu-1:8000"}, "must start with http:// or https://"),
        ({"FOLDLINE_OPENAI_COMPATIBLE": "openai=http://x/v1"}, "is set by FOLDLINE_OPENAI_URL"),
        ({"FOLDLINE_OPENAI_COMPATIBLE": "a/b=http://x/v1"}, "letters, digits"),
        (
            {"FOLDLINE_OPENAI_COMPATIBLE": "ds=http://x/v1", "FOLDLINE_DEEPSEEK_COMPATIBLE": "ds=http://y"},
            "the provider name 'ds' is given twice",
        ),
    ):
        with pytest.raises(ConfigError, match=re.escape(message)):
            Config.from_env(bad)


def test_options_override_single_fields_and_none_keeps_them() -> None:
    config = Config.from_env(SAMPLES)
    changed = config.overridden(kafka__bootstrap="other:9092", dispatch__concurrency=None, data_dir="/tmp/x")
    assert changed.kafka.bootstrap == "other:9092"
    assert changed.dispatch.concurrency == 200
    assert changed.data_dir == Path("/tmp/x")
    assert changed.kafka.topic == config.kafka.topic
    with pytest.raises(ConfigError, match=re.escape("no configuration field 'kafka.bootstrp'")):
        config.overridden(kafka__bootstrp="x")


def test_one_projector_group_per_topic_unless_named() -> None:
    config = Config.from_env({"FOLDLINE_KAFKA_TOPIC": "t1"})
    assert config.kafka.group == "t1.projectors"
    assert WorkerSettings(config).group == "t1.projectors"
    assert "FOLDLINE_PROJECTOR_GROUP" not in config.to_env()  # a child process derives the same group
    named = Config.from_env({"FOLDLINE_KAFKA_TOPIC": "t1", "FOLDLINE_PROJECTOR_GROUP": "g"})
    assert WorkerSettings(named).group == "g"


def test_projector_settings_carry_partitions_and_security() -> None:
    config = Config.from_env({**SAMPLES, **SASL})
    settings = WorkerSettings(config)
    assert (settings.partitions, settings.max_batch, settings.topic) == (6, 100, "prod.events")
    assert settings.client_config["sasl.password"] == "kafka-secret-pw"


def test_faust_gets_the_same_security_settings(tmp_path: Path) -> None:
    assert aiokafka_credentials(Config().kafka) is None
    ca = certifi.where()  # any PEM file of CA certificates
    kafka = Config.from_env({**SASL, "FOLDLINE_KAFKA_SSL_CA_LOCATION": ca}).kafka
    creds = aiokafka_credentials(kafka)
    assert (creds.username, creds.password, creds.mechanism.value) == ("foldline", "kafka-secret-pw", "SCRAM-SHA-512")
    assert creds.protocol.value == "SASL_SSL"
    assert creds.ssl_context.verify_mode == ssl.CERT_REQUIRED
    assert creds.ssl_context.check_hostname
    tuned = dataclasses.replace(kafka, client_properties={**kafka.client_properties, "socket.keepalive.enable": "true"})
    with pytest.raises(
        ConfigError, match=re.escape("cannot apply the librdkafka client properties socket.keepalive.enable")
    ):
        aiokafka_credentials(tuned)
    missing = Config.from_env({**SASL, "FOLDLINE_KAFKA_SSL_CA_LOCATION": str(tmp_path / "no.pem")}).kafka
    with pytest.raises(ConfigError, match="cannot load the Kafka TLS files"):
        aiokafka_credentials(missing)


def test_the_readme_lists_every_variable_with_its_default() -> None:
    rows = {}
    for line in README.read_text().splitlines():
        m = re.match(r"\| `([A-Z0-9_]+)`(?: \(else [^)]*\))? \| `([a-z0-9_.]+)` \| ([^|]+) \|", line)
        if m:
            rows[m.group(1)] = (m.group(2), m.group(3).strip())
    defaults = _fields(Config())
    for s in SETTINGS:
        value = defaults[s.path]
        shown = "unset" if value is None else f"`{str(value).lower() if isinstance(value, bool) else value}`"
        assert rows.get(s.env) == (s.path, shown), s.env
    text = README.read_text()
    for name in (*KAFKA_SECURITY_VARIABLES, "FOLDLINE_KAFKA_CLIENT_PROPERTIES"):
        assert f"`{name}`" in text, name


def test_the_embedded_log_is_built_in_one_place_from_the_data_dir_and_its_busy_timeout(tmp_path: Path) -> None:
    from foldline.adapters.sqlite_log import DB_NAME
    from foldline.config.factories import sqlite_log

    # loops and commands (open_stores), the archiver, restore and doctor all open the embedded log here
    config = Config(data_dir=tmp_path / "data", embedded=EmbeddedConfig(busy_timeout_s=2.5))
    with pytest.raises(ConfigError, match="no data directory"):
        sqlite_log(config, read_only=True)  # an audit never creates one
    assert not config.data_dir.exists()
    log = sqlite_log(config)
    log.close()
    assert (log.path, log.read_only, log._busy_timeout_s) == (config.data_dir / DB_NAME, False, 2.5)
    reader = sqlite_log(config, read_only=True)
    try:
        assert (reader.read_only, reader.sessions()) == (True, [])
    finally:
        reader.close()


@pytest.mark.parametrize("writer", [False, True])
def test_closing_the_stores_closes_the_key_store_the_loops_sealed_with(tmp_path: Path, writer: bool) -> None:
    from foldline.config import open_stores
    from tests.factories import LogBuilder

    # a loop process's stores (writer: its log traced) keep the sealer: closing them closes the key store,
    # whose WAL is then checkpointed into the file, nothing left open behind
    stores = open_stores(Config(data_dir=tmp_path / "data"), writer=writer)
    assert stores.sealer is not None
    stores.log.create("closed-1", LogBuilder().header().turn(0, "a question").events)
    assert (tmp_path / "data" / "keys.sqlite3-wal").exists()  # the key was written, the store is open
    stores.close()
    assert not (tmp_path / "data" / "keys.sqlite3-wal").exists()
