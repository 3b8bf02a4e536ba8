"""What import accepts, every backend and command can hold; ids are held to one rule wherever they enter.

Import used to take a ``time`` past year 9999 (then ``sessions`` crashed for the whole data dir), a
``time`` >= 2^63 (the log could then never move to Kafka: Avro's ``long`` cannot hold it), and a
1,000,000-character id; NUL or a newline in an id split the rows of ``sessions``.
"""

from __future__ import annotations

import hashlib
import io
import json
from pathlib import Path

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from foldline.adapters.avro import AvroCodec
from foldline.adapters.memory_log import MemoryEventLog
from foldline.adapters.sqlite_log import SqliteEventLog
from foldline.core import Envelope, encode_event
from foldline.core.events import MAX_INT, MAX_TIME_MS
from foldline.core.validation import SESSION_ID_MAX_BYTES, check_session_id, check_values
from foldline.errors import ImportFailed, ValidationError
from foldline.export import import_session
from foldline.loop import Agent, AgentOptions
from foldline.providers.emulated import emulated_provider
from tests.adversarial.helpers import assert_one_line_error, invoke, printable_output
from tests.factories import HEADER, simple_log
from tests.strategies import logs

BAD_IDS = ["", "a\nb", "tab\tid", "nul\x00", "esc\x1b]0;t\x07", "del\x7f", "c1\x9b", "rtl\u202e", "ls\u2028"]
LONG_IDS = ["x" * (SESSION_ID_MAX_BYTES + 1), "é" * 128, "x" * 1_000_000]


def export_file(events: list[Envelope], session: str = "s") -> bytes:
    body = b"".join(encode_event(e) + b"\n" for e in events)
    header = {
        "digest": "sha256:" + hashlib.sha256(body).hexdigest(),
        "events": len(events),
        "foldline": "session-export",
        "formatVersion": 0,
        "sessionId": session,
    }
    return orjson.dumps(header, option=orjson.OPT_SORT_KEYS) + b"\n" + body


def raw_export(lines: list[bytes], session: str = "s") -> bytes:
    body = b"".join(line + b"\n" for line in lines)
    header = {
        "digest": "sha256:" + hashlib.sha256(body).hexdigest(),
        "events": len(lines),
        "foldline": "session-export",
        "formatVersion": 0,
        "sessionId": session,
    }
    return orjson.dumps(header, option=orjson.OPT_SORT_KEYS) + b"\n" + body


# ------------------------------------------------------------------ ids


@pytest.mark.parametrize("bad", [*BAD_IDS, *LONG_IDS], ids=lambda s: repr(s[:12]))
def test_a_bad_session_id_is_refused_at_every_entry_point(tmp_path: Path, bad: str) -> None:
    data = tmp_path / "data"
    with SqliteEventLog(data) as log:
        log.append("good", 0, simple_log(1, 1))
    good = export_file(simple_log(1, 1), "good")
    for args in (
        ("show", bad),
        ("verify", bad),
        ("diff", bad),
        ("drops", bad),
        ("requests", bad),
        ("resume", bad),
        ("export", bad, "-o", tmp_path / "x.jsonl"),
        ("fork", "good", "--at", "0", "--as", bad),
        ("fork", bad, "--at", "0"),
        ("restore", bad),
    ):
        line = assert_one_line_error(invoke(args[0], "--data-dir", data, "--", *args[1:]))
        assert printable_output(line)
        assert len(line) < 600  # the id is quoted shortened, never a megabyte of it
    if bad:  # `--as ""` is "must be non-empty", the same refusal
        out = invoke("import", "-", "--as", bad, "--data-dir", data, input=good)
        assert_one_line_error(out, "ValidationError" if bad else "ImportFailed")
    out = invoke("import", "-", "--data-dir", data, input=export_file(simple_log(1, 1), bad))
    assert_one_line_error(out, "ImportFailed", "line 1")
    with SqliteEventLog(data, read_only=True) as log:
        assert log.sessions() == ["good"]
    with pytest.raises(ValidationError):
        Agent(bad, MemoryEventLog(), emulated_provider("anthropic"), AgentOptions(HEADER.config))


@given(st.text(max_size=300))
def test_the_id_rule_is_printable_text_of_bounded_length(value: str) -> None:
    if value.isprintable() and 0 < len(value.encode()) <= SESSION_ID_MAX_BYTES:
        assert check_session_id(value) == value
    else:
        with pytest.raises(ValidationError) as info:
            check_session_id(value)
        assert info.value.rule == "session-id"
        assert len(str(info.value)) < 300  # quoted shortened


def test_sessions_rows_cannot_be_split_by_an_id(tmp_path: Path) -> None:
    with SqliteEventLog(tmp_path) as log:
        for sid in ("plain", "with space", "[bold]markup[/]", "é-ü"):
            log.append(sid, 0, simple_log(1, 1))
    out = invoke("sessions", "--data-dir", tmp_path, "--json")
    assert [row["id"] for row in json.loads(out.stdout)] == sorted(["plain", "with space", "[bold]markup[/]", "é-ü"])
    table = invoke("sessions", "--data-dir", tmp_path).stdout
    assert all(sid in table for sid in ("plain", "with space", "[bold]markup[/]", "é-ü"))


