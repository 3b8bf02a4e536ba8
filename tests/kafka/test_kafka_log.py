"""The Kafka event log against the real local broker: the shared contract, fencing, failure modes."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaException, TopicPartition

from foldline.adapters.kafka import HEADER_BATCH, KafkaEventLog, partition_for
from foldline.adapters.kafka import writer as kafka_writer
from foldline.adapters.kafka.clients import (
    FENCED_CODES,
    RDKAFKA_LOG,
    SESSION_PRODUCER,
    KafkaClients,
    discard,
    flush,
    kafka_error,
)
from foldline.adapters.kafka.inbox import KafkaInboxStore
from foldline.adapters.sealing import ContentSealer
from foldline.core import Envelope, RequestHeader, TextBlock, UserMessage
from foldline.errors import ConflictError, FencedError, StoreUnavailable, ValidationError
from foldline.ports.event_log import EventLog
from foldline.ports.inbox import SealedInbox
from tests.contracts.event_log import EventLogContract
from tests.factories import HEADER, env, simple_log
from tests.kafka.conftest import MakeLog
from tests.kafka.private_broker import PrivateBroker, kafka_libs
from tests.test_sealing import _GatedKeys

pytestmark = pytest.mark.kafka


class TestKafkaEventLog(EventLogContract):
    @pytest.fixture(autouse=True)
    def _factory(self, make_log: MakeLog) -> None:
        self._make = make_log

    def make_log(self) -> EventLog:
        return self._make()


class TestFollowingKafkaEventLog(EventLogContract):
    """The same contract with the follower of committed records serving reads of the sessions it writes."""

    @pytest.fixture(autouse=True)
    def _factory(self, make_log: MakeLog) -> None:
        self._make = make_log

    def make_log(self) -> EventLog:
        return self._make(follow=True)


def _sid() -> str:
    return f"k-{uuid.uuid4().hex}"


def _committed_and_all(bootstrap: str, topic: str, part: int) -> tuple[list[bytes], list[bytes]]:
    """Batch ids of the records in one partition, as read_committed and as read_uncommitted readers see them."""
    out = []
    for isolation in ("read_committed", "read_uncommitted"):
        c = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": uuid.uuid4().hex,
                "isolation.level": isolation,
                "enable.partition.eof": True,
                "enable.auto.commit": False,
            }
        )
        c.assign([TopicPartition(topic, part, 0)])
        seen: list[bytes] = []
        deadline = time.monotonic() + 10
        eof = False
        while not eof and time.monotonic() < deadline:
            for m in c.consume(500, timeout=0.5):
                if m.error():
                    eof = True
                    continue
                headers = m.headers() or []
                items = headers.items() if isinstance(headers, dict) else headers
                seen.extend(v for k, v in items if k == HEADER_BATCH and isinstance(v, bytes))
        c.close()
        out.append(seen)
    return out[0], out[1]


def test_another_instance_reads_and_continues_a_session(make_log: MakeLog) -> None:
    sid = _sid()
    events = simple_log()
    a, b = make_log(), make_log()
    assert a.append(sid, 0, events[:4]) == 4
    assert b.read(sid) == events[:4]
    assert b.append(sid, 4, events[4:9]) == 9  # b's writer fences a's producer; a recovers on its next append
    assert a.append(sid, 9, events[9:]) == len(events)
    fresh = make_log()
    assert fresh.read(sid) == events
    assert fresh.head(sid) == len(events)
    assert sid in fresh.sessions()


def test_a_session_acquired_with_its_events_is_not_read_again_at_its_first_append(
    make_log: MakeLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The take-over's read builds the rules the next append is checked against: a new writer of a long
    session reads it once, not once to open it and once more to append."""
    sid = _sid()
    events = simple_log(turns=6)
    make_log().append(sid, 0, events[:-5])
    log = make_log()
    lease, loaded = log.acquire_and_read(sid)
    assert loaded == events[:-5]
    reads: list[tuple[int, int]] = []
    original = log._events.events

    def counting(session_id: str, state: Any, from_seq: int, to_seq: int, deadline: float) -> list[Envelope]:
        reads.append((from_seq, to_seq))
        return original(session_id, state, from_seq, to_seq, deadline)

    monkeypatch.setattr(log._events, "events", counting)
    assert log.append(sid, len(loaded), events[-5:], lease=lease) == len(events)
    assert reads == []
    with pytest.raises(ValidationError):  # the rules built from the read hold: a seq gap is refused
        log.append(sid, len(events), [Envelope(len(events) + 1, 0, events[1].data)], lease=lease)


