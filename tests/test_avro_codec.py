"""Every event type round-trips through Avro (fastavro) in both framings; bad bytes get typed errors."""

from __future__ import annotations

import io
import json
import struct
from typing import Any

import avro.schema
import fastavro
import pytest
from hypothesis import given, settings

import foldline.adapters.avro.codec as codec_module
import foldline.adapters.avro.datum as avro_module
from foldline.adapters.avro import (
    AvroCodec,
    avro_to_envelope,
    crc64_avro,
    decoding,
    envelope_to_avro,
    load_schema_json,
)
from foldline.core import (
    AssistantMessage,
    CallConfig,
    CompactionEnd,
    CompactionStart,
    CompactionSummary,
    Envelope,
    ImageBlock,
    ImageRef,
    ReplaceOp,
    RequestHeader,
    TextBlock,
    ToolCall,
    ToolCallBlock,
    ToolResult,
    ToolResultBlock,
    TurnEnd,
    TurnStart,
    Usage,
    UserMessage,
    make_header,
)
from foldline.core.events import (
    ApprovalDecision,
    ApprovalRequest,
    AssistantChunk,
    AttachmentQuarantine,
    InboxClaim,
    LlmRetry,
    RequestDispatch,
    Seal,
    SessionEndSeed,
    SessionErased,
    SessionParent,
    StepEnd,
    StepStart,
    TurnRecovery,
    UnknownEvent,
)
from foldline.core.frozen import FrozenDict, freeze_json
from foldline.core.header import ToolSpec
from foldline.core.wire import KNOWN_TYPES, decode_event, encode_event
from foldline.errors import AvroDecodeError, FormatError, UnknownSchemaError, ValidationError
from tests.factories import simple_log
from tests.strategies import logs

IMG = ImageRef("sha256:" + "ab" * 32, "image/png", 1234, 640, 480)
TOOLS = (
    ToolSpec(
        "read", "Read a file", {"type": "object", "properties": {"path": {"type": "string"}}}
    ),  # frozen by ToolSpec
    ToolSpec("noop", "", {}),
)
FULL_CONFIG = CallConfig("openai", "gpt-x", 0.7, 1024, ("END", "STOP"), "high", stream=True)
UNKNOWN = freeze_json({"nested": {"a": [1, 2.5, "x", None, True]}, "z": "ü"})
assert isinstance(UNKNOWN, FrozenDict)

