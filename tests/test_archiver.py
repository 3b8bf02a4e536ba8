"""The archiver's engine on the embedded log: when sessions are archived, what a restore puts back, the CLI.

Everything here runs on real adapters (SQLite log, directory archive); only the clock is a value the test
moves, so the policy's timing is exact.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import sqlite3
import threading
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from foldline.adapters.archive import ArchiveAppender, SegmentEncoder, SessionArchive, audit_archive, build_segment
from foldline.adapters.archive.segments import read_segment
from foldline.adapters.avro import decoding
from foldline.adapters.dir_archive import DirectoryArchiveStore
from foldline.adapters.memory_log import MemoryEventLog
from foldline.adapters.sqlite_log import SqliteEventLog
from foldline.archiver.engine import ArchivePolicy, Archiver
from foldline.archiver.factory import open_archiver
from foldline.archiver.log_feed import LogFeed
from foldline.archiver.restore import restore_session
from foldline.cli.main import app
from foldline.config import Config
from foldline.core import TextBlock, UserMessage
from foldline.errors import ArchiveCorrupt
from foldline.ports.event_log import EventLog
from tests.factories import LogBuilder, env, simple_log

T0 = 1_700_000_000.0  # the factories' events are written at T0 (+ seq ms)


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def _engine(log: EventLog, root: Path, policy: ArchivePolicy, clock: Clock) -> tuple[Archiver, LogFeed, SessionArchive]:
    archive = SessionArchive(DirectoryArchiveStore(root))
    feed = LogFeed(log, archive, policy)
    return Archiver(ArchiveAppender(archive), feed, policy, concurrency=4, clock=clock), feed, archive


def _settle(archiver: Archiver, now: float) -> None:
    archiver.step(now)
    archiver.collect(wait=True)


def test_the_policy_decides_when_each_session_is_archived(tmp_path: Path) -> None:
    log = MemoryEventLog()
    finished = simple_log()  # ends with turn/end at ~T0
    log.append("finished", 0, finished)
    open_turn = finished[:-1]  # the same session without its turn/end: a turn still running
    log.append("running", 0, open_turn)
    busy = LogBuilder().header()
    for i in range(30):
        busy.user(f"message {i}")
    log.append("busy", 0, busy.events)
    log.append("private-1", 0, simple_log())
    policy = ArchivePolicy(sessions=("finished", "running", "busy"), idle_s=60, max_delay_s=3600, segment_events=25)
    clock = Clock(T0 + 1)
    archiver, feed, archive = _engine(log, tmp_path, policy, clock)
    archiver.offer(feed.poll())
    assert archiver.backlog == len(finished) + len(open_turn) + len(busy.events)  # private-1 is not archived

    _settle(archiver, T0 + 1)  # only the busy session: 25 events or more are waiting
    assert {s: archive.watermark(s) for s in ("finished", "running", "busy")} == {
        "finished": 0,
        "running": 0,
        "busy": len(busy.events),
    }
    _settle(archiver, T0 + 59)  # idle 59 s after its turn/end: not yet
    assert archive.watermark("finished") == 0
    _settle(archiver, T0 + 61)
    assert archive.watermark("finished") == len(finished)
    assert archive.watermark("running") == 0  # no turn/end: waits for the delay bound
    _settle(archiver, T0 + 1799)
    assert archive.watermark("running") == 0
    _settle(archiver, T0 + 1801)  # half the maximum delay: archived, so every event is within the bound
    assert archive.watermark("running") == len(open_turn)
    assert archive.watermark("private-1") == 0
    assert archiver.backlog == 0
    assert archive.read("finished", 0, len(finished)) == finished
    # the running session goes on: its next events form the next segment
    more = [env(len(open_turn), finished[-1].data)]
    log.append("running", len(open_turn), more)
    archiver.offer(feed.poll())
    _settle(archiver, T0 + 1801 + 61)
    manifest = archive.manifest("running")
    assert manifest is not None
    assert [(s.first, s.end) for s in manifest.segments] == [
        (0, len(open_turn)),
        (len(open_turn), len(finished)),
    ]
    archiver.close()


def test_too_many_buffered_events_archive_the_largest_sessions_first(tmp_path: Path) -> None:
    log = MemoryEventLog()
    log.append("large", 0, simple_log(turns=4))
    log.append("small", 0, simple_log(turns=1))
    policy = ArchivePolicy(idle_s=10_000, max_delay_s=100_000, segment_events=1000, max_buffered_events=20)
    archiver, feed, archive = _engine(log, tmp_path, policy, Clock(T0))
    archiver.offer(feed.poll())
    _settle(archiver, T0)
    assert archive.watermark("large") == len(simple_log(turns=4))
    assert archive.watermark("small") == 0
    archiver.close()


def test_restore_puts_the_archive_back_under_the_fencing_rules(tmp_path: Path) -> None:
    source = SqliteEventLog(tmp_path / "source")
    sessions = {f"s{i}": simple_log(turns=2 + i) for i in range(3)}
    for sid, events in sessions.items():
        source.append(sid, 0, events)
    archiver, feed, archive = _engine(source, tmp_path / "archive", ArchivePolicy(), Clock(T0))
    archiver.offer(feed.poll())
    archiver.drain()
    archiver.close()
    source.close()

    target = SqliteEventLog(tmp_path / "rebuilt")
    target.append("s1", 0, sessions["s1"][:5])  # a restore that stopped half way
    results = {sid: restore_session(archive, target, sid) for sid in sessions}
    assert {sid: (r.present, r.appended) for sid, r in results.items()} == {
        "s0": (0, len(sessions["s0"])),
        "s1": (5, len(sessions["s1"]) - 5),
        "s2": (0, len(sessions["s2"])),
    }
    for sid, events in sessions.items():
        assert target.read(sid) == events
    assert all(restore_session(archive, target, sid).appended == 0 for sid in sessions)  # twice: a no-op
    # a log holding another history of the session is refused, and nothing is appended to it
    other = SqliteEventLog(tmp_path / "other")
    other.append("s0", 0, [*sessions["s0"][:2], env(2, UserMessage("x", (TextBlock("another"),)))])
    with pytest.raises(ArchiveCorrupt, match="differs between the log and the archive"):
        restore_session(archive, other, "s0")
    assert other.head("s0") == 3
    target.close()
    other.close()


def test_the_embedded_archiver_backs_up_and_the_cli_restores_and_audits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`foldline demo` writes sessions; the archiver (embedded: a poller) backs them up to a directory;
    `foldline restore` rebuilds them in a data directory holding only the attachments, where `foldline
    verify` proves every request; `foldline doctor --audit` passes, then fails on an object nobody names."""
    runner = CliRunner()
    archive_dir = tmp_path / "backup"
    for var in ("FOLDLINE_BACKEND", "FOLDLINE_ARCHIVE_SESSIONS"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("FOLDLINE_ARCHIVE", "dir")
    monkeypatch.setenv("FOLDLINE_ARCHIVE_DIR", str(archive_dir))
    monkeypatch.setenv("FOLDLINE_ARCHIVE_IDLE", "0.01")
    first, second = ["--data-dir", str(tmp_path / "a")], ["--data-dir", str(tmp_path / "b")]
    res = runner.invoke(app, ["demo", "--sessions", "2", "--steps", "3", "--json", *first])
    assert res.exit_code == 0, res.output
    verified_before = json.loads(runner.invoke(app, ["verify", "--json", *first]).stdout)
    assert verified_before["matched"] == verified_before["checked"] > 0

    config = Config.from_env().overridden(data_dir=tmp_path / "a")
    worker = open_archiver(config)
    thread = threading.Thread(target=worker.run)
    thread.start()
    try:
        archive = SessionArchive(DirectoryArchiveStore(archive_dir))
        with SqliteEventLog(tmp_path / "a") as log:
            heads = {sid: log.head(sid) for sid in log.sessions()}
        deadline = time.monotonic() + 30  # the demo's sessions end with turn/end: archived once idle 10 ms
        while any(archive.watermark(s, refresh=True) < h for s, h in heads.items()):
            assert time.monotonic() < deadline, "the embedded archiver did not archive the demo's sessions"
            time.sleep(0.05)
    finally:
        worker.stop()
        thread.join(timeout=30)
    assert not thread.is_alive()

    # the archive holds the log (its content sealed, as stored); attachments live in their own content-addressed
    # store, and the data keys in the key store (docs/ERASURE.md), each copied as they are
    shutil.copytree(tmp_path / "a" / "attachments", tmp_path / "b" / "attachments")
    res = runner.invoke(app, ["restore", *second])
    assert res.exit_code == 0, res.output
    res = runner.invoke(app, ["verify", "--json", *second])
    assert res.exit_code == 2
    assert "KeyMissing" in res.output  # without its keys a restored log is a lost key, never an erasure
    # a copy of a live SQLite database (its write-ahead log included) is made with SQLite's backup API
    with (
        contextlib.closing(sqlite3.connect(tmp_path / "a" / "keys.sqlite3")) as src,
        contextlib.closing(sqlite3.connect(tmp_path / "b" / "keys.sqlite3")) as dst,
    ):
        src.backup(dst)
    res = runner.invoke(app, ["restore", *second])  # nothing left to append
    assert res.exit_code == 0, res.output
    assert f"restored {len(heads)} session(s), 0 event(s) appended" in res.output
    res = runner.invoke(app, ["verify", "--json", *second])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout) == verified_before
    res = runner.invoke(app, ["doctor", "--audit", "--json", *second])
    assert res.exit_code == 0, res.output
    report = json.loads(res.stdout)
    assert report["ok"]
    assert {c["status"] for c in report["checks"] if c["name"] != "decoder"} == {"ok"}
    # the decoder check warns only where the install reads with the interpreted decoder (built without the other)
    compiled = decoding.DECODER != "interpreted"
    assert [c["status"] for c in report["checks"] if c["name"] == "decoder"] == ["ok" if compiled else "warn"]
    stray = archive_dir / "sessions" / "00" / "nobody" / "seg-000000000000-000000000001.avro"
    stray.parent.mkdir(parents=True)
    stray.write_bytes(b"left by hand")
    res = runner.invoke(app, ["doctor", "--audit", "--json", *second])
    assert res.exit_code == 1
    failed = [c for c in json.loads(res.stdout)["checks"] if c["status"] == "fail"]
    assert [c["name"] for c in failed] == ["objects", "orphans"]
    assert str(stray) in failed[1]["detail"]
    assert audit_archive(DirectoryArchiveStore(archive_dir)).orphans == [
        "sessions/00/nobody/seg-000000000000-000000000001.avro"
    ]


