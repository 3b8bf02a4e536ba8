"""Kafka backbone figures against the local broker (FOLDLINE_KAFKA_BOOTSTRAP, deploy/local/up.sh kafka).

* a bare producer: Avro-encode ~200-byte events and produce them on an idempotent ``acks=all``
  producer (no transactions, no index) — the ceiling of one Python process on this machine;
* ``KafkaEventLog.append`` from one process — the issue's target: 128 sessions appending 50-event
  batches concurrently (one thread each) through the group commit, every guarantee on (transactions,
  index entries, fencing checks); median of 3 rounds with min/max, since this machine and its broker
  are shared. For reference: 256 sessions with 10-event appends (each append also costs a fixed
  ~100 µs of interpreter time, see docs/KAFKA.md), and one session appending 500-event batches alone;
* new sessions per second: 256 sessions appending their first batch at once (a take-over each);
* append -> visible to a ``read_committed`` consumer, p50/p99 at 5,000 events/s (batches of 50 every 10 ms);
* the local Apache Kafka (KRaft) cold start: a private broker from the jars ``deploy/local/kafka.sh``
  installed, on free ports with fresh storage, until it answers a metadata request (target <= 30 s).

``run() -> list[dict]`` returns rows {"name", "value", "unit", "target", "ok"}; ``python -m
benchmarks.bench_kafka`` prints them.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from tests.factories import HEADER
from tests.kafka.private_broker import PrivateBroker, kafka_libs

from foldline.adapters.avro import AvroCodec
from foldline.adapters.kafka import KafkaEventLog
from foldline.core import Envelope, RequestHeader, TextBlock, UserMessage
from foldline.core.wire import encode_event

THROUGHPUT_TARGET = 50_000.0
P99_TARGET_MS = 50.0
KRAFT_START_TARGET_S = 30.0
RATE = 5_000
BATCH = 50


def _events(n: int, start: int = 0) -> list[Envelope]:
    text = "x" * 60
    out = [Envelope(start, 1_700_000_000_000, RequestHeader(HEADER, "initial"))] if start == 0 else []
    first = start + len(out)
    out += [
        Envelope(s, 1_700_000_000_000 + s, UserMessage(f"u{s}", (TextBlock(text),))) for s in range(first, start + n)
    ]
    return out


def _row(name: str, value: float, unit: str, target: float | None, higher_is_better: bool = True) -> dict[str, Any]:
    """A result row; ``target=None`` marks a reference figure (reported, not judged)."""
    if target is None:
        return {"name": name, "value": round(value, 1), "unit": unit, "target": "(reference)", "ok": True}
    ok = value >= target if higher_is_better else value <= target
    sign = "≥" if higher_is_better else "≤"
    return {"name": name, "value": round(value, 1), "unit": unit, "target": f"{sign} {target:,g} {unit}", "ok": ok}


def _bootstrap() -> str:
    bootstrap = os.environ.get("FOLDLINE_KAFKA_BOOTSTRAP")
    if not bootstrap:
        raise RuntimeError("FOLDLINE_KAFKA_BOOTSTRAP is not set; run deploy/local/up.sh kafka and source .local/env.sh")
    return bootstrap


def bench_producer(bootstrap: str, topic: str, n: int = 200_000) -> float:
    codec = AvroCodec()
    events = _events(1000, 1)
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 5,
            "queue.buffering.max.messages": 1_000_000,
            "batch.num.messages": 10_000,
        }
    )
    sessions = [f"s{i}" for i in range(64)]
    start = time.perf_counter()
    for i in range(n):
        value = codec.encode(events[i % 1000])
        while True:
            try:
                producer.produce(topic, value=value, key=sessions[i % 64])
                break
            except BufferError:
                producer.poll(0.01)
        if i % 10_000 == 0:
            producer.poll(0)
    if producer.flush(60) != 0:
        raise RuntimeError("producer did not deliver everything")
    return n / (time.perf_counter() - start)


def bench_append(log: KafkaEventLog, batches: int = 40, size: int = 500) -> float:
    """One session alone, 500-event appends back to back (each waits for its own transaction)."""
    sid = f"bench-append-{uuid.uuid4().hex[:8]}"
    events = _events(batches * size)
    log.append(sid, 0, events[:size])  # take-over, topic metadata
    start = time.perf_counter()
    for b in range(1, batches):
        log.append(sid, b * size, events[b * size : (b + 1) * size])
    return (batches - 1) * size / (time.perf_counter() - start)


def bench_concurrent_append(
    log: KafkaEventLog, *, sessions: int = 256, batch: int = 10, appends: int = 30, rounds: int = 3
) -> list[float]:
    """``sessions`` threads, one session each, appending ``batch``-event batches; events/s of each round."""
    sids = [f"bench-many-{uuid.uuid4().hex[:8]}-{i}" for i in range(sessions)]
    per_session = batch * (1 + appends * rounds)
    events = {sid: _events(per_session) for sid in sids}  # built before timing
    heads = dict.fromkeys(sids, 0)

    def work(sid: str, count: int, errors: list[BaseException]) -> None:
        try:
            for _ in range(count):
                head = heads[sid]
                heads[sid] = log.append(sid, head, events[sid][head : head + batch])
        except BaseException as exc:  # reported below: a failed round must not pass as a figure
            errors.append(exc)

    def round_of(count: int) -> float:
        errors: list[BaseException] = []
        threads = [threading.Thread(target=work, args=(sid, count, errors)) for sid in sids]
        start = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        elapsed = time.perf_counter() - start
        if errors:
            raise RuntimeError(f"{len(errors)} appends failed; first: {errors[0]!r}")
        return sessions * count * batch / elapsed

    round_of(1)  # each session's first append takes it over (one small transaction per session)
    return [round_of(appends) for _ in range(rounds)]


def bench_new_sessions(log: KafkaEventLog, sessions: int = 256) -> float:
    """``sessions`` threads each appending the first batch of a new session (created in batched transactions
    per partition, no take-over); sessions/s."""
    sids = [f"bench-new-{uuid.uuid4().hex[:8]}-{i}" for i in range(sessions)]
    first = _events(2)
    errors: list[BaseException] = []

    def start(sid: str) -> None:
        try:
            log.append(sid, 0, first)
        except BaseException as exc:  # reported below: a failed take-over must not pass as a figure
            errors.append(exc)

    threads = [threading.Thread(target=start, args=(sid,)) for sid in sids]
    begin = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - begin
    if errors:
        raise RuntimeError(f"{len(errors)} first appends failed; first: {errors[0]!r}")
    return sessions / elapsed


def bench_visibility(log: KafkaEventLog, bootstrap: str, seconds: float = 4.0) -> tuple[float, float]:
    sid = f"bench-vis-{uuid.uuid4().hex[:8]}"
    from foldline.adapters.kafka import partition_for

    part = partition_for(sid, log.partitions)
    log.append(sid, 0, _events(1))
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": uuid.uuid4().hex,
            "isolation.level": "read_committed",
            "fetch.wait.max.ms": 5,
            "enable.auto.commit": False,
        }
    )
    _low, high = consumer.get_watermark_offsets(TopicPartition(log.topic, part), timeout=10, cached=False)
    consumer.assign([TopicPartition(log.topic, part, high)])
    sent: dict[int, float] = {}
    seen: dict[int, float] = {}
    codec = log.codec
    stop = threading.Event()

    def consume() -> None:
        while not stop.is_set():
            for m in consumer.consume(1000, timeout=0.002):
                if m.error() is None and m.key() == sid.encode() and m.value():
                    seen[codec.decode(m.value()).seq] = time.perf_counter()

    thread = threading.Thread(target=consume, daemon=True)
    thread.start()
    time.sleep(1.0)  # let the consumer fetch from its position
    seq = 1
    total = int(seconds * RATE)
    interval = BATCH / RATE
    next_at = time.perf_counter()
    while seq < total:
        batch = _events(BATCH, seq)
        t = time.perf_counter()
        for e in batch:
            sent[e.seq] = t
        log.append(sid, seq, batch)
        seq += BATCH
        next_at += interval
        delay = next_at - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
    deadline = time.perf_counter() + 10
    while len(seen) < len(sent) and time.perf_counter() < deadline:
        time.sleep(0.05)
    stop.set()
    thread.join()
    consumer.close()
    lat = sorted((seen[s] - sent[s]) * 1000 for s in sent if s in seen)
    if len(lat) < len(sent):
        raise RuntimeError(f"only {len(lat)} of {len(sent)} appended events became visible")
    return lat[len(lat) // 2], lat[int(len(lat) * 0.99) - 1]


def run() -> list[dict[str, Any]]:
    bootstrap = _bootstrap()
    topic = f"bench.session-events.{uuid.uuid4().hex[:8]}"
    size = len(encode_event(_events(2, 1)[1]))
    log = KafkaEventLog(bootstrap, topic=topic, partitions=12)
    try:
        log.head("warm-up")  # creates the topics
        raw = bench_producer(bootstrap, topic + ".raw-bench") if _create(bootstrap, topic + ".raw-bench") else 0.0
        rows = [
            _row(
                f"bare producer, no transactions or index (Avro, idempotent, acks=all, {size}-byte events)",
                raw,
                "events/s",
                None,
            ),
        ]
        for batch, sessions, target in ((50, 128, THROUGHPUT_TARGET), (10, 256, None)):
            figures = sorted(bench_concurrent_append(log, sessions=sessions, batch=batch))
            rows.append(
                _row(
                    f"KafkaEventLog.append, {sessions} sessions appending concurrently, {batch}-event appends "
                    f"({size}-byte events); median of {len(figures)} rounds (min {figures[0]:,.0f}, "
                    f"max {figures[-1]:,.0f})",
                    statistics.median(figures),
                    "events/s",
                    target,
                )
            )
        rows.append(
            _row(
                "new sessions created per second, 256 sessions appending their first batch at once "
                "(created in one transaction per partition for all sessions created meanwhile)",
                bench_new_sessions(log),
                "sessions/s",
                None,
            )
        )
        rows.append(
            _row(
                "KafkaEventLog.append, one session alone, 500-event appends",
                bench_append(log),
                "events/s",
                None,
            )
        )
        p50, p99 = bench_visibility(log, bootstrap)
        rows.append(_row(f"append -> visible p50 at {RATE} events/s", p50, "ms", P99_TARGET_MS, False))
        rows.append(_row(f"append -> visible p99 at {RATE} events/s", p99, "ms", P99_TARGET_MS, False))
        rows.append(
            _row(
                "local Apache Kafka (KRaft) cold start to first metadata answer (fresh storage, format included)",
                bench_kraft_start(),
                "s",
                KRAFT_START_TARGET_S,
                False,
            )
        )
        return rows
    finally:
        log.close()
        _delete(bootstrap, [topic, topic + ".index", topic + ".dlq", topic + ".raw-bench"])


def bench_kraft_start() -> float:
    libs = kafka_libs()
    if libs is None:
        raise RuntimeError("the Kafka jars are missing: run deploy/local/kafka.sh install")
    with tempfile.TemporaryDirectory(prefix="foldline-kraft-") as tmp, PrivateBroker(Path(tmp), libs) as broker:
        return broker.start(timeout_s=120)


def _create(bootstrap: str, topic: str) -> bool:
    from confluent_kafka.cimpl import NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    for fut in admin.create_topics([NewTopic(topic, 12, 1)]).values():
        fut.result(timeout=30)
    time.sleep(0.5)
    return True


def _delete(bootstrap: str, topics: list[str]) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    existing = admin.list_topics(timeout=10).topics
    doomed = [t for t in topics if t in existing]
    if doomed:
        for fut in admin.delete_topics(doomed).values():
            fut.result(timeout=30)


if __name__ == "__main__":
    for row in run():
        mark = "ok " if row["ok"] else "MISS"
        print(f"{mark} {row['name']}: {row['value']} {row['unit']} (target {row['target']})")