EVERY_TYPE: list[Envelope] = [
    Envelope(0, 1, RequestHeader(make_header(FULL_CONFIG, "system ✓", TOOLS), "initial")),
    Envelope(1, 2, RequestHeader(make_header(CallConfig("anthropic", "m")), "change")),
    Envelope(2, 3, UserMessage("u1", (TextBlock("hi"), ImageBlock(IMG)), "inject")),
    Envelope(3, 4, UserMessage("u2", (TextBlock("sum"),), "compaction", ReplaceOp(0, 2), (2, 3))),
    Envelope(
        4,
        5,
        AssistantMessage(
            "a1",
            (
                TextBlock("ok"),
                ToolCallBlock("c1", "read", '{"path": "x"}'),
                ToolResultBlock("c0", (TextBlock("r"), ImageBlock(IMG)), True),
            ),
            Usage(10, 5, 100, 7),
            "tool_use",
        ),
    ),
    Envelope(5, 6, AssistantMessage("a2", (), None, None, ReplaceOp(1, 1), (4,))),
    Envelope(5, 6, AssistantMessage("a3", (TextBlock("hel"),), None, "interrupted", "append", None, "req_1", "msg_1")),
    Envelope(6, 7, ToolResult("c1", "read", (TextBlock("out"), ImageBlock(IMG)), True)),
    Envelope(7, 8, ToolResult("c1", "read", (TextBlock("trim"),), False, ReplaceOp(3, 3), (6,))),
    Envelope(8, 9, TurnStart(0)),
    Envelope(9, 10, TurnEnd(0, "completed")),
    Envelope(9, 10, TurnEnd(0, "max-tokens")),
    Envelope(9, 10, TurnEnd(0, "interrupted")),
    Envelope(9, 10, TurnEnd(0, "refusal")),
    Envelope(9, 10, TurnEnd(0, "context-overflow")),
    Envelope(10, 11, StepStart(0, 1)),
    Envelope(11, 12, StepEnd(0, 1)),
    Envelope(12, 13, ToolCall(0, 1, "c1", "read", '{"path":"x"}')),
    Envelope(13, 14, RequestDispatch(0, 1, "anthropic-messages", 2, "sha256:" + "0f" * 32, 9876)),
    Envelope(14, 15, SessionEndSeed()),
    Envelope(15, 16, SessionEndSeed("parent", 42)),
    Envelope(16, 17, CompactionStart(0, 5, 1200)),
    Envelope(17, 18, CompactionSummary("summary", "anthropic", "m", 256)),
    Envelope(18, 19, CompactionSummary("summary", "anthropic", "m", 256, Usage(1, 2, 3, 4))),
    Envelope(19, 20, CompactionEnd()),
    Envelope(20, 21, AttachmentQuarantine("sha256:" + "cd" * 32, "corrupt", "drop")),
    Envelope(21, 22, UnknownEvent("future/thing", UNKNOWN), ignorable=True),
    Envelope(21, 22, LlmRetry(0, 1, 1, "overloaded_error", 529, 1500, "req_9", 0), ignorable=True),
    Envelope(21, 22, LlmRetry(0, 1, 2, "ReadError", None, None, None, 77), ignorable=True),
    Envelope(21, 22, AssistantChunk(0, 1, 1, 0, '{"type":"ping"}', "ping"), ignorable=True),
    Envelope(21, 22, AssistantChunk(0, 1, 1, 1, "[DONE]"), ignorable=True),
    Envelope(21, 22, SessionErased("erasure-1", "subject", "ops@host", "ab" * 16, "asked"), ignorable=True),
    Envelope(22, 23, TurnStart(3), ignorable=True),
    # content sealed under a data key (docs/FORMAT.md, "Sealed content"): the tokens stand where the text stood
    Envelope(23, 24, UserMessage("u9", (TextBlock("dG9rZW4"),)), sealed=Seal("cd" * 16, 1)),
    Envelope(23, 24, ToolResult("c2", "agent", (TextBlock("done"),), child_session_id="parent/c2")),
    Envelope(24, 25, ApprovalRequest(0, 1, "c1", "read", "sha256:" + "0e" * 32), ignorable=True),
    Envelope(25, 26, ApprovalDecision("c1", "allow", "e1", None, '{"path":"y"}', "ops", 17), ignorable=True),
    Envelope(25, 26, ApprovalDecision("c1", "deny", "e2", "not that file"), ignorable=True),
    Envelope(26, 27, InboxClaim(("e3", "e4")), ignorable=True),
    Envelope(27, 28, TurnRecovery(2, "continue", ("c1",), ("c2",)), ignorable=True),
    Envelope(27, 28, TurnRecovery(2, "end"), ignorable=True),
    Envelope(0, 1, SessionParent("parent", "c2", "agent"), ignorable=True),
]


@pytest.fixture(scope="module")
def codec() -> AvroCodec:
    return AvroCodec()


def test_fixtures_cover_every_event_type() -> None:
    assert {e.type for e in EVERY_TYPE} >= KNOWN_TYPES
    assert any(isinstance(e.data, UnknownEvent) for e in EVERY_TYPE)


@pytest.mark.parametrize("event", EVERY_TYPE, ids=lambda e: f"{e.seq}-{e.type}")
def test_every_event_type_round_trips(codec: AvroCodec, event: Envelope) -> None:
    data = codec.encode(event)
    assert data[:2] == b"\xc3\x01"
    assert data[2:10] == codec.fingerprint
    back = codec.decode(data)
    assert back == event
    assert encode_event(back) == encode_event(event)


def test_datum_is_plain_avro_readable_without_foldline(codec: AvroCodec) -> None:
    """Another consumer needs only the .avsc file: the body is ordinary Avro binary."""
    event = EVERY_TYPE[4]
    body = codec.encode(event)[10:]
    schema = fastavro.parse_schema(load_schema_json())
    datum: Any = fastavro.schemaless_reader(
        io.BytesIO(body), schema, None, return_record_name=True, return_record_name_override=True
    )
    assert datum["type"] == "assistant/message"
    assert datum["data"][0] == "foldline.AssistantMessage"
    usage = {"input": 10, "output": 5, "cacheRead": 100, "cacheWrite": 7, "reasoningTokens": None, "cacheWrite1h": None}
    assert datum["data"][1]["usage"] == usage
    assert avro_to_envelope(envelope_to_avro(event) | {"data": datum["data"]}) == event


