"""Three projectors in one group share the partitions; forced rebalances mid-stream lose and duplicate nothing.

Real Kafka and Redis. Workers run in-process (``start_worker``), each with its own consumer, event log and
fold store. While writers append, workers leave and join the group (each change is a rebalance). At the
end every fold equals a fresh fold of its log, and the fold store's change journal shows every event
applied exactly once.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from foldline.config import Config, FoldsConfig, RedisConfig
from foldline.config.factories import fold_store
from foldline.projector import WorkerHandle, start_worker
from tests.distributed.projector_harness import (
    Topic,
    all_applied,
    env_or_fail,
    fold_mismatches,
    journal_problems,
    kafka_topic,
    session_log,
    wait_until,
    worker_settings,
    write_sessions,
)

pytestmark = [pytest.mark.kafka, pytest.mark.redis]

PARTITIONS = 6


@pytest.fixture
def topic() -> Iterator[Topic]:
    with kafka_topic(env_or_fail("FOLDLINE_KAFKA_BOOTSTRAP"), PARTITIONS, "projector-rebalance") as t:
        yield t


def test_three_workers_with_rebalances_mid_stream_apply_every_event_once(topic: Topic, prefix: str) -> None:
    redis_url = env_or_fail("FOLDLINE_REDIS_URL")
    settings = worker_settings(
        topic,
        redis_url=redis_url,
        prefix=prefix,
        journal=True,
        projector__max_batch=200,  # small batches: many rebalances land between two applies
    )
    logs = {f"r{i:03d}": session_log(i, 60) for i in range(60)}
    heads = {sid: len(events) for sid, events in logs.items()}
    workers: list[WorkerHandle] = [start_worker(settings) for _ in range(3)]
    everyone = list(workers)
    for w in workers:
        w.wait_ready(60)

    written: list[int] = []
    writer = threading.Thread(
        target=lambda: written.append(
            write_sessions(topic.bootstrap, topic.name, logs, batch=4, partitions=PARTITIONS, threads=4, pause_s=0.01)
        )
    )
    writer.start()
    rebalances = 0
    try:
        while writer.is_alive() or rebalances < 4:
            time.sleep(1.0)
            leaving = workers.pop(0)  # the oldest leaves (revokes its partitions), a new one joins
            leaving.stop()
            workers.append(start_worker(settings))
            everyone.append(workers[-1])
            workers[-1].wait_ready(60)
            rebalances += 2
        writer.join()
        store = fold_store(Config(redis=RedisConfig(redis_url), folds=FoldsConfig(prefix)), journal=True)
        wait_until(lambda: all_applied(store, heads), 90, "every session folded")
    finally:
        for w in workers:
            w.stop()
    totals = [w.worker.totals for w in everyone]
    assert written == [sum(heads.values())]
    assert rebalances >= 4
    # every event was newly applied by exactly one worker; whatever else was delivered was a duplicate
    assert sum(t.applied for t in totals) == sum(heads.values())
    assert sum(1 for t in totals if t.applied) >= 3
    log = topic.log()
    try:
        assert fold_mismatches(log, store, heads, epoch=0) == []
    finally:
        log.close()
    problems = {sid: journal_problems(store.journal_of(sid), head) for sid, head in heads.items()}
    assert {sid: p for sid, p in problems.items() if p} == {}
    assert all(not t.gaps and not t.fenced for t in totals)
    store.close()
