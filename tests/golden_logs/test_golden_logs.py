"""The golden session logs of format version 0 (``tests/fixtures/golden-logs/v0/``), checked byte for byte.

They were written once by ``tests/golden_logs/generate.py`` and are never regenerated here. Every stored
log must keep decoding and re-encoding to exactly these bytes — as JSON lines and as Kafka Avro records —
and keep verifying; so renaming a logged field, changing an encoding or an Avro field, or changing what a
request is rebuilt from fails one of these tests.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import get_args

import orjson
import pytest
from typer.testing import CliRunner

from foldline.adapters.avro import SINGLE_OBJECT_MAGIC, AvroCodec
from foldline.adapters.fs_attachments import FilesystemAttachmentStore
from foldline.cli.main import app
from foldline.core.content import ContentBlock, ImageBlock, ReasoningContent, TextBlock, ToolResultBlock
from foldline.core.events import (
    TURN_END_REASONS,
    USER_SOURCES,
    AssistantChunk,
    AssistantMessage,
    AttachmentQuarantine,
    CompactionStart,
    CompactionSummary,
    Envelope,
    EventData,
    LlmRetry,
    ReplaceOp,
    RequestDispatch,
    RequestHeader,
    SessionEndSeed,
    SessionErased,
    ToolResult,
    TurnEnd,
    UnknownEvent,
    UserMessage,
)
from foldline.core.header import HEADER_REASONS
from foldline.core.wire import decode_event, encode_event
from foldline.replay.verify import Mismatch, verify_events

from .layout import (
    ATTACHMENTS_DIR,
    GOLDEN_DIR,
    LINKED,
    SESSIONS,
    avro_dir,
    jsonl_path,
    read_records,
    records_path,
    verify_path,
)

runner = CliRunner()
CODEC = AvroCodec()
FIRST_PROMPT = TextBlock("How do the events of one session stay in order, and what does this chart show?")


def event_lines(session: str) -> list[bytes]:
    """The event lines of a golden export file, without their LF."""
    data = jsonl_path(session).read_bytes()
    assert data.endswith(b"\n")
    return data.split(b"\n")[1:-1]


def golden_events(session: str) -> list[Envelope]:
    return [decode_event(line) for line in event_lines(session)]


def blocks_of(events: list[Envelope]) -> Iterator[ContentBlock]:
    for e in events:
        if isinstance(e.data, UserMessage | AssistantMessage | ToolResult):
            stack: list[ContentBlock] = list(e.data.content)
            while stack:
                block = stack.pop()
                yield block
                if isinstance(block, ToolResultBlock):
                    stack.extend(block.content)


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    """An empty embedded data directory holding the golden attachment objects."""
    shutil.copytree(ATTACHMENTS_DIR, tmp_path / "attachments")
    return tmp_path


# ---------------------------------------------------------------------------- the bytes


@pytest.mark.parametrize("session", SESSIONS)
def test_every_line_decodes_and_reencodes_to_identical_bytes(session: str) -> None:
    lines = event_lines(session)
    header = json.loads(jsonl_path(session).read_bytes().split(b"\n", 1)[0])
    assert (header["sessionId"], header["events"], header["formatVersion"]) == (session, len(lines), 0)
    for seq, line in enumerate(lines):
        env = decode_event(line)
        assert env.seq == seq
        assert encode_event(env) == line, f"{session} seq {seq}: the event no longer encodes to its logged bytes"


def test_the_current_avro_schema_has_golden_streams() -> None:
    missing = [s for s in SESSIONS if not records_path(CODEC.fingerprint, s).is_file()]
    assert not missing, (
        f"no golden Avro stream for schema fingerprint {CODEC.fingerprint.hex()}: {missing}. The record encoding "
        "changed. If that is a reviewed schema change (docs/SCHEMAS.md), keep the existing streams and add the new "
        "ones with `python -m tests.golden_logs.generate --avro-only`; otherwise restore the schema."
    )


@pytest.mark.parametrize("session", SESSIONS)
def test_avro_records_decode_to_the_logged_events_and_reencode_identically(session: str) -> None:
    lines = event_lines(session)
    streams = sorted(GOLDEN_DIR.glob(f"avro-*/{session}.records"))
    assert streams, f"{session} has no Avro record stream"
    for path in streams:
        fingerprint = bytes.fromhex(path.parent.name.removeprefix("avro-"))
        records = read_records(path.read_bytes())
        assert len(records) == len(lines), f"{path}: {len(records)} records for {len(lines)} events"
        for seq, (record, line) in enumerate(zip(records, lines, strict=True)):
            assert record[:10] == SINGLE_OBJECT_MAGIC + fingerprint
            env = CODEC.decode(record)
            assert env == decode_event(line), f"{path} seq {seq}: the record decodes to another event"
            if fingerprint == CODEC.fingerprint:
                assert CODEC.encode(env) == record, f"{path} seq {seq}: the event no longer encodes to this record"
    assert avro_dir(CODEC.fingerprint) in {p.parent for p in streams}


# ---------------------------------------------------------------------------- import, verify, export


@pytest.mark.parametrize("session", SESSIONS)
def test_imports_verifies_and_exports_unchanged(session: str, data_dir: Path) -> None:
    res = runner.invoke(app, ["import", str(jsonl_path(session)), "--data-dir", str(data_dir)])
    assert res.exit_code == 0, res.output
    for linked in LINKED.get(session, ()):  # the other end of its lineage, which verify reads
        res = runner.invoke(app, ["import", str(jsonl_path(linked)), "--data-dir", str(data_dir)])
        assert res.exit_code == 0, res.output
    events = golden_events(session)
    dispatches = [e.seq for e in events if isinstance(e.data, RequestDispatch)]
    quarantines = [e.seq for e in events if isinstance(e.data, AttachmentQuarantine)]

    res = runner.invoke(app, ["verify", session, "--data-dir", str(data_dir), "--json"])
    assert res.exit_code == (3 if quarantines else 0), res.output  # 3: unreconstructable
    report = json.loads(res.stdout)
    # the report's fields come first, byte for byte as recorded; then the outcome, overall and per session
    fields = {k: v for k, v in report.items() if k not in ("status", "sessions")}
    assert orjson.dumps(fields) + b"\n" == verify_path(session).read_bytes()
    status = "unreconstructable" if quarantines else "verified"
    assert (report["status"], report["sessions"]) == (
        status,
        [{"id": session, "status": status, "checked": report["checked"], "matched": report["matched"]}],
    )
    assert report["matched"] == len(dispatches) > 0
    assert report["checked"] == len(dispatches) + len(quarantines)
    assert report["mismatched"] == []
    assert [u["seq"] for u in report["unreconstructable"]] == quarantines

    out = data_dir / "exported.jsonl"
    res = runner.invoke(app, ["export", session, "--out", str(out), "--data-dir", str(data_dir)])
    assert res.exit_code == 0, res.output
    assert out.read_bytes() == jsonl_path(session).read_bytes()


def _tampered(session: str, seq: int, old: bytes, new: bytes, *, fix_digest: bool) -> bytes:
    """The export file with one byte of event ``seq`` changed (``old`` → ``new``), digest recomputed or not."""
    assert len(old) == len(new)
    assert sum(a != b for a, b in zip(old, new, strict=True)) == 1
    header, *lines = jsonl_path(session).read_bytes().split(b"\n")
    assert lines[seq].count(old) == 1
    lines[seq] = lines[seq].replace(old, new)
    body = b"".join(line + b"\n" for line in lines[:-1])
    if fix_digest:
        values = json.loads(header)
        values["digest"] = "sha256:" + hashlib.sha256(body).hexdigest()
        header = json.dumps(values, separators=(",", ":"), sort_keys=True).encode()
    return header + b"\n" + body


def _first_prompt(events: list[Envelope]) -> Envelope:
    """The user/message of the first turn of golden-anthropic (after the carried-over history)."""
    return next(e for e in events if isinstance(e.data, UserMessage) and e.data.content[0] == FIRST_PROMPT)


def test_a_changed_model_visible_byte_imports_but_fails_verify(data_dir: Path) -> None:
    session = "golden-anthropic"
    events = golden_events(session)
    prompt = _first_prompt(events)
    path = data_dir / "tampered.jsonl"
    path.write_bytes(_tampered(session, prompt.seq, b'"How do the', b'"Now do the', fix_digest=True))
    res = runner.invoke(app, ["import", str(path), "--data-dir", str(data_dir)])
    assert res.exit_code == 0, res.output

    res = runner.invoke(app, ["verify", session, "--data-dir", str(data_dir), "--json"])
    assert res.exit_code == 1, res.output
    report = json.loads(res.stdout)
    compaction = next(e.seq for e in events if isinstance(e.data, CompactionStart))
    summary = next(e.seq for e in events if isinstance(e.data, CompactionSummary))
    dispatches = {e.seq: e.data for e in events if isinstance(e.data, RequestDispatch)}
    # every request that carried the message is caught; the compaction that summarized it is too; the requests
    # after the compaction see only the logged summary and still match
    affected = [seq for seq in dispatches if prompt.seq < seq < compaction]
    assert [m["seq"] for m in report["mismatched"]] == affected
    assert [u["seq"] for u in report["unreconstructable"]] == [summary]
    assert "rebuilt summarize body has digest" in report["unreconstructable"][0]["reason"]
    assert report["matched"] == len(dispatches) - len(affected)

    tampered = [decode_event(line) for line in path.read_bytes().split(b"\n")[1:-1]]
    typed = verify_events(session, tampered, FilesystemAttachmentStore(data_dir / "attachments"))
    assert [m.seq for m in typed.mismatched] == affected
    for m in typed.mismatched:
        d = dispatches[m.seq]
        assert m == Mismatch(session, d.turn, d.step, m.seq, d.digest, m.rebuilt, None)  # bodies were not archived
        assert m.rebuilt != m.recorded


def test_a_changed_byte_without_a_new_digest_is_refused(data_dir: Path) -> None:
    session = "golden-anthropic"
    path = data_dir / "tampered.jsonl"
    seq = _first_prompt(golden_events(session)).seq
    path.write_bytes(_tampered(session, seq, b'"How do the', b'"Now do the', fix_digest=False))
    res = runner.invoke(app, ["import", str(path), "--data-dir", str(data_dir)])
    assert res.exit_code == 2
    assert "line 1" in res.output
    assert "digest" in res.output
    res = runner.invoke(app, ["sessions", "--data-dir", str(data_dir), "--json"])
    assert json.loads(res.stdout) == []


# ---------------------------------------------------------------------------- what they cover


def test_the_golden_logs_cover_the_whole_catalog() -> None:
    events = [e for s in SESSIONS for e in golden_events(s)]
    datas = [e.data for e in events]
    newer = {SessionErased}  # newer than these logs: test_sealed_logs covers it
    assert {type(d) for d in datas} == set(get_args(EventData)) - newer, "an event type has no golden example"
    reasoning = set(get_args(ReasoningContent))  # newer than most of these logs: test_reasoning_logs covers them
    assert {type(b) for b in blocks_of(events)} - reasoning == set(get_args(ContentBlock)) - reasoning, (
        "a block kind has no example"
    )
    assert {d.source for d in datas if isinstance(d, UserMessage)} == USER_SOURCES
    assert {d.reason for d in datas if isinstance(d, TurnEnd)} == TURN_END_REASONS
    assert {d.reason for d in datas if isinstance(d, RequestHeader)} == HEADER_REASONS
    assert {d.stop_reason for d in datas if isinstance(d, AssistantMessage)} == {
        "end_turn",
        "tool_use",
        "max_tokens",
        "stop_sequence",
        "pause_turn",
        "refusal",
        "interrupted",
        "model_context_window_exceeded",
    }
    assert {(d.serializer, d.serializer_version) for d in datas if isinstance(d, RequestDispatch)} == {
        ("anthropic-messages", 1),
        ("anthropic-messages", 3),
        ("openai-chat", 1),
        ("openai-chat", 2),
        ("openai-responses", 2),
    }
    usages = [d.usage for d in datas if isinstance(d, AssistantMessage) and d.usage is not None]
    assert any(u.cache_write_1h for u in usages), "no golden example of a 1-hour cache write"
    assert any(u.reasoning_tokens for u in usages), "no golden example of counted reasoning tokens"
    assert any(isinstance(d, RequestHeader) and d.header.config.stream for d in datas)
    assert any(isinstance(d, AssistantMessage) and d.provider_request_id and d.provider_message_id for d in datas)
    retries = [d for d in datas if isinstance(d, LlmRetry)]
    assert {r.wait_ms is None for r in retries} == {True, False}
    assert {r.status is None for r in retries} == {True, False}
    assert all(e.ignorable for e in events if isinstance(e.data, LlmRetry | AssistantChunk))
    assert {d.usage is None for d in datas if isinstance(d, AssistantMessage)} == {True, False}
    results = [d for d in datas if isinstance(d, ToolResult)]
    assert any(r.is_error for r in results)
    assert any(isinstance(p, ImageBlock) for r in results for p in r.content)
    assert any(isinstance(r.surface_op, ReplaceOp) and r.surface_op.start == r.surface_op.end for r in results)
    assert any(
        isinstance(d, UserMessage) and d.source == "compaction" and isinstance(d.surface_op, ReplaceOp) for d in datas
    )
    assert any(isinstance(d, UserMessage) and any(isinstance(b, ImageBlock) for b in d.content) for d in datas)
    assert any(isinstance(d, SessionEndSeed) and d.parent_id is not None for d in datas)
    assert any(isinstance(e.data, UnknownEvent) and e.ignorable for e in events)


def test_the_attachment_objects_are_exactly_the_referenced_ones() -> None:
    store = FilesystemAttachmentStore(ATTACHMENTS_DIR)
    referenced = {
        b.image.attachment_id: b.image
        for s in SESSIONS
        for b in blocks_of(golden_events(s))
        if isinstance(b, ImageBlock)
    }
    stored = {"sha256:" + p.name for p in (ATTACHMENTS_DIR / "objects").glob("*/*") if "." not in p.name}
    assert stored == set(referenced)
    for attachment_id, ref in referenced.items():
        store.get(attachment_id, ref)  # re-hashed, metadata checked
