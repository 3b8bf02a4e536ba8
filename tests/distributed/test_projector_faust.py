"""The faust-streaming projector runtime (``foldline projector --runtime faust``) against the real Kafka and Redis.

* Its consumer reads ``read_committed`` although the app is not in exactly-once mode: an aborted
  transaction's records are never folded, while faust's stock consumer (same app settings) reads them.
* ``kill -9`` of faust projector processes, repeatedly, during 10,000 events across 100 sessions: every
  fold equals a fresh fold of its log and the journal shows each event applied exactly once.
* An apply that raises half way through a batch: nothing of the batch is acknowledged (the committed
  offsets stay below it), the process exits non-zero, and a restarted projector applies the rest once.
"""

from __future__ import annotations

import asyncio
import json
import random
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from foldline.adapters.avro import AvroCodec
from foldline.adapters.kafka import HEADER_EPOCH, HEADER_KIND, KIND_EVENT, partition_for
from foldline.config import Config, FoldsConfig, RedisConfig
from foldline.config.factories import fold_store
from foldline.projector import WorkerSettings
from foldline.projector.faust_runtime import READ_COMMITTED, projector_app
from tests.distributed.projector_harness import (
    REPO,
    Topic,
    WorkerProcess,
    all_applied,
    env_or_fail,
    fold_mismatches,
    fold_mismatches_parallel,
    journal_problems,
    kafka_topic,
    session_log,
    wait_until,
    worker_env,
    write_sessions,
)

pytestmark = [pytest.mark.kafka, pytest.mark.redis]

PARTITIONS = 4


@pytest.fixture
def topic() -> Iterator[Topic]:
    with kafka_topic(env_or_fail("FOLDLINE_KAFKA_BOOTSTRAP"), PARTITIONS, "projector-faust") as t:
        yield t


def _group() -> str:
    return f"test-projector-faust-{uuid.uuid4().hex[:8]}"


def _args(group: str, topic: Topic, prefix: str, *extra: str) -> list[str]:
    return [
        "--runtime",
        "faust",
        "--group",
        group,
        "--topic",
        topic.name,
        "--partitions",
        str(topic.partitions),
        "--fold-prefix",
        prefix,
        "--journal",
        *extra,
    ]


def _env(topic: Topic) -> dict[str, str]:
    return worker_env(
        {"FOLDLINE_REDIS_URL": env_or_fail("FOLDLINE_REDIS_URL"), "FOLDLINE_KAFKA_BOOTSTRAP": topic.bootstrap}
    )


def _lags(metrics_url: str) -> list[float]:
    """Every foldline_projector_lag_{events,seconds} sample the worker exports."""
    with urllib.request.urlopen(metrics_url + "/metrics", timeout=5) as response:
        text = response.read().decode()
    prefixes = ("foldline_projector_lag_events{", "foldline_projector_lag_seconds{")
    return [float(line.split()[-1]) for line in text.splitlines() if line.startswith(prefixes)]


def _stop(worker: WorkerProcess) -> dict[str, int]:
    """SIGTERM, wait for a clean exit, and return the totals line the process printed on stderr."""
    proc = worker.proc
    assert proc is not None
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(60) == 0, worker.stderr()[-3000:]
    text = worker.stderr()
    worker.kill()
    found = re.search(r"projector stopped: (\d+) events, (\d+) applied, (\d+) duplicates", text.replace("\n", " "))
    assert found is not None, text[-3000:]
    return {"events": int(found[1]), "applied": int(found[2]), "duplicates": int(found[3])}


# ------------------------------------------------------------------------ read_committed


def _write_aborted(topic: Topic, session_id: str, n_events: int) -> list[bytes]:
    """Valid events of ``session_id`` in a transaction that is then aborted; returns their values."""
    codec = AvroCodec(subject=f"{topic.name}-value")
    values = [codec.encode(ev) for ev in session_log(999, n_events)]  # other content than the real log
    producer = Producer({"bootstrap.servers": topic.bootstrap, "transactional.id": f"test-aborted-{uuid.uuid4()}"})
    producer.init_transactions(30)
    producer.begin_transaction()
    for value in values:
        producer.produce(
            topic.name,
            key=session_id.encode(),
            value=value,
            partition=partition_for(session_id, topic.partitions),
            headers=[(HEADER_KIND, KIND_EVENT), (HEADER_EPOCH, b"0")],
        )
    assert producer.flush(30) == 0
    producer.abort_transaction(30)
    return values


