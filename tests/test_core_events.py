"""Event encoding, decoding and the log rules, with typed errors naming seq and rule."""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import msgspec
import orjson
import pytest

from foldline.core import (
    CallConfig,
    Envelope,
    GenerateOptions,
    ImageBlock,
    ImageRef,
    Session,
    TextBlock,
    ToolSpec,
    build_request,
    decode_event,
    encode_event,
    header_equals,
    make_header,
)
from foldline.core.events import CompactionSummary, UserMessage
from foldline.core.header import EpochHeader
from foldline.core.validation import check_log
from foldline.errors import FormatError, ValidationError
from tests.factories import HEADER, LogBuilder, env, simple_log


def test_every_event_round_trips_through_canonical_json() -> None:
    for e in simple_log(3, 3):
        raw = encode_event(e)
        assert decode_event(raw) == e
        assert encode_event(decode_event(raw)) == raw
        assert raw == orjson.dumps(orjson.loads(raw), option=orjson.OPT_SORT_KEYS)


def _raw(etype: str, data: dict[str, object], seq: int = 0, **extra: object) -> bytes:
    return orjson.dumps({"type": etype, "seq": seq, "time": 1, "data": data, **extra}, option=orjson.OPT_SORT_KEYS)


def test_legacy_header_delta_is_rejected_even_if_ignorable() -> None:
    with pytest.raises(ValidationError) as info:
        decode_event(_raw("request/header-delta", {}, 4, ignorable=True))
    assert info.value.rule == "legacy-header-delta"
    assert info.value.seq == 4


def test_fallback_reason_is_rejected() -> None:
    header = {"config": {"provider": "p", "model": "m"}}
    with pytest.raises(ValidationError) as info:
        decode_event(_raw("request/header", {"header": header, "reason": "fallback"}, 7))
    assert info.value.rule == "legacy-fallback-reason"
    assert "seq 7" in str(info.value)


def test_unknown_type_needs_ignorable() -> None:
    with pytest.raises(ValidationError) as info:
        decode_event(_raw("future/thing", {"x": 1}))
    assert info.value.rule == "unknown-type"
    e = decode_event(_raw("future/thing", {"x": [1, {"y": 2}]}, ignorable=True))
    assert e.type == "future/thing"
    assert encode_event(e) == _raw("future/thing", {"x": [1, {"y": 2}]}, ignorable=True)
    # and it validates in a log
    check_log([e])


def test_surface_fields_only_on_surface_events() -> None:
    with pytest.raises(ValidationError) as info:
        decode_event(_raw("turn/start", {"turn": 0, "surfaceOp": "append"}))
    assert info.value.rule == "surface-fields-only-on-surface"


def test_non_canonical_header_is_rejected() -> None:
    header = {"config": {"provider": "p", "model": "m"}, "system": ""}
    with pytest.raises(FormatError) as info:
        decode_event(_raw("request/header", {"header": header, "reason": "initial"}))
    assert info.value.rule == "header-canonical"


def test_malformed_json_is_a_format_error() -> None:
    with pytest.raises(FormatError):
        decode_event(b"{not json")
    with pytest.raises(FormatError) as info:
        decode_event(
            _raw("user/message", {"id": 1, "role": "user", "content": [], "source": "user", "surfaceOp": "append"}, 3)
        )
    assert info.value.seq == 3
    assert "data.id" in str(info.value)


def test_header_canonicalization_and_equality() -> None:
    a = make_header(CallConfig("p", "m"), "", [])
    assert a.system is None
    assert a.tools is None
    assert header_equals(a, EpochHeader(CallConfig("p", "m")))
    tool = ToolSpec("read", "Read a file", {"type": "object", "properties": {"path": {"type": "string"}}})
    b = make_header(CallConfig("p", "m"), "s", [tool])
    assert not header_equals(a, b)
    assert header_equals(b, make_header(CallConfig("p", "m"), "s", [tool]))


def test_compaction_summary_must_be_followed_by_its_replacement() -> None:
    b = LogBuilder().header().user("a").user("b")
    b.add(CompactionSummary("sum", "p", "m", 100))
    with pytest.raises(ValidationError) as info:
        check_log([*b.events, env(b.seq, UserMessage("x", (TextBlock("not the summary"),)))])
    assert info.value.rule == "compaction-replacement"


