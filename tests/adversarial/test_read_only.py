"""Every command that only reads works on a data directory nobody may write, and changes nothing in one.

A read-only copy of a data dir could not even be listed or verified: the commands opened the log for
writing. Root ignores ``chmod -w``, so as root the commands run without the capabilities that override
file permissions (``CAP_DAC_OVERRIDE``, ``CAP_DAC_READ_SEARCH``, ``CAP_FOWNER``), which binds them to the
permissions like any user.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import shutil
import sqlite3
import stat
from collections.abc import Callable
from pathlib import Path

import pytest

from foldline.adapters.sqlite_log import SqliteEventLog
from tests.adversarial.helpers import assert_one_line_error, demo, invoke, run

_PR_CAPBSET_DROP = 24
_DAC_CAPABILITIES = (1, 2, 3)  # CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH, CAP_FOWNER


def snapshot(root: Path) -> dict[str, tuple[int, str]]:
    """Every file under ``root``: its mode and content digest. SQLite's reader coordination files are not
    data: a reader on a writable directory may create ``-shm`` and an empty ``-wal``, as any reader does."""
    out = {}
    for p in sorted(root.rglob("*")):
        coordination = p.name.endswith("-shm") or (p.name.endswith("-wal") and p.stat().st_size == 0)
        if p.is_file() and not coordination:
            out[str(p.relative_to(root))] = (p.stat().st_mode, hashlib.sha256(p.read_bytes()).hexdigest())
    return out


def make_read_only(root: Path) -> None:
    for p in [*root.rglob("*"), root]:
        p.chmod(p.stat().st_mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))


def make_writable(root: Path) -> None:
    for p in [root, *root.rglob("*")]:
        p.chmod(p.stat().st_mode | stat.S_IWUSR)


def as_reader() -> Callable[[], None] | None:
    """Bind the command to file permissions: a user already is; root drops what overrides them."""
    if os.geteuid() != 0:
        return None

    def drop() -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        for cap in _DAC_CAPABILITIES:
            if libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
                raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")

    return drop


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    data = tmp_path_factory.mktemp("read-only") / "data"
    assert demo(data, sessions=2, steps=3).code == 0
    return data


READ_ONLY_COMMANDS = (
    ("sessions", "--json"),
    ("show", "demo-000"),
    ("show", "demo-001", "--json"),
    ("verify",),
    ("verify", "demo-001", "--json"),
    ("requests", "demo-000", "--step", "1"),
    ("diff", "demo-000"),
    ("drops", "--json"),
    ("replay", "--all", "--json"),
)


def check_commands(data: Path, out_dir: Path) -> None:
    before = snapshot(data)
    for args in READ_ONLY_COMMANDS:
        done = run(*args, "--data-dir", data, preexec=as_reader(), cwd=out_dir)
        assert done.code == 0, (args, done.stderr)
        assert done.stdout.strip(), args
    assert snapshot(data) == before
    exported = out_dir / "copy.jsonl"
    export = run("export", "demo-000", "-o", exported, "--data-dir", data, preexec=as_reader(), cwd=out_dir)
    assert export.code == 0, export.stderr
    assert exported.read_bytes().count(b"\n") > 10
    after = snapshot(data)
    # the one change an export makes: it is noted in the key store, so that an erasure removes the file too
    assert {name for name in after if after[name] != before.get(name)} <= {"keys.sqlite3"}


@pytest.fixture
def out_dir(tmp_path: Path) -> Path:
    return tmp_path


def test_a_read_only_data_dir(source: Path, out_dir: Path) -> None:
    data = source.parent / "ro"
    shutil.copytree(source, data)
    make_read_only(data)
    try:
        check_commands(data, out_dir)
    finally:
        make_writable(data)


def test_a_read_only_copy_with_the_wal_files_a_reader_left(source: Path, out_dir: Path) -> None:
    """A copy taken while the log was open has its -wal and -shm files; it is read through them."""
    data = source.parent / "ro-wal"
    shutil.copytree(source, data)
    keep = sqlite3.connect(data / "log.sqlite3")  # creates the -shm and -wal a live log has
    keep.execute("SELECT count(*) FROM events").fetchone()
    frozen = source.parent / "ro-wal-copy"
    shutil.copytree(data, frozen)
    keep.close()
    assert (frozen / "log.sqlite3-shm").exists()
    make_read_only(frozen)
    try:
        check_commands(frozen, out_dir)
    finally:
        make_writable(frozen)


def test_read_only_commands_do_not_change_a_writable_data_dir(source: Path, out_dir: Path) -> None:
    data = source.parent / "rw"
    shutil.copytree(source, data)
    check_commands(data, out_dir)


def test_writing_commands_on_a_read_only_dir_fail_in_one_line(source: Path, out_dir: Path) -> None:
    data = source.parent / "ro-write"
    shutil.copytree(source, data)
    export = out_dir / "demo-000.jsonl"
    assert run("export", "demo-000", "-o", export, "--data-dir", data).code == 0
    make_read_only(data)
    try:
        before = snapshot(data)
        for args in (
            ("import", export, "--as", "again"),
            ("fork", "demo-000", "--at", "0"),
            ("resume", "demo-000", "--steps", "1"),
        ):
            assert_one_line_error(run(*args, "--data-dir", data, preexec=as_reader(), cwd=out_dir), "StoreUnavailable")
        assert snapshot(data) == before
    finally:
        make_writable(data)


def test_the_read_only_log_refuses_writes_typed(tmp_path: Path) -> None:
    from foldline.errors import StoreUnavailable
    from tests.factories import simple_log

    with SqliteEventLog(tmp_path) as log:
        log.append("s", 0, simple_log(1, 1))
    with SqliteEventLog(tmp_path, read_only=True) as log:
        assert [e.seq for e in log.read("s")][:2] == [0, 1]
        with pytest.raises(StoreUnavailable, match="read-only"):
            log.append("s", log.head("s"), simple_log(1, 1)[:1])
        with pytest.raises(StoreUnavailable, match="read-only"):
            log.acquire("s")
    missing = tmp_path / "none"
    with SqliteEventLog(missing, read_only=True) as log:  # nothing there: an empty log, and nothing created
        assert log.sessions() == []
    assert not missing.exists()


def test_sessions_on_a_missing_dir_lists_none_and_creates_nothing(tmp_path: Path) -> None:
    missing = tmp_path / "nothing-here"
    out = invoke("sessions", "--data-dir", missing, "--json")
    assert (out.code, json.loads(out.stdout)) == (0, [])
    assert not missing.exists()
