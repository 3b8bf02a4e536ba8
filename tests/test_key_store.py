"""The key-store contract against the in-process store and the embedded SQLite file; the file's own promises."""

from __future__ import annotations

from pathlib import Path

import pytest

from foldline.adapters.memory_keys import MemoryKeyStore
from foldline.adapters.sealing import new_key
from foldline.adapters.sqlite_keys import KEYS_NAME, SqliteKeyStore
from foldline.errors import StoreUnavailable
from foldline.ports.key_store import KeyStore
from tests.contracts.key_store import KeyStoreContract


class TestMemoryKeyStore(KeyStoreContract):
    def make_store(self) -> KeyStore:
        return MemoryKeyStore()

    def held_bytes(self, store: KeyStore) -> bytes:
        assert isinstance(store, MemoryKeyStore)
        return b"".join(k.material or b"" for k in store._keys.values())


class TestSqliteKeyStore(KeyStoreContract):
    @pytest.fixture(autouse=True)
    def _dir(self, tmp_path: Path) -> None:
        self.dir = tmp_path

    def make_store(self) -> KeyStore:
        return SqliteKeyStore(self.dir / KEYS_NAME)

    def held_bytes(self, store: KeyStore) -> bytes:
        return b"".join(p.read_bytes() for p in self.dir.iterdir() if p.is_file())  # the file and any journal


def test_a_read_only_key_store_creates_nothing_and_refuses_writes(tmp_path: Path) -> None:
    path = tmp_path / "none" / KEYS_NAME
    store = SqliteKeyStore(path, read_only=True)
    assert store.get("s") is None
    assert store.erasures() == []
    with pytest.raises(StoreUnavailable, match="read-only"):
        store.create(new_key("s", 1))
    assert not path.parent.exists()


def test_the_key_file_is_private_to_its_owner(tmp_path: Path) -> None:
    store = SqliteKeyStore(tmp_path / KEYS_NAME)
    store.create(new_key("s", 1))
    store.close()
    assert (tmp_path / KEYS_NAME).stat().st_mode & 0o077 == 0


def test_another_sqlite_database_is_not_taken_for_a_key_store(tmp_path: Path) -> None:
    import sqlite3

    path = tmp_path / KEYS_NAME
    sqlite3.connect(path).execute("CREATE TABLE mine (x)")
    with pytest.raises(StoreUnavailable, match="not a foldline key store"):
        SqliteKeyStore(path).get("s")
