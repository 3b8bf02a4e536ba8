"""Large sessions stream with bounded memory and fit on disk; output adapts to pipes and terminals.

A 200 MB export imported with 2.0 GB of memory into a 916 MB database, with no progress; ``show`` of a
large session ran 43 s silently; piped output was hard-wrapped at 80 columns. (The throughput and
time-to-first-line targets are measured in ``benchmarks/bench_cli.py``; here are the properties that do
not depend on the machine's speed.)
"""

from __future__ import annotations

import os
import pty
import select
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from benchmarks.bench_cli import write_export

from foldline.adapters.sqlite_log import SqliteEventLog
from tests.adversarial.helpers import cli_env, run


def measured(*args: str | Path) -> tuple[int, float]:
    """(exit status, peak resident MB) of ``python -m foldline.cli ARGS``.

    The peak is the child's own ``VmHWM`` (its address space's high-water mark since its exec), read until it
    exits: ``ru_maxrss`` of a child also counts the pages of this process it was forked from, which in a
    long test run are hundreds of MB.
    """
    proc = subprocess.Popen(
        [sys.executable, "-m", "foldline.cli", *map(str, args)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=cli_env(),
    )
    status = Path(f"/proc/{proc.pid}/status")
    peak_kb = 0
    while proc.poll() is None:
        try:
            for line in status.read_text().splitlines():
                if line.startswith("VmHWM:"):
                    peak_kb = max(peak_kb, int(line.split()[1]))
        except (FileNotFoundError, ProcessLookupError):
            break
        time.sleep(0.005)
    proc.wait()
    assert peak_kb > 0, "the child's memory was never read"
    return proc.returncode, peak_kb / 1024


@pytest.fixture(scope="module")
def exports(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, int]]:
    root = tmp_path_factory.mktemp("large")
    out = {}
    for name, size in (("small", 4_000_000), ("large", 40_000_000)):
        path = root / f"{name}.jsonl"
        out[name] = (path, write_export(path, name, min_bytes=size))
    return out


def test_import_memory_does_not_grow_with_the_file_and_the_database_stays_small(
    exports: dict[str, tuple[Path, int]], tmp_path: Path
) -> None:
    peaks = {}
    for name, (path, event_bytes) in exports.items():
        data = tmp_path / name
        code, peaks[name] = measured("import", path, "--data-dir", data)
        assert code == 0
        on_disk = sum(p.stat().st_size for p in data.glob("log.sqlite3*"))
        # the rows hold the events sealed (docs/ERASURE.md): their content as base64 of its ciphertext
        stored = sum(len(b) for (b,) in sqlite3.connect(data / "log.sqlite3").execute("SELECT body FROM events"))
        assert stored <= 1.4 * event_bytes, (name, stored, event_bytes)
        assert on_disk <= 1.5 * stored, (name, on_disk, stored)
    assert peaks["large"] - peaks["small"] < 40, peaks  # ten times the file, about the same memory
    assert peaks["large"] < 250, peaks


def test_show_streams_a_large_session_in_bounded_memory(tmp_path: Path) -> None:
    data = tmp_path / "data"
    peaks = {}
    for name, events in (("short", 5_000), ("long", 60_000)):
        export = tmp_path / f"{name}.jsonl"
        write_export(export, name, events=events, small=True)
        assert run("import", export, "--data-dir", data).code == 0
        code, peaks[name] = measured("show", name, "--data-dir", data)
        assert code == 0
    assert peaks["long"] - peaks["short"] < 30, peaks
    with SqliteEventLog(data, read_only=True) as log:
        assert log.head("long") == 60_000


def test_piped_output_is_never_wrapped(tmp_path: Path) -> None:
    data = tmp_path / "data"
    long_id = "session-" + "x" * 150
    export = tmp_path / "s.jsonl"
    write_export(export, long_id, events=40, small=True)
    assert run("import", export, "--data-dir", data).code == 0
    env = cli_env(COLUMNS="30")
    for args in (("sessions",), ("show", long_id), ("verify",), ("diff", long_id)):
        done = subprocess.run(
            [sys.executable, "-m", "foldline.cli", *args, "--data-dir", str(data)],
            capture_output=True,
            text=True,
            env=env,
            check=False,
        )
        assert long_id in done.stdout, (args, done.stdout)  # on one line, whole
    show = run("show", long_id, "--data-dir", data, env=env).stdout.splitlines()
    assert len(show) == 41  # one title line, one line per event, however long


def on_terminal_stderr(*args: str | Path) -> str:
    """The command's stderr as a terminal sees it (stdout to a pipe)."""
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "foldline.cli", *map(str, args)],
        stdout=subprocess.DEVNULL,
        stderr=slave,
        env=cli_env(TERM="xterm-256color"),
    )
    os.close(slave)
    chunks = []
    while True:
        ready, _, _ = select.select([master], [], [], 120)
        if not ready:
            break
        try:
            chunk = os.read(master, 65536)
        except OSError:
            break
        if not chunk:
            break
        chunks.append(chunk)
    proc.wait(timeout=120)
    os.close(master)
    return b"".join(chunks).decode(errors="replace")


def test_progress_only_on_a_terminal(exports: dict[str, tuple[Path, int]], tmp_path: Path) -> None:
    path, _ = exports["small"]
    seen = on_terminal_stderr("import", path, "--data-dir", tmp_path / "a")
    assert "importing" in seen  # the bar, with the bytes read
    piped = run("import", path, "--data-dir", tmp_path / "b")
    assert piped.code == 0
    assert piped.stderr == ""  # no bar, no control sequence, into a pipe or a file
    seen = on_terminal_stderr("show", "small", "--data-dir", tmp_path / "b")
    assert "events" in seen  # show's output goes to a pipe: the terminal gets the progress
