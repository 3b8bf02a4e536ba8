"""Nothing foldline did not create is ever deleted; two demos on one data directory cannot destroy each other.

The demo used to clear its data directory recursively: pointed at a project it removed the sources and
``.git``; a second demo deleted the first one's live database while the first still reported success.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from foldline.adapters.sqlite_log import SqliteEventLog
from foldline.demo_data_dir import LOCK_NAME, MARKER_NAME, demo_data_dir
from tests.adversarial.helpers import assert_one_line_error, cli_env, demo, invoke
from tests.factories import simple_log


def tree(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` with its bytes (what must survive)."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def project(root: Path) -> Path:
    (root / ".git" / "objects").mkdir(parents=True)
    (root / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (root / "src").mkdir()
    (root / "src" / "app.py").write_text("print('precious')\n")
    (root / "README.md").write_text("# my project\n")
    return root


def test_a_project_directory_is_refused_and_left_as_it_was(tmp_path: Path) -> None:
    root = project(tmp_path / "project")
    before = tree(root)
    out = demo(root)
    assert_one_line_error(out, "ConfigError", "not empty", "--keep")
    assert tree(root) == before


def test_the_data_dir_from_the_environment_is_refused_too(tmp_path: Path) -> None:
    home = project(tmp_path / "home")
    before = tree(home)
    out = invoke("demo", "--sessions", "1", "--steps", "1", "--json", env={"FOLDLINE_DATA_DIR": str(home)})
    assert_one_line_error(out, "not empty")
    assert tree(home) == before


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(names=st.lists(st.text("abcdefgh.-_", min_size=1, max_size=12), min_size=1, max_size=4, unique=True))
def test_any_foreign_content_is_refused(tmp_path_factory: pytest.TempPathFactory, names: list[str]) -> None:
    root = tmp_path_factory.mktemp("foreign")
    for name in names:
        if name not in (".", ".."):
            (root / name).write_text("mine")
    before = tree(root)
    if not before:
        return
    assert_one_line_error(demo(root, sessions=1, steps=1), "not empty")
    assert tree(root) == before


def test_keep_adds_to_a_foreign_directory_and_deletes_nothing(tmp_path: Path) -> None:
    root = project(tmp_path / "project")
    before = tree(root)
    out = demo(root, sessions=1, steps=2, extra=["--keep"])
    assert out.code == 0, out.stderr
    after = tree(root)
    assert {k: v for k, v in after.items() if k in before} == before  # every file of the project, unchanged
    assert "log.sqlite3" in after


def test_a_fresh_run_clears_only_the_demos_own_files(tmp_path: Path) -> None:
    data = tmp_path / "data"
    assert demo(data).code == 0
    (data / "notes.txt").write_text("my notes")
    (data / "attachments" / "mine.png").write_bytes(b"not an object")
    (data / "attachments" / "objects" / "keep-me").write_text("x")
    assert demo(data, sessions=1, steps=2).code == 0
    assert (data / "notes.txt").read_text() == "my notes"
    assert (data / "attachments" / "mine.png").read_bytes() == b"not an object"
    assert (data / "attachments" / "objects" / "keep-me").read_text() == "x"
    with SqliteEventLog(data, read_only=True) as log:
        # the earlier run's demo-001 was the demo's to clear (the reasoning, approval and structured sessions come with
        # every run)
        assert log.sessions() == ["demo-000", "demo-approval", "demo-responses", "demo-structured", "demo-think"]


def test_a_fresh_run_keeps_a_log_that_holds_more_than_demo_sessions(tmp_path: Path) -> None:
    data = tmp_path / "data"
    assert demo(data).code == 0
    with SqliteEventLog(data) as log:
        log.append("my-work", 0, simple_log(1, 1))
    before = tree(data)
    assert_one_line_error(demo(data, sessions=1, steps=1), "did not write", "'my-work'")
    assert tree(data) == before


def test_a_demo_holding_the_directory_keeps_a_second_demo_out(tmp_path: Path) -> None:
    data = tmp_path / "data"
    assert demo(data).code == 0
    before = tree(data)
    with demo_data_dir(data, fresh=False):  # a running demo holds the lock
        for extra in ([], ["--keep"]):
            assert_one_line_error(demo(data, sessions=1, steps=1, extra=extra), "StoreBusy", "another foldline demo")
    assert tree(data) == before


def test_a_fresh_run_does_not_clear_a_log_another_process_has_open(tmp_path: Path) -> None:
    data = tmp_path / "data"
    assert demo(data).code == 0
    with SqliteEventLog(data, checkpoint_interval_s=0):  # e.g. a `foldline resume` still running
        assert_one_line_error(demo(data, sessions=1, steps=1), "StoreBusy", "open in another process")
    with SqliteEventLog(data, read_only=True) as log:
        assert log.sessions() == [
            "demo-000",
            "demo-001",
            "demo-approval",
            "demo-responses",
            "demo-structured",
            "demo-think",
        ]


def test_two_demos_started_together_on_one_data_dir(tmp_path: Path) -> None:
    """Real processes: one runs to completion with every session verified; the other stops at once."""
    data = tmp_path / "data"
    args = [sys.executable, "-m", "foldline.cli", "demo", "--sessions", "4", "--steps", "24", "--json"]
    env = cli_env()
    first = subprocess.Popen([*args, "--data-dir", str(data)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    deadline = time.monotonic() + 60
    while not (data / LOCK_NAME).exists() or os.path.getsize(data / LOCK_NAME) == 0:
        assert time.monotonic() < deadline
        assert first.poll() is None
        time.sleep(0.05)
    second = subprocess.run([*args, "--data-dir", str(data)], capture_output=True, env=env, check=False, timeout=120)
    out, err = first.communicate(timeout=300)
    if second.returncode == 0:  # the first had already finished: the second ran after it, alone
        assert first.returncode == 0
    else:
        assert second.returncode == 2
        assert b"StoreBusy" in second.stderr
    assert first.returncode == 0, err.decode()
    report = json.loads(out)
    assert all(s["verified"] for s in report["sessions"])
    with SqliteEventLog(data, read_only=True) as log:
        assert len(log.sessions()) == 8  # four, the two reasoning sessions, demo-approval and demo-structured
    assert (data / MARKER_NAME).exists()


def test_the_demo_marks_only_a_directory_it_created_or_found_empty(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    assert demo(empty, sessions=1, steps=1).code == 0
    assert (empty / MARKER_NAME).exists()
    foreign = project(tmp_path / "project")
    assert demo(foreign, sessions=1, steps=1, extra=["--keep"]).code == 0
    assert not (foreign / MARKER_NAME).exists()  # so a later fresh run still refuses it
    assert_one_line_error(demo(foreign, sessions=1, steps=1), "not empty")
