"""Crash tests of the projector against the real Kafka and Redis (issue: "Crash test").

* ``kill -9`` projector processes repeatedly during a 50,000-event run across 500 sessions: afterwards
  every session's Redis fold equals a fresh fold of its log, and the fold store's journal shows each
  event applied exactly once (never twice, never skipped, no rebuild needed).
* A private Redis server killed and restarted mid-run: the projector waits (not ready), then rebuilds
  the lost folds from the log; every fold equals a fresh fold.
* A writer fenced mid-run: its stale events never reach the fold (nor the log); a stale record forced
  into the topic goes to the dead-letter topic with the reason.
"""

from __future__ import annotations

import random
import shutil
import socket
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer

from foldline.adapters.avro import AvroCodec
from foldline.adapters.kafka import (
    DLQ_HEADER_ERROR,
    DLQ_HEADER_REASON,
    HEADER_EPOCH,
    HEADER_KIND,
    KIND_EVENT,
    SessionEventConsumer,
    partition_for,
)
from foldline.config import Config, FoldsConfig, RedisConfig
from foldline.config.factories import fold_store
from foldline.dispatcher import wait_for_fold
from foldline.errors import FencedError
from foldline.projector import start_worker
from tests.distributed.projector_harness import (
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
    worker_settings,
    write_sessions,
)

pytestmark = [pytest.mark.kafka, pytest.mark.redis]

PARTITIONS = 12


@pytest.mark.slow
@pytest.mark.alone  # kill -9 at scale: its timing limits assume the machine to itself
def test_kill_9_projectors_during_50000_events_across_500_sessions(prefix: str) -> None:
    redis_url = env_or_fail("FOLDLINE_REDIS_URL")
    rng = random.Random(6)
    with kafka_topic(env_or_fail("FOLDLINE_KAFKA_BOOTSTRAP"), PARTITIONS, "projector-crash") as topic:
        logs = {f"k{i:03d}": session_log(i, 100) for i in range(500)}
        heads = {sid: len(events) for sid, events in logs.items()}
        assert sum(heads.values()) == 50_000
        group = f"test-projector-{uuid.uuid4().hex[:8]}"
        args = [
            "--group",
            group,
            "--topic",
            topic.name,
            "--partitions",
            str(PARTITIONS),
            "--fold-prefix",
            prefix,
            "--journal",
            "--max-batch",
            "500",
        ]
        env = worker_env({"FOLDLINE_REDIS_URL": redis_url, "FOLDLINE_KAFKA_BOOTSTRAP": topic.bootstrap})
        workers = [WorkerProcess(args, env).start() for _ in range(3)]
        written: list[int] = []
        writer = threading.Thread(
            target=lambda: written.append(
                write_sessions(topic.bootstrap, topic.name, logs, batch=10, partitions=PARTITIONS, threads=12)
            )
        )
        writer.start()
        kills = 0
        store = fold_store(Config(redis=RedisConfig(redis_url), folds=FoldsConfig(prefix)), journal=True)
        try:
            while writer.is_alive() or kills < 5:
                time.sleep(rng.uniform(0.5, 2.0))
                victim = rng.randrange(len(workers))
                workers[victim].kill()  # SIGKILL: no shutdown code, offsets of in-flight batches not committed
                kills += 1
                workers[victim].start()
            writer.join()
            wait_until(lambda: all_applied(store, heads), 120, "every session folded after the last kill")
        finally:
            for w in workers:
                w.kill()
        assert written == [50_000]
        assert fold_mismatches_parallel(topic, store, heads, epoch=0) == []
        problems = {sid: journal_problems(store.journal_of(sid), head) for sid, head in heads.items()}
        assert {sid: p for sid, p in problems.items() if p} == {}
        assert kills >= 5
        store.close()


# ------------------------------------------------------------------------ the crash window itself


class _CrashBeforeCommit(BaseException):
    """Stops a worker thread dead between a successful apply and its offset commit."""


