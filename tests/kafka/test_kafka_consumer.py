"""Consuming the session topic: bad records get typed errors, go to the DLQ with the reason, and consumption goes on."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka import Consumer, Message, Producer

from foldline.adapters.avro import AvroCodec
from foldline.adapters.kafka import (
    DLQ_HEADER_ERROR,
    DLQ_HEADER_OFFSET,
    DLQ_HEADER_REASON,
    DLQ_HEADER_RULE,
    ConsumedEvent,
    ConsumedItem,
    ConsumedLease,
    DeadLetter,
    SessionEventConsumer,
    partition_for,
)
from foldline.core import Envelope, TextBlock, UserMessage
from foldline.errors import AvroDecodeError, UnknownSchemaError, ValidationError
from tests.factories import simple_log
from tests.kafka.conftest import MakeLog

pytestmark = pytest.mark.kafka


def _drain(consumer: SessionEventConsumer, want: int, timeout_s: float = 20) -> list[ConsumedItem]:
    items: list[ConsumedItem] = []
    deadline = time.monotonic() + timeout_s
    while len(items) < want and time.monotonic() < deadline:
        items.extend(consumer.poll(500, 0.5))
    return items


def test_bad_records_are_dead_lettered_and_consumption_goes_on(make_log: MakeLog, kafka_bootstrap: str) -> None:
    topic = f"test.dlq.{uuid.uuid4().hex[:8]}"
    log = make_log(topic=topic, partitions=2)
    good = f"good-{uuid.uuid4().hex[:6]}"
    bad = f"bad-{uuid.uuid4().hex[:6]}"
    events = simple_log(1, 1)
    lease = log.acquire(good)
    log.append(good, 0, events[:3], lease=lease)

    # A misbehaving producer (not foldline's writer) puts garbage on the session's partition.
    codec = AvroCodec()
    raw = Producer({"bootstrap.servers": kafka_bootstrap, "enable.idempotence": True, "acks": "all"})
    part = partition_for(bad, 2)
    fine = codec.encode(Envelope(0, 1, UserMessage("u", (TextBlock("hi"),))))
    gap = codec.encode(Envelope(5, 1, UserMessage("u", (TextBlock("gap"),))))
    unknown_fp = fine[:2] + b"\x01" * 8 + fine[10:]
    for value in (b"not avro at all", unknown_fp, fine, gap):
        raw.produce(topic, value=value, key=bad, partition=part, headers=[("fl-kind", b"event")])
    assert raw.flush(10) == 0
    log.append(good, 3, events[3:], lease=lease)  # consumption must go on past the bad records

    consumer = SessionEventConsumer(kafka_bootstrap, f"g-{uuid.uuid4().hex}", topic=topic, log=log)
    try:
        items = _drain(consumer, want=1 + len(events) + 4)
        consumer.commit()
    finally:
        consumer.close()
    consumed = [i for i in items if isinstance(i, ConsumedEvent)]
    dead = [i for i in items if isinstance(i, DeadLetter)]
    leases = [i for i in items if isinstance(i, ConsumedLease)]
    assert [c.event for c in consumed if c.session_id == good] == events
    assert [c.event.seq for c in consumed if c.session_id == bad] == [0]
    assert leases == [ConsumedLease(good, 1, partition_for(good, 2), leases[0].offset)]
    assert [type(d.error) for d in dead] == [AvroDecodeError, UnknownSchemaError, ValidationError]
    assert isinstance(dead[2].error, ValidationError)
    assert dead[2].error.rule == "seq-gapless"

    dlq = Consumer(
        {"bootstrap.servers": kafka_bootstrap, "group.id": uuid.uuid4().hex, "auto.offset.reset": "earliest"}
    )
    dlq.subscribe([topic + ".dlq"])
    records: list[Message] = []
    deadline = time.monotonic() + 20
    while len(records) < 3 and time.monotonic() < deadline:
        m = dlq.poll(0.5)
        if m is not None and m.error() is None:
            records.append(m)
    dlq.close()
    assert len(records) == 3
    for record, letter in zip(records, dead, strict=True):
        headers = record.headers() or []
        h = dict(headers.items() if isinstance(headers, dict) else headers)
        assert h[DLQ_HEADER_ERROR] == type(letter.error).__name__.encode()
        assert h[DLQ_HEADER_OFFSET] == str(letter.offset).encode()
        assert h[DLQ_HEADER_REASON] == str(letter.error).encode()
        assert record.key() == bad.encode()
    assert h[DLQ_HEADER_RULE] == b"seq-gapless"
    assert records[0].value() == b"not avro at all"  # the original bytes are kept for inspection


def test_rule_state_stays_bounded_and_evicted_sessions_re_anchor_from_the_log(
    make_log: MakeLog, kafka_bootstrap: str
) -> None:
    topic = f"test.lru.{uuid.uuid4().hex[:8]}"
    log = make_log(topic=topic, partitions=1)
    events = simple_log(2, 2)
    sessions = [f"s{i}-{uuid.uuid4().hex[:6]}" for i in range(5)]
    leases = {sid: log.acquire(sid) for sid in sessions}
    # Interleave small appends so every session is met again after the others evicted it.
    for start in range(0, len(events), 3):
        for sid in sessions:
            log.append(sid, start, events[start : start + 3], lease=leases[sid])

    consumer = SessionEventConsumer(kafka_bootstrap, f"g-{uuid.uuid4().hex}", topic=topic, log=log, max_sessions=2)
    try:
        items = _drain(consumer, want=len(sessions) * (len(events) + 1))
        assert consumer.tracked_sessions <= 2
    finally:
        consumer.close()
    assert not [i for i in items if isinstance(i, DeadLetter)]
    for sid in sessions:
        assert [i.event for i in items if isinstance(i, ConsumedEvent) and i.session_id == sid] == events


def test_a_lone_record_is_handed_over_as_it_arrives_and_a_backlog_in_one_batch(kafka_bootstrap: str) -> None:
    """``consume_ready`` waits for the first record only: a record that comes alone is returned at once, not
    after the timeout (librdkafka's ``consume(n, timeout)`` holds it until it has ``n``); records already
    fetched come together."""
    from confluent_kafka.admin import AdminClient
    from confluent_kafka.cimpl import NewTopic

    from foldline.adapters.kafka.clients import consume_ready

    topic = f"test.consume-ready.{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    for future in admin.create_topics([NewTopic(topic, 1, 1)]).values():
        future.result(timeout=30)
    producer = Producer({"bootstrap.servers": kafka_bootstrap})
    consumer = Consumer(
        {"bootstrap.servers": kafka_bootstrap, "group.id": f"g-{topic}", "auto.offset.reset": "earliest"}
    )
    try:
        consumer.subscribe([topic])
        assert consume_ready(consumer, 500, 1.0) == []  # nothing yet: the whole (short) timeout, then none
        producer.produce(topic, b"alone")
        producer.flush(10)
        began = time.monotonic()
        got = consume_ready(consumer, 500, 60.0)  # with consume(500, 60) this would wait the minute
        assert [m.value() for m in got] == [b"alone"]
        assert time.monotonic() - began < 30  # it did not wait for the batch to fill
        for i in range(20):
            producer.produce(topic, f"r{i}".encode())
        producer.flush(10)
        seen: list[bytes | None] = []
        while len(seen) < 20:
            batch = consume_ready(consumer, 500, 10.0)
            assert batch, "the backlog was not delivered"
            seen += [m.value() for m in batch]
        assert seen == [f"r{i}".encode() for i in range(20)]
    finally:
        consumer.close()
        for future in admin.delete_topics([topic]).values():
            future.result(timeout=30)


def test_a_consumer_starting_mid_stream_anchors_its_sessions_together_and_reads_what_a_full_reader_does(
    make_log: MakeLog, kafka_bootstrap: str
) -> None:
    """A group member that takes partitions over meets their sessions mid-stream: the sessions of a batch are
    anchored together (``read_prefixes``: one pass over each partition), not with one read each, and the items
    are those a consumer that read from the start hands over. ``read_prefixes`` equals ``read`` per session
    and leaves out a session not committed that far."""
    from confluent_kafka import TopicPartition

    topic = f"test.anchor.{uuid.uuid4().hex[:8]}"
    log = make_log(topic=topic, partitions=2)
    events = simple_log(2, 2)
    half = len(events) // 2
    sessions = [f"a{i}-{uuid.uuid4().hex[:6]}" for i in range(12)]
    leases = {sid: log.acquire(sid) for sid in sessions}
    for sid in sessions:
        log.append(sid, 0, events[:half], lease=leases[sid])

    prefixes = log.read_prefixes(dict.fromkeys(sessions, half) | {"not-there": 3})
    assert prefixes == {sid: log.read(sid, 0, half) for sid in sessions}

    # the group's position: every partition's end now, so the member starts mid-stream of every session
    group = f"g-{uuid.uuid4().hex}"
    ends = Consumer({"bootstrap.servers": kafka_bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        marks = [ends.get_watermark_offsets(TopicPartition(topic, p), timeout=10) for p in range(2)]
        ends.commit(
            offsets=[TopicPartition(topic, p, high) for p, (_low, high) in enumerate(marks)], asynchronous=False
        )
    finally:
        ends.close()
    for sid in sessions:
        log.append(sid, half, events[half:], lease=leases[sid])

    calls = {"read": 0, "read_prefixes": 0}
    reader = make_log(topic=topic, partitions=2)
    for name in calls:
        real = getattr(reader, name)

        def counted(*args: Any, _real: Callable[..., Any] = real, _name: str = name, **kwargs: Any) -> Any:
            calls[_name] += 1
            return _real(*args, **kwargs)

        setattr(reader, name, counted)
    consumer = SessionEventConsumer(kafka_bootstrap, group, topic=topic, log=reader)
    try:
        items = _drain(consumer, want=len(sessions) * (len(events) - half))
    finally:
        consumer.close()
    assert not [i for i in items if isinstance(i, DeadLetter)]
    for sid in sessions:
        assert [i.event for i in items if isinstance(i, ConsumedEvent) and i.session_id == sid] == events[half:]
    assert calls["read"] < len(sessions) / 2, calls  # anchored in batches, not one read per session
    assert calls["read_prefixes"] >= 1