def test_built_request_is_deeply_immutable() -> None:
    tool = ToolSpec("read", "Read", {"type": "object", "properties": {"path": {"type": "string"}}})
    header = make_header(CallConfig("p", "m"), "sys", [tool])
    b = LogBuilder().header(header).user("hello")
    img = ImageRef("sha256:" + "a" * 64, "image/png", 10, 1, 1)
    b.add(UserMessage("img", (ImageBlock(img), TextBlock("look"))))
    s = Session("x", b.events)
    req = build_request(s.derive_messages(), s.header() or HEADER)
    assert isinstance(req, GenerateOptions)
    r: Any = req  # typed as Any: these are the mutations the types already forbid
    m0, m1 = r.messages[0], r.messages[1]
    assert r.tools is not None
    schema = r.tools[0].input_schema
    attempts: list[tuple[type[BaseException], Callable[[], object]]] = [
        (AttributeError, lambda: setattr(r, "system", "changed")),
        (TypeError, lambda: operator.setitem(r.messages, 0, m1)),
        (AttributeError, lambda: r.messages.append(m0)),
        (TypeError, lambda: setattr(r.messages, "_len", 0)),
        (AttributeError, lambda: setattr(m0, "role", "assistant")),
        (AttributeError, lambda: setattr(m0.content[0], "text", "x")),
        (AttributeError, lambda: m1.content.append(TextBlock("x"))),
        (AttributeError, lambda: setattr(m1.content[0], "image", None)),
        (AttributeError, lambda: setattr(m1.content[0].image, "width", 2)),
        (TypeError, lambda: operator.setitem(schema, "type", "array")),
        (TypeError, lambda: operator.setitem(schema["properties"], "path", {})),
        (TypeError, lambda: setattr(schema, "_items", {})),
        (AttributeError, lambda: setattr(r.tools[0], "name", "write")),
    ]
    for expected, attempt in attempts:
        with pytest.raises(expected):
            attempt()


def test_derive_messages_returns_fresh_snapshots() -> None:
    s = Session("x", LogBuilder().header().user("a").events)
    first = s.derive_messages()
    second = s.derive_messages()
    assert first is not second
    assert first == second
    s.append(env(s.next_seq, UserMessage("b", (TextBlock("b"),))))
    assert len(first) == 1
    assert len(s.derive_messages()) == 2
    assert s.derive_messages()[0] is first[0]  # shared, not cloned


def test_loading_an_invalid_log_names_the_seq() -> None:
    events = simple_log()
    broken = [*events[:3], Envelope(9, 0, events[3].data)]
    with pytest.raises(ValidationError) as info:
        Session("x", broken)
    assert info.value.seq == 9
    assert info.value.rule == "seq-gapless"


@pytest.mark.parametrize(
    "digest",
    ["sha256:" + "A" * 64, "sha256:" + "g" * 64, "sha256:" + "a" * 63, "md5:" + "a" * 67, "sha256:" + "a" * 62 + "\n "],
)
def test_dispatch_digest_must_be_lowercase_sha256_hex(digest: str) -> None:
    data = {"turn": 0, "step": 0, "serializer": "anthropic-messages", "serializerVersion": 1, "bytes": 1}
    with pytest.raises(FormatError, match="64 lowercase hex digits"):
        decode_event(_raw("request/dispatch", {**data, "digest": digest}, 3))


def test_a_refused_batch_leaves_the_rules_as_they_were_and_the_same_events_are_accepted_after() -> None:
    """check_batch is all-or-nothing: a batch refused at its last event moves nothing on (the next seq, the
    surface, the call ids), so the same valid prefix is accepted afterwards at the same seqs."""
    from foldline.core.validation import LogRules

    events = simple_log()
    rules = LogRules()
    rules.check_batch(events[:3])
    surface, calls = list(rules.surface), set(rules.call_ids)
    bad = msgspec.structs.replace(events[-1], seq=len(events) + 5)  # a gap: refused
    with pytest.raises(ValidationError, match="seq"):
        rules.check_batch([*events[3:], bad])
    assert (rules.next_seq, list(rules.surface), set(rules.call_ids)) == (3, surface, calls)
    rules.check_batch(events[3:])
    assert rules.next_seq == len(events)
