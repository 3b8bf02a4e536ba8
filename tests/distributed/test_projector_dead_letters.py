"""Both projector runtimes write the same dead-letter records, byte for byte, as docs/KAFKA.md describes.

Real Kafka and Redis. The confluent runtime (in-process) and the faust runtime (a process) fold one topic
into folds of their own. Each folds a session, then the session's fold is moved to a newer writer epoch
behind the runtimes' backs and the old writer appends once more: the store refuses that event as stale
(``fenced``) and each runtime dead-letters it. A record that does not decode is dead-lettered by each
runtime's record checks as well. Every source record then has two dead-letter copies, which must be
identical: the original key, value bytes and headers, then the ``fl-dlq-*`` headers.
"""

from __future__ import annotations

import signal
import time
import uuid
from collections.abc import Iterator

import pytest
from confluent_kafka import Consumer, Message, Producer, TopicPartition

from foldline.adapters.avro import AvroCodec
from foldline.adapters.kafka import (
    DLQ_HEADER_ERROR,
    DLQ_HEADER_OFFSET,
    DLQ_HEADER_PARTITION,
    DLQ_HEADER_REASON,
    DLQ_HEADER_RULE,
    DLQ_HEADER_TOPIC,
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
    env_or_fail,
    kafka_topic,
    session_log,
    worker_env,
    worker_settings,
)

pytestmark = [pytest.mark.kafka, pytest.mark.redis]

Headers = list[tuple[str, bytes]]


@pytest.fixture
def topic() -> Iterator[Topic]:
    with kafka_topic(env_or_fail("FOLDLINE_KAFKA_BOOTSTRAP"), 4, "projector-dlq") as t:
        yield t


def _headers(msg: Message) -> Headers:
    raw = msg.headers() or []
    pairs = raw.items() if isinstance(raw, dict) else raw
    return [(k, v if isinstance(v, bytes) else (v or "").encode()) for k, v in pairs]


def _read(bootstrap: str, topic: str, *, want: int, partition: int | None = None, offset: int = 0) -> list[Message]:
    """Up to ``want`` committed records of ``topic`` (one partition from ``offset``, or every partition from the
    start), waiting up to a minute for them."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"test-dlq-{uuid.uuid4().hex[:8]}",
            "isolation.level": "read_committed",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    if partition is None:
        consumer.subscribe([topic])
    else:
        consumer.assign([TopicPartition(topic, partition, offset)])
    out: list[Message] = []
    deadline = time.monotonic() + 60
    try:
        while len(out) < want and time.monotonic() < deadline:
            out.extend(m for m in consumer.consume(100, timeout=0.5) if m.error() is None)
    finally:
        consumer.close()
    return out[:want]


def test_both_runtimes_dead_letter_the_same_records_byte_for_byte(topic: Topic, prefix: str) -> None:
    redis_url = env_or_fail("FOLDLINE_REDIS_URL")
    sid, junk = f"fenced-{uuid.uuid4().hex[:6]}", f"junk-{uuid.uuid4().hex[:6]}"
    events = session_log(7, 5)
    writer = topic.log()
    lease = writer.acquire(sid)
    writer.append(sid, 0, events[:4], lease=lease)
    garbage = Producer({"bootstrap.servers": topic.bootstrap, "enable.idempotence": True})
    garbage.produce(
        topic.name, key=junk.encode(), value=b"not avro at all", partition=partition_for(junk, topic.partitions)
    )
    assert garbage.flush(10) == 0

    prefixes = {"confluent": prefix + "confluent:", "faust": prefix + "faust:"}
    confluent = start_worker(
        worker_settings(
            topic,
            redis_url=redis_url,
            prefix=prefixes["confluent"],
            group=f"test-dlq-confluent-{uuid.uuid4().hex[:8]}",
        )
    )
    faust_args = ["--runtime", "faust", "--group", f"test-dlq-faust-{uuid.uuid4().hex[:8]}", "--topic", topic.name]
    faust_args += ["--partitions", str(topic.partitions), "--fold-prefix", prefixes["faust"]]
    faust = WorkerProcess(faust_args, worker_env({"FOLDLINE_REDIS_URL": redis_url})).start()
    stores = {
        name: fold_store(Config(redis=RedisConfig(redis_url), folds=FoldsConfig(p))) for name, p in prefixes.items()
    }
    try:
        for name, store in stores.items():
            wait_for_fold(store, sid, 3, 60)  # each runtime folded the session so far (epoch 1)
            store.raise_epoch(sid, lease.epoch + 4)  # a newer writer's epoch, unseen by the runtimes
            assert store.get(sid) is not None, name
        writer.append(sid, 4, events[4:], lease=lease)  # the old writer once more: stale for both folds
        dead = _read(topic.bootstrap, topic.name + ".dlq", want=4)
    finally:
        totals = confluent.stop()
        proc = faust.proc
        assert proc is not None
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0, faust.stderr()[-3000:]
        faust_totals = " ".join(faust.stderr().split())  # the totals line may be wrapped
        faust.kill()
        for store in stores.values():
            store.close()
        writer.close()
    assert (len(totals.fenced), totals.dead_letters, totals.applied) == (1, 1, 4)
    assert "4 applied," in faust_totals
    assert "1 fenced, 1 dead letters" in faust_totals, faust_totals[-3000:]
    for store in stores.values():
        state = store.get(sid)
        assert state is not None
        assert (state.applied_seq, state.epoch) == (3, lease.epoch + 4)  # the stale event was not folded

    by_source: dict[tuple[bytes, bytes], list[Message]] = {}
    for msg in dead:
        h = dict(_headers(msg))
        by_source.setdefault((h[DLQ_HEADER_PARTITION], h[DLQ_HEADER_OFFSET]), []).append(msg)
    assert len(dead) == 4, [_headers(m) for m in dead]
    assert len(by_source) == 2, [_headers(m) for m in dead]
    for (part, off), copies in by_source.items():
        first, second = copies
        assert (first.key(), first.value(), _headers(first)) == (second.key(), second.value(), _headers(second))
        [source] = _read(topic.bootstrap, topic.name, want=1, partition=int(part), offset=int(off))
        key = source.key()
        assert key is not None
        if key == sid.encode():
            error: Exception = FencedError(sid, lease.epoch, lease.epoch + 4)
            rule = b""
        else:
            assert key == junk.encode()
            error, rule = _decode_error(source), b"avro-decode"
        assert first.key() == key
        assert first.value() == source.value()  # the original bytes, not a re-encoding
        assert _headers(first) == [
            *_headers(source),
            (DLQ_HEADER_REASON, str(error).encode()),
            (DLQ_HEADER_ERROR, type(error).__name__.encode()),
            (DLQ_HEADER_RULE, rule),
            (DLQ_HEADER_TOPIC, topic.name.encode()),
            (DLQ_HEADER_PARTITION, part),
            (DLQ_HEADER_OFFSET, off),
        ]


def _decode_error(source: Message) -> Exception:
    try:
        AvroCodec().decode(source.value())
    except Exception as exc:
        return exc
    raise AssertionError("the junk record decoded")
