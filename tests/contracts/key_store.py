"""The KeyStore contract: every adapter (memory, the embedded SQLite file, S3) runs exactly this suite."""

from __future__ import annotations

import abc
import threading
from collections.abc import Iterator

import pytest

from foldline.adapters.sealing import b64url, new_key
from foldline.ports.key_store import ErasureRecord, KeyStore, SessionKey, TrackedExport, subject_digest


class KeyStoreContract(abc.ABC):
    @abc.abstractmethod
    def make_store(self) -> KeyStore:
        """A store for this test (empty, or isolated by a unique prefix)."""

    @abc.abstractmethod
    def held_bytes(self, store: KeyStore) -> bytes:
        """Every byte the store keeps on its medium (files, objects, memory): where a destroyed key must not be."""

    def key_forms(self, store: KeyStore, key: SessionKey) -> list[bytes]:
        """The forms in which ``store`` holds ``key`` (its bytes, as written: raw, base64url, wrapped)."""
        assert key.material is not None
        return [key.material, b64url(key.material).encode()]

    @pytest.fixture
    def store(self) -> Iterator[KeyStore]:
        s = self.make_store()
        try:
            yield s
        finally:
            s.close()

    def test_a_key_is_created_once_and_read_back(self, store: KeyStore) -> None:
        key = new_key("session é 1", 5)
        assert store.get("session é 1") is None
        assert store.create(key) == key
        assert store.get("session é 1") == key
        other = new_key("session é 1", 6)
        assert store.create(other) == key  # create-only: the first key stays
        assert store.get("session é 1") == key

    def test_concurrent_first_appends_agree_on_one_key(self, store: KeyStore) -> None:
        results: list[SessionKey] = []
        barrier = threading.Barrier(8)

        def race() -> None:
            barrier.wait()
            results.append(store.create(new_key("raced", 1)))

        threads = [threading.Thread(target=race) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(results) == 8
        assert len({(k.kid, k.material) for k in results}) == 1
        assert store.get("raced") == results[0]

    def test_destroy_leaves_a_tombstone_and_no_copy_of_the_key(self, store: KeyStore) -> None:
        key = store.create(new_key("doomed", 1, subject_digest("subject-a")))
        keep = store.create(new_key("kept", 1))
        assert key.material is not None
        assert keep.material is not None
        forms, kept = self.key_forms(store, key), self.key_forms(store, keep)
        assert any(f in self.held_bytes(store) for f in forms)
        gone = store.destroy("doomed", "erasure-1", 99)
        assert gone is not None
        assert gone.erased
        assert (gone.kid, gone.erasure, gone.erased_ms, gone.subject) == (key.kid, "erasure-1", 99, key.subject)
        assert store.get("doomed") == gone
        again = store.destroy("doomed", "erasure-2", 100)  # idempotent: the first erasure stays recorded
        assert again == gone
        held = self.held_bytes(store)
        assert not any(f in held for f in forms)
        assert any(f in held for f in kept)  # nothing else was touched
        assert store.get("kept") == keep
        assert store.destroy("never-made", "erasure-3", 1) is None

    def test_a_subjects_sessions_are_listed(self, store: KeyStore) -> None:
        a, b = subject_digest("user-a@example.com"), subject_digest("user-b")
        for sid, subject in (("s2", a), ("s1", a), ("s3", b), ("s4", None)):
            store.create(new_key(sid, 1, subject))
        assert store.sessions_of_subject(a) == ["s1", "s2"]
        assert store.sessions_of_subject(b) == ["s3"]
        assert store.sessions_of_subject(subject_digest("nobody")) == []
        store.destroy("s1", "e", 2)
        assert store.sessions_of_subject(a) == ["s1", "s2"]  # an erased session still belongs to its subject

    def test_erasure_records_are_put_whole_and_listed_oldest_first(self, store: KeyStore) -> None:
        first = ErasureRecord("erasure-b", "session", "s1", ("s1",), "ops@host", "asked", 20)
        second = ErasureRecord("erasure-a", "subject", subject_digest("u"), ("s2", "s3"), "ops@host", None, 30)
        store.put_erasure(second)
        store.put_erasure(first)
        assert store.erasures() == [first, second]
        done = ErasureRecord(
            "erasure-b", "session", "s1", ("s1",), "ops@host", "asked", 20, "done", 25, ("sha256:" + "a" * 64,),
            {"keysDestroyed": 1},
        )  # fmt: skip
        store.put_erasure(done)
        assert store.erasures() == [done, second]

    def test_exports_are_noted_per_session_and_forgotten(self, store: KeyStore) -> None:
        one = TrackedExport("s1", "host-a", "/tmp/one.jsonl", "sha256:" + "1" * 64, 5)
        two = TrackedExport("s1", "host-b", "/tmp/one.jsonl", "sha256:" + "2" * 64, 6)
        store.track_export(one)
        store.track_export(two)
        store.track_export(TrackedExport("s2", "host-a", "/tmp/x", "sha256:" + "3" * 64, 7))
        assert store.exports("s1") == [one, two]
        newer = TrackedExport("s1", "host-a", "/tmp/one.jsonl", "sha256:" + "4" * 64, 8)
        store.track_export(newer)  # the same file written again: its newest export
        assert store.exports("s1") == [newer, two]
        store.forget_export(newer)
        assert store.exports("s1") == [two]
        assert store.exports("nobody") == []
