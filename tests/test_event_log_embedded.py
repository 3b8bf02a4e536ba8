"""The embedded and in-memory event logs run the shared contract, plus SQLite-specific checks."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from foldline.adapters.memory_log import MemoryEventLog
from foldline.adapters.metered_log import MeteredEventLog
from foldline.adapters.sqlite_log import SqliteEventLog
from foldline.core import Session
from foldline.errors import StoreBusy, StoreUnavailable
from foldline.metrics import LoopMetrics, new_registry
from foldline.ports.event_log import EventLog
from tests.contracts.event_log import EventLogContract
from tests.factories import simple_log


class TestMemoryEventLog(EventLogContract):
    def make_log(self) -> EventLog:
        return MemoryEventLog()


class TestSqliteEventLog(EventLogContract):
    @pytest.fixture(autouse=True)
    def _dir(self, tmp_path: Path) -> None:
        self.dir = tmp_path

    def make_log(self) -> EventLog:
        return SqliteEventLog(self.dir / "data")


class TestMeteredEventLog(EventLogContract):
    """The metrics decorator is an event log like any other: it passes the same contract."""

    def make_log(self) -> EventLog:
        return MeteredEventLog(MemoryEventLog(), LoopMetrics(new_registry(process=False)))


def test_a_contended_log_is_a_typed_busy_error_and_writes_nothing(tmp_path: Path) -> None:
    """Another process holding the write lock past the busy timeout: StoreBusy, one line, nothing written."""
    import sqlite3

    with SqliteEventLog(tmp_path, busy_timeout_s=0.2) as log:
        log.append("s", 0, simple_log(turns=1, steps=1)[:3])
        holder = sqlite3.connect(str(tmp_path / "log.sqlite3"), isolation_level=None)
        holder.execute("BEGIN IMMEDIATE")
        try:
            with pytest.raises(StoreBusy, match=r"locked by another writer .*retry") as busy:
                log.append("s", 3, simple_log(turns=1, steps=1)[3:4])
            assert "\n" not in str(busy.value)
            with pytest.raises(StoreBusy):
                log.acquire("s")
            assert log.head("s") == 3  # readers are not blocked by a writer (WAL)
        finally:
            holder.execute("ROLLBACK")
            holder.close()
        assert [e.seq for e in log.read("s")] == [0, 1, 2]
        log.append("s", 3, simple_log(turns=1, steps=1)[3:4])  # the lock is gone: the append goes through


def test_a_damaged_database_file_is_a_typed_error(tmp_path: Path) -> None:
    (tmp_path / "log.sqlite3").write_bytes(b"this is not a database" * 100)
    with pytest.raises(StoreUnavailable, match="damaged or not a foldline log"):
        SqliteEventLog(tmp_path)


def test_sqlite_log_persists_across_instances(tmp_path: Path) -> None:
    events = simple_log()
    with SqliteEventLog(tmp_path) as log:
        log.append("s", 0, events)
    with SqliteEventLog(tmp_path) as log:
        assert log.read("s") == events
        assert log.head("s") == len(events)


def test_two_instances_see_each_others_appends(tmp_path: Path) -> None:
    events = simple_log()
    a, b = SqliteEventLog(tmp_path), SqliteEventLog(tmp_path)
    a.append("s", 0, events[:3])
    b.append("s", 3, events[3:6])  # b's rules cache must load what a wrote
    a.append("s", 6, events[6:])
    assert b.read("s") == events
    a.close()
    b.close()


_WRITER = textwrap.dedent(
    """
    import sys
    from foldline.adapters.sqlite_log import SqliteEventLog
    from foldline.core import Envelope, TextBlock, UserMessage, RequestHeader
    from tests.factories import HEADER
    log = SqliteEventLog(sys.argv[1])
    seq = log.head("crash")
    if seq == 0:
        log.append("crash", 0, [Envelope(0, 0, RequestHeader(HEADER, "initial"))])
        seq = 1
    print("ready", flush=True)
    while True:
        batch = [Envelope(seq + i, 0, UserMessage(f"m{seq + i}", (TextBlock("x" * 2000),))) for i in range(50)]
        seq = log.append("crash", seq, batch)
    """
)


def test_kill_9_mid_append_leaves_whole_batches(tmp_path: Path) -> None:
    root = Path(__file__).resolve().parent.parent
    for round_ in range(3):
        with subprocess.Popen(
            [sys.executable, "-c", _WRITER, str(tmp_path)],
            stdout=subprocess.PIPE,
            cwd=root,
            env={**os.environ, "PYTHONPATH": str(root)},
        ) as proc:
            assert proc.stdout is not None
            assert proc.stdout.readline().strip() == b"ready"
            time.sleep(0.2 + 0.1 * round_)
            proc.send_signal(signal.SIGKILL)
            proc.wait()
        with SqliteEventLog(tmp_path) as log:
            events = log.read("crash")
            assert len(events) == log.head("crash")
            assert (len(events) - 1) % 50 == 0, "a batch was torn"
            Session("crash", events)  # the whole log still validates
    assert len(events) > 1