# ------------------------------------------------------------------ values


def lines_with(field_path: tuple[str, ...], value: object) -> list[bytes]:
    """simple_log's lines with the first event holding ``field_path`` set to ``value`` (raw JSON, bypassing
    the dataclasses, as a hand-made or hostile export would)."""
    lines = [encode_event(e) for e in simple_log(1, 2)]
    for i, line in enumerate(lines):
        obj = json.loads(line)
        target = obj
        try:
            for key in field_path[:-1]:
                target = target[key]
        except (KeyError, TypeError):
            continue
        if field_path[-1] in target:
            target[field_path[-1]] = value
            lines[i] = orjson.dumps(obj, option=orjson.OPT_SORT_KEYS)
            return lines
    raise AssertionError(f"no event has {field_path}")


OUT_OF_RANGE = [
    (("time",), MAX_TIME_MS + 1, "time"),
    (("time",), 1 << 63, "time"),
    (("time",), (1 << 64) - 1, "time"),
    (("seq",), 1 << 63, None),
    (("data", "turn"), 1 << 63, "value-range"),
    (("data", "step"), (1 << 64) - 1, "value-range"),
    (("data", "usage", "input"), 1 << 63, "value-range"),
    (("data", "id"), "x" * 1_000_000, "id"),
    (("data", "callId"), "call\nid", "id"),
]


@pytest.mark.parametrize(("path", "value", "rule"), OUT_OF_RANGE, ids=lambda v: str(v)[:20])
def test_import_refuses_what_no_backend_could_hold(path: tuple[str, ...], value: object, rule: str | None) -> None:
    data = raw_export(lines_with(path, value))
    log = MemoryEventLog()
    with pytest.raises(ImportFailed) as info:
        import_session(log, io.BytesIO(data))
    assert info.value.line >= 2
    if rule is not None:
        assert f"[rule {rule}]" in info.value.reason
    assert log.sessions() == []


def test_the_avro_codec_refuses_the_same_values_typed() -> None:
    codec = AvroCodec()
    for path, value, _rule in OUT_OF_RANGE:
        if path == ("seq",):
            continue
        line = lines_with(path, value)
        index = next(i for i, raw in enumerate(line) if raw != encode_event(simple_log(1, 2)[i]))
        obj = json.loads(line[index])
        from foldline.core.wire import envelope_from_json

        try:
            env = envelope_from_json(obj)  # the decoder refuses most of them already
        except ValidationError:
            continue
        with pytest.raises(ValidationError):
            codec.encode(env)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(log=logs, times=st.lists(st.integers(0, MAX_TIME_MS), min_size=1, max_size=50))
def test_whatever_import_accepts_kafka_and_sessions_can_hold(log: list[Envelope], times: list[int]) -> None:
    events = [Envelope(e.seq, times[i % len(times)], e.data, e.ignorable) for i, e in enumerate(log)]
    target = MemoryEventLog()
    import_session(target, io.BytesIO(export_file(events)))
    codec = AvroCodec()
    for e in target.read("s"):
        check_values(e)
        assert codec.decode(codec.encode(e)) == e  # the same log can move to Kafka


def test_a_time_at_the_limit_lists_with_its_date(tmp_path: Path) -> None:
    events = simple_log(1, 1)
    events = [Envelope(e.seq, MAX_TIME_MS if e.seq == len(events) - 1 else e.time, e.data) for e in events]
    assert invoke("import", "-", "--data-dir", tmp_path, input=export_file(events)).code == 0
    out = invoke("sessions", "--data-dir", tmp_path, "--json")
    assert json.loads(out.stdout)[0]["lastEventAt"] == "9999-12-31T23:59:59.999Z"


def test_a_log_written_behind_the_rules_back_is_a_typed_error_not_a_crash(tmp_path: Path) -> None:
    import sqlite3

    with SqliteEventLog(tmp_path) as log:
        log.append("s", 0, simple_log(1, 1))
        head = log.head("s")
    conn = sqlite3.connect(tmp_path / "log.sqlite3")
    obj = json.loads(conn.execute("SELECT body FROM events WHERE seq=?", (head - 1,)).fetchone()[0])
    obj["time"] = 1 << 62  # past year 9999: the rules never let it in; an old or edited file may hold it
    conn.execute("UPDATE events SET body=? WHERE seq=?", (orjson.dumps(obj, option=orjson.OPT_SORT_KEYS), head - 1))
    conn.commit()
    conn.close()
    assert_one_line_error(invoke("sessions", "--data-dir", tmp_path), "FormatError", "9999")
    assert MAX_INT > (1 << 62)