def _write_interleaved(topic: Topic, index: int) -> dict[str, int]:
    """Two sessions on one partition, written by two transactional producers whose transactions overlap
    and commit one after the other, so the partition ends with two commit markers; returns their heads."""
    names = (f"interleaved-{k}" for k in range(1000))
    by_part: dict[int, str] = {}
    while True:
        sid = next(names)
        other = by_part.setdefault(partition_for(sid, topic.partitions), sid)
        if other != sid:
            pair = (other, sid)
            break
    codec = AvroCodec(subject=f"{topic.name}-value")
    producers = []
    for k, sid in enumerate(pair):
        producer = Producer({"bootstrap.servers": topic.bootstrap, "transactional.id": f"test-mark-{uuid.uuid4()}"})
        producer.init_transactions(30)
        producer.begin_transaction()
        for ev in session_log(index + k, 12):
            producer.produce(
                topic.name,
                key=sid.encode(),
                value=codec.encode(ev),
                partition=partition_for(sid, topic.partitions),
                headers=[(HEADER_KIND, KIND_EVENT), (HEADER_EPOCH, b"0")],
            )
        assert producer.flush(30) == 0
        producers.append(producer)
    for producer in producers:
        producer.commit_transaction(30)
    return dict.fromkeys(pair, 12)


async def _read_partition(settings: WorkerSettings, partition: int, *, vanilla: bool) -> tuple[object, list[bytes]]:
    """Read one partition from the start with the consumer the projector app would build: (isolation, values)."""
    import aiokafka  # type: ignore[import-untyped]

    with tempfile.TemporaryDirectory() as datadir:
        app = projector_app(settings, datadir, vanilla=vanilla)
        thread: Any = cast(Any, app.consumer)._thread  # faust's aiokafka consumer thread
        consumer = thread._create_worker_consumer(app.transport)
        await consumer.start()
        try:
            tp = aiokafka.TopicPartition(settings.topic, partition)
            consumer.assign([tp])
            await consumer.seek_to_beginning(tp)
            values: list[bytes] = []
            empty = 0
            while empty < 3:
                got = await consumer.getmany(tp, timeout_ms=500)
                records = got.get(tp, [])
                values.extend(r.value for r in records)
                empty = 0 if records else empty + 1
            return consumer._fetcher._isolation_level, values
        finally:
            await consumer.stop()
            thread.thread_loop.close()  # the consumer thread's own loop: never started here


