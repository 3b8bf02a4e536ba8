"""The in-memory and embedded inbox stores run the shared contract, plus what only the embedded one has."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from foldline.adapters.memory_inbox import MemoryInboxStore
from foldline.adapters.sqlite_log import SqliteEventLog
from foldline.core.inbox import InboxEntry
from foldline.errors import StoreUnavailable
from foldline.ports.inbox import InboxStore
from tests.contracts.inbox import InboxStoreContract, message, texts


class _Shared(InboxStore):
    """A second view of one memory store (close does not close it), as a second process would have."""

    def __init__(self, inner: InboxStore) -> None:
        self.inner = inner

    def put(self, session_id: str, entry: InboxEntry, *, unique: str | None = None) -> bool:
        return self.inner.put(session_id, entry, unique=unique)

    def entries(self, session_id: str) -> list[InboxEntry]:
        return self.inner.entries(session_id)

    def remove(self, session_id: str, entry_ids: Sequence[str]) -> None:
        self.inner.remove(session_id, entry_ids)

    def sessions(self) -> list[str]:
        return self.inner.sessions()


class TestMemoryInboxStore(InboxStoreContract):
    def make_store(self) -> InboxStore:
        return MemoryInboxStore()

    def peer(self, store: InboxStore) -> InboxStore:
        return _Shared(store)


class TestSqliteInboxStore(InboxStoreContract):
    @pytest.fixture(autouse=True)
    def _dir(self, tmp_path: Path) -> Iterator[None]:
        self.dir = tmp_path / "data"
        self.logs: list[SqliteEventLog] = []
        yield
        for log in self.logs:
            log.close()

    def make_store(self) -> InboxStore:
        log = SqliteEventLog(self.dir)
        self.logs.append(log)
        return _Shared(log.inbox())  # the log closes its inbox; the test's close() must not close it twice

    def peer(self, store: InboxStore) -> InboxStore:
        return self.make_store()  # another connection to the same database file


def test_the_embedded_inbox_survives_a_reopen_and_a_read_only_one_refuses_to_write(tmp_path: Path) -> None:
    log = SqliteEventLog(tmp_path)
    log.inbox().put("s", message("kept"))
    log.close()
    reader = SqliteEventLog(tmp_path, read_only=True)
    try:
        assert texts(reader.inbox().entries("s")) == ["kept"]
        with pytest.raises(StoreUnavailable, match="read-only"):
            reader.inbox().put("s", message("no"))
        with pytest.raises(StoreUnavailable, match="read-only"):
            reader.inbox().remove("s", ["x"])
    finally:
        reader.close()


def test_a_read_only_log_without_the_inbox_table_reads_empty_inboxes(tmp_path: Path) -> None:
    import sqlite3

    log = SqliteEventLog(tmp_path)
    log.close()
    db = sqlite3.connect(tmp_path / "log.sqlite3")
    db.execute("DROP TABLE inbox")  # a data directory written before the inbox existed
    db.commit()
    db.close()
    reader = SqliteEventLog(tmp_path, read_only=True)
    try:
        assert reader.inbox().entries("s") == []
        assert reader.inbox().sessions() == []
    finally:
        reader.close()
