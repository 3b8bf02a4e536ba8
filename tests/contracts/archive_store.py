"""The ArchiveStore contract: every archive store (directory, S3) runs exactly this suite.

Then, on the same store, the archive built on it: segments appended by intent/segment/commit, read back
digest-checked, and every way an append can be interrupted completed by the next one without an orphan.
"""

from __future__ import annotations

import abc
import hashlib
import threading
from collections.abc import Iterator

import pytest

from foldline.adapters.archive import ArchiveAppender, SegmentEncoder, SessionArchive, audit_archive, build_segment
from foldline.adapters.archive.layout import encode_manifest, manifest_key, segment_key, segment_name
from foldline.core.events import Envelope
from foldline.errors import ArchiveConflict, ArchiveCorrupt, ArchiveObjectMissing
from foldline.ports.archive import ArchiveStore, Manifest, SegmentRef
from tests.factories import simple_log


class ArchiveStoreContract(abc.ABC):
    @abc.abstractmethod
    def make_store(self) -> ArchiveStore:
        """An empty store for this test (or one isolated by a unique prefix)."""

    @abc.abstractmethod
    def tamper(self, store: ArchiveStore, key: str, data: bytes) -> None:
        """Overwrite an object behind the store's back."""

    @pytest.fixture
    def store(self) -> Iterator[ArchiveStore]:
        store = self.make_store()
        try:
            yield store
        finally:
            store.close()

    # -------------------------------------------------------------- the port

    def test_create_is_create_only(self, store: ArchiveStore) -> None:
        assert store.read("a/b") is None
        assert store.create("a/b", b"first") is True
        assert store.create("a/b", b"second") is False
        stored = store.read("a/b")
        assert stored is not None
        assert stored.data == b"first"

    def test_fetch_reads_an_objects_bytes_or_none(self, store: ArchiveStore) -> None:
        """``fetch`` (an immutable object whose digest the caller checks) gives what ``read`` gives, bytes only."""
        assert store.fetch("f/g") is None
        assert store.create("f/g", b"\x00segment bytes\xff")
        assert store.fetch("f/g") == b"\x00segment bytes\xff"
        stored = store.read("f/g")
        assert stored is not None
        assert store.fetch("f/g") == stored.data

    def test_concurrent_creates_have_one_winner(self, store: ArchiveStore) -> None:
        wins: list[int] = []
        barrier = threading.Barrier(8)

        def create(i: int) -> None:
            barrier.wait()
            if store.create("race", f"writer {i}".encode()):
                wins.append(i)

        threads = [threading.Thread(target=create, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(wins) == 1
        stored = store.read("race")
        assert stored is not None
        assert stored.data == f"writer {wins[0]}".encode()

    def test_replace_is_compare_and_set(self, store: ArchiveStore) -> None:
        first = store.replace("m", b"v1", None)
        with pytest.raises(ArchiveConflict):
            store.replace("m", b"again", None)  # must not exist
        second = store.replace("m", b"v2", first)
        assert second != first
        with pytest.raises(ArchiveConflict) as info:
            store.replace("m", b"stale", first)
        assert store.where("m") in str(info.value)
        stored = store.read("m")
        assert stored is not None
        assert (stored.data, stored.version) == (b"v2", second)
        with pytest.raises(ArchiveConflict):
            store.replace("absent", b"x", second)

    def test_concurrent_replaces_of_one_version_have_one_winner(self, store: ArchiveStore) -> None:
        version = store.replace("m", b"base", None)
        wins: list[int] = []
        barrier = threading.Barrier(8)

        def replace(i: int) -> None:
            barrier.wait()
            try:
                store.replace("m", f"w{i}".encode(), version)
                wins.append(i)
            except ArchiveConflict:
                pass

        threads = [threading.Thread(target=replace, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(wins) == 1
        stored = store.read("m")
        assert stored is not None
        assert stored.data == f"w{wins[0]}".encode()

    def test_keys_list_in_order_under_a_prefix(self, store: ArchiveStore) -> None:
        for key in ("p/b", "p/a/x", "q/z", "p/c"):
            store.create(key, key.encode())
        assert list(store.keys("p/")) == ["p/a/x", "p/b", "p/c"]
        assert list(store.keys("p/", start_after="p/b")) == ["p/c"]
        assert list(store.keys("nothing/")) == []
        store.delete("p/b")
        store.delete("p/never")
        assert list(store.keys("p/")) == ["p/a/x", "p/c"]

    # -------------------------------------------------------------- the archive on it

    @staticmethod
    def _source(session_id: str, events: list[Envelope]) -> tuple[SegmentEncoder, list[bytes]]:
        encoder = SegmentEncoder()
        return encoder, [encoder.body(e) for e in events]

    def test_segments_append_and_read_back(self, store: ArchiveStore) -> None:
        sid = "session/with:odd chars"
        events = simple_log(turns=4)
        encoder, bodies = self._source(sid, events)
        archive = SessionArchive(store)
        appender = ArchiveAppender(archive)

        def segment_for(a: int, b: int) -> bytes:
            return build_segment(sid, a, bodies[a:b], encoder.fingerprint)

        assert appender.append(sid, 7, segment_for).next_seq == 7
        assert appender.append(sid, 7, segment_for).next_seq == 7  # nothing new
        manifest = appender.append(sid, len(events), segment_for)
        assert [(s.first, s.end) for s in manifest.segments] == [(0, 7), (7, len(events))]
        fresh = SessionArchive(store)
        assert fresh.read(sid, 0, len(events)) == events
        assert fresh.read(sid, 5, 9) == events[5:9]
        assert fresh.sessions() == [sid]
        assert audit_archive(store, verify=True).clean

    def test_a_missing_or_corrupt_segment_is_a_typed_error_naming_it(self, store: ArchiveStore) -> None:
        sid = "s-broken"
        events = simple_log()
        encoder, bodies = self._source(sid, events)
        appender = ArchiveAppender(SessionArchive(store))
        manifest = appender.append(sid, 4, lambda a, b: build_segment(sid, a, bodies[a:b], encoder.fingerprint))
        appender.append(sid, len(events), lambda a, b: build_segment(sid, a, bodies[a:b], encoder.fingerprint))
        key = segment_key(sid, manifest.segments[0])
        good = store.read(key)
        assert good is not None
        self.tamper(store, key, good.data[:-5] + b"xxxxx")
        with pytest.raises(ArchiveCorrupt) as corrupt:
            SessionArchive(store).read(sid, 0, len(events))
        assert store.where(key) in str(corrupt.value)
        assert corrupt.value.object == store.where(key)
        store.delete(key)
        with pytest.raises(ArchiveObjectMissing) as missing:
            SessionArchive(store).read(sid, 0, 2)
        assert missing.value.object == store.where(key)
        # another session's segment at the right key, with the right digest in the manifest: still refused
        other = build_segment("someone-else", 0, bodies[:4], encoder.fingerprint)
        store.create(key, other)
        m = Manifest(sid, (SegmentRef(manifest.segments[0].key, 0, 4, hashlib.sha256(other).hexdigest(), len(other)),))
        stored = store.read(manifest_key(sid))
        assert stored is not None
        store.replace(manifest_key(sid), encode_manifest(m), stored.version)
        with pytest.raises(ArchiveCorrupt, match="names session 'someone-else'"):
            SessionArchive(store).read(sid, 0, 4)

    @pytest.mark.parametrize("stop_after", ["intent", "segment"])
    def test_an_interrupted_append_is_completed_by_the_next_one(self, store: ArchiveStore, stop_after: str) -> None:
        """A crash after the intent (or after the segment) leaves the watermark where it was; the next
        append writes (or checks) exactly the announced segment and commits it; nothing is left unnamed."""
        sid = f"s-crash-{stop_after}"
        events = simple_log(turns=3)
        encoder, bodies = self._source(sid, events)

        def segment_for(a: int, b: int) -> bytes:
            return build_segment(sid, a, bodies[a:b], encoder.fingerprint)

        ArchiveAppender(SessionArchive(store)).append(sid, 5, segment_for)
        # what an archiver killed mid-append leaves behind, written step by step
        stored = store.read(manifest_key(sid))
        assert stored is not None
        data = segment_for(5, 12)
        ref = SegmentRef(segment_name(5, 12), 5, 12, hashlib.sha256(data).hexdigest(), len(data))
        before = SessionArchive(store).manifest(sid)
        assert before is not None
        store.replace(manifest_key(sid), encode_manifest(Manifest(sid, before.segments, ref)), stored.version)
        if stop_after == "segment":
            store.create(segment_key(sid, ref), data)
        reader = SessionArchive(store)
        assert reader.watermark(sid) == 5  # the pending segment is not part of the archive yet
        assert reader.read(sid, 0, 5) == events[:5]
        report = audit_archive(store)
        assert report.orphans == []
        assert len(report.pending) == 1
        # the next append (another archiver, which reached seq 20 meanwhile) completes it first
        manifest = ArchiveAppender(SessionArchive(store)).append(sid, 20, segment_for)
        assert [(s.first, s.end) for s in manifest.segments] == [(0, 5), (5, 12), (12, 20)]
        assert manifest.pending is None
        assert SessionArchive(store).read(sid, 0, 20) == events[:20]
        report = audit_archive(store, verify=True)
        assert report.clean
        assert report.pending == []
        assert report.segments == 3

    def test_concurrent_appenders_never_overlap_or_orphan(self, store: ArchiveStore) -> None:
        sid = "s-contended"
        events = simple_log(turns=6)
        encoder, bodies = self._source(sid, events)
        barrier = threading.Barrier(4)
        errors: list[BaseException] = []

        def run(k: int) -> None:
            appender = ArchiveAppender(SessionArchive(store))
            barrier.wait()
            try:
                for end in range(3 + k, len(events) + 1, 4):
                    appender.append(sid, end, lambda a, b: build_segment(sid, a, bodies[a:b], encoder.fingerprint))
            except BaseException as exc:  # pragma: no cover - reported below
                errors.append(exc)

        threads = [threading.Thread(target=run, args=(k,)) for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        reader = SessionArchive(store)
        manifest = reader.manifest(sid)
        assert manifest is not None
        assert manifest.pending is None
        assert manifest.next_seq >= len(events) - 3
        assert reader.read(sid, 0, manifest.next_seq) == events[: manifest.next_seq]
        report = audit_archive(store, verify=True)
        assert report.clean, report
        assert report.segments == len(manifest.segments)

    def test_an_object_nobody_names_is_reported_as_an_orphan(self, store: ArchiveStore) -> None:
        sid = "s-orphaned"
        events = simple_log()
        encoder, bodies = self._source(sid, events)
        ArchiveAppender(SessionArchive(store)).append(
            sid, 4, lambda a, b: build_segment(sid, a, bodies[a:b], encoder.fingerprint)
        )
        stray = segment_key(sid, SegmentRef(segment_name(2, 6), 2, 6, "0" * 64, 1))
        store.create(stray, b"left by hand")
        report = audit_archive(store)
        assert report.orphans == [stray]
        assert not report.clean