def test_faust_runtime_reads_committed_only_and_never_folds_an_aborted_transaction(topic: Topic, prefix: str) -> None:
    from aiokafka.consumer import fetcher  # type: ignore[import-untyped]

    sid = "aborted-first"
    aborted = _write_aborted(topic, sid, 20)
    logs = {sid: session_log(0, 20), **{f"c{i}": session_log(i + 1, 30) for i in range(6)}}
    heads = {s: len(events) for s, events in logs.items()}
    write_sessions(topic.bootstrap, topic.name, logs, batch=10, partitions=topic.partitions, threads=2)
    # a partition that ends with two commit markers (writers whose transactions overlapped) still reads lag 0
    marked = _write_interleaved(topic, 50)

    # the probes read by manual assignment in groups of their own
    settings = WorkerSettings(
        Config().overridden(
            kafka__bootstrap=topic.bootstrap,
            kafka__topic=topic.name,
            kafka__projector_group=_group(),
            kafka__partitions=topic.partitions,
        )
    )
    part = partition_for(sid, topic.partitions)
    ours_level, ours = asyncio.run(_read_partition(settings, part, vanilla=False))
    stock_level, stock = asyncio.run(_read_partition(settings, part, vanilla=True))
    # faust's stock consumer (not in exactly-once mode) reads the aborted records; the runtime's does not
    # (the logs share some event bytes, so compare as multisets)
    assert stock_level == fetcher.READ_UNCOMMITTED
    assert Counter(stock) - Counter(ours) == Counter(aborted)
    assert ours_level == fetcher.READ_COMMITTED
    assert len(ours) == len(stock) - len(aborted)
    assert READ_COMMITTED == "read_committed"

    group = _group()
    worker = WorkerProcess(_args(group, topic, prefix, "--metrics-port", "0"), _env(topic)).start()
    store = fold_store(
        Config(redis=RedisConfig(env_or_fail("FOLDLINE_REDIS_URL")), folds=FoldsConfig(prefix)), journal=True
    )
    try:
        wait_until(lambda: all_applied(store, heads | marked), 60, "the faust projector to fold every session")
        ready = next(line for line in worker.lines if line.startswith("projector ready"))
        metrics_url = ready.split("metrics=", 1)[1].strip()
        # Caught up and idle: no lag on any partition, although each ends with a transaction marker.
        wait_until(lambda: bool(_lags(metrics_url)) and not any(_lags(metrics_url)), 20, "the faust lag to read 0")
        time.sleep(2.5)  # sampled once a second: an idle worker stays at 0
        assert not any(_lags(metrics_url)), _lags(metrics_url)
        totals = _stop(worker)
    finally:
        worker.kill()
    total = sum(heads.values()) + sum(marked.values())
    assert totals == {"events": total, "applied": total, "duplicates": 0}
    # Everything applied is committed at a clean stop, across the holes the transaction markers and the
    # aborted records leave in the offsets (only a partition's final markers stay past the commit).
    reader = Consumer({"bootstrap.servers": topic.bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        tps = [TopicPartition(topic.name, p) for p in range(topic.partitions)]
        committed = {tp.partition: tp.offset for tp in reader.committed(tps, timeout=10)}
        ends = {tp.partition: reader.get_watermark_offsets(tp, timeout=10)[1] for tp in tps}
    finally:
        reader.close()
    markers = {p: 2 if p == partition_for(next(iter(marked)), topic.partitions) else 1 for p in ends}
    assert {p: committed[p] >= ends[p] - markers[p] for p in ends} == dict.fromkeys(ends, True), (committed, ends)
    log = topic.log()
    try:
        assert fold_mismatches(log, store, heads, epoch=0) == []
    finally:
        log.close()
    for s, head in heads.items():
        assert journal_problems(store.journal_of(s), head) == [], s
    store.close()


# ------------------------------------------------------------------------ kill -9


@pytest.mark.alone  # kill -9 at scale: its timing limits assume the machine to itself
def test_kill_9_faust_projectors_during_10000_events_across_100_sessions(topic: Topic, prefix: str) -> None:
    redis_url = env_or_fail("FOLDLINE_REDIS_URL")
    rng = random.Random(61)
    logs = {f"f{i:03d}": session_log(i, 100) for i in range(100)}
    heads = {sid: len(events) for sid, events in logs.items()}
    assert sum(heads.values()) == 10_000
    args = _args(_group(), topic, prefix, "--max-batch", "300")
    workers = [WorkerProcess(args, _env(topic)).start() for _ in range(2)]
    written: list[int] = []
    # the writer is paced to outlast at least three kill-and-restart cycles (a restart waits for the worker)
    writer = threading.Thread(
        target=lambda: written.append(
            write_sessions(
                topic.bootstrap, topic.name, logs, batch=10, partitions=topic.partitions, threads=4, pause_s=0.1
            )
        )
    )
    writer.start()
    kills = kills_while_writing = 0
    store = fold_store(Config(redis=RedisConfig(redis_url), folds=FoldsConfig(prefix)), journal=True)
    try:
        while writer.is_alive() or kills < 3:
            time.sleep(rng.uniform(0.5, 1.5))
            victim = rng.randrange(len(workers))
            workers[victim].kill()  # SIGKILL: no shutdown code, acked-but-uncommitted offsets are lost
            kills += 1
            kills_while_writing += writer.is_alive()
            workers[victim].start()
        writer.join()
        wait_until(lambda: all_applied(store, heads), 90, "every session folded after the last kill")
    finally:
        for w in workers:
            w.kill()
    assert written == [10_000]
    assert kills_while_writing >= 3, kills_while_writing
    assert fold_mismatches_parallel(topic, store, heads, epoch=0, threads=4) == []
    problems = {sid: journal_problems(store.journal_of(sid), head) for sid, head in heads.items()}
    assert {sid: p for sid, p in problems.items() if p} == {}
    store.close()


# ------------------------------------------------------------------------ an apply that raises mid-batch

# The faust runtime as a process whose third apply folds half of its batch and then raises; it writes the
# (partition, offset) of every event of that batch to argv[1] first; before it stops it lingers, then
# writes to argv[3] which of those events faust's consumer holds as acked or committed.
_FAILING_CHILD = """
import asyncio, json, sys
from faust.types import TP
from foldline.adapters.kafka import ConsumedEvent
from foldline.adapters.kafka import KafkaEventLog
from foldline.config import Config
from foldline.config.factories import fold_store
from foldline.projector import BatchProjector, WorkerSettings
from foldline.projector.faust_runtime import FaustProjector

class ApplyFailsHalfWay(BatchProjector):
    calls = 0

    def project(self, items):
        ApplyFailsHalfWay.calls += 1
        events = [i for i in items if isinstance(i, ConsumedEvent)]
        if ApplyFailsHalfWay.calls < 3 or len(events) < 2:
            return super().project(items)
        with open(sys.argv[1], "w") as out:
            json.dump([[e.partition, e.offset] for e in events], out)
        super().project(items[: len(items) // 2])
        raise RuntimeError("injected: the apply failed half way through its batch")

class LingersAfterTheFailure(FaustProjector):
    async def _fail(self, exc, size):
        # faust commits acked offsets every second: linger past that, then report which events of the
        # failed batch faust's consumer holds as acked or committed
        await asyncio.sleep(2.5)
        consumer = self._worker.app.consumer
        with open(sys.argv[1]) as f:
            failed = json.load(f)
        acked = []
        for part, offset in failed:
            tp = TP(settings.topic, part)
            committed = consumer._committed_offset.get(tp)
            if offset in consumer._acked_index[tp] or (committed is not None and committed > offset):
                acked.append([part, offset])
        with open(sys.argv[3], "w") as out:
            json.dump({"acked": acked}, out)
        await super()._fail(exc, size)

settings = WorkerSettings(Config().overridden(**json.loads(sys.argv[2])), journal=True)
store = fold_store(settings.config, journal=True)
log = KafkaEventLog(settings.bootstrap, topic=settings.topic, partitions=settings.partitions)
LingersAfterTheFailure(settings, projector=ApplyFailsHalfWay(store, log)).run()
"""


def test_an_apply_that_raises_mid_batch_acknowledges_nothing_of_the_batch(
    topic: Topic, prefix: str, tmp_path: Path
) -> None:
    redis_url = env_or_fail("FOLDLINE_REDIS_URL")
    logs = {f"m{i}": session_log(i, 60) for i in range(20)}
    heads = {sid: len(events) for sid, events in logs.items()}
    write_sessions(topic.bootstrap, topic.name, logs, batch=20, partitions=topic.partitions, threads=2)
    group = _group()
    settings = {  # the child's configuration: Config.overridden(**settings)
        "kafka__bootstrap": topic.bootstrap,
        "kafka__topic": topic.name,
        "kafka__projector_group": group,
        "redis__url": redis_url,
        "folds__prefix": prefix,
        "kafka__partitions": topic.partitions,
        "projector__max_batch": 100,
    }
    failed_path = tmp_path / "failed-batch.json"
    acks_path = tmp_path / "acks.json"
    child = subprocess.run(
        [sys.executable, "-c", _FAILING_CHILD, str(failed_path), json.dumps(settings), str(acks_path)],
        env=_env(topic),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )
    assert child.returncode != 0, child.stderr[-3000:]
    assert "injected: the apply failed half way through its batch" in child.stderr
    failed = json.loads(failed_path.read_text())
    assert failed
    acks = json.loads(acks_path.read_text())
    assert acks["acked"] == [], "events of the failed batch were acked"

    # No offset of the failed batch was committed: per partition, the commit stays at or below its first event.
    first_failed: dict[int, int] = {}
    for part, offset in failed:
        first_failed[part] = min(offset, first_failed.get(part, offset))
    reader = Consumer({"bootstrap.servers": topic.bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        committed = reader.committed([TopicPartition(topic.name, p) for p in range(topic.partitions)], timeout=10)
    finally:
        reader.close()
    by_part = {tp.partition: tp.offset for tp in committed}
    assert any(off > 0 for off in by_part.values()), "the batches before the failure were committed"
    for part, first in first_failed.items():
        assert by_part[part] <= first, (part, by_part[part], first)

    store = fold_store(Config(redis=RedisConfig(redis_url), folds=FoldsConfig(prefix)), journal=True)
    worker = WorkerProcess(_args(group, topic, prefix), _env(topic)).start()
    try:
        wait_until(lambda: all_applied(store, heads), 60, "the restarted projector to fold every session")
        totals = _stop(worker)
    finally:
        worker.kill()
    assert totals["duplicates"] > 0  # the half that reached Redis came back and was skipped
    log = topic.log()
    try:
        assert fold_mismatches(log, store, heads, epoch=0) == []
    finally:
        log.close()
    for sid, head in heads.items():
        assert journal_problems(store.journal_of(sid), head) == [], sid
    store.close()
