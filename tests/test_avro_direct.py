"""Avro bodies decoded straight into envelopes (the decoder generated from the record definitions) agree with
fastavro + the datum mapping on every record."""

from __future__ import annotations

import io
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import fastavro
import pytest
from hypothesis import given, settings

from foldline.adapters.avro import AvroCodec, avro_to_envelope, decoding, envelope_to_avro, writer_schemas
from foldline.adapters.avro.direct import DIRECT_FINGERPRINT, decoder_source, reads_directly
from foldline.core import Envelope, TextBlock, ToolCallBlock, TurnEnd, UserMessage
from foldline.core.codec import canonical_json
from foldline.core.events import MAX_TIME_MS
from foldline.core.frozen import OrderedObject
from foldline.core.wire import encode_event
from foldline.errors import FormatError
from tests.builds import require_compiled_decoder
from tests.factories import simple_log
from tests.golden_logs.ordered import ORDERED_SESSIONS
from tests.golden_logs.reasoning import REASONING_SESSIONS
from tests.golden_logs.test_ordered_logs import events as ordered_events
from tests.golden_logs.test_reasoning_logs import events
from tests.strategies import logs
from tests.test_avro_codec import EVERY_TYPE

CODEC = AvroCodec()
SCHEMA = writer_schemas()[CODEC.fingerprint]
direct_module: Any = decoding.interpreted_module()
decode_bodies = direct_module.decode_bodies
_INTERPRETED = (decode_bodies, direct_module)


@pytest.fixture(autouse=True, scope="module", params=["interpreted", "compiled"])
def decoder(request: pytest.FixtureRequest) -> Iterator[str]:
    """Every test here runs on the generated decoder as interpreted and on its mypyc build (``hatch_build.py``);
    an install built with the compiled decoder must have it, of the current definitions (one built without it
    skips, saying so)."""
    global decode_bodies, direct_module
    if request.param == "compiled":
        require_compiled_decoder()
        native, _ = decoding.native_module()
        assert native is not None
        assert decoding.DECODER == "compiled (mypyc)"
        decode_bodies, direct_module = native.decode_bodies, native
    try:
        yield request.param
    finally:
        decode_bodies, direct_module = _INTERPRETED[0], _INTERPRETED[1]


def test_the_reading_build_is_the_compiled_one_where_it_can_be() -> None:
    """The archive and the codec decode through the compiled build when it was built from the current text."""
    require_compiled_decoder()
    native, why = decoding.native_module()
    assert native is not None, why
    assert decoding.decode_bodies is native.decode_bodies
    assert decoding.direct_envelope is native.direct_envelope
    assert isinstance(native, ModuleType)
    assert native.__file__ is not None
    assert native.__file__.endswith(".so")


def _body(event: Envelope) -> bytes:
    return CODEC.encode(event)[10:]


def _raw(datum: dict[str, Any]) -> bytes:
    out = io.BytesIO()
    fastavro.schemaless_writer(out, SCHEMA, datum)
    return out.getvalue()


def _through_fastavro(body: bytes) -> Envelope:
    datum = fastavro.schemaless_reader(
        io.BytesIO(body), SCHEMA, None, return_record_name=True, return_record_name_override=True
    )
    assert isinstance(datum, dict)
    return avro_to_envelope(datum)


def test_the_direct_reading_is_for_the_current_schema() -> None:
    """The decoder is generated for the schema the definitions give, which is the committed one."""
    assert CODEC.fingerprint == DIRECT_FINGERPRINT
    assert reads_directly(CODEC.fingerprint)
    assert not any(reads_directly(fp) for fp in writer_schemas() if fp != CODEC.fingerprint)


@pytest.mark.parametrize("event", EVERY_TYPE, ids=lambda e: f"{e.seq}-{e.type}")
def test_every_event_type_decodes_as_fastavro_decodes_it(event: Envelope) -> None:
    body = _body(event)
    assert decode_bodies(body, 1, SCHEMA) == [_through_fastavro(body)] == [event]


@settings(max_examples=80, deadline=None)
@given(logs)
def test_random_logs_decode_as_fastavro_decodes_them(log: list[Envelope]) -> None:
    bodies = [_body(e) for e in log]
    assert decode_bodies(b"".join(bodies), len(bodies), SCHEMA) == [_through_fastavro(b) for b in bodies] == log


@pytest.mark.parametrize("session", REASONING_SESSIONS)
def test_the_golden_reasoning_logs_decode_as_fastavro_decodes_them(session: str) -> None:
    log = events(session)
    bodies = [_body(e) for e in log]
    assert decode_bodies(b"".join(bodies), len(bodies), SCHEMA) == log


@pytest.mark.parametrize("session", ORDERED_SESSIONS)
def test_the_golden_ordered_logs_decode_in_their_order(session: str) -> None:
    """A tool schema is read straight into an ordered object, in the order of its text (docs/FORMAT.md §1.9): the
    decoded events re-encode to the very bytes they were read from."""
    log = ordered_events(session)
    bodies = [_body(e) for e in log]
    decoded = decode_bodies(b"".join(bodies), len(bodies), SCHEMA)
    assert decoded == log
    assert [encode_event(e) for e in decoded] == [encode_event(e) for e in log]


