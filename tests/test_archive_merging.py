"""Long-lived sessions in the archive: merges as turns accumulate, the reader's manifest age and cache, doctor.

Real adapters throughout (SQLite log, directory archive); the archiver's clock and the reader's are values
the tests move. The protocol's steps, cut off one by one, are in the store contract
(``tests/contracts/archive_store.py``), which runs on the directory store and on S3.
"""

from __future__ import annotations

import itertools
import json
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from foldline.adapters.archive import (
    ArchiveAppender,
    MergePolicy,
    SegmentEncoder,
    SessionArchive,
    audit_archive,
    build_segment,
    merge_segments,
    read_segment,
)
from foldline.adapters.archive.layout import manifest_key
from foldline.adapters.dir_archive import DirectoryArchiveStore
from foldline.adapters.sqlite_log import DB_NAME, SqliteEventLog
from foldline.archiver.engine import ArchivePolicy, Archiver
from foldline.archiver.log_feed import LogFeed
from foldline.cli.main import app
from foldline.core.events import Envelope
from foldline.errors import ArchiveCorrupt
from foldline.metrics import ArchiverMetrics, new_registry
from foldline.ports.archive import ArchiveStore, SegmentRef, StoredObject
from tests.factories import LogBuilder, simple_log

T0 = 1_700_000_000.0


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class CountingStore(ArchiveStore):
    """Counts the GETs (``read`` and ``fetch``) and the greatest number of fetches in flight at once."""

    def __init__(self, inner: ArchiveStore, together: int = 0) -> None:
        self.inner = inner
        self.reads: list[str] = []
        self.fetches: list[str] = []
        # with ``together``, each fetch waits (at most 10 s) until that many are in flight at once
        self.barrier = threading.Barrier(together) if together else None
        self._lock = threading.Lock()
        self._flying = 0
        self.most_at_once = 0

    def create(self, key: str, data: bytes) -> bool:
        return self.inner.create(key, data)

    def replace(self, key: str, data: bytes, expected: str | None) -> str:
        return self.inner.replace(key, data, expected)

    def delete(self, key: str) -> None:
        self.inner.delete(key)

    def read(self, key: str) -> StoredObject | None:
        self.reads.append(key)
        return self.inner.read(key)

    def fetch(self, key: str) -> bytes | None:
        with self._lock:
            self.fetches.append(key)
            self._flying += 1
            self.most_at_once = max(self.most_at_once, self._flying)
        try:
            if self.barrier is not None:
                self.barrier.wait(timeout=10)  # BrokenBarrierError unless the fetches run at the same time
            return self.inner.fetch(key)
        finally:
            with self._lock:
                self._flying -= 1

    def keys(self, prefix: str = "", start_after: str = "") -> Iterator[str]:
        return self.inner.keys(prefix, start_after)

    def where(self, key: str) -> str:
        return self.inner.where(key)

    @property
    def gets(self) -> int:
        return len(self.reads) + len(self.fetches)


def _turns(count: int) -> list[list[Envelope]]:
    """``count`` turns of a session, each ending with ``turn/end``, as the batches a loop appends."""
    log = LogBuilder().header()
    batches: list[list[Envelope]] = []
    start = 0  # the header goes with the first turn
    for t in range(count):
        log.turn(t, f"question {t}", steps=2)
        batches.append(log.events[start:])
        start = len(log.events)
    return batches


def _archive(root: Path, segments: list[tuple[int, int]], sid: str = "s") -> tuple[list[Envelope], ArchiveStore]:
    events = simple_log(turns=8)
    encoder = SegmentEncoder()
    bodies = [encoder.body(e) for e in events]
    store = DirectoryArchiveStore(root)
    appender = ArchiveAppender(SessionArchive(store))
    for _, end in segments:
        appender.append(sid, end, lambda a, b: build_segment(sid, a, bodies[a:b], encoder.fingerprint))
    return events[: segments[-1][1]], store


# ------------------------------------------------------------------ the archiver


