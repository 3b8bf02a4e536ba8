"""Export / import of one session: byte-identical round trips, and bad files rejected by line, writing nothing."""

from __future__ import annotations

import hashlib
import io
import sqlite3
from pathlib import Path
from typing import Any

import orjson
import pytest

from foldline.adapters.memory_log import MemoryEventLog
from foldline.adapters.sqlite_log import SqliteEventLog
from foldline.core import (
    CallConfig,
    CompactionEnd,
    CompactionStart,
    CompactionSummary,
    Envelope,
    ImageBlock,
    ImageRef,
    ReplaceOp,
    RequestDispatch,
    RequestHeader,
    SessionEndSeed,
    TextBlock,
    ToolResult,
    ToolSpec,
    UnknownEvent,
    Usage,
    UserMessage,
    encode_event,
    make_header,
)
from foldline.core.frozen import FrozenDict
from foldline.core.limits import MAX_EVENT_BYTES
from foldline.core.validation import LogRules
from foldline.errors import ImportFailed, SessionExists, SessionNotFound
from foldline.export import export_session, import_session
from foldline.ports.event_log import EventLog
from tests.factories import LogBuilder, event_of_size, simple_log

IMAGE = ImageRef("sha256:" + "ab" * 32, "image/png", 1234, 64, 48)


def surface_seqs(events: list[Envelope], start: int, end: int) -> tuple[int, ...]:
    """The seqs of the visible surface entries ``start..end`` after ``events``."""
    rules = LogRules()
    rules.check_batch(events)
    return tuple(node.seq for node in rules.surface[start : end + 1])


def rich_log() -> list[Envelope]:
    """A valid log touching every event type and the awkward encodings (floats, images, replaces)."""
    b = LogBuilder().header()
    b.add(SessionEndSeed("parent", 1))
    b.turn(0, "first question", steps=2)  # surface: user, assistant(tool-call), tool/result, assistant
    b.add(UserMessage(f"u{b.seq}", (TextBlock("look"), ImageBlock(IMAGE)), "inject"))
    b.tool_round(1, 0, result="a long tool output " * 5)  # surface 5, 6
    b.add(ToolResult("call-1", "read", (TextBlock("trimmed"),), False, ReplaceOp(6, 6), surface_seqs(b.events, 6, 6)))
    b.add(ToolResult("call-0", "read", (TextBlock("ok?"),), False, ReplaceOp(2, 2), surface_seqs(b.events, 2, 2)))
    tools = (ToolSpec("read", "Read a file", {"type": "object", "properties": {"path": {"type": "string"}}}),)
    config = CallConfig("anthropic", "m2", temperature=0.7, stop=("END",), reasoning_effort="low")
    b.add(RequestHeader(make_header(config, "s", tools), "change"))
    b.add(RequestDispatch(1, 0, "anthropic-messages", 1, "sha256:" + "0" * 64, 2048))
    b.add(CompactionStart(0, 3, 4000))
    b.add(CompactionSummary("summary of the start", "anthropic", "m2", 1024, Usage(100, 20, 5, 0)))
    hidden = surface_seqs(b.events, 0, 3)
    b.add(UserMessage(f"u{b.seq}", (TextBlock("summary"),), "compaction", ReplaceOp(0, 3), hidden))
    b.add(CompactionEnd())
    b.assistant("done")
    unknown = UnknownEvent("future/thing", FrozenDict({"x": 1.0, "y": (1, "é😀")}))
    b.events.append(Envelope(b.seq, 1_700_000_009_999, unknown, ignorable=True))
    return b.events


def export_bytes(log: EventLog, session_id: str) -> bytes:
    out = io.BytesIO()
    export_session(log, session_id, out)
    return out.getvalue()


def make_file(lines: list[bytes], *, sid: str = "s", events: Any = None, digest: str | None = None) -> bytes:
    body = b"".join(line + b"\n" for line in lines)
    header = {
        "foldline": "session-export",
        "formatVersion": 0,
        "sessionId": sid,
        "events": len(lines) if events is None else events,
        "digest": digest or "sha256:" + hashlib.sha256(body).hexdigest(),
    }
    return orjson.dumps(header, option=orjson.OPT_SORT_KEYS) + b"\n" + body


def lines_of(events: list[Envelope]) -> list[bytes]:
    return [encode_event(e) for e in events]


