"""End to end: `foldline demo --metrics-port` is scraped over HTTP and every counter equals what the log says."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import urllib.error
import urllib.request
import uuid
from collections import Counter
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from foldline.config import Config, open_stores
from foldline.core.drops import DROP_CAUSES, classify_session, session_drops
from foldline.core.events import Envelope, RequestHeader

FOLDLINE = Path(sys.executable).with_name("foldline")
Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def scrape(url: str) -> Samples:
    with urllib.request.urlopen(url, timeout=10) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("text/plain; version=")
        text = resp.read().decode()
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return exc.code


def run_demo_and_scrape(args: list[str], sessions: int, steps: int) -> tuple[Samples, dict[str, Any]]:
    """Run the real CLI in a child process, read its JSON result, scrape while it lingers, then stop it."""
    assert FOLDLINE.exists(), f"{FOLDLINE} missing: install the package with `make` (pip install -e .)"
    port = free_port()
    cmd = [str(FOLDLINE), "demo", "--sessions", str(sessions), "--steps", str(steps), "--json"]
    cmd += ["--metrics-port", str(port), "--metrics-linger", "60", *args]
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as proc:
        try:
            assert proc.stdout is not None
            assert proc.stderr is not None
            line = proc.stdout.readline()  # the result is printed before the endpoint lingers
            if not line:
                proc.wait(timeout=30)
                pytest.fail(f"demo exited {proc.returncode} without a result: {proc.stderr.read()}")
            result: dict[str, Any] = json.loads(line)
            base = f"http://127.0.0.1:{port}"
            assert status(base + "/healthz") == 200
            assert status(base + "/readyz") == 200
            assert status(base + "/nope") == 404
            return scrape(base + "/metrics"), result
        finally:
            proc.terminate()
            proc.wait(timeout=30)


def check_against_log(
    samples: Samples, events_by_session: dict[str, list[Envelope]], steps: int, other_steps: Mapping[str, int] = {}
) -> None:
    all_verdicts = [v for sid, events in events_by_session.items() for v in classify_session(sid, events)]
    assert len(all_verdicts) == sum(other_steps.get(sid, steps) for sid in events_by_session)
    labels = sorted({(v.provider, v.model) for v in all_verdicts})
    assert ("anthropic", "claude-emulated") in labels
    for provider, model in labels:  # the series of each provider and model hold exactly its steps
        pm = {"provider": provider, "model": model}
        verdicts = [v for v in all_verdicts if (v.provider, v.model) == (provider, model)]
        usages = [v.step.usage for v in verdicts]
        assert value(samples, "foldline_steps_total", **pm) == len(verdicts)
        assert value(samples, "foldline_step_cache_read_tokens_total", **pm) == sum(u.cache_read for u in usages)
        assert value(samples, "foldline_step_cache_write_tokens_total", **pm) == sum(u.cache_write for u in usages)
        assert value(samples, "foldline_step_input_tokens_total", **pm) == sum(u.input for u in usages)
        assert value(samples, "foldline_step_output_tokens_total", **pm) == sum(u.output for u in usages)
        # per step: every step's cache-read ratio lands in the histogram bucket the log puts it in
        ratios = [u.cache_read / u.prompt_tokens for u in usages]
        assert value(samples, "foldline_step_cache_read_ratio_count", **pm) == len(ratios)
        assert value(samples, "foldline_step_cache_read_ratio_sum", **pm) == pytest.approx(sum(ratios))
        for le in ("0.0", "0.5", "0.9", "0.95", "0.99", "1.0"):
            assert value(samples, "foldline_step_cache_read_ratio_bucket", le=le, **pm) == sum(
                1 for r in ratios if r <= float(le)
            ), le
        assert sum(u.cache_read for u in usages) > 0
    headers = Counter(
        e.data.reason for evs in events_by_session.values() for e in evs if isinstance(e.data, RequestHeader)
    )
    assert headers["initial"] == len(events_by_session)
    for reason in ("initial", "resume", "change"):
        assert value(samples, "foldline_request_header_snapshots_total", reason=reason) == headers[reason], reason
    drops = [d for sid, evs in events_by_session.items() for d in session_drops(sid, evs)]
    assert drops  # at least the cold first requests
    for cause in DROP_CAUSES:
        assert samples[("foldline_cache_read_drops_total", frozenset({("cause", cause)}))] == sum(
            1 for d in drops if d.cause == cause
        ), cause
        for provider, model in labels:
            lost = sum(
                d.lost_tokens
                for d in drops
                if d.cause == cause and (d.step.provider, d.step.model) == (provider, model)
            )
            got = value(samples, "foldline_cache_read_drop_tokens_total", cause=cause, provider=provider, model=model)
            assert got == lost, (cause, provider, model)
    assert value(samples, "foldline_invariant_violations_total") == 0
    assert value(samples, "process_resident_memory_bytes") > 0


def test_embedded_demo_metrics_equal_the_log(tmp_path: Path) -> None:
    data = tmp_path / "data"
    samples, result = run_demo_and_scrape(["--data-dir", str(data)], sessions=3, steps=6)
    assert all(s["verified"] for s in result["sessions"])
    stores = open_stores(Config(data_dir=data))
    try:
        events = {sid: stores.log.read(sid) for sid in stores.log.sessions()}
    finally:
        stores.close()
    assert sorted(events) == [
        "demo-000",
        "demo-001",
        "demo-002",
        "demo-approval",
        "demo-responses",
        "demo-structured",
        "demo-think",
    ]
    # demo-approval: a step that ran a tool, then one whose answer waits for an approval
    check_against_log(samples, events, steps=6, other_steps={"demo-approval": 2})
    # the transport's families, beside the loop's: every request went through the process's one sender
    assert value(samples, "foldline_provider_concurrency_limit", provider="anthropic") >= 64
    assert value(samples, "foldline_provider_requests_in_flight", provider="anthropic") == 0
    retried = [k for k in samples if k[0] == "foldline_provider_retries_total"]
    assert retried == []  # the demo's emulator injects no faults


def _delete_topics(bootstrap: str, prefix: str) -> None:
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap})
    doomed = [t for t in admin.list_topics(timeout=10).topics if t.startswith(prefix)]
    if doomed:
        for fut in admin.delete_topics(doomed, operation_timeout=10).values():
            fut.result(timeout=20)


@pytest.fixture
def kafka_topic(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A topic (with its .index and .dlq) of this test only, deleted afterwards."""
    bootstrap = os.environ.get("FOLDLINE_KAFKA_BOOTSTRAP")
    if not bootstrap:
        pytest.fail("FOLDLINE_KAFKA_BOOTSTRAP is not set: run `deploy/local/up.sh kafka` and `source .local/env.sh`")
    topic = f"test.metrics.{uuid.uuid4().hex[:10]}"
    monkeypatch.setenv("FOLDLINE_KAFKA_TOPIC", topic)
    yield topic
    _delete_topics(bootstrap, topic)