def test_the_fields_added_to_format_0_travel_in_json_and_avro(codec: AvroCodec) -> None:
    """``usage.reasoningTokens``, ``usage.cacheWrite1h`` and an image's ``name`` (each one line in its definition):
    written when set, omitted when not, and read back from the logged JSON, through fastavro and through the
    generated decoder."""
    image = ImageRef("sha256:" + "ab" * 32, "image/png", 3, 1, 1, name="chart.png")
    usage = Usage(1, 20, 3, 4, reasoning_tokens=12, cache_write_1h=3)
    events = [
        Envelope(0, 1, UserMessage("u", (ImageBlock(image), TextBlock("what is it?")))),
        Envelope(1, 2, AssistantMessage("a", (TextBlock("a chart"),), usage)),
    ]
    lines = [encode_event(e) for e in events]
    assert b'"name":"chart.png"' in lines[0]
    assert b'"reasoningTokens":12' in lines[1]
    assert b'"cacheWrite1h":3' in lines[1]
    plain = Envelope(1, 2, AssistantMessage("a", (TextBlock("a chart"),), Usage(1, 20, 3, 4)))
    assert b"reasoningTokens" not in encode_event(plain)
    assert b"cacheWrite1h" not in encode_event(plain)
    for event, line in zip(events, lines, strict=True):
        assert decode_event(line) == event
        data = codec.encode(event)
        assert codec.decode(data) == event
        assert decoding.direct_envelope(data[10:]) == event
    # the bytes of the schema that added them (1ee11c1993a58747): the name after the height, the reasoning
    # tokens after cacheWrite, each a ["null", T] union (branch 1 = 02); still read, by their fingerprint
    added = [
        "c3011ee11c1993a5874718757365722f6d65737361676500020000027504028e01"
        + "7368613235363a"
        + "6162" * 32
        + "12696d6167652f706e67060202021263686172742e706e670016776861742069732069743f00087573657200000000",
        "c3011ee11c1993a5874722617373697374616e742f6d65737361676502040002026102000e6120636861727400020228060802180000"
        "0000000000",
    ]
    before_1h = [events[0], Envelope(1, 2, AssistantMessage("a", (TextBlock("a chart"),), Usage(1, 20, 3, 4, 12)))]
    for event, written in zip(before_1h, added, strict=True):
        assert codec.decode(bytes.fromhex(written)) == event
    # and in the current schema: the same body with the envelope's sealed union (null: 00) before the data (after
    # the type's 13 bytes and seq, time and ignorable)
    body = bytes.fromhex(added[0])[10:]
    assert codec.encode(events[0])[10:] == body[:16] + b"\x00" + body[16:]
    # cacheWrite1h (schema 8f4caf499cd39b8f) follows the reasoning tokens: branch 1 (02), then 3 (06)
    assert codec.encode(events[1])[10:].hex() == (
        "22" + b"assistant/message".hex() + "020400" + "00" + "02026102000e6120636861727400020228060802180206"
        "00000000000000"
    )


def test_the_sealed_marker_travels_before_the_data(codec: AvroCodec) -> None:
    """``sealed`` is ``["null", Seal {kid, v}]`` between ``ignorable`` and ``data``: branch 1 (02), the key id (32
    characters: length 40), the version (1: 02); then the data branch (TurnStart is branch 3: 06) and its turn."""
    event = Envelope(3, 2, TurnStart(0), sealed=Seal("ab" * 16, 1))
    head = "14" + b"turn/start".hex() + "06" + "04" + "00"
    assert codec.encode(event)[10:].hex() == head + "02" + "40" + ("ab" * 16).encode().hex() + "02" + "06" + "00"
    assert codec.decode(codec.encode(event)) == event
    assert decoding.direct_envelope(codec.encode(event)[10:]) == event


def test_the_1h_cache_write_is_a_part_of_the_cache_write() -> None:
    with pytest.raises(ValueError, match="cacheWrite1h 5 exceeds cacheWrite 4"):
        Usage(1, 2, 3, 4, cache_write_1h=5)
    line = encode_event(Envelope(0, 1, AssistantMessage("a", (TextBlock("x"),), Usage(1, 2, 3, 4, cache_write_1h=4))))
    with pytest.raises(FormatError, match="cacheWrite1h 5 exceeds cacheWrite 4"):
        decode_event(line.replace(b'"cacheWrite1h":4', b'"cacheWrite1h":5'))


