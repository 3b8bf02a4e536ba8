"""The ArchiveStore contract: every archive store (directory, S3) runs exactly this suite.

Then, on the same store, the archive built on it: segments appended by intent/segment/commit, read back
digest-checked, and every way an append can be interrupted completed by the next one without an orphan;
segments merged, their replaced objects deleted after the grace period, and a merge cut off after each of
its writes (what ``kill -9`` of the archiver leaves) still readable and completed by the next run.
"""

from __future__ import annotations

import abc
import hashlib
import threading
from collections.abc import Iterator

import pytest

from foldline.adapters.archive import (
    ArchiveAppender,
    MergePolicy,
    SegmentEncoder,
    SessionArchive,
    audit_archive,
    build_segment,
)
from foldline.adapters.archive.layout import encode_manifest, manifest_key, segment_key, segment_name
from foldline.core.events import Envelope
from foldline.errors import ArchiveConflict, ArchiveCorrupt, ArchiveObjectMissing
from foldline.ports.archive import ArchiveStore, Manifest, SegmentRef, StoredObject
from tests.factories import simple_log

T_MS = 1_700_000_000_000
GRACE_MS = 3_600_000


class Killed(BaseException):
    """What ``kill -9`` does to the code between two writes: nothing after it runs (no handler catches it)."""