def test_stale_expected_seq_across_instances_conflicts(make_log: MakeLog) -> None:
    sid = _sid()
    events = simple_log()
    a, b = make_log(), make_log()
    a.append(sid, 0, events[:3])
    b.append(sid, 3, events[3:5])
    with pytest.raises(ConflictError) as info:
        a.append(sid, 3, events[3:5])  # a's view is stale: b moved the head
    assert info.value.actual_seq == 5
    assert make_log().read(sid) == events[:5]


def test_stale_writer_in_another_process_is_fenced(make_log: MakeLog) -> None:
    sid = _sid()
    events = simple_log()
    a, b = make_log(), make_log()
    lease_a = a.acquire(sid)
    a.append(sid, 0, events[:2], lease=lease_a)
    lease_b = b.acquire(sid)
    assert lease_b.epoch == lease_a.epoch + 1
    with pytest.raises(FencedError) as info:
        a.append(sid, 2, events[2:4], lease=lease_a)
    assert (info.value.epoch, info.value.current_epoch) == (lease_a.epoch, lease_b.epoch)
    assert b.append(sid, 2, events[2:4], lease=lease_b) == 4  # b was fenced by a's retry and recovers
    with pytest.raises(FencedError):
        a.append(sid, 4, events[4:6], lease=lease_a)
    assert make_log().read(sid) == events[:4]


def test_paused_writer_records_are_never_visible(make_log: MakeLog, kafka_bootstrap: str) -> None:
    """A writer pauses mid-transaction (records sent, not committed); another instance acquires the session.

    The take-over fences the paused writer's producer, which aborts its transaction: read_committed
    readers never see its records although they reached the partition. The paused instance then gets
    FencedError without disturbing the new owner, and goes on writing its other sessions.
    """
    sid, other = _sid(), _sid()
    events = simple_log()
    a, b = make_log(), make_log()
    lease_a = a.acquire(sid)
    a.append(sid, 0, events[:2], lease=lease_a)
    a.append(other, 0, events[:2])
    producer = a._writer_for(partition_for(sid, a.partitions)).producer()
    assert producer is not None
    producer.begin_transaction()
    for e in events[2:4]:
        producer.produce(
            a.topic,
            value=a.codec.encode(e),
            key=sid,
            partition=partition_for(sid, a.partitions),
            headers=[("fl-kind", b"event"), ("fl-epoch", b"1"), (HEADER_BATCH, b"zombie")],
        )
    assert producer.flush(10) == 0  # the records are on the broker, inside an open transaction
    lease_b = b.acquire(sid)  # "the pause": another instance takes over meanwhile
    with pytest.raises(Exception, match="fenced"):
        producer.commit_transaction(10)
    assert b.append(sid, 2, events[2:5], lease=lease_b) == 5
    committed, everything = _committed_and_all(kafka_bootstrap, a.topic, partition_for(sid, a.partitions))
    assert b"zombie" in everything
    assert b"zombie" not in committed
    assert make_log().read(sid) == events[:5]
    b_writer = b._writer_for(partition_for(sid, b.partitions)).writer_id
    with pytest.raises(FencedError):
        a.append(sid, 5, events[5:6], lease=lease_a)
    assert a.append(other, 2, events[2:4]) == 4  # the fenced instance recovers for the sessions it still owns
    assert b.append(sid, 5, events[5:6], lease=lease_b) == 6
    assert (
        b._writer_for(partition_for(sid, b.partitions)).writer_id == b_writer
    )  # the stale writer's attempts never fenced the rightful one
    assert make_log().read(sid) == events[:6]
    assert make_log().read(other) == events[:4]


def test_broker_down_fails_fast_with_store_unavailable() -> None:
    log = KafkaEventLog("127.0.0.1:1", topic="unreachable.session-events", partitions=1, timeout_s=2.0)
    for call in (lambda: log.append("s", 0, simple_log()[:1]), lambda: log.head("s"), lambda: log.acquire("s")):
        start = time.monotonic()
        with pytest.raises(StoreUnavailable, match="did not answer"):
            call()
        assert time.monotonic() - start < 4.0
    log.close()


