"""The Kafka inbox store against the real local broker: the shared contract, as several processes would use it."""

from __future__ import annotations

import threading
import time

import pytest

from foldline.adapters.kafka import KafkaEventLog
from foldline.adapters.kafka.inbox import KafkaInboxStore
from foldline.adapters.kafka.partitioning import partition_for
from foldline.core.inbox import InboxEntry
from foldline.ports.inbox import InboxStore, SealedInbox
from tests.contracts.inbox import InboxStoreContract, message, texts
from tests.kafka.conftest import MakeLog

pytestmark = pytest.mark.kafka

REFRESH_S = 0.2


class TestKafkaInboxStore(InboxStoreContract):
    @pytest.fixture(autouse=True)
    def _factory(self, make_log: MakeLog) -> None:
        self._make = make_log

    def _store(self) -> KafkaInboxStore:
        log: KafkaEventLog = self._make()
        sealed = log.inbox()  # the adapter, behind the log's sealing of entries
        assert isinstance(sealed, SealedInbox)
        store = sealed.inner
        assert isinstance(store, KafkaInboxStore)
        store._refresh_s = REFRESH_S
        return store

    def make_store(self) -> InboxStore:
        return self._store()

    def peer(self, store: InboxStore) -> InboxStore:
        return self._store()  # another log instance: its own producer, consumer and view of the topic

    def _fresh_entries(self, store: InboxStore, sid: str) -> list[InboxEntry]:
        time.sleep(REFRESH_S * 1.5)  # another instance's put joins this one's view within refresh_s
        return store.entries(sid)


def test_an_entry_put_by_another_instance_joins_within_the_refresh_interval(make_log: MakeLog) -> None:
    a, b = make_log().inbox(), make_log().inbox()
    assert isinstance(a, SealedInbox)
    sid = f"inbox-refresh-{time.monotonic_ns()}"
    assert a.entries(sid) == []
    b.put(sid, message("late"))
    deadline = time.monotonic() + 5
    while not a.entries(sid):
        assert time.monotonic() < deadline, "the other instance's entry never showed"
        time.sleep(0.05)
    assert texts(a.entries(sid)) == ["late"]


def _inner(log: KafkaEventLog) -> KafkaInboxStore:
    sealed = log.inbox()
    assert isinstance(sealed, SealedInbox)
    assert isinstance(sealed.inner, KafkaInboxStore)
    return sealed.inner


def _two_partitions(prefix: str, partitions: int) -> tuple[str, str]:
    """Two session ids on different partitions of the inbox."""
    first = f"{prefix}-0"
    for i in range(1, 1000):
        other = f"{prefix}-{i}"
        if partition_for(other, partitions) != partition_for(first, partitions):
            return first, other
    raise AssertionError("no second partition")


def test_entries_answered_from_memory_do_not_wait_for_another_threads_broker_read(
    make_log: MakeLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A claim answered from memory (an event loop's fast path) must not queue behind a read of another
    partition that is waiting for the broker."""
    store = _inner(make_log())
    store._refresh_s = 60.0
    fresh, stale = _two_partitions(f"inbox-io-{time.monotonic_ns()}", store._partitions)
    store.put(fresh, message("here"))
    assert texts(store.entries(fresh)) == ["here"]  # read once: answered from memory from now on
    entered, release = threading.Event(), threading.Event()
    high = store._marks.high

    def slow_high(topic: str, part: int, deadline: float | None = None) -> int:
        if part == partition_for(stale, store._partitions):
            entered.set()
            release.wait(30)
        return high(topic, part, deadline)

    monkeypatch.setattr(store._marks, "high", slow_high)
    reader = threading.Thread(target=store.entries, args=(stale,))
    reader.start()
    try:
        assert entered.wait(30), "the stale partition's read never asked the broker"
        answered: list[list[InboxEntry]] = []
        fast = threading.Thread(target=lambda: answered.append(store.entries(fresh)))
        fast.start()
        fast.join(5)
        assert answered, "a claim answered from memory waited for a broker read"
        assert texts(answered[0]) == ["here"]
    finally:
        release.set()
        reader.join(30)


def test_an_entry_removed_while_a_read_is_under_way_does_not_come_back(
    make_log: MakeLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A read that asked for the partition's end before a removal brings the entry's record without its
    tombstone; the removal this instance made must win."""
    store = _inner(make_log())
    store._refresh_s = 60.0
    sid = f"inbox-gone-{time.monotonic_ns()}"
    entry = message("claimed")
    store.put(sid, entry)
    store._parts.clear()  # forget what was read: the next read starts from the partition's beginning
    asked, release = threading.Event(), threading.Event()
    high = store._marks.high

    def end_then_wait(topic: str, part: int, deadline: float | None = None) -> int:
        end = high(topic, part, deadline)  # the end before the removal: the put's record, not its tombstone
        asked.set()
        release.wait(30)
        return end

    monkeypatch.setattr(store._marks, "high", end_then_wait)
    reader = threading.Thread(target=store.sessions)
    reader.start()
    try:
        assert asked.wait(30)
        store.remove(sid, [entry.id])
    finally:
        release.set()
        reader.join(30)
    monkeypatch.setattr(store._marks, "high", high)
    assert store.entries(sid) == [], "an entry removed by this instance came back from a read begun before"