def raw_event(etype: str, seq: int, data: dict[str, Any], **extra: Any) -> bytes:
    return orjson.dumps({"type": etype, "seq": seq, "time": 5, "data": data, **extra}, option=orjson.OPT_SORT_KEYS)


# ------------------------------------------------------------------ round trips


def test_round_trip_is_byte_identical_and_equals_the_stored_bytes(tmp_path: Path) -> None:
    events = rich_log()
    with SqliteEventLog(tmp_path / "a") as src:
        src.append("s", 0, events[:10])
        src.append("s", 10, events[10:])
        first = export_bytes(src, "s")
    stored = [
        bytes(row[0])
        for row in sqlite3.connect(tmp_path / "a" / "log.sqlite3").execute(
            "SELECT body FROM events WHERE session_id='s' ORDER BY seq"
        )
    ]
    header, *rest = first.split(b"\n")[:-1]
    assert rest == stored == lines_of(events)
    assert orjson.loads(header) == {
        "foldline": "session-export",
        "formatVersion": 0,
        "sessionId": "s",
        "events": len(events),
        "digest": "sha256:" + hashlib.sha256(b"".join(line + b"\n" for line in stored)).hexdigest(),
    }
    with SqliteEventLog(tmp_path / "b") as dst:
        summary = import_session(dst, io.BytesIO(first))
        assert (summary.session_id, summary.events) == ("s", len(events))
        assert dst.read("s") == events
        assert export_bytes(dst, "s") == first


def test_import_as_new_id_keeps_every_event_byte_for_byte() -> None:
    log = MemoryEventLog()
    log.append("orig", 0, simple_log())
    data = export_bytes(log, "orig")
    summary = import_session(log, io.BytesIO(data), as_id="copy")
    assert summary.session_id == "copy"
    assert log.sessions() == ["copy", "orig"]
    assert lines_of(log.read("copy")) == lines_of(log.read("orig"))
    # the copy's export differs only in the header's sessionId
    copy = export_bytes(log, "copy")
    assert copy.split(b"\n", 1)[1] == data.split(b"\n", 1)[1]
    assert orjson.loads(copy.split(b"\n", 1)[0])["sessionId"] == "copy"


def test_export_of_an_unknown_session_fails_typed() -> None:
    with pytest.raises(SessionNotFound):
        export_bytes(MemoryEventLog(), "nope")


def test_import_streams_a_large_session() -> None:
    b = LogBuilder().header()
    for t in range(400):
        b.turn(t, f"q{t}", steps=3)
    log = MemoryEventLog()
    data = make_file(lines_of(b.events))
    assert import_session(log, io.BytesIO(data)).events == len(b.events) > 5000
    assert export_bytes(log, "s") == data


# ------------------------------------------------------------------ bad files


def assert_rejected(data: bytes, line: int, *needles: str, as_id: str | None = None) -> ImportFailed:
    log = MemoryEventLog()
    log.append("other", 0, simple_log(1, 1))
    with pytest.raises(ImportFailed) as info:
        import_session(log, io.BytesIO(data), as_id)
    err = info.value
    assert err.line == line, str(err)
    for needle in needles:
        assert needle in err.reason, err.reason
    assert f"line {line}:" in str(err)
    assert "Nothing was imported" in str(err)
    assert log.sessions() == ["other"]
    assert log.head(as_id or "s") == 0
    return err


GOOD = lines_of(simple_log(2, 2))


def test_malformed_json_names_its_line() -> None:
    lines = [*GOOD[:3], b'{"type": "turn/start", "seq": 3,', *GOOD[4:]]
    assert_rejected(make_file(lines), 5, "malformed JSON", "[rule format]")


def test_a_gap_in_seqs_names_its_line() -> None:
    lines = [*GOOD[:6], *GOOD[7:]]
    assert_rejected(make_file(lines), 8, "expected seq 6", "got 7", "[rule seq-gapless]")


def test_a_log_not_starting_at_seq_0_is_rejected_on_line_2() -> None:
    assert_rejected(make_file(GOOD[1:]), 2, "expected seq 0", "[rule seq-gapless]")


def test_a_legacy_header_delta_is_rejected() -> None:
    lines = [*GOOD[:4], raw_event("request/header-delta", 4, {"system": "x"}, ignorable=True)]
    assert_rejected(make_file(lines), 6, "legacy", "[rule legacy-header-delta]")