def test_confluent_framing_with_mock_registry(make_log: MakeLog, kafka_bootstrap: str) -> None:
    sid = _sid()
    events = simple_log(1, 1)
    log = make_log(registry_url="mock://kafka-test")
    assert log.codec.framing == "confluent"
    log.append(sid, 0, events)
    assert log.read(sid) == events
    c = Consumer(
        {"bootstrap.servers": kafka_bootstrap, "group.id": uuid.uuid4().hex, "isolation.level": "read_committed"}
    )
    part = partition_for(sid, log.partitions)
    c.assign([TopicPartition(log.topic, part, log._load_state(sid, time.monotonic() + 10).offsets[0])])
    msg = None
    while msg is None:
        msg = c.poll(5)
    c.close()
    value = msg.value()
    assert value is not None
    assert value[0] == 0  # magic byte 0 + 4-byte schema id
    assert log.codec.decode(value) == events[0]


def test_large_session_reads_only_its_own_records(make_log: MakeLog) -> None:
    """Reading fetches the session's listed offsets, not the whole partition."""
    log = make_log(partitions=4)
    target = _sid()
    part = partition_for(target, 4)
    others = [s for s in (_sid() for _ in range(200)) if partition_for(s, 4) == part][:5]
    events = simple_log(4, 2)
    log.append(target, 0, events[:3])
    for s in others:
        log.append(s, 0, simple_log(6, 3))  # noise in the same partition
    log.append(target, 3, events[3:])
    state = log._load_state(target, time.monotonic() + 10)
    assert len(state.offsets) == len(events)
    assert log.read(target) == events


@pytest.mark.slow
def test_broker_lost_mid_run_fails_appends_in_bounded_time_and_keeps_acknowledged_events(tmp_path: Path) -> None:
    """A private broker is killed after some appends: the next append fails with StoreUnavailable within
    its bound (no hang); after a restart every acknowledged event is there and the log goes on."""
    libs = kafka_libs()
    if libs is None:
        pytest.fail("the Kafka jars are missing: run deploy/local/kafka.sh install (make test does)")
    sid = _sid()
    events = simple_log()
    with PrivateBroker(tmp_path / "broker", libs) as broker:
        broker.start()
        log = KafkaEventLog(broker.bootstrap, topic="lost.session-events", partitions=2, timeout_s=3.0)
        try:
            assert log.append(sid, 0, events[:4]) == 4
            broker.stop()
            start = time.monotonic()
            with pytest.raises(StoreUnavailable):
                log.append(sid, 4, events[4:6])
            assert time.monotonic() - start < 2 * (3.0 + 5.0) + 2  # the documented bound: never a hang
        finally:
            log.close()
        broker.start()
        fresh = KafkaEventLog(broker.bootstrap, topic="lost.session-events", partitions=2, timeout_s=20.0)
        try:
            assert fresh.read(sid) == events[:4]  # the acknowledged batch survived; the failed one is absent
            assert fresh.append(sid, 4, events[4:]) == len(events)
            assert fresh.read(sid) == events
        finally:
            fresh.close()


def test_index_entries_stay_bounded_as_a_session_grows(make_log: MakeLog) -> None:
    """Offsets beyond a tail of runs are sealed into chunk records; the session entry stays small."""
    topic = f"test.chunks.{uuid.uuid4().hex[:8]}"
    log = make_log(topic=topic, partitions=1)
    target, noise = _sid(), _sid()

    def session(n: int) -> list[Envelope]:
        return [env(0, RequestHeader(HEADER, "initial"))] + [
            env(s, UserMessage(f"u{s}", (TextBlock(f"message {s}"),))) for s in range(1, n)
        ]

    events, others = session(80), session(80)
    for s, e in enumerate(events):  # one event per append, interleaved: every append is its own run
        log.append(target, s, [e])
        log.append(noise, s, [others[s]])
    entries = _index_entries(log, target)
    assert entries, "no index entry for the session"
    last = entries[-1]
    assert last["chunks"] >= 2
    assert last["sealed"] >= 64
    assert max(len(e["offsets"]) for e in entries) <= 33  # a tail never grows past one chunk
    assert make_log(topic=topic, partitions=1).read(target) == events