def test_a_session_grown_turn_by_turn_never_has_more_than_max_segments(tmp_path: Path) -> None:
    """Every turn ends in an idle period, so each becomes a segment of its own; the archiver merges after each
    append, so the session has at most ``max_segments`` segments whenever it has caught up, every event reads
    back, and the segments merges replaced are deleted by a job of their own once the grace period is over —
    also for a session that gets no new events."""
    log = SqliteEventLog(tmp_path / "log")
    archive = SessionArchive(DirectoryArchiveStore(tmp_path / "archive"))
    policy = ArchivePolicy(idle_s=1, max_delay_s=3600, max_segments=3, grace_s=100)
    clock = Clock(T0)
    metrics = ArchiverMetrics(new_registry())
    feed = LogFeed(log, archive, policy)
    archiver = Archiver(ArchiveAppender(archive), feed, policy, concurrency=2, clock=clock, metrics=metrics)
    written: list[Envelope] = []
    most = 0
    for batch in _turns(60):
        stamped = [Envelope(e.seq, int(clock.now * 1000), e.data) for e in batch]
        log.append("long", len(written), stamped)
        written += stamped
        clock.now += 2  # idle past the threshold after the turn's turn/end
        archiver.offer(feed.poll())
        archiver.step()
        archiver.collect(wait=True)
        archiver.step()  # the tidy jobs that came due
        archiver.collect(wait=True)
        manifest = archive.manifest("long")
        assert manifest is not None
        assert manifest.next_seq == len(written)
        most = max(most, len(manifest.segments))
    assert most <= 3
    assert archiver.merges > 10
    assert archiver.deleted > 0  # the early merges' inputs: 120 s of turns is past the 100 s grace
    assert metrics.merges._value.get() == archiver.merges
    assert metrics.merged_events._value.get() == archiver.merged_events
    fresh = SessionArchive(DirectoryArchiveStore(tmp_path / "archive"))
    assert fresh.read("long", 0, len(written)) == written
    manifest = fresh.manifest("long")
    assert manifest is not None
    assert manifest.retired
    # no new events: the scheduled tidy still deletes what merges replaced, once its grace period is over
    clock.now += 101
    archiver.step()
    archiver.collect(wait=True)
    after = SessionArchive(DirectoryArchiveStore(tmp_path / "archive")).manifest("long")
    assert after is not None
    assert after.retired == ()
    assert archiver.tidying == 0
    report = audit_archive(DirectoryArchiveStore(tmp_path / "archive"), verify=True)
    assert report.clean
    assert report.retired == []
    assert report.per_session == {"long": len(after.segments)}
    archiver.close()


def test_a_merge_that_fails_leaves_every_event_archived_and_is_tried_again(tmp_path: Path) -> None:
    """A foreign object where a merged segment belongs refuses the merge (typed, logged, counted); the
    appends go on, and once the object is gone the next flush merges."""
    log = SqliteEventLog(tmp_path / "log")
    store = DirectoryArchiveStore(tmp_path / "archive")
    archive = SessionArchive(store)
    policy = ArchivePolicy(idle_s=1, max_delay_s=3600, max_segments=2)
    clock = Clock(T0)
    metrics = ArchiverMetrics(new_registry())
    feed = LogFeed(log, archive, policy)
    archiver = Archiver(ArchiveAppender(archive), feed, policy, concurrency=1, clock=clock, metrics=metrics)
    written: list[Envelope] = []
    batches = _turns(4)
    ends = [sum(len(b) for b in batches[: i + 1]) for i in range(len(batches))]
    blocker = manifest_key("s").replace("manifest.json", f"seg-{0:012d}-{ends[2]:012d}.avro")
    store.create(blocker, b"not a segment")
    for batch in batches:
        log.append("s", len(written), batch)
        written += batch
        clock.now += 2
        archiver.offer(feed.poll())
        archiver.step(clock.now)
        archiver.collect(wait=True)
    manifest = archive.manifest("s", refresh=True)
    assert manifest is not None
    assert manifest.next_seq == len(written)
    assert metrics.errors.labels("ArchiveCorrupt")._value.get() >= 1
    assert SessionArchive(store).read("s", 0, len(written)) == written
    store.delete(blocker)
    log.append("s", len(written), _turns(5)[4])
    archiver.offer(feed.poll())
    clock.now += 2
    archiver.step(clock.now)
    archiver.collect(wait=True)
    manifest = archive.manifest("s", refresh=True)
    assert manifest is not None
    assert len(manifest.segments) <= 2
    assert manifest.merging is None
    archiver.close()


