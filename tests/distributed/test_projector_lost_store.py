"""A fold store that lost its data (Redis flushed, or restarted without persistence) is refolded from the log.

Both runtimes, as ``foldline projector`` processes: sessions are folded, every key of the run's fold prefix is
deleted (its folds and the projectors' partition marks: what a ``FLUSHALL`` does to them), and — with no new
event written — every fold comes back, byte for byte the fold of the session's log.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from foldline.adapters.kafka import read_partition_span
from foldline.config import Config, FoldsConfig, RedisConfig
from foldline.config.factories import fold_store, partition_marks
from foldline.projector import runtime as projector_runtime
from foldline.projector import start_worker
from tests.distributed.projector_harness import (
    Topic,
    WorkerProcess,
    all_applied,
    all_marked,
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
    with kafka_topic(env_or_fail("FOLDLINE_KAFKA_BOOTSTRAP"), 4, "projector-lost-store") as t:
        yield t


@pytest.mark.parametrize("runtime", ["confluent", "faust"])
def test_folds_lost_with_the_store_are_refolded_without_a_new_event(topic: Topic, prefix: str, runtime: str) -> None:
    redis_url = env_or_fail("FOLDLINE_REDIS_URL")
    logs = {f"l{i}": session_log(i, 24) for i in range(8)}
    heads = {sid: len(events) for sid, events in logs.items()}
    log = topic.log()
    for sid, events in logs.items():
        log.append(sid, 0, events)
    args = ["--runtime", runtime, "--group", f"g-{uuid.uuid4().hex[:8]}", "--topic", topic.name]
    args += ["--partitions", str(topic.partitions), "--fold-prefix", prefix]
    worker = WorkerProcess(args, worker_env({"FOLDLINE_REDIS_URL": redis_url})).start()
    store = fold_store(Config(redis=RedisConfig(redis_url), folds=FoldsConfig(prefix)))
    marks = partition_marks(Config(redis=RedisConfig(redis_url), folds=FoldsConfig(prefix)))
    try:
        wait_until(lambda: all_applied(store, heads), 60, "the first folds")
        # the marks follow within a check round of the first assignment
        wait_until(lambda: all_marked(marks, topic), 60, "every partition marked")
        assert fold_mismatches(log, store, heads, epoch=0) == []
        assert "re-reading offsets" not in worker.stderr()  # a first start only marks its partitions

        drop_prefix(redis_url, prefix)  # the folds and the marks are gone; nothing new is written
        assert store.get("l0") is None

        wait_until(lambda: all_applied(store, heads), 60, "the folds refolded from the log")
        assert fold_mismatches(log, store, heads, epoch=0) == []
        wait_until(lambda: all_marked(marks, topic), 60, "every partition marked again")
        assert "re-reading offsets" in worker.stderr()
    finally:
        worker.kill()
        store.close()
        marks.close()
        log.close()
        drop_prefix(redis_url, prefix)


def test_the_group_keeps_folding_while_a_lost_partition_is_re_read(
    topic: Topic, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A re-read of a partition whose folds were lost runs beside the group's consumption: a session that
    gets new events meanwhile is folded at once (rebuilt from the log), not after the re-read, however long
    that takes — here it is held until the new events are folded."""
    redis_url = env_or_fail("FOLDLINE_REDIS_URL")
    full = {f"k{i}": session_log(i, 30) for i in range(8)}
    heads = dict.fromkeys(full, 24)
    log = topic.log()
    for sid, events in full.items():
        log.append(sid, 0, events[:24])
    reread_started, release = threading.Event(), threading.Event()

    def held_span(*args: Any, **kwargs: Any) -> Iterator[Any]:
        reread_started.set()
        if not release.wait(60):
            raise AssertionError("the re-read was never released")
        yield from read_partition_span(*args, **kwargs)

    monkeypatch.setattr(projector_runtime, "read_partition_span", held_span)
    settings = worker_settings(topic, redis_url=redis_url, prefix=prefix)
    store = fold_store(Config(redis=RedisConfig(redis_url), folds=FoldsConfig(prefix)))
    marks = partition_marks(Config(redis=RedisConfig(redis_url), folds=FoldsConfig(prefix)))
    worker = start_worker(settings)
    try:
        wait_until(lambda: all_applied(store, heads), 60, "the first folds")
        wait_until(lambda: all_marked(marks, topic), 60, "every partition marked")
        drop_prefix(redis_url, prefix)  # folds and marks gone
        assert reread_started.wait(30), "no partition was re-read"
        for sid, events in full.items():  # new events for every session while the re-read is held
            log.append(sid, 24, events[24:])
        heads = {sid: len(events) for sid, events in full.items()}
        wait_until(lambda: all_applied(store, heads), 30, "the new events folded while the re-read is held")
        assert not release.is_set()
        release.set()
        wait_until(lambda: all_marked(marks, topic), 60, "every partition re-read and marked again")
        assert fold_mismatches(log, store, heads, epoch=0) == []
    finally:
        release.set()
        worker.stop()
        store.close()
        marks.close()
        log.close()
