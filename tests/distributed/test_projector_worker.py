"""The projector as shipped: ``foldline projector`` processes, ``--rebuild``, readiness and metrics, dead letters.

Real Kafka and Redis; unique topics and Redis key prefixes per test.
"""

from __future__ import annotations

import signal
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator

import pytest
from confluent_kafka import Producer
from typer.testing import CliRunner

from foldline.adapters.kafka import partition_for
from foldline.cli.main import app
from foldline.config import Config, FoldsConfig, RedisConfig
from foldline.config.factories import fold_store
from foldline.core import TextBlock
from foldline.core.events import Envelope, ReplaceOp, ToolResult
from foldline.core.projection import Session
from foldline.dispatcher import wait_for_fold
from foldline.projector import WorkerHandle, start_worker
from tests.distributed.projector_harness import (
    Topic,
    WorkerProcess,
    all_applied,
    drop_prefix,
    env_or_fail,
    fold_mismatches,
    kafka_topic,
    session_log,
    wait_until,
    worker_env,
    worker_settings,
)

pytestmark = [pytest.mark.kafka, pytest.mark.redis]


@pytest.fixture
def topic() -> Iterator[Topic]:
    with kafka_topic(env_or_fail("FOLDLINE_KAFKA_BOOTSTRAP"), 4, "projector-worker") as t:
        yield t


def _start_in_process(topic: Topic, redis_url: str, prefix: str) -> WorkerHandle:
    """A projector worker thread in this process, in a group of its own."""
    return start_worker(worker_settings(topic, redis_url=redis_url, prefix=prefix))


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return int(response.status), response.read().decode()
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read().decode()


def test_cli_worker_folds_reports_ready_serves_metrics_and_stops_on_sigterm(topic: Topic, prefix: str) -> None:
    redis_url = env_or_fail("FOLDLINE_REDIS_URL")
    logs = {f"c{i}": session_log(i, 40) for i in range(6)}
    log = topic.log()
    for sid, events in logs.items():
        log.append(sid, 0, events[:25])
    args = ["--group", f"g-{uuid.uuid4().hex[:8]}", "--topic", topic.name, "--partitions", str(topic.partitions)]
    args += ["--fold-prefix", prefix, "--metrics-port", "0"]
    worker = WorkerProcess(args, worker_env({"FOLDLINE_REDIS_URL": redis_url})).start()
    try:
        ready_line = next(line for line in worker.lines if line.startswith("projector ready"))
        metrics_url = ready_line.split("metrics=", 1)[1].strip()
        assert _get(metrics_url + "/readyz") == (200, "ok\n")
        assert _get(metrics_url + "/healthz")[0] == 200
        for sid, events in logs.items():
            log.append(sid, 25, events[25:])
        store = fold_store(Config(redis=RedisConfig(redis_url), folds=FoldsConfig(prefix)))
        heads = {sid: len(events) for sid, events in logs.items()}
        wait_until(lambda: all_applied(store, heads), 60, "the CLI worker to fold every session")
        assert fold_mismatches(log, store, heads, epoch=0) == []
        status, body = _get(metrics_url + "/metrics")
        assert status == 200
        applied = next(
            float(line.split()[-1])
            for line in body.splitlines()
            if line.startswith("foldline_projector_events_applied_total")
        )
        assert applied == sum(heads.values())

        def lag_series() -> list[tuple[str, float]]:
            text = _get(metrics_url + "/metrics")[1]
            prefixes = ("foldline_projector_lag_events{", "foldline_projector_lag_seconds{")
            return [
                (line.split("{")[0], float(line.split()[-1])) for line in text.splitlines() if line.startswith(prefixes)
            ]

        # Caught up and idle: no lag, in events or seconds, on any partition (transaction markers included).
        wait_until(lambda: bool(lag_series()) and all(v == 0 for _, v in lag_series()), 15, "the lag to read 0")
        time.sleep(2.5)  # the lag is sampled once a second; an idle worker must stay at 0
        assert all(v == 0 for _, v in lag_series()), lag_series()
        assert worker.proc is not None
        worker.proc.send_signal(signal.SIGTERM)
        assert worker.proc.wait(30) == 0
        assert f"{sum(heads.values())} applied" in worker.stderr()
    finally:
        worker.kill()
        log.close()


