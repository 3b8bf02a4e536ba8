"""The InboxStore contract: every adapter (memory, SQLite, Kafka) runs exactly this suite.

Subclass :class:`InboxStoreContract` in a ``Test*`` class and implement ``make_store`` (a fresh store) and
``peer`` (a second store over the same backing data, as another process would open it).
"""

from __future__ import annotations

import abc
import asyncio
import threading
import uuid
from collections.abc import Iterator

import pytest

from foldline.core.content import TextBlock
from foldline.core.inbox import InboxDecision, InboxEntry, InboxMessage
from foldline.ports.inbox import InboxStore


def message(text: str, entry_id: str | None = None) -> InboxEntry:
    return InboxEntry(entry_id or uuid.uuid4().hex, 1_767_225_600_000, InboxMessage((TextBlock(text),)))


def decision(call_id: str, verdict: str = "allow") -> InboxEntry:
    item = InboxDecision(call_id, "allow" if verdict == "allow" else "deny", reason="r" if verdict == "deny" else None)
    return InboxEntry(uuid.uuid4().hex, 1_767_225_600_000, item)


def texts(entries: list[InboxEntry]) -> list[str]:
    out = []
    for e in entries:
        assert isinstance(e.item, InboxMessage)
        block = e.item.content[0]
        assert isinstance(block, TextBlock)
        out.append(block.text)
    return out


class InboxStoreContract(abc.ABC):
    @abc.abstractmethod
    def make_store(self) -> InboxStore:
        """A fresh store (or one whose session ids are unique to this test)."""

    @abc.abstractmethod
    def peer(self, store: InboxStore) -> InboxStore:
        """Another store over the same data as ``store`` (another process's view); closed by the test."""

    @pytest.fixture
    def store(self) -> Iterator[InboxStore]:
        store = self.make_store()
        try:
            yield store
        finally:
            store.close()

    @pytest.fixture
    def sid(self) -> str:
        return f"inbox-{uuid.uuid4().hex[:12]}"

    def test_an_empty_inbox_lists_nothing(self, store: InboxStore, sid: str) -> None:
        assert store.entries(sid) == []
        assert sid not in store.sessions()

    def test_entries_come_back_in_put_order_each_once(self, store: InboxStore, sid: str) -> None:
        for text in ("one", "two", "three"):
            assert store.put(sid, message(text)) is True
        assert texts(store.entries(sid)) == ["one", "two", "three"]
        assert texts(store.entries(sid)) == ["one", "two", "three"]  # reading takes nothing
        assert sid in store.sessions()

    def test_an_entry_id_is_stored_once(self, store: InboxStore, sid: str) -> None:
        store.put(sid, message("first", "same-id"))
        store.put(sid, message("second", "same-id"))
        assert texts(store.entries(sid)) == ["first"]

    def test_an_entry_comes_back_equal(self, store: InboxStore, sid: str) -> None:
        entry = decision("call-1", "deny")
        store.put(sid, entry)
        assert store.entries(sid) == [entry]

    def test_another_process_sees_what_was_put(self, store: InboxStore, sid: str) -> None:
        store.put(sid, message("from here"))
        other = self.peer(store)
        try:
            assert texts(other.entries(sid)) == ["from here"]
            other.put(sid, message("from there"))
        finally:
            other.close()
        assert texts(self._fresh_entries(store, sid)) == ["from here", "from there"]

    def test_remove_drops_the_named_entries_and_ignores_unknown_ones(self, store: InboxStore, sid: str) -> None:
        a, b, c = message("a"), message("b"), message("c")
        for e in (a, b, c):
            store.put(sid, e)
        store.remove(sid, [b.id, "no-such-entry"])
        assert texts(store.entries(sid)) == ["a", "c"]
        store.remove(sid, [a.id, c.id])
        assert store.entries(sid) == []
        assert sid not in store.sessions()
        store.remove(sid, [])
        other = self.peer(store)
        try:
            assert other.entries(sid) == []
        finally:
            other.close()

    def test_purge_removes_every_entry_of_the_session_only(self, store: InboxStore, sid: str) -> None:
        a, b, kept = message("a"), message("b"), message("kept")
        store.put(sid, a)
        store.put(sid, b)
        store.put(sid + "-other", kept)
        assert store.purge(sid) == [a.id, b.id]
        assert store.entries(sid) == []
        assert store.purge(sid) == []  # again: nothing left
        assert texts(store.entries(sid + "-other")) == ["kept"]
        other = self.peer(store)
        try:
            assert self._fresh_entries(other, sid) == []
        finally:
            other.close()

    def test_sessions_do_not_share_entries(self, store: InboxStore, sid: str) -> None:
        store.put(sid, message("mine"))
        store.put(sid + "-other", message("theirs"))
        assert texts(store.entries(sid)) == ["mine"]
        assert texts(store.entries(sid + "-other")) == ["theirs"]

    def test_a_unique_key_is_held_by_one_entry(self, store: InboxStore, sid: str) -> None:
        first, second = decision("call-1"), decision("call-1", "deny")
        assert store.put(sid, first, unique="call-1") is True
        assert store.put(sid, second, unique="call-1") is False
        assert store.put(sid, decision("call-2"), unique="call-2") is True
        held = [e for e in store.entries(sid) if isinstance(e.item, InboxDecision) and e.item.call_id == "call-1"]
        assert held == [first]
        store.remove(sid, [first.id])
        assert store.put(sid, second, unique="call-1") is True  # removed: the key is free again

    def test_racing_puts_of_one_key_store_exactly_one_from_any_process(self, store: InboxStore, sid: str) -> None:
        stores = [store, self.peer(store), self.peer(store)]
        won: list[bool] = []
        lock = threading.Lock()
        go = threading.Barrier(len(stores))

        def put(s: InboxStore, n: int) -> None:
            go.wait()
            ok = s.put(sid, decision("call-x", "allow" if n % 2 else "deny"), unique="call-x")
            with lock:
                won.append(ok)

        threads = [threading.Thread(target=put, args=(s, n)) for n, s in enumerate(stores)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        try:
            assert sorted(won) == [False, False, True]
            for s in stores:
                live = [e for e in self._fresh_entries(s, sid) if isinstance(e.item, InboxDecision)]
                assert len(live) == 1, "every process must see the one decision that counts"
        finally:
            for s in stores[1:]:
                s.close()

    def test_the_awaitable_forms_answer_the_same(self, store: InboxStore, sid: str) -> None:
        async def run() -> list[str]:
            await store.put_async(sid, message("x"))
            got = await store.entries_async(sid)
            await store.remove_async(sid, [got[0].id])
            return texts(got) + texts(await store.entries_async(sid))

        assert asyncio.run(run()) == ["x"]

    def _fresh_entries(self, store: InboxStore, sid: str) -> list[InboxEntry]:
        """What ``store`` lists once it has caught up with every other process (a caching adapter refreshes)."""
        return store.entries(sid)