# ------------------------------------------------------------------ merging bytes


def test_merged_segments_hold_their_inputs_events_and_are_a_function_of_their_bytes() -> None:
    events = simple_log(turns=6)
    encoder = SegmentEncoder()
    bodies = [encoder.body(e) for e in events]
    cuts = [0, 9, 10, 31, len(events)]
    parts = [
        (a, b, build_segment("s", a, bodies[a:b], encoder.fingerprint), f"p{a}") for a, b in itertools.pairwise(cuts)
    ]
    merged = merge_segments("s", parts)
    assert read_segment(merged, "s", 0, len(events), "m") == events
    assert merge_segments("s", parts) == merged  # what a second archiver completing the merge writes
    nested = merge_segments("s", [(0, 31, merge_segments("s", parts[:3]), "n"), parts[3]])
    assert read_segment(nested, "s", 0, len(events), "m") == events
    with pytest.raises(ArchiveCorrupt, match="names session 'other'"):
        merge_segments("s", [parts[0], (9, 10, build_segment("other", 9, bodies[9:10], encoder.fingerprint), "x")])
    with pytest.raises(ValueError, match="not adjacent"):
        merge_segments("s", [parts[0], parts[2]])


# ------------------------------------------------------------------ the reader


def test_a_cold_read_is_the_manifest_and_each_segment_once_fetched_at_the_same_time(tmp_path: Path) -> None:
    events, inner = _archive(tmp_path, [(0, 20), (20, 30), (30, 35), (35, 40)])
    store = CountingStore(inner, together=4)
    assert SessionArchive(store).read("s", 0, 40) == events
    assert len(store.reads) == 1
    assert len(store.fetches) == 4
    assert store.most_at_once == 4


def test_a_session_larger_than_the_cache_does_not_push_out_what_the_next_read_needs(tmp_path: Path) -> None:
    """Segments of 20, 10, 5 and 5 events and a cache of 32: the first read keeps the first two (30 events);
    every read after it fetches only the last two, instead of each read evicting the segments it needs next."""
    events, inner = _archive(tmp_path, [(0, 20), (20, 30), (30, 35), (35, 40)])
    store = CountingStore(inner)
    reader = SessionArchive(store, cache_events=32)
    assert reader.read("s", 0, 40) == events
    assert len(store.fetches) == 4
    for _ in range(3):
        store.fetches.clear()
        assert reader.read("s", 0, 40) == events
        assert sorted(store.fetches) == sorted(
            k for k in inner.keys("sessions/") if "-000000000030-" in k or "-000000000035-" in k
        )


def test_a_kept_manifest_is_read_again_before_segments_once_it_is_old(tmp_path: Path) -> None:
    events, inner = _archive(tmp_path, [(0, 20), (20, 40)])
    store = CountingStore(inner)
    clock = Clock(100.0)
    reader = SessionArchive(store, cache_events=0, clock=clock)
    assert reader.read("s", 0, 40) == events
    assert len(store.reads) == 1
    clock.now += 59
    assert reader.read("s", 0, 40) == events
    assert len(store.reads) == 1  # young enough: kept
    clock.now += 2
    assert reader.read("s", 0, 40) == events
    assert len(store.reads) == 2  # 61 s old: read again first
    assert reader.watermark("s") == 40
    assert len(store.reads) == 2


def test_a_reader_with_an_old_manifest_whose_segments_were_merged_and_deleted_reads_the_merged_one(
    tmp_path: Path,
) -> None:
    events, inner = _archive(tmp_path, [(0, 20), (20, 30), (30, 40)])
    store = CountingStore(inner)
    reader = SessionArchive(store, cache_events=0)
    assert reader.read("s", 0, 40) == events
    appender = ArchiveAppender(SessionArchive(inner))
    appender.merge("s", MergePolicy(max_segments=2), now_ms=0, grace_ms=0)
    assert appender.tidy("s", now_ms=1, grace_ms=0)[0] == 3  # all three became one
    store.reads.clear()
    assert reader.read("s", 0, 40) == events
    assert len(store.reads) == 1  # one missing segment, one fresh manifest