@pytest.mark.kafka
def test_kafka_demo_metrics_equal_the_log(kafka_topic: str, tmp_path: Path) -> None:
    samples, _ = run_demo_and_scrape(["--backend", "kafka", "--data-dir", str(tmp_path)], sessions=2, steps=4)
    stores = open_stores(Config.from_env().overridden(data_dir=tmp_path, backend="kafka"))
    try:
        events = {sid: stores.log.read(sid) for sid in stores.log.sessions()}
    finally:
        stores.close()
    assert sorted(events) == ["demo-000", "demo-001"]
    check_against_log(samples, events, steps=4)


@pytest.fixture
def distributed_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, str]]:
    """A topic, fold key prefix and S3 bucket of this test only, removed afterwards."""
    names = {
        "FOLDLINE_KAFKA_BOOTSTRAP": os.environ.get("FOLDLINE_KAFKA_BOOTSTRAP", ""),
        "FOLDLINE_REDIS_URL": os.environ.get("FOLDLINE_REDIS_URL", ""),
        "FOLDLINE_S3_ENDPOINT": os.environ.get("FOLDLINE_S3_ENDPOINT", ""),
    }
    unset = [k for k, v in names.items() if not v]
    if unset:
        pytest.fail(f"{', '.join(unset)} unset: run `bash deploy/local/up.sh` and `source .local/env.sh`")
    run = uuid.uuid4().hex[:10]
    env = {
        "FOLDLINE_KAFKA_TOPIC": f"test.metrics.{run}",
        "FOLDLINE_FOLD_PREFIX": f"test:metrics:{run}:",
        "FOLDLINE_S3_BUCKET": f"foldline-metrics-{run}",
    }
    for key, val in env.items():
        monkeypatch.setenv(key, val)
    yield {**env, **names}

    import boto3
    import redis

    _delete_topics(names["FOLDLINE_KAFKA_BOOTSTRAP"], env["FOLDLINE_KAFKA_TOPIC"])
    r = redis.Redis.from_url(names["FOLDLINE_REDIS_URL"])
    for key in r.scan_iter(match=env["FOLDLINE_FOLD_PREFIX"] + "*", count=1000):
        r.delete(key)
    r.close()
    s3 = boto3.session.Session().client("s3", endpoint_url=names["FOLDLINE_S3_ENDPOINT"])
    bucket = env["FOLDLINE_S3_BUCKET"]
    if any(b["Name"] == bucket for b in s3.list_buckets().get("Buckets", [])):
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket):
            for obj in page.get("Contents", []):
                s3.delete_object(Bucket=bucket, Key=obj["Key"])
        s3.delete_bucket(Bucket=bucket)
    s3.close()


@pytest.mark.kafka
@pytest.mark.redis
@pytest.mark.s3
def test_distributed_demo_metrics_equal_the_log(distributed_env: dict[str, str], tmp_path: Path) -> None:
    """loop → Kafka → projector process → Redis → dispatcher → emulator; the loop process exports the metrics."""
    samples, result = run_demo_and_scrape(
        ["--backend", "distributed", "--data-dir", str(tmp_path)], sessions=2, steps=4
    )
    assert all(s["verified"] for s in result["sessions"])
    stores = open_stores(Config.from_env().overridden(data_dir=tmp_path, backend="distributed"))
    try:
        events = {sid: stores.log.read(sid) for sid in stores.log.sessions()}
    finally:
        stores.close()
    assert sorted(events) == ["demo-000", "demo-001"]
    check_against_log(samples, events, steps=4)
