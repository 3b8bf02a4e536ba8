"""The independent reconstructor (written from docs/FORMAT.md, importing nothing of foldline) matches every
digest of the golden logs and of fresh demo logs."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from foldline.config import Config, open_stores
from foldline.demo import run_demo

from ..golden_logs.layout import ATTACHMENTS_DIR, SESSIONS, jsonl_path
from ..golden_logs.reasoning import REASONING_DIR, REASONING_SESSIONS
from .reconstruct import body_bytes, reconstruct


def export_lines(path: Path) -> list[bytes]:
    return path.read_bytes().split(b"\n")[1:-1]


def test_canonical_json_follows_section_1() -> None:
    cases = [
        (0.7, "0.7"), (1.0, "1.0"), (0.0, "0.0"), (-0.0, "-0.0"), (0.00001, "0.00001"), (1e15, "1000000000000000.0"),
        (0.1 + 0.2, "0.30000000000000004"), (1e16, "1e+16"), (1.5e300, "1.5e+300"), (1e-6, "1e-6"), (5e-324, "5e-324"),
    ]  # fmt: skip
    for value, text in cases:
        assert body_bytes(value).decode() == text
    assert (
        body_bytes({"b": "\u007f\u2028/", "a": "\x01\t", "é": 1})
        == '{"a":"\\u0001\\t","b":"\u007f\u2028/","é":1}'.encode()
    )


def test_every_digest_of_the_v0_golden_logs() -> None:
    kinds = set()
    for session in SESSIONS:
        checks = reconstruct(export_lines(jsonl_path(session)), ATTACHMENTS_DIR)
        assert checks, session
        assert [c for c in checks if not c.ok] == [], session
        kinds |= {c.what for c in checks}
    assert kinds == {"dispatch", "summarize"}


def test_every_digest_of_the_reasoning_golden_logs() -> None:
    kinds = set()
    for session in REASONING_SESSIONS:
        checks = reconstruct(export_lines(REASONING_DIR / f"{session}.jsonl"))
        assert [c for c in checks if not c.ok] == [], session
        kinds |= {c.what for c in checks}
    assert kinds == {"dispatch", "summarize"}


def test_every_digest_of_a_fresh_demo(tmp_path: Path) -> None:
    config = Config(data_dir=tmp_path)
    stores = open_stores(config)
    try:
        result = run_demo(stores, config.data_dir, config.backend, 4, 24, quiet=True)
    finally:
        stores.close()
    assert result.verified_ok
    db = sqlite3.connect(tmp_path / "log.sqlite3")
    try:
        sessions = [row[0] for row in db.execute("SELECT id FROM sessions ORDER BY id")]
        assert {"demo-think", "demo-responses"} <= set(sessions)
        kinds = set()
        for session in sessions:
            rows = db.execute("SELECT body FROM events WHERE session_id=? ORDER BY seq", (session,)).fetchall()
            checks = reconstruct([bytes(r[0]) for r in rows], tmp_path / "attachments")
            assert checks, session
            assert [c for c in checks if not c.ok] == [], session
            kinds |= {c.what for c in checks}
        assert kinds == {"dispatch", "summarize"}
    finally:
        db.close()
