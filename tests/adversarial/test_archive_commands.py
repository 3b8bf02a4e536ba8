"""``foldline archiver``, ``restore`` and ``doctor`` hold to the rules of every other command.

Failures are typed and one line; a named session the archive lacks, or an archive with nothing in it,
is an error (never "restored 0 sessions" and exit 0); ids are checked; ``--json`` on each; text from the
configuration or the log is printed literally; ``doctor`` is an audit, so it never creates a data
directory and reads a read-only one.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from foldline.adapters.archive import SessionArchive
from foldline.adapters.dir_archive import DirectoryArchiveStore
from foldline.adapters.sqlite_log import SqliteEventLog
from tests.adversarial.helpers import assert_one_line_error, cli_env, demo, invoke, printable_output, run
from tests.adversarial.test_read_only import as_reader, make_read_only, make_writable, snapshot


def archive_env(archive: Path) -> dict[str, str]:
    return {"FOLDLINE_ARCHIVE": "dir", "FOLDLINE_ARCHIVE_DIR": str(archive), "FOLDLINE_ARCHIVE_IDLE": "0.01"}


@pytest.fixture(scope="module")
def archived(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A demo's data directory and an archive of its two sessions (written by a real archiver process)."""
    root = tmp_path_factory.mktemp("archived")
    data, archive = root / "data", root / "archive"
    assert demo(data, sessions=2, steps=2).code == 0
    with SqliteEventLog(data) as log:
        heads = {sid: log.head(sid) for sid in log.sessions()}
    proc = subprocess.Popen(
        [sys.executable, "-m", "foldline.cli", "archiver", "--json", "--data-dir", str(data)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=cli_env(**archive_env(archive)),
    )
    try:
        assert proc.stdout is not None
        ready = json.loads(proc.stdout.readline())
        assert ready == {"ready": True, "metrics": None}
        reader = SessionArchive(DirectoryArchiveStore(archive))
        deadline = time.monotonic() + 60
        while any(reader.watermark(s, refresh=True) < h for s, h in heads.items()):
            assert time.monotonic() < deadline, "the archiver did not archive the demo's sessions"
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    stopped = json.loads(out.decode().strip().splitlines()[-1])
    assert stopped["stopped"] is True
    assert stopped["events"] == sum(heads.values())
    assert stopped["segments"] >= len(heads)
    return data, archive


def test_restore_reports_as_json_and_again_is_a_no_op(archived: tuple[Path, Path], tmp_path: Path) -> None:
    data, archive = archived
    with SqliteEventLog(data, read_only=True) as log:
        ids = log.sessions()
    target = tmp_path / "restored"
    target.mkdir()
    out = invoke("restore", "--json", "--data-dir", target, env=archive_env(archive))
    assert out.code == 0, out.stderr
    rows = [json.loads(line) for line in out.stdout.splitlines()]
    assert sorted(r["session"] for r in rows[:-1]) == sorted(ids)
    assert rows[-1] == {"restored": len(ids), "failed": 0, "appended": sum(r["appended"] for r in rows[:-1])}
    assert all(r["appended"] == r["archived"] > 0 for r in rows[:-1])
    assert all(r["present"] == 0 for r in rows[:-1])
    again = invoke("restore", "demo-001", "--json", "--data-dir", target, env=archive_env(archive))
    assert [json.loads(line) for line in again.stdout.splitlines()][-1] == {"restored": 1, "failed": 0, "appended": 0}


def test_restore_restores_every_session_it_can_and_reports_each_failure(
    archived: tuple[Path, Path], tmp_path: Path
) -> None:
    """A session whose segment is damaged does not stop the restore: every other session is restored, the
    damaged one is reported by name (one line, typed), the log holds nothing of it, and the status is 1."""
    data, archive = archived
    damaged = tmp_path / "archive"
    shutil.copytree(archive, damaged)
    reader = SessionArchive(DirectoryArchiveStore(damaged))
    ids = reader.sessions()
    assert len(ids) >= 3
    first = ids[0]  # the first one restored: every session after it must still be tried
    segment = next(p for p in damaged.rglob("seg-*.avro") if p.parent.name == first)
    segment.write_bytes(segment.read_bytes()[:-20] + b"\0" * 20)
    with SqliteEventLog(data, read_only=True) as log:
        heads = {sid: log.head(sid) for sid in ids}
    target = tmp_path / "restored"
    target.mkdir()
    out = invoke("restore", "--data-dir", target, env=archive_env(damaged))
    assert out.code == 1, out.stdout + out.stderr
    errors = [line for line in out.stderr.splitlines() if line.strip()]
    assert len(errors) == 1
    assert errors[0].startswith(f"{first}: not restored: ArchiveCorrupt: ")
    assert f"restored {len(ids) - 1} session(s)" in out.stdout
    assert "1 session(s) not restored" in out.stdout
    with SqliteEventLog(target, read_only=True) as log:
        assert {sid: log.head(sid) for sid in ids} == {**heads, first: 0}

    again = tmp_path / "again"
    again.mkdir()
    out = invoke("restore", "--json", "--data-dir", again, env=archive_env(damaged))
    assert out.code == 1
    rows = [json.loads(line) for line in out.stdout.splitlines()]
    assert [r["session"] for r in rows[:-1]] == ids
    assert rows[0]["error"].startswith("ArchiveCorrupt: ")
    assert all("error" not in r and r["appended"] == heads[r["session"]] for r in rows[1:-1])
    assert rows[-1] == {"restored": len(ids) - 1, "failed": 1, "appended": sum(heads.values()) - heads[first]}


def test_restore_of_a_session_the_archive_lacks_restores_nothing(archived: tuple[Path, Path], tmp_path: Path) -> None:
    _, archive = archived
    target = tmp_path / "t"
    target.mkdir()
    out = invoke("restore", "demo-000", "nobody", "--data-dir", target, env=archive_env(archive))
    assert_one_line_error(out, "SessionNotFound", "'nobody'", "nothing was restored")
    assert invoke("sessions", "--json", "--data-dir", target).stdout.strip() == "[]"


def test_restore_from_an_empty_or_missing_archive_is_an_error(tmp_path: Path) -> None:
    empty = tmp_path / "empty-archive"
    empty.mkdir()
    out = invoke("restore", "--data-dir", tmp_path / "d", env=archive_env(empty))
    assert_one_line_error(out, "ConfigError", "holds no session")
    out = invoke("restore", "--data-dir", tmp_path / "d", env={"FOLDLINE_ARCHIVE": "off"})
    assert_one_line_error(out, "ConfigError", "no session archive is configured")


def test_restore_checks_ids_and_data_dirs(archived: tuple[Path, Path], tmp_path: Path) -> None:
    _, archive = archived
    for bad in ("a\x1b]0;owned\x07", "x" * 10_000, "line\nbreak", ""):
        out = invoke("restore", bad, "--data-dir", tmp_path / "d", env=archive_env(archive))
        line = assert_one_line_error(out, "ValidationError")
        assert printable_output(line)
    afile = tmp_path / "a-file"
    afile.write_text("mine")
    for args in (("restore",), ("archiver",)):
        out = invoke(*args, "--data-dir", afile, env=archive_env(archive))
        assert_one_line_error(out, "ConfigError", "is a file")
    assert afile.read_text() == "mine"


def test_doctor_never_creates_a_data_dir_and_never_passes_on_one_that_is_missing(tmp_path: Path) -> None:
    missing = tmp_path / "typo"
    out = invoke("doctor", "--json", "--data-dir", missing, env={"FOLDLINE_ARCHIVE": "off"})
    assert out.code == 1
    report = json.loads(out.stdout)
    assert not report["ok"]
    failed = [c for c in report["checks"] if c["status"] == "fail"]
    assert [c["area"] for c in failed] == ["log"]
    assert "no data directory" in failed[0]["detail"]
    assert not missing.exists()


def test_doctor_never_creates_the_archive_it_checks_and_fails_on_one_that_misses_the_log(
    archived: tuple[Path, Path], tmp_path: Path
) -> None:
    """A mistyped FOLDLINE_ARCHIVE_DIR is a failed check, and stays missing; an archive that exists but lacks
    sessions older than the maximum delay is a failed check naming them; the real archive passes."""
    data, archive = archived
    with SqliteEventLog(data, read_only=True) as log:
        ids = log.sessions()
    typo = tmp_path / "archvie"
    out = invoke("doctor", "--json", "--data-dir", data, env=archive_env(typo))
    assert out.code == 1, out.stdout
    failed = [c for c in json.loads(out.stdout)["checks"] if c["status"] == "fail"]
    assert [(c["area"], c["name"]) for c in failed] == [("archive", "store")]
    assert f"archive directory {typo} does not exist" in failed[0]["detail"]
    assert not typo.exists()

    empty = tmp_path / "empty"
    empty.mkdir()
    time.sleep(0.05)
    late = {**archive_env(empty), "FOLDLINE_ARCHIVE_MAX_DELAY": "0.01"}
    out = invoke("doctor", "--json", "--data-dir", data, env=late)
    assert out.code == 1, out.stdout
    failed = [c for c in json.loads(out.stdout)["checks"] if c["status"] == "fail"]
    assert [(c["area"], c["name"]) for c in failed] == [("archive", "sessions archived")]
    assert f"{len(ids)} of the {len(ids)} session(s)" in failed[0]["detail"]
    assert all(repr(sid) in failed[0]["detail"] for sid in ids[:10])
    assert list(empty.iterdir()) == []
    out = invoke("doctor", "--data-dir", data, env=late)
    assert out.code == 1
    assert f"FAIL archive  sessions archived: {len(ids)} of the {len(ids)} session(s)" in out.stdout

    out = invoke(
        "doctor", "--json", "--data-dir", data, env={**archive_env(archive), "FOLDLINE_ARCHIVE_MAX_DELAY": "0.01"}
    )
    assert out.code == 0, out.stdout
    coverage = next(c for c in json.loads(out.stdout)["checks"] if c["name"] == "sessions archived")
    assert coverage["status"] == "ok"
    assert f"{len(ids)} of {len(ids)} session(s) archived to their head" in coverage["detail"]


def test_doctor_reads_a_read_only_data_dir_and_changes_nothing(archived: tuple[Path, Path], tmp_path: Path) -> None:
    data, archive = archived
    copy = tmp_path / "ro"
    shutil.copytree(data, copy)
    make_read_only(copy)
    try:
        before = snapshot(copy)
        env = cli_env(**archive_env(archive))
        out = run("doctor", "--audit", "--json", "--data-dir", copy, env=env, preexec=as_reader(), cwd=tmp_path)
        assert out.code == 0, out.stdout + out.stderr
        assert json.loads(out.stdout)["ok"]
        assert snapshot(copy) == before
    finally:
        make_writable(copy)


def test_doctor_prints_paths_literally(tmp_path: Path) -> None:
    """A data directory's name is text from outside: no markup, no escape sequence reaches the terminal."""
    data = tmp_path / "[bold]x[/bold]\x1b[2J"
    assert demo(data, sessions=1, steps=1).code == 0
    out = invoke("doctor", "--data-dir", data, env={"FOLDLINE_ARCHIVE": "off"})
    assert out.code == 0, out.stdout + out.stderr
    assert "[bold]x[/bold]\\x1b[2J" in out.stdout
    assert printable_output(out.stdout)
    assert os.path.isdir(data)
