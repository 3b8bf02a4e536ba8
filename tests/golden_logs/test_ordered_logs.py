"""The golden logs of the versions that keep the author's key order: byte-stable events in every codec, imports,
verify reports, and what their requests show (docs/FORMAT.md §1.9, §9.8, §9.9)."""

from __future__ import annotations

import io
import json

import orjson
import pytest

from foldline.adapters.avro import AvroCodec
from foldline.adapters.memory_log import MemoryEventLog
from foldline.core.codec import canonical_json, digest_bytes
from foldline.core.events import Envelope, RequestDispatch, RequestHeader
from foldline.core.frozen import thaw_json
from foldline.core.wire import decode_canonical, decode_event, encode_event
from foldline.errors import ImportFailed
from foldline.export import import_session
from foldline.providers.base import serializer_for
from foldline.replay.verify import rebuild_requests, verify_events

from .ordered import ORDERED_DIR, ORDERED_SESSIONS

DECLARED = ["zeta", "alpha", "mid"]


def export(session: str) -> bytes:
    return (ORDERED_DIR / f"{session}.jsonl").read_bytes()


def lines(session: str) -> list[bytes]:
    return export(session).split(b"\n")[1:-1]


def events(session: str) -> list[Envelope]:
    return [decode_event(line) for line in lines(session)]


@pytest.mark.parametrize("session", ORDERED_SESSIONS)
def test_every_event_reencodes_to_its_bytes_in_every_codec(session: str) -> None:
    codec = AvroCodec()
    for line in lines(session):
        event = decode_event(line)
        assert encode_event(event) == line
        assert decode_canonical(line) == (event, line)
        assert encode_event(codec.decode(codec.encode(event))) == line


def with_lines(session: str, replace: bytes, by: bytes) -> bytes:
    """The session's export with one event line changed and its header's digest made to match again."""
    head, _, body = export(session).partition(b"\n")
    assert body.count(replace) == 1
    body = body.replace(replace, by)
    header = orjson.loads(head)
    header["digest"] = digest_bytes(body)
    return canonical_json(header) + b"\n" + body


@pytest.mark.parametrize("session", ORDERED_SESSIONS)
def test_the_export_imports_and_the_schema_s_order_is_data(session: str) -> None:
    log = MemoryEventLog()
    summary = import_session(log, io.BytesIO(export(session)))
    assert summary.events == len(lines(session))
    assert [encode_event(e) for e in log.read(session)] == lines(session)
    # another order inside the schema is another canonical value: it imports, as a different header
    zeta = b'"zeta":{"title":"Zeta","type":"string"},'
    header_line = next(line for line in lines(session) if b'"type":"request/header"' in line)
    moved = header_line.replace(zeta, b"", 1).replace(b'"mid":{', zeta + b'"mid":{', 1)
    other = MemoryEventLog()
    import_session(other, io.BytesIO(with_lines(session, header_line, moved)))
    header = next(e.data.header for e in other.read(session) if isinstance(e.data, RequestHeader))
    assert list(header.tools[0].input_schema["properties"]) == ["alpha", "zeta", "mid"]  # type: ignore[index]
    # but whitespace inside it, or keys out of order outside it, are not canonical (§1), and are refused
    spaced = header_line.replace(b'"properties":{', b'"properties": {', 1)
    assert header_line.endswith(b',"type":"request/header"}')
    unsorted = b'{"type":"request/header",' + header_line[1:].removesuffix(b',"type":"request/header"}') + b"}"
    for bad in (spaced, unsorted):
        assert bad != header_line
        with pytest.raises(ImportFailed, match="canonical"):
            import_session(MemoryEventLog(), io.BytesIO(with_lines(session, header_line, bad)))


@pytest.mark.parametrize("session", ORDERED_SESSIONS)
def test_verify_reproduces_the_committed_report(session: str) -> None:
    report = verify_events(session, events(session))
    assert report.ok
    assert report.checked >= 4
    assert report.to_json() == json.loads((ORDERED_DIR / f"{session}.verify.json").read_bytes())


@pytest.mark.parametrize("session", ORDERED_SESSIONS)
def test_every_request_shows_the_declared_order(session: str) -> None:
    log = events(session)
    headers = [e.data.header for e in log if isinstance(e.data, RequestHeader)]
    first = headers[0].tools[0].input_schema  # type: ignore[index]
    assert list(first["properties"]) == DECLARED
    bodies = []
    for dispatch, _, request in rebuild_requests(session, log):
        body = orjson.loads(serializer_for(dispatch.serializer, dispatch.serializer_version).serialize(request, None))
        tool = body["tools"][0]
        bodies.append(
            list((tool.get("input_schema") or tool.get("parameters") or tool["function"]["parameters"])["properties"])
        )
    if session == "ordered-anthropic":  # the second turn's tools are the same schema sorted: a `change`
        assert [e.data.reason for e in log if isinstance(e.data, RequestHeader)] == ["initial", "change"]
        assert headers[1].tools is not None
        assert thaw_json(headers[1].tools[0].input_schema) == thaw_json(first)  # equal members, another order
        assert headers[1] != headers[0]
        assert bodies == [DECLARED, DECLARED, sorted(DECLARED), sorted(DECLARED)]
    else:
        assert bodies == [DECLARED] * len(bodies)


def test_each_session_was_sent_with_the_version_that_first_kept_the_author_order() -> None:
    """The logs were written when these were the adapters' newest versions; later ones (§9.10) keep the order too."""
    dispatched = {
        s: {(d.serializer, d.serializer_version) for e in events(s) if isinstance(d := e.data, RequestDispatch)}
        for s in ORDERED_SESSIONS
    }
    assert dispatched == {
        "ordered-anthropic": {("anthropic-messages", 4)},
        "ordered-chat": {("openai-chat", 3)},
        "ordered-deepseek": {("reasoning-chat", 3)},
        "ordered-responses": {("openai-responses", 3)},
    }


def test_the_deepseek_log_s_requests_follow_deepseek_s_documented_schema() -> None:
    """§9.9: the two-block user message as one string, tool-call turns with ``"content":null``, the thinking
    switch beside the effort."""
    log = events("ordered-deepseek")
    bodies = [
        orjson.loads(serializer_for(d.serializer, d.serializer_version).serialize(r, None))
        for d, _, r in rebuild_requests("ordered-deepseek", log)
    ]
    last = bodies[-1]
    assert (last["thinking"], last["reasoning_effort"]) == ({"type": "enabled"}, "high")
    assert last["messages"][1] == {
        "content": "Context: the probe was installed today.\n\nTake a reading of the probe.",
        "role": "user",
    }
    calls_only = [m for m in last["messages"] if m["role"] == "assistant" and "tool_calls" in m]
    assert calls_only
    assert all(m["content"] is None and m["reasoning_content"] for m in calls_only)