def test_a_tool_result_names_its_sub_agent_session_in_json_and_avro(codec: AvroCodec) -> None:
    """``tool/result.childSessionId`` (schema 5eefc45de1402c0f): written when set, omitted when not, read back
    through the logged JSON, fastavro and the generated decoder; the control events travel as UnknownEvent."""
    linked = Envelope(3, 4, ToolResult("c1", "agent", (TextBlock("done"),), child_session_id="p/c1"))
    line = encode_event(linked)
    assert b'"childSessionId":"p/c1"' in line
    assert b"childSessionId" not in encode_event(Envelope(3, 4, ToolResult("c1", "agent", (TextBlock("done"),))))
    data = codec.encode(linked)
    assert codec.decode(data) == linked == decode_event(line)
    assert decoding.direct_envelope(data[10:]) == linked
    control = Envelope(4, 5, InboxClaim(("e1",)), ignorable=True)
    datum = envelope_to_avro(control)
    assert datum["data"][0] == "foldline.UnknownEvent"
    assert codec.decode(codec.encode(control)) == control


@settings(max_examples=60, deadline=None)
@given(logs)
def test_random_valid_logs_round_trip(log: list[Envelope]) -> None:
    codec = AvroCodec()
    for event in log:
        back = codec.decode(codec.encode(event))
        assert back == event
        assert encode_event(back) == encode_event(event)


def _datum(event: Envelope) -> dict[str, object]:
    """The datum fastavro reads back for an event (``return_record_name`` form)."""
    body = io.BytesIO()
    schema = fastavro.parse_schema(load_schema_json())
    fastavro.schemaless_writer(body, schema, envelope_to_avro(event))
    body.seek(0)
    datum = fastavro.schemaless_reader(body, schema, None, return_record_name=True, return_record_name_override=True)
    assert isinstance(datum, dict)
    return datum


@settings(max_examples=60, deadline=None)
@given(logs)
def test_every_datum_reads_back_to_its_event(log: list[Envelope]) -> None:
    """The datum of an event (the Avro layout derived from its definition) reads back, through the logged JSON
    form and the core's decoders, to the same event."""
    for event in log:
        assert avro_module.avro_to_envelope(_datum(event)) == event


def test_a_datum_with_a_field_this_schema_does_not_know_is_still_read() -> None:
    """A record of a newer schema, resolved against this one, has no unknown field: the layout reads the fields
    it knows (fastavro drops the rest), and a datum missing one of them is a typed error."""
    plain = simple_log(turns=1)
    datum: dict[str, Any] = _datum(plain[2])
    name, fields = datum["data"]
    assert avro_module.avro_to_envelope({**datum, "data": (name, {**fields, "futureField": 1})}) == plain[2]
    missing = dict(list(fields.items())[1:])
    with pytest.raises(AvroDecodeError):
        avro_module.avro_to_envelope({**datum, "data": (name, missing)})


def _public_writer_bytes(codec: AvroCodec, event: Envelope) -> bytes:
    body = io.BytesIO()
    fastavro.schemaless_writer(body, fastavro.parse_schema(load_schema_json()), envelope_to_avro(event))
    return b"\xc3\x01" + codec.fingerprint + body.getvalue()


def test_compiled_writer_writes_exactly_what_the_public_writer_writes(codec: AvroCodec) -> None:
    assert codec.uses_compiled_writer  # the fastavro pinned here agrees with its own schemaless_writer
    for event in EVERY_TYPE:
        assert codec.encode(event) == _public_writer_bytes(codec, event)


@settings(max_examples=60, deadline=None)
@given(logs)
def test_compiled_writer_matches_the_public_writer_on_random_logs(log: list[Envelope]) -> None:
    codec = AvroCodec()
    for event in log:
        assert codec.encode(event) == _public_writer_bytes(codec, event)


def test_a_compiled_writer_that_disagrees_is_not_used(monkeypatch: pytest.MonkeyPatch) -> None:
    def wrong(out: bytearray, *args: object) -> None:
        out.extend(b"\x00")

    monkeypatch.setattr(codec_module, "_WRITE_DATA", wrong)
    codec = AvroCodec()
    assert not codec.uses_compiled_writer
    for event in EVERY_TYPE:
        assert codec.encode(event) == _public_writer_bytes(codec, event)
        assert codec.decode(codec.encode(event)) == event


def test_fingerprint_is_crc64_avro_of_the_parsing_canonical_form(codec: AvroCodec) -> None:
    parsed = avro.schema.parse(json.dumps(load_schema_json()))
    assert codec.fingerprint == parsed.fingerprint("CRC-64-AVRO")
    # the specification's value for the empty string is the initial constant
    assert crc64_avro(b"") == 0xC15D213AA4D7A795


def test_unknown_fingerprint_is_a_typed_error(codec: AvroCodec) -> None:
    data = codec.encode(EVERY_TYPE[8])
    with pytest.raises(UnknownSchemaError) as info:
        codec.decode(data[:2] + b"\x00" * 8 + data[10:])
    assert info.value.rule == "avro-unknown-schema"
    assert isinstance(info.value, FormatError)