def test_an_ordered_field_is_read_by_the_ordered_reader() -> None:
    """The reader the definitions name for an ordered field keeps the text's key order at every depth; an unordered
    field's reader gives a plain frozen object."""
    text = b'{"zeta":{"y":1,"x":2},"alpha":[{"q":1,"p":2}]}'
    raw = io.BytesIO()
    fastavro.schemaless_writer(raw, "string", text.decode())
    ordered, end = direct_module._ordered_json(raw.getvalue(), 0)
    assert end == len(raw.getvalue())
    assert isinstance(ordered, OrderedObject)
    assert ordered.json == text
    plain, _ = direct_module._json(raw.getvalue(), 0)
    assert not isinstance(plain, OrderedObject)
    assert canonical_json(plain) == b'{"alpha":[{"p":2,"q":1}],"zeta":{"x":2,"y":1}}'
    assert "= _ordered_json(buf, p)" in decoder_source()  # a ToolSpec's inputSchema


def test_the_loop_s_events_are_read_directly_and_ignorable_ones_through_fastavro() -> None:
    """Every event of a plain session is built without fastavro; an event that travels as UnknownEvent (every
    ignorable type) is left to it."""
    log = simple_log(turns=3)
    for event in log:
        body = _body(event)
        assert direct_module._record(body, 0) == (event, len(body))
    unknown = next(e for e in EVERY_TYPE if e.ignorable)
    with pytest.raises(direct_module._Other):
        direct_module._record(_body(unknown), 0)
    assert decode_bodies(_body(unknown), 1, SCHEMA) == [unknown]
    calls = UserMessage("u", (TextBlock("a"), ToolCallBlock("c", "n", "{}")), "user")
    assert direct_module._record(_body(Envelope(3, 4, calls)), 0)[0].data == calls


@pytest.mark.parametrize(
    "change",
    [
        {"seq": -1},
        {"time": -5},
        {"type": "turn/start"},  # not its data branch
        {"data": ("foldline.TurnEnd", {"turn": 0, "reason": "bored"})},
        {"data": ("foldline.TurnEnd", {"turn": -2, "reason": "completed"})},
        {"data": ("foldline.StepStart", {"turn": 0, "step": -1})},
        {
            "data": (
                "foldline.RequestDispatch",
                {"turn": 0, "step": 0, "serializer": "s", "serializerVersion": 1, "digest": "sha256:XY", "bytes": 1},
            )
        },
    ],
)
def test_values_the_core_refuses_fail_as_through_fastavro(change: dict[str, Any]) -> None:
    datum = envelope_to_avro(Envelope(3, 4, TurnEnd(0, "completed"))) | change
    body = _raw(datum)
    try:
        expected: Envelope | type[Exception] = _through_fastavro(body)
    except FormatError as exc:
        expected = type(exc)
    if isinstance(expected, Envelope):
        assert decode_bodies(body, 1, SCHEMA) == [expected]
    else:
        with pytest.raises(expected):
            decode_bodies(body, 1, SCHEMA)


def test_bytes_that_are_not_the_records_fail() -> None:
    body = b"".join(_body(e) for e in simple_log(turns=1))
    count = len(simple_log(turns=1))
    with pytest.raises(ValueError, match="bytes after"):
        decode_bodies(body + b"\x00", count, SCHEMA)
    with pytest.raises(EOFError):  # fastavro's, for the record cut short
        decode_bodies(body[:-3], count, SCHEMA)


def test_the_codec_reads_records_of_the_current_schema_directly() -> None:
    """``AvroCodec.decode`` takes the direct path for a whole body of the common shapes, fastavro for the rest
    (a body with bytes after its record decodes as fastavro reads it, as before)."""
    for event in [*simple_log(turns=2), *EVERY_TYPE]:
        data = CODEC.encode(event)
        assert CODEC.decode(data) == event
        assert CODEC.decode(data + b"\x00") == _through_fastavro(data[10:] + b"\x00")
    step = simple_log(turns=1)[2]
    assert direct_module.direct_envelope(_body(step)) == step
    assert direct_module.direct_envelope(_body(step) + b"\x00") is None


@pytest.mark.parametrize(
    "time",
    [0, 1, 63, 64, 2**34 - 1, 2**34, 1_700_000_000_123, 2**41 - 1, 2**41, MAX_TIME_MS],
)
def test_times_of_every_varint_length_are_read_directly(time: int) -> None:
    """Six-byte times (1970-07 to 2039) take the gathered-groups path, others the byte-by-byte one: both equal."""
    event = Envelope(7, time, TurnEnd(0, "completed"))
    body = _body(event)
    assert direct_module._record(body, 0) == (event, len(body))
    assert decode_bodies(body, 1, SCHEMA) == [_through_fastavro(body)] == [event]