def test_rebuild_command_restores_flushed_folds(topic: Topic, prefix: str, monkeypatch: pytest.MonkeyPatch) -> None:
    redis_url = env_or_fail("FOLDLINE_REDIS_URL")
    logs = {f"b{i}": session_log(i, 30) for i in range(3)}
    log = topic.log()
    for sid, events in logs.items():
        log.append(sid, 0, events)
    monkeypatch.setenv("FOLDLINE_REDIS_URL", redis_url)
    base = ["projector", "--topic", topic.name, "--partitions", str(topic.partitions), "--fold-prefix", prefix]
    runner = CliRunner()
    result = runner.invoke(app, [*base, "--rebuild", "b0", "b2"])
    assert result.exit_code == 0, result.output
    assert "rebuilt 2 session fold(s)" in result.output
    store = fold_store(Config(redis=RedisConfig(redis_url), folds=FoldsConfig(prefix)))
    assert store.get("b1") is None
    assert fold_mismatches(log, store, {"b0": 30, "b2": 30}, epoch=0) == []
    drop_prefix(redis_url, prefix)  # Redis is a cache: lose every fold...
    result = runner.invoke(app, [*base, "--rebuild"])  # ...and rebuild all of them from the log
    assert result.exit_code == 0, result.output
    assert fold_mismatches(log, store, dict.fromkeys(logs, 30), epoch=0) == []
    missing = runner.invoke(app, [*base, "--rebuild", "no-such-session"])
    assert missing.exit_code == 2
    assert "SessionNotFound" in missing.output
    sessions_without_rebuild = runner.invoke(app, [*base, "b0"])
    assert sessions_without_rebuild.exit_code == 2
    assert "only taken with --rebuild" in sessions_without_rebuild.output
    store.close()
    log.close()


def test_undecodable_records_are_dead_lettered_and_the_rest_folds(topic: Topic, prefix: str) -> None:
    redis_url = env_or_fail("FOLDLINE_REDIS_URL")
    events = session_log(0, 20)
    log = topic.log()
    log.append("d", 0, events[:10])
    garbage = Producer({"bootstrap.servers": topic.bootstrap})
    garbage.produce(topic.name, key=b"d", value=b"not avro at all", partition=partition_for("d", topic.partitions))
    assert garbage.flush(10) == 0
    log.append("d", 10, events[10:])
    handle = _start_in_process(topic, redis_url, prefix)
    store = fold_store(Config(redis=RedisConfig(redis_url), folds=FoldsConfig(prefix)))
    try:
        wait_for_fold(store, "d", len(events) - 1, 60)
    finally:
        totals = handle.stop()
    assert (totals.dead_letters, totals.applied) == (1, len(events))
    assert fold_mismatches(log, store, {"d": len(events)}, epoch=0) == []
    store.close()
    log.close()


def test_a_surface_replace_on_the_log_rebuilds_the_fold(topic: Topic, prefix: str) -> None:
    redis_url = env_or_fail("FOLDLINE_REDIS_URL")
    events = session_log(3, 40)
    result = next(e for e in events if isinstance(e.data, ToolResult))
    assert isinstance(result.data, ToolResult)
    pos = next(i for i, n in enumerate(Session("t", events).rules.surface) if n.seq == result.seq)
    trim = Envelope(
        len(events),
        1_700_000_100_000,
        ToolResult(
            result.data.call_id,
            result.data.name,
            (TextBlock("[trimmed]"),),
            surface_op=ReplaceOp(pos, pos),
            source_event_seqs=(result.seq,),
        ),
    )
    log = topic.log()
    log.append("t", 0, events)
    handle = _start_in_process(topic, redis_url, prefix)
    store = fold_store(Config(redis=RedisConfig(redis_url), folds=FoldsConfig(prefix)))
    try:
        wait_for_fold(store, "t", len(events) - 1, 60)
        log.append("t", len(events), [trim])
        state = wait_for_fold(store, "t", len(events), 60)
    finally:
        totals = handle.stop()
    assert state.generation == 1
    assert b"[trimmed]" in b"".join(state.messages)
    assert totals.rebuilt == ["t"]
    assert fold_mismatches(log, store, {"t": len(events) + 1}, epoch=0) == []
    store.close()
    log.close()