def test_a_segment_whose_records_skip_a_seq_is_corrupt_and_the_record_named() -> None:
    events = simple_log(turns=2)
    encoder = SegmentEncoder()
    bodies = [encoder.body(e) for e in events]
    good = build_segment("s", 0, bodies[:5], encoder.fingerprint)
    assert read_segment(good, "s", 0, 5, "the-key") == events[:5]
    skipping = build_segment("s", 0, [*bodies[:2], *bodies[3:6]], encoder.fingerprint)
    with pytest.raises(ArchiveCorrupt, match="record 2 has seq 3, expected 2"):
        read_segment(skipping, "s", 0, 5, "the-key")


def test_the_archivers_readiness_names_its_archive_store(tmp_path: Path) -> None:
    """/readyz of an archiver: it runs, and its archive store answers — a directory that is gone is named."""
    import urllib.error
    import urllib.request

    from foldline.archiver.worker import LogArchiverWorker
    from foldline.errors import StoreUnavailable
    from foldline.metrics import new_registry
    from foldline.metrics_server import serve

    archive = tmp_path / "archive"
    (tmp_path / "data").mkdir()
    config = Config(data_dir=tmp_path / "data").overridden(archive__store="dir", archive__dir=str(archive))
    worker = open_archiver(config)
    assert isinstance(worker, LogArchiverWorker)
    try:
        checks = worker.readiness()
        assert set(checks) == {"archiver", "archive"}
        assert checks["archive"]()
        shutil.rmtree(archive)
        with pytest.raises(StoreUnavailable, match="is gone"):
            checks["archive"]()
        with serve(0, new_registry(process=False), ready=checks, host="127.0.0.1") as server:
            with pytest.raises(urllib.error.HTTPError) as info:
                urllib.request.urlopen(server.url + "/readyz", timeout=10)
            body = info.value.read().decode()
            info.value.close()
        gone = f"archive: StoreUnavailable: archive directory {archive} is gone (unmounted, deleted or renamed)"
        assert body.splitlines() == ["archiver: not ready", gone]  # not running yet, and its store is gone
    finally:
        worker.archiver.close()
        worker.feed.close()