def test_the_fallback_reason_is_rejected() -> None:
    header = {"config": {"model": "m", "provider": "p"}}
    lines = [*GOOD[:2], raw_event("request/header", 2, {"header": header, "reason": "fallback"})]
    assert_rejected(make_file(lines), 4, "fallback", "[rule legacy-fallback-reason]")


def test_a_replace_that_hides_without_listing_is_rejected() -> None:
    b = LogBuilder().header().user("one").assistant("two")
    hide_all = UserMessage("u3", (TextBlock("s"),), "user", ReplaceOp(0, 1), (b.events[1].seq,))
    b.add(hide_all)
    assert_rejected(make_file(lines_of(b.events)), 5, "hides event seq(s) [2]", "[rule replace-lists-hidden]")


def test_a_replace_outside_the_surface_is_rejected() -> None:
    b = LogBuilder().header().user("one")
    b.add(UserMessage("u2", (TextBlock("s"),), "user", ReplaceOp(0, 3), (1,)))
    assert_rejected(make_file(lines_of(b.events)), 4, "[rule replace-range]")


def test_a_tool_result_without_its_call_is_rejected() -> None:
    b = LogBuilder().header().user("one")
    b.add(ToolResult("ghost", "read", (TextBlock("x"),)))
    assert_rejected(make_file(lines_of(b.events)), 4, "'ghost'", "[rule tool-result-call]")


def test_a_tool_call_whose_arguments_differ_from_its_answer_is_rejected() -> None:
    """The answer asked for one thing, the logged call says another: the file is refused at that line."""
    b = LogBuilder().header().user("one")
    b.tool_round(0, 0)
    lines = lines_of(b.events)
    call = orjson.loads(lines[3])
    assert call["type"] == "tool/call"
    call["data"]["arguments"] = '{"path":"/etc/shadow"}'
    lines[3] = orjson.dumps(call, option=orjson.OPT_SORT_KEYS)
    assert_rejected(make_file(lines), 5, "'call-0'", "arguments", "[rule tool-call-block]")


def test_an_unknown_type_that_is_not_ignorable_is_rejected() -> None:
    lines = [*GOOD[:1], raw_event("future/thing", 1, {})]
    assert_rejected(make_file(lines), 3, "[rule unknown-type]")


def test_surface_fields_on_a_non_surface_event_are_rejected() -> None:
    lines = [*GOOD[:1], raw_event("turn/start", 1, {"turn": 0, "surfaceOp": "append"})]
    assert_rejected(make_file(lines), 3, "[rule surface-fields-only-on-surface]")


def test_a_non_canonical_line_is_rejected_even_with_a_matching_digest() -> None:
    spaced = orjson.dumps(orjson.loads(GOOD[3]), option=orjson.OPT_INDENT_2).replace(b"\n", b"")
    assert_rejected(make_file([*GOOD[:3], spaced, *GOOD[4:]]), 5, "not in canonical form")
    value = orjson.loads(GOOD[1])
    unsorted = orjson.dumps({k: value[k] for k in ("type", "seq", "time", "data")})
    assert unsorted != GOOD[1]
    assert_rejected(make_file([GOOD[0], unsorted, *GOOD[2:]]), 3, "not in canonical form")


def test_a_wrong_digest_is_reported_on_the_header_line() -> None:
    good = make_file(GOOD)
    tampered = good.replace(b"question 1", b"question X")
    assert tampered != good
    assert_rejected(tampered, 1, "does not match the event lines", "altered")


def test_a_wrong_header_line_is_rejected() -> None:
    body = make_file(GOOD).split(b"\n", 1)[1]
    digest = "sha256:" + hashlib.sha256(body).hexdigest()

    def header(**fields: Any) -> bytes:
        base: dict[str, Any] = {
            "foldline": "session-export",
            "formatVersion": 0,
            "sessionId": "s",
            "events": len(GOOD),
            "digest": digest,
        }
        base.update(fields)
        return orjson.dumps({k: v for k, v in base.items() if v is not None}) + b"\n" + body

    assert_rejected(body, 1, "bad export header", "foldline")  # the header line is missing altogether
    assert_rejected(b"", 1, "the file is empty")
    assert_rejected(b"not json\n" + body, 1, "malformed JSON")
    assert_rejected(b"[1]\n" + body, 1, "expected a JSON object")
    assert_rejected(header(foldline="other-tool"), 1, "'session-export'")
    assert_rejected(header(formatVersion=1), 1, "formatVersion 1 is not supported")
    assert_rejected(header(sessionId=""), 1, "sessionId")
    assert_rejected(header(events=None), 1, "missing field(s) ['events']")
    assert_rejected(header(extra=True), 1, "unknown field(s) ['extra']")
    assert_rejected(header(events=0), 1, "events must be an integer >= 1")
    assert_rejected(header(digest="sha256:xyz"), 1, "64 lowercase hex")
    # the helper itself builds a loadable file, so each rejection above is due to its one change
    assert import_session(MemoryEventLog(), io.BytesIO(header())).events == len(GOOD)


