"""The golden sealed logs (``tests/fixtures/golden-logs/sealed/``, written by ``tests.golden_logs.sealed``): a
session as the embedded log stores it with encryption on, the same as Kafka records, and the export of an erased
session. Every build must read them: open the stored form with its key into exactly the logged session, and show
the erased one's structure with no way to its content."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from foldline.adapters.avro import AvroCodec
from foldline.adapters.memory_keys import MemoryKeyStore
from foldline.adapters.sealing import ContentSealer
from foldline.cli.main import app
from foldline.core.events import RequestDispatch, SessionErased
from foldline.core.sealing import content_paths, erased_view
from foldline.core.wire import decode_canonical, decode_event
from foldline.ports.key_store import SessionKey
from foldline.replay.verify import verify_events

from .layout import ATTACHMENTS_DIR, read_records, verify_path
from .sealed import ERASED, KEYS, RECORDS, STORED
from .test_golden_logs import event_lines, golden_events


def _sealer() -> ContentSealer:
    keys = MemoryKeyStore()
    for sid, k in json.loads(KEYS.read_text()).items():
        keys.create(SessionKey(sid, k["kid"], bytes.fromhex(k["key"]), 0))
    return ContentSealer(keys)


def stored_lines() -> list[bytes]:
    return STORED.read_bytes().split(b"\n")[:-1]


def test_the_stored_form_is_canonical_holds_no_content_and_opens_to_the_logged_session() -> None:
    stored = []
    for line in stored_lines():
        env, canonical = decode_canonical(line)
        assert canonical == line
        stored.append(env)
    plain = golden_events("golden-anthropic")
    assert _sealer().open("golden-anthropic", stored) == plain
    for s, p in zip(stored, plain, strict=True):
        assert (s.sealed is not None) == bool(content_paths(p)), s.seq
    raw = STORED.read_bytes()
    assert b"How do the events of one session stay in order" in b"".join(event_lines("golden-anthropic"))
    assert b"How do the events of one session stay in order" not in raw
    assert b"You are a meticulous" not in raw  # the system prompt


def test_the_stored_form_verifies_with_its_key() -> None:
    events = _sealer().open("golden-anthropic", [decode_event(line) for line in stored_lines()])
    from foldline.adapters.fs_attachments import FilesystemAttachmentStore

    report = verify_events("golden-anthropic", events, FilesystemAttachmentStore(ATTACHMENTS_DIR, read_only=True))
    assert report.to_json() == json.loads(verify_path("golden-anthropic").read_text())


def test_the_sealed_kafka_records_decode_to_the_stored_form() -> None:
    codec = AvroCodec()
    records = read_records(RECORDS.read_bytes())
    assert [codec.decode(r) for r in records] == [decode_event(line) for line in stored_lines()]


def test_an_erased_sessions_export_shows_its_structure_and_nothing_opens_it(tmp_path: Path) -> None:
    lines = ERASED.read_bytes().split(b"\n")[1:-1]
    erased = [decode_event(line) for line in lines]
    plain = golden_events("golden-openai")
    assert len(erased) == len(plain) + 1
    mark = erased[-1]
    assert isinstance(mark.data, SessionErased)
    assert mark.ignorable
    assert (mark.data.scope, mark.data.by, mark.data.reason) == (
        "session",
        "golden@generator",
        "a golden erased session",
    )
    for e, p in zip(erased[:-1], plain, strict=True):  # the same structure: the content alone is gone
        assert erased_view(e).data == erased_view(p.__class__(p.seq, p.time, p.data, p.ignorable, e.sealed)).data
        if isinstance(p.data, RequestDispatch):
            assert e.data == p.data  # the dispatch digests stay
    assert b"What does this chart show" not in ERASED.read_bytes()
    shutil.copytree(ATTACHMENTS_DIR, tmp_path / "attachments")
    res = CliRunner().invoke(app, ["import", str(ERASED), "--data-dir", str(tmp_path)])
    assert res.exit_code == 2
    assert "sealed content" in res.output


@pytest.mark.parametrize("path", [STORED, ERASED], ids=lambda p: p.name)
def test_the_sealed_files_decode_without_a_key(path: Path) -> None:
    lines = path.read_bytes().split(b"\n")[:-1]
    if path == ERASED:
        lines = lines[1:]
    assert all(decode_event(line).seq == i for i, line in enumerate(lines))