def _index_entries(log: KafkaEventLog, session_id: str) -> list[dict[str, Any]]:
    c = Consumer(
        {
            "bootstrap.servers": log.bootstrap,
            "group.id": uuid.uuid4().hex,
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
        }
    )
    c.assign([TopicPartition(log.index_topic, partition_for(session_id, log.partitions), 0)])
    out: list[dict[str, Any]] = []
    deadline = time.monotonic() + 10
    done = False
    while not done and time.monotonic() < deadline:
        for m in c.consume(500, timeout=0.5):
            if m.error():
                done = True
            elif m.key() == session_id.encode() and m.value():
                out.append(json.loads(m.value() or b""))
    c.close()
    return out


def test_two_instances_racing_on_one_session_never_lose_or_duplicate(make_log: MakeLog) -> None:
    """Lease-less appends from two instances at once: each append either lands whole or conflicts."""
    sid = _sid()
    a, b = make_log(), make_log()
    a.append(sid, 0, [env(0, RequestHeader(HEADER, "initial"))])
    landed: dict[int, Envelope] = {}
    lock = threading.Lock()

    def writer(log: KafkaEventLog, name: str) -> None:
        wins = 0
        while wins < 4:
            head = log.head(sid)
            e = env(head, UserMessage(f"{name}{head}", (TextBlock(f"{name} at {head}"),)))
            try:
                assert log.append(sid, head, [e]) == head + 1
            except ConflictError:
                continue
            with lock:
                assert head not in landed
                landed[head] = e
            wins += 1

    threads = [threading.Thread(target=writer, args=(log, name)) for log, name in ((a, "a"), (b, "b"))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert sorted(landed) == list(range(1, 9))
    assert make_log().read(sid)[1:] == [landed[s] for s in range(1, 9)]


def test_handing_a_session_back_and_forth_fences_only_that_session(make_log: MakeLog) -> None:
    """After the first take-over a handed-over session runs on its own producer: later hand-overs
    fence that producer alone, not the group writer the instance's other sessions share."""
    s, t = _sid(), _sid()
    events = simple_log()
    a, b = make_log(), make_log()
    lease = a.acquire(s)
    a.append(s, 0, events[:2], lease=lease)
    a.append(t, 0, events[:2])
    assert b.append(s, 2, events[2:3], lease=lease) == 3  # fences a's group writer once
    assert a.append(t, 2, events[2:3]) == 3  # a continues t on a new group writer
    group_writer = a._writer_for(partition_for(t, a.partitions)).writer_id
    for head in range(3, 9):
        log = a if head % 2 else b
        assert log.append(s, head, events[head : head + 1], lease=lease) == head + 1
    assert a.append(t, 3, events[3:4]) == 4
    assert a._writer_for(partition_for(t, a.partitions)).writer_id == group_writer
    fresh = make_log()
    assert fresh.read(s) == events[:9]
    assert fresh.read(t) == events[:4]


def test_a_take_over_fences_both_producers_of_the_group_writer(make_log: MakeLog) -> None:
    """A group writer commits through two producers that take turns; the index entry names its writer id,
    and a take-over by another instance fences both, so neither can commit anything afterwards — not even
    the one whose transaction did not write the entry."""
    s = _sid()
    events = simple_log()
    a, b = make_log(), make_log()
    lease = a.acquire(s)
    for head in range(0, 4):  # appends alternate between the two producers
        assert a.append(s, head, events[head : head + 1], lease=lease) == head + 1
    writer = a._writer_for(partition_for(s, a.partitions))
    first, second = writer._producer, writer._alternate
    assert first is not None
    assert second is not None
    assert kafka_writer.producer_ids(writer.writer_id or "") == (writer.writer_id, f"{writer.writer_id}/alt")
    assert b.append(s, 4, events[4:5], lease=lease) == 5  # b takes the session over

    def stale_commit(producer: Any) -> None:
        producer.begin_transaction()
        producer.produce(a.topic, value=b"stale", key=s, partition=partition_for(s, a.partitions))
        producer.commit_transaction(10)

    for producer in (first, second):
        with pytest.raises(KafkaException):  # fenced: the transaction fails, nothing of it is visible
            stale_commit(producer)
    assert a.append(s, 5, events[5:6], lease=lease) == 6  # a takes it back (on the session's own producer)
    assert make_log().read(s) == events[:6]


def test_refused_batches_in_a_busy_group_send_nothing_and_spare_the_others(make_log: MakeLog) -> None:
    """The group writer encodes and checks every queued append; one it refuses (a seq gap, an event over
    the size limit) fails alone with its typed error, while the appends committed beside it land whole."""
    log = make_log()
    events = simple_log(turns=3)
    good = [_sid() for _ in range(12)]
    gap, huge = _sid(), _sid()
    start = threading.Barrier(len(good) + 2)
    errors: dict[str, ValidationError] = {}

    def valid(sid: str) -> None:
        start.wait()
        head = 0
        while head < len(events):
            head = log.append(sid, head, events[head : head + 3])

    def refused(sid: str, batch: list[Envelope]) -> None:
        start.wait()
        try:
            log.append(sid, 0, batch)
        except ValidationError as exc:
            errors[sid] = exc

    big = Envelope(1, 2, UserMessage("u", (TextBlock("x" * (9 * 1024 * 1024)),)))
    threads = [threading.Thread(target=valid, args=(sid,)) for sid in good]
    threads.append(threading.Thread(target=refused, args=(gap, [events[0], events[2]])))
    threads.append(threading.Thread(target=refused, args=(huge, [events[0], big])))
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert {sid: e.rule for sid, e in errors.items()} == {gap: "seq-gapless", huge: "event-size"}
    # nothing of a refused batch was written, and its session's rules did not count it
    assert log.head(gap) == 0
    assert log.head(huge) == 0
    assert log.append(gap, 0, events[:4]) == 4
    assert log.append(huge, 0, events[:1]) == 1
    fresh = make_log()
    for sid in good:
        assert fresh.read(sid) == events
    assert fresh.read(gap) == events[:4]
    assert fresh.read(huge) == events[:1]


def test_a_fault_in_the_group_writer_fails_its_appends_fast_and_the_next_ones_go_through(
    make_log: MakeLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bug inside the writer thread must not leave appends hanging or lose what was acknowledged."""
    log = make_log()
    events = simple_log()
    sid = _sid()
    assert log.append(sid, 0, events[:3]) == 3
    original = kafka_writer.GroupWriter._start
    faults = [RuntimeError("injected writer fault")]

    def faulty(self: kafka_writer.GroupWriter, batch: list[kafka_writer.AppendRequest]) -> Any:
        if faults:
            raise faults.pop()
        return original(self, batch)

    monkeypatch.setattr(kafka_writer.GroupWriter, "_start", faulty)
    began = time.monotonic()
    with pytest.raises(StoreUnavailable, match="injected writer fault"):
        log.append(sid, 3, events[3:6])
    assert time.monotonic() - began < log.timeout_s  # failed at once, not after the stuck-client timeout
    assert log.head(sid) == 3  # the failed batch was never sent
    assert log.append(sid, 3, events[3:6]) == 6  # the writer goes on (with a fresh producer)
    assert make_log().read(sid) == events[:6]


def test_new_sessions_are_created_in_a_few_transactions_not_one_take_over_each(make_log: MakeLog) -> None:
    log = make_log()
    sids = [_sid() for _ in range(120)]
    with ThreadPoolExecutor(32) as pool:
        leases = list(pool.map(log.acquire, sids))
    assert {lease.epoch for lease in leases} == {1}
    assert log._creator.transactions <= 60  # batched per partition, not one per session (4 partitions here)
    events = simple_log()[:2]
    with ThreadPoolExecutor(32) as pool:
        heads = list(pool.map(lambda sid, lease: log.append(sid, 0, events, lease=lease), sids, leases))
    assert heads == [2] * len(sids)
    other = make_log()
    assert all(other.read(sid) == events for sid in sids[:10])


def test_sessions_opened_from_asyncio_wait_on_no_thread_and_share_a_few_transactions(
    make_log: MakeLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``acquire_and_read_async`` of new sessions queues each creation and awaits it: no worker thread per
    session (so no cap on how many wait at once), and a partition's creations queued while one of its
    transactions commits all go in its next one."""
    log = make_log()
    asyncio.run(log.acquire_and_read_async(_sid()))  # the log and its writer are started
    blocking: list[object] = []

    async def no_thread(call: object, *args: object, **kwargs: object) -> Any:
        blocking.append(call)
        raise AssertionError("a new session went to a worker thread")

    monkeypatch.setattr(log, "_blocking", no_thread)
    before = log._creator.transactions
    sids = [_sid() for _ in range(400)]

    async def open_all() -> list[tuple[Any, list[Envelope]]]:
        return await asyncio.gather(*(log.acquire_and_read_async(sid) for sid in sids))

    opened = asyncio.run(open_all())
    assert blocking == []
    assert all(lease.epoch == 1 and events == [] for lease, events in opened)
    # 4 partitions: each commits what was queued when its drain began, then the rest (a few batches), where
    # a thread per session (at most 256 waiting) would need at least two batches of each partition's ~100
    assert log._creator.transactions - before <= 4 * 4
    monkeypatch.undo()
    events = simple_log()[:2]

    async def append_all() -> list[int]:
        return await asyncio.gather(
            *(log.append_async(sid, 0, events, lease=lease) for sid, (lease, _) in zip(sids, opened, strict=True))
        )

    assert asyncio.run(append_all()) == [2] * len(sids)
    other = make_log()
    assert all(other.read(sid) == events for sid in sids[:10])


def test_a_new_sessions_first_append_awaits_its_key_being_made_without_a_worker_thread(
    make_log: MakeLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Sealed sessions: a new session's key is made ahead (``ContentSealer.make_ahead``, as a loop does when it opens
    one); its first append awaits that making and joins the group transaction — no worker thread held while
    the key store answers, then through the commit."""
    keys = _GatedKeys()
    sealer = ContentSealer(keys)
    log = make_log(sealer=sealer)
    asyncio.run(log.acquire_and_read_async(_sid()))  # the log and its writer are started
    sids = [_sid() for _ in range(40)]

    async def open_all() -> list[tuple[Any, list[Envelope]]]:
        return await asyncio.gather(*(log.acquire_and_read_async(sid) for sid in sids))

    opened = asyncio.run(open_all())
    keys.gate.clear()  # the key store answers only once the appends wait
    for sid in sids:
        sealer.make_ahead(sid)
    blocking: list[object] = []

    async def no_thread(call: object, *args: object, **kwargs: object) -> Any:
        blocking.append(call)
        raise AssertionError("a new session's first append went to a worker thread")

    monkeypatch.setattr(log, "_blocking", no_thread)
    events = simple_log()[:2]

    async def append_all() -> list[int]:
        appends = asyncio.gather(
            *(log.append_async(sid, 0, events, lease=lease) for sid, (lease, _) in zip(sids, opened, strict=True))
        )
        await asyncio.sleep(0.2)
        assert all(sealer.making(sid) is not None for sid in sids)  # each append is waiting for its key
        keys.gate.set()
        return await appends

    assert asyncio.run(append_all()) == [2] * len(sids)
    assert blocking == []
    assert keys.calls == ["create"] * len(sids)  # one key each, made ahead; no append asked the store again
    monkeypatch.undo()
    reader = make_log(sealer=ContentSealer(keys))
    assert all(reader.read(sid) == events for sid in sids[:5])
    assert any(e.sealed is not None for e in reader.read_stored(sids[0]))  # stored sealed


def test_a_warmed_log_has_started_what_its_first_sessions_would_wait_for(
    make_log: MakeLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``warm`` starts the group writers, every partition's session creator and reads every inbox partition:
    afterwards a new session is created by a started producer, and a claim is answered without the broker. A
    session another instance created before is still found (the creator catches the index up at its first
    creation, as after any start)."""
    other = make_log()
    existing = _sid()
    other.append(existing, 0, simple_log()[:2], lease=other.acquire(existing))
    log = make_log()
    log.warm()
    assert log._writers
    assert all(w.ready_id() is not None for w in log._writers)
    assert all(log._creator._parts[p].producer is not None for p in range(log.partitions))
    sealed = log.inbox()
    assert isinstance(sealed, SealedInbox)
    store = sealed.inner
    assert isinstance(store, KafkaInboxStore)

    def no_broker(*args: object, **kwargs: object) -> int:
        raise AssertionError("a claim asked the broker after warm")

    monkeypatch.setattr(store._marks, "high", no_broker)
    assert log.inbox().entries(_sid()) == []  # from memory: every partition was read
    monkeypatch.undo()
    before = log._creator.transactions
    lease, events = asyncio.run(log.acquire_and_read_async(_sid()))
    assert (lease.epoch, events, log._creator.transactions) == (1, [], before + 1)
    taken, found = asyncio.run(log.acquire_and_read_async(existing))  # created elsewhere: taken over, not made
    assert found == simple_log()[:2]
    assert taken.epoch == 2


def test_a_session_opened_from_asyncio_that_another_instance_created_is_taken_over(make_log: MakeLog) -> None:
    """The asyncio path creates only sessions that do not exist: one created elsewhere meanwhile is answered
    as such by the creator, and taken over the usual way (epoch 2); its first writer is fenced."""
    a, b = make_log(), make_log()
    sid = _sid()
    first = a.acquire(sid)
    lease, events = asyncio.run(b.acquire_and_read_async(sid))
    assert (first.epoch, lease.epoch, events) == (1, 2, [])
    with pytest.raises(FencedError):
        a.append(sid, 0, simple_log()[:1], lease=first)
    assert b.append(sid, 0, simple_log()[:1], lease=lease) == 1


def test_an_open_cancelled_while_its_creation_waits_leaves_creation_working(make_log: MakeLog) -> None:
    """A caller that gives up on an open (its task cancelled while the creation waits for its transaction)
    neither stops the partition's creations nor leaves its session half made: the next acquire of it takes
    it over (or creates it), once."""
    log = make_log()
    asyncio.run(log.acquire_and_read_async(_sid()))  # the log and its writer are started
    gone = _sid()
    others = [_sid() for _ in range(40)]

    async def go() -> list[tuple[Any, list[Envelope]]]:
        task = asyncio.create_task(log.acquire_and_read_async(gone))
        await asyncio.sleep(0)  # its creation is queued
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return await asyncio.wait_for(asyncio.gather(*(log.acquire_and_read_async(o) for o in others)), 60)

    opened = asyncio.run(go())
    assert [lease.epoch for lease, _ in opened] == [1] * len(others)
    lease = log.acquire(gone)
    assert lease.epoch in (1, 2)  # created by the abandoned call (then taken over) or by this one
    assert log.append(gone, 0, simple_log()[:1], lease=lease) == 1
    assert make_log().read(gone) == simple_log()[:1]


def test_creations_still_queued_when_the_log_closes_fail_with_store_unavailable(make_log: MakeLog) -> None:
    """A submitted creation no transaction took yet is answered, not left waiting, when the log closes."""
    log = make_log()

    class Idle(ThreadPoolExecutor):
        def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> Any:
            return None  # the drain never runs

    future = log._creator.submit(_sid(), 0, "writer", 1, time.monotonic() + 10, Idle(1))
    assert not future.done()
    log.close()
    with pytest.raises(StoreUnavailable, match="the log was closed"):
        future.result(timeout=1)


def test_two_instances_creating_one_new_session_at_once_get_one_owner_each_in_turn(make_log: MakeLog) -> None:
    """Creation is fenced per partition: whichever creates first owns epoch 1; the other takes it over."""
    for _ in range(5):
        sid = _sid()
        a, b = make_log(), make_log()
        with ThreadPoolExecutor(2) as pool:
            first, second = pool.map(KafkaEventLog.acquire, (a, b), (sid, sid))
        assert sorted((first.epoch, second.epoch)) == [1, 2]
        stale, fresh = (a, first), (b, second)
        if first.epoch > second.epoch:
            stale, fresh = (b, second), (a, first)
        with pytest.raises(FencedError):
            stale[0].append(sid, 0, simple_log()[:1], lease=stale[1])
        assert fresh[0].append(sid, 0, simple_log()[:1], lease=fresh[1]) == 1


def test_a_creator_fenced_by_another_instance_reads_the_index_again_before_creating(make_log: MakeLog) -> None:
    """After its first batch a partition's creator checks new sessions against the index view it has; another
    instance creating in the same partition fences it, so its next batch starts over and reads the index."""
    a, b = make_log(), make_log()
    warm = _sid()
    part = partition_for(warm, a.partitions)
    taken = next(sid for sid in (_sid() for _ in range(1000)) if partition_for(sid, a.partitions) == part)
    assert a.acquire(warm).epoch == 1  # a's creator of the partition is initialised and caught up
    assert b.acquire(taken).epoch == 1  # b creates a session there: its init fences a's creator
    lease = a.acquire(taken)  # not in a's view: a's creator is fenced, starts over and finds it exists
    assert lease.epoch == 2  # a take-over, never a second creation of the same session
    assert a.append(taken, 0, simple_log()[:1], lease=lease) == 1


def test_the_follower_serves_reads_of_what_this_instance_appended(
    make_log: MakeLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = make_log(follow=True)
    sid = _sid()
    lease, _ = log.acquire_and_read(sid)
    events = simple_log()
    fetched: list[int] = []
    original = log._reader.events

    def counting(*args: Any, **kwargs: Any) -> Any:
        fetched.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(log._reader, "events", counting)
    head = 0
    for i in range(0, len(events), 3):
        head = log.append(sid, head, events[i : i + 3], lease=lease)
        assert log.read(sid, i, head) == events[i:head]
    assert fetched == []  # every read came from the follower
    assert make_log().read(sid) == events  # and another instance reads the same from the broker


def test_a_fenced_producer_logs_its_fence_as_info_and_other_fatal_errors_as_they_are(
    make_log: MakeLog, kafka_bootstrap: str, kafka_topic: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A take-over fences the previous producer, which librdkafka reports as fatal: that is expected, so
    those lines are INFO; a fatal error of another kind keeps librdkafka's level."""
    make_log().check_topics()  # the topic the fenced producer writes to
    clients = KafkaClients(kafka_bootstrap, timeout_s=10.0)
    writer_id = f"{kafka_topic}/fence-log/{uuid.uuid4().hex}"
    fenced = clients.transactional_producer(writer_id, SESSION_PRODUCER)
    caplog.set_level(logging.DEBUG, logger="foldline.kafka")
    try:
        fenced.init_transactions(10)
        fenced.begin_transaction()
        fenced.produce(kafka_topic, value=b"x", key=b"fence-log", partition=0)
        assert flush(fenced, 10) == 0
        clients.fence(writer_id, clients.deadline())
        with pytest.raises(KafkaException) as raised:
            fenced.commit_transaction(10)
        err = kafka_error(raised.value)
        assert err is not None
        assert err.code() in FENCED_CODES
    finally:
        discard(fenced, "the fenced producer")
    fence_lines = [r for r in caplog.records if "rdkafka#" in r.getMessage() and "fenced by a newer" in r.getMessage()]
    assert fence_lines, "librdkafka logged nothing about the fence"
    assert all(r.levelno == logging.INFO for r in fence_lines)
    caplog.clear()
    RDKAFKA_LOG.log(
        logging.CRITICAL, "FATAL [%s]: Fatal error: %s", "rdkafka#producer-1", "Broker: Cluster authorization failed"
    )
    assert [r.levelno for r in caplog.records] == [logging.CRITICAL]


def test_an_async_append_whose_outcome_never_arrives_is_reported_unknown_and_the_log_recovers(
    make_log: MakeLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An awaited append bounds its wait for the transaction's outcome: none in time is a stuck writer,
    reported as an unknown outcome; the writer is replaced and the next append goes through."""

    from foldline.adapters.kafka import log as kafka_log

    sid = _sid()
    events = simple_log()
    log = make_log()
    assert log.append(sid, 0, events[:2]) == 2  # owned, with its rules: the next append takes the awaited path
    monkeypatch.setattr(kafka_log, "_append_wait_s", lambda timeout_s: 0.2)
    monkeypatch.setattr(kafka_writer.GroupWriter, "send", lambda self, request: None)  # never settles
    began = time.monotonic()
    with pytest.raises(StoreUnavailable, match="outcome is unknown"):
        asyncio.run(log.append_async(sid, 2, events[2:4]))
    assert time.monotonic() - began < 5.0
    monkeypatch.undo()
    assert asyncio.run(log.append_async(sid, 2, events[2:4])) == 4
    assert make_log().read(sid) == events[:4]


def test_a_partition_the_client_does_not_know_is_asked_again_until_the_deadline_then_named(
    make_log: MakeLog, kafka_bootstrap: str, kafka_topic: str
) -> None:
    """While a broker restarts, librdkafka answers a watermark query with ``_UNKNOWN_PARTITION`` (it has no fresh
    metadata for the partition): that is asked again, not failed at once — the chaos run that stops Kafka for ten
    seconds depends on it. A partition that stays unknown fails at the deadline with the code named."""
    from foldline.adapters.kafka.reader import Watermarks

    make_log().check_topics()
    marks = Watermarks(KafkaClients(kafka_bootstrap, timeout_s=10.0))
    try:
        assert marks.high(kafka_topic, 0) >= 0  # a partition that exists answers at once
        began = time.monotonic()
        with pytest.raises(StoreUnavailable, match="_UNKNOWN_PARTITION"):
            marks.high(kafka_topic, 999, deadline=time.monotonic() + 1.5)
        assert time.monotonic() - began >= 1.0, "an unknown partition was not asked again until the deadline"
    finally:
        marks.close()