def test_a_count_mismatch_is_rejected() -> None:
    assert_rejected(make_file(GOOD, events=len(GOOD) + 1), len(GOOD) + 2, "ends after", "truncated")
    assert_rejected(make_file(GOOD, events=len(GOOD) - 1), len(GOOD) + 1, "has more lines")


def test_truncation_and_blank_lines_are_rejected() -> None:
    good = make_file(GOOD)
    assert_rejected(good[:-1], len(GOOD) + 1, "does not end with a newline")
    assert_rejected(good[:-40], len(GOOD) + 1, "does not end with a newline")
    lines = good.split(b"\n")
    assert_rejected(b"\n".join([*lines[:3], b"", *lines[3:]]), 4, "empty line")


def test_an_existing_session_id_is_refused_and_nothing_is_written() -> None:
    log = MemoryEventLog()
    log.append("s", 0, simple_log(1, 1))
    before = lines_of(log.read("s"))
    with pytest.raises(SessionExists):
        import_session(log, io.BytesIO(make_file(GOOD)))
    assert lines_of(log.read("s")) == before
    with pytest.raises(SessionExists):
        import_session(log, io.BytesIO(make_file(GOOD, sid="t")), as_id="s")
    assert log.sessions() == ["s"]


def test_an_empty_new_id_is_refused() -> None:
    with pytest.raises(ImportFailed, match="non-empty"):
        import_session(MemoryEventLog(), io.BytesIO(make_file(GOOD)), as_id="")


def test_the_first_bad_line_wins() -> None:
    lines = [*GOOD[:2], b"{", *GOOD[3:5], b"}"]
    assert_rejected(make_file(lines, digest="sha256:" + "0" * 64), 4, "malformed JSON")


def test_nothing_is_written_to_sqlite_on_failure(tmp_path: Path) -> None:
    with SqliteEventLog(tmp_path) as log:
        with pytest.raises(ImportFailed):
            import_session(log, io.BytesIO(make_file([*GOOD[:-1], b"{"])))
        assert log.sessions() == []
        assert log.read("s") == []


class _Counting:
    """A file that counts the bytes it hands out."""

    def __init__(self, data: bytes) -> None:
        self._fp = io.BytesIO(data)
        self.read = 0

    def readline(self, size: int = -1, /) -> bytes:
        raw = self._fp.readline(size)
        self.read += len(raw)
        return raw


def test_a_line_over_the_event_size_limit_is_refused_before_it_is_read_whole() -> None:
    """A 40 MB event line is refused at its line having read little more than the limit (it used to be read,
    decoded and imported whole); an event of exactly the limit imports; one byte more is refused by size."""
    b = LogBuilder().header()
    huge = event_of_size(b.seq, 10 * MAX_EVENT_BYTES)
    data = make_file([*lines_of(b.events), encode_event(huge)])
    reader = _Counting(data)
    log = MemoryEventLog()
    with pytest.raises(ImportFailed) as info:
        import_session(log, reader)
    assert info.value.line == 3
    assert f"longer than the {MAX_EVENT_BYTES:,} bytes one event may take" in info.value.reason
    assert reader.read < MAX_EVENT_BYTES + 4096
    assert log.sessions() == []
    at_limit = make_file([*lines_of(b.events), encode_event(event_of_size(b.seq, MAX_EVENT_BYTES))])
    assert import_session(MemoryEventLog(), io.BytesIO(at_limit)).events == 2
    over = make_file([*lines_of(b.events), encode_event(event_of_size(b.seq, MAX_EVENT_BYTES + 1))])
    assert_rejected(over, 3, f"over the {MAX_EVENT_BYTES:,}-byte limit of one event", "[rule event-size]")