def test_crash_between_apply_and_commit_redelivers_only_duplicates(
    topic: Topic, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    redis_url = env_or_fail("FOLDLINE_REDIS_URL")
    logs = {f"w{i}": session_log(i, 30) for i in range(8)}
    heads = {sid: len(events) for sid, events in logs.items()}
    write_sessions(topic.bootstrap, topic.name, logs, batch=30, partitions=topic.partitions, threads=2)
    settings = worker_settings(
        topic,
        redis_url=redis_url,
        prefix=prefix,
        journal=True,
        projector__max_batch=40,
        projector__commit_interval_s=0.0,  # a commit after every batch: the third one is early in the run
    )
    commit = SessionEventConsumer.commit
    commits = [0]

    def crash_on_the_third_commit(self: SessionEventConsumer) -> None:
        commits[0] += 1
        if commits[0] == 3:
            raise _CrashBeforeCommit  # the batch is in Redis, its offsets are never committed
        commit(self)

    monkeypatch.setattr(SessionEventConsumer, "commit", crash_on_the_third_commit)
    first = start_worker(settings)
    first.thread.join(60)
    assert [type(e) for e in first.errors] == [_CrashBeforeCommit]
    applied_before_crash = first.worker.totals.applied  # totals are merged after the commit, so...
    monkeypatch.undo()
    second = start_worker(settings)
    store = fold_store(Config(redis=RedisConfig(redis_url), folds=FoldsConfig(prefix)), journal=True)
    try:
        wait_until(lambda: all_applied(store, heads), 60, "the second worker to fold everything")
    finally:
        totals = second.stop()
    # ...the crashed batch is only in the store; it comes back to the second worker, every event a duplicate
    assert 0 < totals.duplicates <= settings.max_batch
    assert applied_before_crash + totals.duplicates + totals.applied == sum(heads.values())
    assert fold_mismatches_parallel(topic, store, heads, epoch=0, threads=2) == []
    for sid, head in heads.items():
        assert journal_problems(store.journal_of(sid), head) == [], sid
    store.close()


# ------------------------------------------------------------------------ Redis restarted mid-run


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PrivateRedis:
    """A redis-server of our own (the binary deploy/local/redis.sh installs), killed and restarted at will."""

    def __init__(self, workdir: Path) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            pytest.fail("redis-server is not installed: run `bash deploy/local/up.sh redis`")
        self.binary = binary
        self.port = _free_port()
        self.workdir = workdir
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [self.binary, "--bind", "127.0.0.1", "--port", str(self.port), "--save", "", "--appendonly", "no"],
            cwd=self.workdir,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        store = fold_store(
            Config(
                redis=RedisConfig(self.url, socket_timeout_s=0.5, connect_timeout_s=0.5), folds=FoldsConfig("probe:")
            )
        )
        try:
            wait_until(store.ping, 15, f"private redis on port {self.port}")
        finally:
            store.close()

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[PrivateRedis]:
    server = PrivateRedis(tmp_path)
    server.start()
    yield server
    server.kill()


@pytest.fixture
def topic() -> Iterator[Topic]:
    with kafka_topic(env_or_fail("FOLDLINE_KAFKA_BOOTSTRAP"), 4, "projector-redis") as t:
        yield t


def test_redis_restarted_mid_run_folds_are_rebuilt_from_the_log(topic: Topic, private_redis: PrivateRedis) -> None:
    logs = {f"r{i:02d}": session_log(i, 80) for i in range(40)}
    heads = {sid: len(events) for sid, events in logs.items()}
    settings = worker_settings(topic, redis_url=private_redis.url, journal=True, projector__max_batch=200)
    handle = start_worker(settings)
    handle.wait_ready(60)
    not_ready_seen = threading.Event()
    writer_done = threading.Event()

    def watch_readiness() -> None:
        while not writer_done.is_set():
            if not handle.worker.ready():
                not_ready_seen.set()
            time.sleep(0.01)

    watcher = threading.Thread(target=watch_readiness)
    watcher.start()
    written: list[int] = []
    writer = threading.Thread(
        target=lambda: written.append(
            write_sessions(topic.bootstrap, topic.name, logs, batch=5, partitions=topic.partitions, pause_s=0.01)
        )
    )
    writer.start()
    store = fold_store(
        Config(
            redis=RedisConfig(private_redis.url, socket_timeout_s=1.0, connect_timeout_s=1.0),
            folds=FoldsConfig(),
        ),
        journal=True,
    )
    try:
        wait_until(lambda: handle.worker.totals.applied > 300, 60, "the projector to fold some events")
        private_redis.kill()  # every fold is gone; the projector's applies fail meanwhile
        time.sleep(1.0)
        private_redis.start()
        writer.join()
        wait_until(lambda: all_applied(store, heads), 90, "every session folded after the restart")
    finally:
        writer_done.set()
        watcher.join()
        totals = handle.stop()
    assert written == [sum(heads.values())]
    assert not_ready_seen.is_set()  # /readyz reported the outage
    log = topic.log()
    try:
        assert fold_mismatches(log, store, heads, epoch=0) == []
    finally:
        log.close()
    assert totals.rebuilt  # sessions first met after the restart were rebuilt from the log...
    assert totals.gaps == []  # ...which is not a seq gap
    for sid, head in heads.items():  # after the restart: at most one rebuild, then every event exactly once
        assert journal_problems(store.journal_of(sid), head, rebuilds_allowed=True) == [], sid
    store.close()


# ------------------------------------------------------------------------ a writer fenced mid-run


def test_a_writer_fenced_mid_run_never_reaches_the_fold(topic: Topic, prefix: str) -> None:
    redis_url = env_or_fail("FOLDLINE_REDIS_URL")
    settings = worker_settings(topic, redis_url=redis_url, prefix=prefix)
    handle = start_worker(settings)
    handle.wait_ready(60)
    events = session_log(1, 60)
    sid = f"fenced-{uuid.uuid4().hex[:6]}"
    old_writer, new_writer = topic.log(), topic.log()
    store = fold_store(Config(redis=RedisConfig(redis_url), folds=FoldsConfig(prefix)))
    try:
        old = old_writer.acquire(sid)
        old_writer.append(sid, 0, events[:20], lease=old)
        wait_for_fold(store, sid, 19, 30)
        new = new_writer.acquire(sid)  # a second instance takes the session over: epoch + 1
        assert new.epoch == old.epoch + 1
        with pytest.raises(FencedError):
            old_writer.append(sid, 20, events[20:30], lease=old)
        new_writer.append(sid, 20, events[20:40], lease=new)
        # A stale record that reached the topic anyway (a writer bypassing the log's transactions):
        # it carries the old epoch and the next seq, and must never be folded.
        codec = AvroCodec()
        rogue = Producer({"bootstrap.servers": topic.bootstrap, "enable.idempotence": True})
        rogue.produce(
            topic.name,
            key=sid.encode(),
            value=codec.encode(events[40]),
            partition=partition_for(sid, topic.partitions),
            headers=[(HEADER_KIND, KIND_EVENT), (HEADER_EPOCH, str(old.epoch).encode())],
        )
        assert rogue.flush(10) == 0
        new_writer.append(sid, 40, events[40:], lease=new)
        state = wait_for_fold(store, sid, len(events) - 1, 30)
    finally:
        totals = handle.stop()
        old_writer.close()
    assert state.epoch == new.epoch
    fresh = fold_mismatches(new_writer, store, {sid: len(events)}, epoch=new.epoch)
    new_writer.close()
    assert fresh == []
    assert totals.applied == len(events)  # the rogue record was not applied
    assert totals.dead_letters == 1
    dead = _dead_letters(topic)
    assert [(d[0], d[1]) for d in dead] == [(sid, FencedError.__name__)]
    assert "fenced" in dead[0][2]
    store.close()


def _dead_letters(topic: Topic) -> list[tuple[str, str, str]]:
    consumer = Consumer(
        {
            "bootstrap.servers": topic.bootstrap,
            "group.id": f"test-dlq-{uuid.uuid4().hex[:8]}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe([topic.name + ".dlq"])
    out: list[tuple[str, str, str]] = []
    deadline = time.monotonic() + 20
    try:
        while time.monotonic() < deadline and not out:
            for msg in consumer.consume(100, timeout=0.5):
                if msg.error() is not None:
                    continue
                raw = msg.headers() or []
                pairs = raw.items() if isinstance(raw, dict) else raw
                headers = {k: _text(v) for k, v in pairs}
                out.append((_text(msg.key()), headers.get(DLQ_HEADER_ERROR, ""), headers.get(DLQ_HEADER_REASON, "")))
    finally:
        consumer.close()
    return out


def _text(raw: str | bytes | None) -> str:
    if raw is None:
        return ""
    return raw.decode() if isinstance(raw, bytes) else raw
