"""Ordered JSON values (docs/FORMAT.md §1.9): what the model reads as its author wrote it keeps that key order in
the log, in every codec, and in a header's value — while every other object stays sorted and logs written before
keep their bytes.

The structured-output field of the call config does not exist yet; the mechanism is proven for it here on a second
ordered field of a record defined in this test, through the core's derived codecs (``Output``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson
import pydantic
import pytest

from foldline.adapters.avro import AvroCodec, decoding, writer_schemas
from foldline.core import codec
from foldline.core.content import Usage
from foldline.core.diff import diff_headers
from foldline.core.events import Envelope, RequestHeader
from foldline.core.frozen import FrozenDict, OrderedObject, freeze_json, freeze_ordered
from foldline.core.header import CallConfig, ToolSpec, make_header
from foldline.core.records import (
    OrderedJson,
    Record,
    field_signatures,
    from_json,
    holds_ordered_json,
    read_json,
    record_spec,
    to_json,
)
from foldline.core.request_diff import header_changes
from foldline.core.wire import _ORDERED_TYPES as ORDERED_TYPES
from foldline.core.wire import decode_canonical, decode_event, encode_event
from foldline.errors import FormatError


class Probe(pydantic.BaseModel):
    """Fields declared out of alphabetical order: the order a model must see them in."""

    zeta: str
    alpha: int
    mid: list[float] | None = None


def probe_schema() -> dict[str, Any]:
    schema = pydantic.TypeAdapter(Probe).json_schema()
    assert list(schema["properties"]) == ["zeta", "alpha", "mid"]  # pydantic keeps declaration order
    return schema


def schema_of(event: Envelope) -> Mapping[str, Any]:
    """The input schema of the first tool of a ``request/header`` event."""
    assert isinstance(event.data, RequestHeader)
    assert event.data.header.tools
    return event.data.header.tools[0].input_schema


def header_event(schema: Mapping[str, Any], seq: int = 0) -> Envelope:
    tool = ToolSpec("probe", "Record a probe reading.", schema)
    return Envelope(seq, 1_767_225_600_000, RequestHeader(make_header(CallConfig("p", "m"), "sys", [tool]), "initial"))


# ---------------------------------------------------------------------------- the value


def test_an_ordered_object_is_its_keys_in_order_at_every_depth() -> None:
    a = freeze_ordered({"b": 1, "a": {"y": 2, "x": [{"q": 1, "p": 2}]}})
    same = freeze_ordered({"b": 1, "a": {"y": 2, "x": [{"q": 1, "p": 2}]}})
    inner_swapped = freeze_ordered({"b": 1, "a": {"y": 2, "x": [{"p": 2, "q": 1}]}})
    assert a.json == b'{"b":1,"a":{"y":2,"x":[{"q":1,"p":2}]}}'
    assert a == same
    assert hash(a) == hash(same)
    assert a != inner_swapped  # an order change three levels down is another value
    assert a != freeze_ordered({"a": {"y": 2, "x": [{"q": 1, "p": 2}]}, "b": 1})
    assert freeze_ordered({"n": 1}) != freeze_ordered({"n": 1.0})  # written differently: another value
    assert isinstance(a["a"], OrderedObject)  # every object inside is ordered too
    assert a == {"b": 1, "a": {"y": 2, "x": [{"q": 1, "p": 2}]}}  # a plain mapping compares in its own order
    assert a != {"a": {"y": 2, "x": [{"q": 1, "p": 2}]}, "b": 1}
    # a FrozenDict (an unordered value) compares by members, as before
    assert freeze_json({"b": 1, "a": 2}) == freeze_json({"a": 2, "b": 1})
    with pytest.raises(TypeError):
        a.__setattr__("_items", {})
    with pytest.raises(TypeError):
        freeze_ordered([1, 2])  # type: ignore[arg-type]


def test_canonical_json_sorts_everything_but_an_ordered_object() -> None:
    value = {
        "z": {"d": 1, "c": 2},
        "a": freeze_ordered({"d": 1, "c": {"f": 1, "e": 2}}),
        "m": freeze_json({"d": 1, "c": 2}),
    }
    assert codec.canonical_json(value) == b'{"a":{"d":1,"c":{"f":1,"e":2}},"m":{"c":2,"d":1},"z":{"c":2,"d":1}}'
    # written as a plain dict it is sorted, as every version before ordered schemas writes it
    assert codec.canonical_json(freeze_ordered({"d": 1, "c": 2}).to_dict()) == b'{"c":2,"d":1}'


# ---------------------------------------------------------------------------- the header


def test_a_pydantic_schema_keeps_its_declaration_order_in_the_log() -> None:
    event = header_event(probe_schema())
    raw = encode_event(event)
    assert b'"properties":{"zeta":' in raw
    assert raw.index(b'"zeta"') < raw.index(b'"alpha"') < raw.index(b'"mid"')
    # everything outside the schema is sorted; inside, pydantic's own keyword order is kept as given
    assert raw.startswith(b'{"data":{"header":{"config":{"model":"m","provider":"p"},"system":"sys","tools":[{')
    decoded = decode_event(raw)
    assert decoded == event
    assert encode_event(decoded) == raw
    # the importer's check: the line is canonical, and a sorted re-encoding of it would not be
    env, canonical = decode_canonical(raw)
    assert env == event
    assert canonical == raw
    assert codec.canonical_json(orjson.loads(raw)) != raw
    assert {"request/header"} == ORDERED_TYPES  # the only event type whose sorted re-encoding is not canonical


def test_a_schema_read_through_the_checking_reader_keeps_its_order_too() -> None:
    """A header the generated decoder does not take (an integer temperature) is read by the interpreter: same
    order, same bytes once canonical."""
    raw = encode_event(header_event(probe_schema()))
    loose = raw.replace(b'"config":{"model":"m"', b'"config":{"temperature":1,"model":"m"')
    env, canonical = decode_canonical(loose)
    assert list(schema_of(env)["properties"]) == ["zeta", "alpha", "mid"]
    assert b'"properties":{"zeta":' in canonical
    assert b'"temperature":1.0' in canonical


def test_a_log_written_before_keeps_its_sorted_bytes() -> None:
    """A schema logged sorted (every log before ordered values) decodes in that order and re-encodes identically."""
    sorted_schema = orjson.loads(codec.canonical_json(probe_schema()))  # sorted at every depth
    raw = codec.canonical_json(orjson.loads(encode_event(header_event(sorted_schema))))
    assert decode_canonical(raw)[1] == raw
    assert list(schema_of(decode_event(raw))["properties"]) == ["alpha", "mid", "zeta"]


def test_an_order_change_is_a_header_change() -> None:
    declared = probe_schema()
    resorted = orjson.loads(codec.canonical_json(declared))
    assert resorted == declared  # equal as plain dicts...
    a = make_header(CallConfig("p", "m"), "s", [ToolSpec("probe", "d", declared)])
    b = make_header(CallConfig("p", "m"), "s", [ToolSpec("probe", "d", resorted)])
    assert a != b  # ...but not to a model: a `change` snapshot is owed
    assert diff_headers(a, b).tools_changed == ("probe",)
    # what replay reports: the reordered object itself, shown in each side's order
    (change,) = header_changes(a, b)
    assert change.path == "tools[0].inputSchema.properties"
    assert orjson.dumps(change.to_json()).startswith(b'{"path":"tools[0].inputSchema.properties","old":{"zeta":')
    assert a == make_header(CallConfig("p", "m"), "s", [ToolSpec("probe", "d", probe_schema())])


def test_avro_carries_the_schema_text_in_its_order() -> None:
    event = header_event(probe_schema())
    avro = AvroCodec()
    record = avro.encode(event)
    assert b'"properties":{"zeta":' in record  # the field is JSON text, in document order
    assert avro.decode(record) == event
    assert encode_event(avro.decode(record)) == encode_event(event)
    # the generated direct decoder (the archive's reading), interpreted and as built, gives the same, in order
    native, _ = decoding.native_module()
    for module in (decoding.interpreted_module(), native):
        if module is None:
            continue
        direct = module.decode_bodies(record[10:], 1, writer_schemas()[avro.fingerprint])
        assert direct == [event]
        assert encode_event(direct[0]) == encode_event(event)


# ---------------------------------------------------------------------------- a second ordered field


class Output(Record, frozen=True):
    """A stand-in for the structured-output config: an output schema the model must fill in its order, and an
    optional second one."""

    name: str
    schema: OrderedJson
    fallback: OrderedJson | None = None


def test_any_record_field_declared_ordered_gets_the_same_codecs() -> None:
    """The mechanism is the definition, not ToolSpec: a record declaring ``OrderedJson`` is written, read (by the
    generated decoder and by the checking interpreter), compared and listed the same way."""
    schema = {"properties": {"reasoning": {"type": "string"}, "answer": {"type": "string"}}, "type": "object"}
    out = Output("answer", freeze_ordered(schema), freeze_ordered({"type": "object", "properties": {}}))
    text = codec.canonical_json(to_json(out))
    assert text == (
        b'{"fallback":{"type":"object","properties":{}},"name":"answer",'
        b'"schema":{"properties":{"reasoning":{"type":"string"},"answer":{"type":"string"}},"type":"object"}}'
    )
    fast = from_json(Output, orjson.loads(text), "output")
    checked = read_json(Output, orjson.loads(text), "output")
    assert fast == checked == out
    assert isinstance(fast.schema, OrderedObject)
    assert isinstance(checked.fallback, OrderedObject)
    assert codec.canonical_json(to_json(fast)) == text
    swapped = Output("answer", freeze_ordered({"type": "object", "properties": schema["properties"]}))
    assert swapped != Output("answer", freeze_ordered(schema))
    # built in code with a plain dict: still written in the dict's order
    assert codec.canonical_json(to_json(Output("answer", schema))) == text.replace(
        b'"fallback":{"type":"object","properties":{}},', b""
    )
    assert holds_ordered_json(Output)
    assert not holds_ordered_json(Usage)
    assert field_signatures(Output) == ["Output.name: string", "Output.schema: object", "Output.fallback: object?"]
    assert [f.node.ordered for f in record_spec(Output).fields if f.name != "name"] == [True, True]  # type: ignore[union-attr]
    with pytest.raises(FormatError, match=r"output\.schema must be an object"):
        read_json(Output, {"name": "answer", "schema": [1]}, "output")
    # an unordered JSON field (an unknown event's payload) is still a FrozenDict, sorted when written
    assert not isinstance(freeze_json({"b": 1}), OrderedObject)
    assert isinstance(freeze_json({"b": 1}), FrozenDict)
