"""``verify`` never passes vacuously: each outcome has its own report line, JSON status and exit status.

It used to create a mistyped data directory, print "verified 0/0" and exit 0, so a CI job with a wrong path
passed; imported sessions without dispatch records verified "0/0" too.
"""

from __future__ import annotations

import io
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from foldline.adapters.sqlite_log import SqliteEventLog
from foldline.core import TextBlock, UserMessage
from foldline.core.events import Envelope, RequestDispatch
from foldline.core.wire import decode_event, encode_event
from foldline.export import export_session
from foldline.replay.verify import VERIFY_EXIT_STATUS
from tests.adversarial.helpers import assert_one_line_error, cli_env, demo, invoke
from tests.factories import simple_log


@pytest.fixture(scope="module")
def demo_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    data = tmp_path_factory.mktemp("verify") / "data"
    assert demo(data, sessions=2, steps=4).code == 0
    return data


def verify_json(data: Path, *sessions: str) -> tuple[int, dict[str, Any]]:
    out = invoke("verify", *sessions, "--data-dir", data, "--json")
    return out.code, json.loads(out.stdout)


def copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def test_the_exit_statuses_are_distinct_and_documented() -> None:
    assert sorted(VERIFY_EXIT_STATUS.values()) == [0, 1, 3, 4, 5]  # 2 stays "an error"
    help_text = invoke("verify", "--help").stdout
    words = ("0 every request", "1 a request differs", "3 a request could not be rebuilt", "4 nothing", "5 a session's")
    for word in words:
        assert word in " ".join(help_text.split()), word


def test_verified(demo_dir: Path) -> None:
    code, report = verify_json(demo_dir)
    assert (code, report["status"]) == (0, "verified")
    # demo-000, -001, the reasoning two, demo-approval and demo-structured
    assert [s["status"] for s in report["sessions"]] == ["verified"] * 6


def test_a_mistyped_data_dir_is_an_error_and_is_not_created(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-dir"
    for args in (["verify"], ["verify", "--json"], ["drops"], ["show", "s"], ["requests", "s"], ["diff", "s"]):
        assert_one_line_error(invoke(*args, "--data-dir", missing), "ConfigError", "no data directory")
        assert not missing.exists()
    assert_one_line_error(invoke("export", "s", "-o", tmp_path / "x", "--data-dir", missing), "no data directory")
    assert not missing.exists()


def test_an_empty_data_dir_checks_nothing_and_says_so(tmp_path: Path) -> None:
    out = invoke("verify", "--data-dir", tmp_path)
    assert out.code == 4
    assert "not-verifiable" in out.stdout
    code, report = verify_json(tmp_path)
    assert (code, report["status"], report["checked"], report["sessions"]) == (4, "not-verifiable", 0, [])
    assert list(tmp_path.iterdir()) == []  # and it wrote nothing there


def test_a_session_without_dispatch_records_is_not_verifiable(tmp_path: Path, demo_dir: Path) -> None:
    data = copy(demo_dir, tmp_path / "data")
    with SqliteEventLog(data) as log:
        log.append("imported", 0, simple_log(2, 2))  # a complete log, but nothing was ever sent through a loop
    code, report = verify_json(data, "imported")
    assert (code, report["status"], report["checked"]) == (4, "not-verifiable", 0)
    # among verified sessions it still decides the outcome: nothing may pass unchecked
    code, report = verify_json(data)
    assert code == 4
    assert {s["id"]: s["status"] for s in report["sessions"]} == {
        "demo-000": "verified",
        "demo-001": "verified",
        "demo-approval": "verified",
        "demo-responses": "verified",
        "demo-structured": "verified",
        "demo-think": "verified",
        "imported": "not-verifiable",
    }
    out = invoke("verify", "--data-dir", data)
    assert "NOT VERIFIABLE imported" in out.stdout


def test_mismatched_beats_everything(tmp_path: Path, demo_dir: Path) -> None:
    data = copy(demo_dir, tmp_path / "data")
    forge_first_message(data / "log.sqlite3", "demo-000")
    (next((data / "attachments" / "objects").rglob("*.meta.json"))).unlink()  # and break an image on demo-001
    code, report = verify_json(data)
    assert code == 1
    assert report["status"] == "mismatched"
    assert {s["id"]: s["status"] for s in report["sessions"]}["demo-000"] == "mismatched"


def test_unreconstructable(tmp_path: Path, demo_dir: Path) -> None:
    data = copy(demo_dir, tmp_path / "data")
    with SqliteEventLog(data, read_only=True) as log:
        images = [
            b.image.attachment_id
            for e in log.read("demo-001")
            if isinstance(e.data, UserMessage)
            for b in e.data.content
            if hasattr(b, "image")
        ]
    assert images
    hexd = images[0].removeprefix("sha256:")
    (data / "attachments" / "objects" / hexd[:2] / hexd).unlink()
    code, report = verify_json(data)
    assert (code, report["status"]) == (3, "unreconstructable")
    out = invoke("verify", "--data-dir", data)
    assert out.code == 3
    assert "UNRECONSTRUCTABLE demo-001" in out.stdout


def test_the_summary_survives_a_pipe_whole(demo_dir: Path) -> None:
    """`foldline verify | tail -1` printed one word: a hard wrap at 80 columns."""
    cmd = f"{sys.executable} -m foldline.cli verify --data-dir '{demo_dir}' | tail -1"
    done = subprocess.run(["sh", "-c", cmd], capture_output=True, text=True, env=cli_env(COLUMNS="20"), check=False)
    assert done.stdout.startswith("verified: ")
    assert "0 session(s) not verifiable" in done.stdout  # the end of the one summary line
    assert done.stdout.count("\n") == 1


def test_an_export_imported_without_its_dispatches_is_not_verifiable(tmp_path: Path, demo_dir: Path) -> None:
    """The export/import round trip keeps the dispatch records, so the copy verifies; a log stripped of
    them (as another harness's history would be) imports, and is reported as not verifiable."""
    with SqliteEventLog(demo_dir, read_only=True) as log:
        buf = io.BytesIO()
        export_session(log, "demo-000", buf)
        events = log.read("demo-000")
    target = tmp_path / "other"
    assert invoke("import", "-", "--data-dir", target, input=buf.getvalue()).code == 0
    assert verify_json(target)[0] == 0
    kept = [e for e in events if not isinstance(e.data, RequestDispatch)]
    stripped = [Envelope(i, e.time, e.data) for i, e in enumerate(kept)]
    with SqliteEventLog(target) as log:
        log.append("stripped", 0, stripped)
    code, report = verify_json(target, "stripped")
    assert (code, report["status"]) == (4, "not-verifiable")


def forge_first_message(db: Path, session: str) -> None:
    """Rewrite a logged user message behind the log's back (what verify exists to catch)."""
    import sqlite3

    conn = sqlite3.connect(db)
    for seq, body in conn.execute("SELECT seq, body FROM events WHERE session_id=? ORDER BY seq", (session,)):
        e = decode_event(bytes(body))
        if isinstance(e.data, UserMessage):
            forged = Envelope(e.seq, e.time, UserMessage(e.data.id, (TextBlock("forged"),), e.data.source))
            conn.execute("UPDATE events SET body=? WHERE session_id=? AND seq=?", (encode_event(forged), session, seq))
            break
    conn.commit()
    conn.close()
