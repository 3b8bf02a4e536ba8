"""The Kafka inbox store against the real local broker: the shared contract, as several processes would use it."""

from __future__ import annotations

import time

import pytest

from foldline.adapters.kafka import KafkaEventLog
from foldline.adapters.kafka.inbox import KafkaInboxStore
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