# ------------------------------------------------------------------ doctor


def test_doctor_audit_reports_segments_per_session_and_what_merges_left(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = tmp_path / "data"
    data.mkdir()
    archive_dir = tmp_path / "archive"
    log = SqliteEventLog(data / DB_NAME)
    written: list[Envelope] = []
    for batch in _turns(12):
        log.append("long", len(written), batch)
        written += batch
    log.append("short", 0, simple_log())
    log.close()
    encoder = SegmentEncoder()
    store = DirectoryArchiveStore(archive_dir)
    appender = ArchiveAppender(SessionArchive(store))
    bodies = [encoder.body(e) for e in written]
    for end in [*range(10, len(written), 10), len(written)]:  # every event: the doctor checks that too
        appender.append("long", end, lambda a, b: build_segment("long", a, bodies[a:b], encoder.fingerprint))
    short = simple_log()
    sbodies = [encoder.body(e) for e in short]
    appender.append("short", len(short), lambda a, b: build_segment("short", a, sbodies[a:b], encoder.fingerprint))
    for var in ("FOLDLINE_BACKEND", "FOLDLINE_ARCHIVE_SESSIONS", "FOLDLINE_ARCHIVE_GRACE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("FOLDLINE_ARCHIVE", "dir")
    monkeypatch.setenv("FOLDLINE_ARCHIVE_DIR", str(archive_dir))
    runner = CliRunner()

    def checks() -> dict[str, dict[str, str]]:
        res = runner.invoke(app, ["doctor", "--audit", "--json", "--data-dir", str(data)])
        assert res.exit_code == 0, res.output
        return {c["name"]: c for c in json.loads(res.stdout)["checks"] if c["area"] == "audit"}

    before = checks()["segments per session"]
    segments = -(-len(written) // 10)
    assert before["status"] == "warn"
    assert f"max {segments} (merged while over 4)" in before["detail"]
    assert "1 session(s) have more than 4: 'long'" in before["detail"]
    outcome = appender.merge("long", MergePolicy(max_segments=4), now_ms=int(time.time() * 1000), grace_ms=3_600_000)
    assert outcome.segments <= 4
    found = checks()
    assert found["segments per session"]["status"] == "ok"
    assert f"max {outcome.segments} (merged while over 4)" in found["segments per session"]["detail"]
    assert "bytes per event" in found["segments per session"]["detail"]
    assert found["retired"]["status"] == "ok"
    assert found["objects"]["status"] == "ok"
    # an hour later the replaced segments are overdue: the archiver had not come back to the session
    monkeypatch.setattr(time, "time", lambda: T0 * 2)
    assert checks()["retired"]["status"] == "warn"
    appender.tidy("long", now_ms=int(T0 * 2000), grace_ms=3_600_000)
    assert "retired" not in checks()
    assert SessionArchive(store).read("long", 0, len(written)) == written


def test_the_reader_refuses_a_manifest_whose_merge_names_segments_it_does_not_list(tmp_path: Path) -> None:
    events, store = _archive(tmp_path, [(0, 20), (20, 40)])
    manifest = SessionArchive(store).manifest("s")
    assert manifest is not None
    stored = store.read(manifest_key("s"))
    assert stored is not None
    value = json.loads(stored.data)
    ghost = SegmentRef("seg-000000000040-000000000050.avro", 40, 50, "0" * 64, 1)
    value["merging"] = {
        "segment": {"key": "seg-000000000000-000000000050.avro", "first": 0, "end": 50, "sha256": "0" * 64, "bytes": 1},
        "inputs": [
            {"key": r.key, "first": r.first, "end": r.end, "sha256": r.sha256, "bytes": r.size}
            for r in (*manifest.segments[1:], ghost)
        ],
    }
    store.replace(manifest_key("s"), json.dumps(value).encode(), stored.version)
    with pytest.raises(ArchiveCorrupt, match=re.escape("covers seqs 0..50, its inputs 20..50")):
        SessionArchive(store).manifest("s")
    del events