class DyingStore(ArchiveStore):
    """A store whose process dies right after its ``writes``-th write (create, replace or delete) succeeded."""

    def __init__(self, store: ArchiveStore, writes: int) -> None:
        self.inner = store
        self.left = writes
        self.done: list[str] = []

    def _wrote(self, what: str) -> None:
        self.done.append(what)
        self.left -= 1
        if self.left <= 0:
            raise Killed(what)

    def create(self, key: str, data: bytes) -> bool:
        created = self.inner.create(key, data)
        self._wrote(f"create {key}")
        return created

    def replace(self, key: str, data: bytes, expected: str | None) -> str:
        version = self.inner.replace(key, data, expected)
        self._wrote(f"replace {key}")
        return version

    def delete(self, key: str) -> None:
        self.inner.delete(key)
        self._wrote(f"delete {key}")

    def read(self, key: str) -> StoredObject | None:
        return self.inner.read(key)

    def fetch(self, key: str) -> bytes | None:
        return self.inner.fetch(key)

    def keys(self, prefix: str = "", start_after: str = "") -> Iterator[str]:
        return self.inner.keys(prefix, start_after)

    def where(self, key: str) -> str:
        return self.inner.where(key)


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

    # -------------------------------------------------------------- merging

    @staticmethod
    def _archived(
        store: ArchiveStore, sid: str, cuts: list[int], turns: int = 6
    ) -> tuple[list[Envelope], SegmentEncoder, list[bytes]]:
        """A session archived as one segment per pair of ``cuts``."""
        events = simple_log(turns=turns)
        encoder = SegmentEncoder()
        bodies = [encoder.body(e) for e in events]
        appender = ArchiveAppender(SessionArchive(store))
        for end in cuts[1:]:
            appender.append(sid, end, lambda a, b: build_segment(sid, a, bodies[a:b], encoder.fingerprint))
        return events[: cuts[-1]], encoder, bodies

    @staticmethod
    def _objects(store: ArchiveStore, sid: str) -> set[str]:
        directory = manifest_key(sid).rsplit("/", 1)[0] + "/"
        return {k.removeprefix(directory) for k in store.keys(directory)}

    def test_segments_merge_into_fewer_and_the_replaced_ones_go_after_the_grace_period(
        self, store: ArchiveStore
    ) -> None:
        sid = "s-merged"
        cuts = [0, 30, 36, 41, 47, 52, 58]
        events, _, _ = self._archived(store, sid, cuts)
        old = SessionArchive(store, cache_events=0)
        assert old.read(sid, 0, 58) == events  # a reader that read the manifest before the merges
        before = old.manifest(sid)
        assert before is not None
        appender = ArchiveAppender(SessionArchive(store))
        outcome = appender.merge(sid, MergePolicy(max_segments=4), now_ms=T_MS, grace_ms=GRACE_MS)
        assert (outcome.merges, outcome.events, outcome.segments, outcome.tidy_at_ms) == (1, 58, 1, T_MS + GRACE_MS)
        manifest = SessionArchive(store).manifest(sid)
        assert manifest is not None
        # six segments of [30, 6, 5, 6, 5, 6] events: the 28 after the first reach a quarter of its 30, so all merge
        assert [(r.first, r.end) for r in manifest.segments] == [(0, 58)]
        assert manifest.merging is None
        assert [r.key for r in manifest.retired] == [r.key for r in before.segments]
        assert {r.at_ms for r in manifest.retired} == {T_MS}
        assert SessionArchive(store).read(sid, 0, 58) == events
        assert old.read(sid, 3, 50) == events[3:50]  # the old manifest's segments are still there
        report = audit_archive(store, verify=True, grace_ms=GRACE_MS, now_ms=T_MS)
        assert report.clean, report
        assert report.per_session[sid] == len(manifest.segments)
        assert len(report.retired) == len(manifest.retired)
        assert report.overdue == []
        # within the grace period nothing is deleted; after it, the replaced segments go
        assert appender.tidy(sid, now_ms=T_MS + GRACE_MS - 1, grace_ms=GRACE_MS) == (0, T_MS + GRACE_MS)
        assert audit_archive(store, grace_ms=GRACE_MS, now_ms=T_MS + GRACE_MS).overdue == report.retired
        deleted, _ = appender.tidy(sid, now_ms=T_MS + GRACE_MS, grace_ms=GRACE_MS)
        assert deleted == len(manifest.retired)
        after = SessionArchive(store).manifest(sid)
        assert after is not None
        assert after.retired == ()
        assert self._objects(store, sid) == {"manifest.json", *(r.key for r in after.segments)}
        # a reader still holding the old manifest finds its segments gone: it reads the manifest again
        assert old.read(sid, 0, 58) == events
        assert audit_archive(store, verify=True).clean

    def test_a_merge_cut_off_after_any_of_its_writes_loses_nothing_and_the_next_run_completes_it(
        self, store: ArchiveStore
    ) -> None:
        """``kill -9`` of the archiver after each write of a merge and of the tidy that follows (intent, object,
        commit, each deletion, the manifest without the deleted): the session reads whole through a fresh reader
        and through one holding the manifest from before, nothing is unnamed, and the next run finishes the job
        with the same result as a run that was never cut off."""
        cuts = [0, 20, 25, 30, 35, 40]
        policy = MergePolicy(max_segments=4)
        reference = "s-walk-reference"
        events, _, _ = self._archived(store, reference, cuts)
        straight = ArchiveAppender(SessionArchive(store))
        straight.merge(reference, policy, now_ms=T_MS, grace_ms=GRACE_MS)
        straight.tidy(reference, now_ms=T_MS + GRACE_MS, grace_ms=GRACE_MS)
        expected = SessionArchive(store).manifest(reference)
        assert expected is not None
        writes = 3 + 5 + 1  # intent, object, commit; five deletions; the manifest without them
        walked: list[str] = []
        for k in range(1, writes + 1):
            sid = f"s-walk-{k}"
            self._archived(store, sid, cuts)
            holding = SessionArchive(store, cache_events=0)
            assert holding.read(sid, 0, 40) == events
            dying = DyingStore(store, k)
            appender = ArchiveAppender(SessionArchive(dying))
            with pytest.raises(Killed):
                self._merge_then_tidy(appender, sid, policy)
            walked.append(dying.done[-1].split(" ")[0])
            assert SessionArchive(store).read(sid, 0, 40) == events, dying.done
            assert holding.read(sid, 0, 40) == events, dying.done
            report = audit_archive(store, verify=True)
            assert (report.orphans, report.missing, report.corrupt) == ([], [], []), dying.done
            # the next run (another process: nothing remembered) completes the merge, then the tidy
            after = ArchiveAppender(SessionArchive(store))
            after.merge(sid, policy, now_ms=T_MS + 1, grace_ms=GRACE_MS)
            after.tidy(sid, now_ms=T_MS + 2 * GRACE_MS, grace_ms=GRACE_MS)
            manifest = SessionArchive(store).manifest(sid)
            assert manifest is not None
            assert [(r.first, r.end) for r in manifest.segments] == [(r.first, r.end) for r in expected.segments]
            assert (manifest.pending, manifest.merging, manifest.retired) == (None, None, ())
            assert self._objects(store, sid) == {"manifest.json", *(r.key for r in manifest.segments)}
            assert SessionArchive(store).read(sid, 0, 40) == events
            assert holding.read(sid, 0, 40) == events
        assert walked == ["replace", "create", "replace", *["delete"] * 5, "replace"]

    @staticmethod
    def _merge_then_tidy(appender: ArchiveAppender, sid: str, policy: MergePolicy) -> None:
        appender.merge(sid, policy, now_ms=T_MS, grace_ms=GRACE_MS)
        appender.tidy(sid, now_ms=T_MS + GRACE_MS, grace_ms=GRACE_MS)

    def test_appends_and_merges_from_many_archivers_at_once_never_lose_overlap_or_orphan(
        self, store: ArchiveStore
    ) -> None:
        sid = "s-merge-contended"
        events = simple_log(turns=8)
        encoder = SegmentEncoder()
        bodies = [encoder.body(e) for e in events]
        barrier = threading.Barrier(4)
        errors: list[BaseException] = []
        policy = MergePolicy(max_segments=3)

        def run(k: int) -> None:
            appender = ArchiveAppender(SessionArchive(store))
            barrier.wait()
            try:
                for end in range(2 + k, len(events) + 1, 3):
                    appender.append(sid, end, lambda a, b: build_segment(sid, a, bodies[a:b], encoder.fingerprint))
                    appender.merge(sid, policy, now_ms=T_MS, grace_ms=GRACE_MS)
            except BaseException as exc:  # pragma: no cover - reported below
                errors.append(exc)

        threads = [threading.Thread(target=run, args=(k,)) for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        ArchiveAppender(SessionArchive(store)).merge(sid, policy, now_ms=T_MS, grace_ms=GRACE_MS)
        reader = SessionArchive(store)
        manifest = reader.manifest(sid)
        assert manifest is not None
        assert (manifest.pending, manifest.merging) == (None, None)
        assert len(manifest.segments) <= 3
        assert reader.read(sid, 0, manifest.next_seq) == events[: manifest.next_seq]
        report = audit_archive(store, verify=True)
        assert report.clean, report
        assert self._objects(store, sid) == {
            "manifest.json",
            *(r.key for r in manifest.segments),
            *(r.key for r in manifest.retired),
        }

    def test_a_manifest_without_merges_is_what_earlier_versions_wrote(self, store: ArchiveStore) -> None:
        """Byte for byte: readers of a version without merges read every manifest this version writes once
        its merges are committed and tidied (they take ``segments`` and ignore the rest)."""
        sid = "s-bytes"
        self._archived(store, sid, [0, 10, 20])
        stored = store.read(manifest_key(sid))
        assert stored is not None
        manifest = SessionArchive(store).manifest(sid)
        assert manifest is not None
        assert stored.data == (
            b'{"pending":null,"segments":['
            + b",".join(
                f'{{"bytes":{r.size},"end":{r.end},"first":{r.first},"key":"{r.key}","sha256":"{r.sha256}"}}'.encode()
                for r in manifest.segments
            )
            + b'],"session":"s-bytes","v":1}'
        )