@pytest.mark.parametrize(
    "raw",
    [b"", b"garbage", b"\xc3", b"{}", None],
    ids=["empty", "garbage", "short-magic", "json", "none"],
)
def test_unframed_bytes_are_typed_errors(codec: AvroCodec, raw: bytes | None) -> None:
    with pytest.raises(FormatError):
        codec.decode(raw)


def test_truncated_body_is_a_typed_error(codec: AvroCodec) -> None:
    data = codec.encode(EVERY_TYPE[0])
    with pytest.raises(AvroDecodeError):
        codec.decode(data[: len(data) // 2])


def test_type_that_disagrees_with_its_record_is_rejected(codec: AvroCodec) -> None:
    datum = envelope_to_avro(EVERY_TYPE[8]) | {"type": "turn/end"}
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, fastavro.parse_schema(load_schema_json()), datum)
    with pytest.raises(AvroDecodeError, match="does not match"):
        codec.decode(b"\xc3\x01" + codec.fingerprint + buf.getvalue())


def test_decoded_events_get_core_validation(codec: AvroCodec) -> None:
    """An unknown, non-ignorable type and a legacy type decode to the core's typed rule errors."""
    schema = fastavro.parse_schema(load_schema_json())
    for etype, ignorable, rule in (("future/x", False, "unknown-type"), ("request/header-delta", True, "legacy")):
        datum = {
            "type": etype,
            "seq": 5,
            "time": 1,
            "ignorable": ignorable,
            "data": ("foldline.UnknownEvent", {"json": "{}"}),
        }
        buf = io.BytesIO()
        fastavro.schemaless_writer(buf, schema, datum)
        with pytest.raises(ValidationError) as info:
            codec.decode(b"\xc3\x01" + codec.fingerprint + buf.getvalue())
        assert info.value.rule.startswith(rule)
        assert info.value.seq == 5


def test_confluent_framing_with_mock_registry() -> None:
    from confluent_kafka.schema_registry import SchemaRegistryClient

    codec = AvroCodec(registry_url="mock://foldline-test", subject="t-value")
    assert codec.framing == "confluent"
    assert type(codec.registry).__name__ == "MockSchemaRegistryClient"
    data = codec.encode(EVERY_TYPE[4])
    assert data[0] == 0
    (schema_id,) = struct.unpack(">I", data[1:5])
    assert schema_id > 0
    assert codec.decode(data) == EVERY_TYPE[4]
    # a second codec sharing the registry (as two processes share a server) resolves the schema by id
    shared = SchemaRegistryClient.new_client({"url": "mock://shared"})
    writer = AvroCodec(registry=shared, subject="t-value")
    reader = AvroCodec(registry=shared, subject="t-value")
    framed = writer.encode(EVERY_TYPE[6])
    assert reader.decode(framed) == EVERY_TYPE[6]
    # single-object records stay readable by a registry-configured codec
    assert codec.decode(AvroCodec().encode(EVERY_TYPE[8])) == EVERY_TYPE[8]
    with pytest.raises(UnknownSchemaError):
        codec.decode(b"\x00" + struct.pack(">I", 987654) + data[5:])


def test_confluent_framing_without_registry_is_a_typed_error(codec: AvroCodec) -> None:
    with pytest.raises(UnknownSchemaError, match="no schema registry"):
        codec.decode(b"\x00\x00\x00\x00\x01" + b"\x00")


def test_the_datum_encoders_build_safely_from_many_threads_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """The encoders are generated on first use; writer threads that ask for them at the same moment each get a
    working one (unguarded, a thread could look up a name another had registered but not compiled yet)."""
    import sys
    import threading

    from foldline.adapters.avro import layout
    from foldline.core.events import EVENT_TYPES

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-7)  # switch threads as often as possible: what a busy machine does now and then
    try:
        for _ in range(20):
            monkeypatch.setattr(layout, "_ENCODERS", layout._Encoders())
            layout.datum_encoder.cache_clear()
            errors: list[str] = []
            barrier = threading.Barrier(len(EVENT_TYPES))

            def build(cls: type, barrier: threading.Barrier = barrier, errors: list[str] = errors) -> None:
                barrier.wait()
                try:
                    layout.datum_encoder(cls)
                except Exception as exc:  # the failure this test is about, reported below
                    errors.append(f"{cls.__name__}: {exc!r}")

            threads = [threading.Thread(target=build, args=(cls,)) for cls in EVENT_TYPES]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            assert errors == []
    finally:
        sys.setswitchinterval(interval)
        layout.datum_encoder.cache_clear()
