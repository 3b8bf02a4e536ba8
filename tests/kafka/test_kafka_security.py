"""Every process kind reaches a Kafka that requires SASL (SCRAM-SHA-512) over TLS, from configuration alone.

The local broker (deploy/local/kafka.sh) has a SASL_SSL listener beside its PLAINTEXT one; up.sh exports its
address (FOLDLINE_LOCAL_KAFKA_SASL_BOOTSTRAP) and the librdkafka client properties that reach it
(FOLDLINE_LOCAL_KAFKA_SASL_PROPERTIES). Each test runs real `foldline` processes pointed at it: the loop
(`demo`, `verify`), a projector of either runtime and a dispatcher process (a distributed demo), and the
commands a wrong password or an untrusted certificate must stop at once with one typed line.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import certifi
import pytest
from confluent_kafka.admin import AdminClient

from foldline.config import KAFKA_SECURITY_VARIABLES, read_client_properties

pytestmark = pytest.mark.kafka

CLI = "from foldline.cli.main import main; main()"


def _required(name: str) -> str:
    value = os.environ.get(name)
    if not value:
        pytest.fail(f"{name} is not set: run `bash deploy/local/up.sh` and `source .local/env.sh`")
    return value


@pytest.fixture
def sasl_env(tmp_path: Path) -> Iterator[dict[str, str]]:
    """The environment of a process on the SASL_SSL listener (credentials from the client-properties file),
    with a topic, fold prefix and bucket of this test; the topics are deleted afterwards."""
    run = uuid.uuid4().hex[:10]
    topic = f"test.sasl.{run}"
    env = {
        **os.environ,
        "FOLDLINE_KAFKA_BOOTSTRAP": _required("FOLDLINE_LOCAL_KAFKA_SASL_BOOTSTRAP"),
        "FOLDLINE_KAFKA_CLIENT_PROPERTIES": _required("FOLDLINE_LOCAL_KAFKA_SASL_PROPERTIES"),
        "FOLDLINE_KAFKA_TOPIC": topic,
        "FOLDLINE_KAFKA_PARTITIONS": "4",
        "FOLDLINE_FOLD_PREFIX": f"test:sasl:{run}:",
        "FOLDLINE_S3_BUCKET": f"foldline-sasl-{run}",
        "FOLDLINE_DATA_DIR": str(tmp_path / "data"),
    }
    for name in (*KAFKA_SECURITY_VARIABLES, "FOLDLINE_BACKEND", "FOLDLINE_PROJECTOR_GROUP"):
        env.pop(name, None)
    yield env
    admin = AdminClient({"bootstrap.servers": _required("FOLDLINE_KAFKA_BOOTSTRAP")})  # the PLAINTEXT listener
    doomed = [t for t in (topic, f"{topic}.index", f"{topic}.dlq") if t in admin.list_topics(timeout=10).topics]
    if doomed:
        for fut in admin.delete_topics(doomed, operation_timeout=10).values():
            fut.result(timeout=20)


def foldline(env: dict[str, str], *args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", CLI, *args], env=env, capture_output=True, text=True, timeout=timeout, check=False
    )


def as_variables(env: dict[str, str]) -> dict[str, str]:
    """The same credentials as FOLDLINE_KAFKA_* variables instead of the client-properties file."""
    props = read_client_properties(env["FOLDLINE_KAFKA_CLIENT_PROPERTIES"])
    by_property = {prop: name for name, prop in KAFKA_SECURITY_VARIABLES.items()}
    out = {k: v for k, v in env.items() if k != "FOLDLINE_KAFKA_CLIENT_PROPERTIES"}
    out.update({by_property[k]: v for k, v in props.items()})
    return out


def test_demo_and_verify_over_sasl_ssl(sasl_env: dict[str, str]) -> None:
    """The loop writes through SASL_SSL with the properties file; verify reads back with the variables."""
    done = foldline(sasl_env, "demo", "--backend", "kafka", "--sessions", "2", "--steps", "3", "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    assert all(s["verified"] for s in json.loads(done.stdout)["sessions"])
    env = as_variables(sasl_env)
    assert env["FOLDLINE_KAFKA_SECURITY_PROTOCOL"] == "SASL_SSL"
    done = foldline(env, "verify", "--backend", "kafka", "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout)
    assert {k: report[k] for k in ("checked", "matched", "mismatched", "unreconstructable", "status")} == {
        "checked": 6,
        "matched": 6,
        "mismatched": [],
        "unreconstructable": [],
        "status": "verified",
    }


@pytest.mark.redis
@pytest.mark.s3
@pytest.mark.parametrize("runtime", ["confluent", "faust"])
def test_a_distributed_demo_over_sasl_ssl(sasl_env: dict[str, str], runtime: str, tmp_path: Path) -> None:
    """Loop, projector process (either runtime) and dispatcher process all on the SASL_SSL listener."""
    env = {**sasl_env, "FOLDLINE_PROJECTOR_RUNTIME": runtime}
    data = tmp_path / "data"
    args = ["--backend", "distributed", "--sessions", "2", "--steps", "3", "--dispatchers", "1", "--json"]
    done = foldline(env, "demo", *args)
    logs = "".join(p.read_text() for p in (data / "logs").glob("*.log")) if (data / "logs").exists() else ""
    assert done.returncode == 0, done.stdout + done.stderr + logs
    assert all(len(s["steps"]) == 3 and s["verified"] for s in json.loads(done.stdout)["sessions"])
    assert "projector ready" in (data / "logs" / "projector-0.log").read_text()
    assert "sending 6 step(s)" in (data / "logs" / "dispatcher-0.log").read_text()
    _drop_bucket(env["FOLDLINE_S3_BUCKET"])


@pytest.mark.parametrize(
    "command",
    [
        ["sessions", "--backend", "kafka"],
        ["demo", "--backend", "kafka", "--sessions", "1", "--steps", "1"],
        ["projector"],
        ["projector", "--runtime", "faust"],
    ],
    ids=["sessions", "demo", "projector", "projector-faust"],
)
def test_a_wrong_password_is_one_typed_line_at_once(sasl_env: dict[str, str], command: list[str]) -> None:
    # a broker wait may take 60 s: an answer well inside that is the refusal, not a timeout
    env = {**sasl_env, "FOLDLINE_KAFKA_SASL_PASSWORD": "not-the-password", "FOLDLINE_KAFKA_TIMEOUT": "60"}
    started = time.monotonic()
    done = foldline(env, *command, timeout=120)
    elapsed = time.monotonic() - started
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2, done.stdout + done.stderr
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("error: AuthenticationFailed: Kafka at 127.0.0.1:"), lines[0]
    assert "refused the SASL login of user 'foldline' (SCRAM-SHA-512)" in lines[0]
    assert "not-the-password" not in done.stdout + done.stderr
    assert "projector ready" not in done.stdout
    assert elapsed < 30, elapsed


def test_an_untrusted_broker_certificate_is_one_typed_line(sasl_env: dict[str, str]) -> None:
    env = {**sasl_env, "FOLDLINE_KAFKA_SSL_CA_LOCATION": certifi.where(), "FOLDLINE_KAFKA_TIMEOUT": "60"}
    done = foldline(env, "sessions", "--backend", "kafka", timeout=120)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2, done.stdout + done.stderr
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("error: AuthenticationFailed: the TLS handshake with Kafka at 127.0.0.1:"), lines[0]
    assert "certificate verify failed" in lines[0]


def _drop_bucket(bucket: str) -> None:
    import boto3

    s3 = boto3.session.Session().client("s3", endpoint_url=_required("FOLDLINE_S3_ENDPOINT"))
    try:
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket):
            for obj in page.get("Contents", []):
                s3.delete_object(Bucket=bucket, Key=obj["Key"])
        s3.delete_bucket(Bucket=bucket)
    finally:
        s3.close()
