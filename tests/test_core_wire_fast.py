"""The decoders generated from the record definitions equal the interpreter of the same definitions.

``envelope_from_json`` answers what the encoder writes through the generated decoders (``fast_envelope``) and
everything else through the validating reader (the interpreter); for every input, ``fast_envelope`` either
defers (``None``) or returns exactly what the validating reader returns — never accepts what it would refuse.
And what it accepts is exactly what the encoder writes (``encode_event`` of the result is the canonical JSON
of the input): ``decode_canonical`` relies on that to check an imported line is canonical without encoding
the event again — for every event but one that can hold an ordered object (a header's tool schemas, written in
their own order rather than sorted: docs/FORMAT.md §1.9), which it encodes again.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from foldline.core import codec
from foldline.core.wire import _ORDERED_TYPES as ORDERED_TYPES
from foldline.core.wire import _fast_envelope as fast_envelope
from foldline.core.wire import decode_canonical, decode_event, encode_event, read_envelope
from foldline.errors import ValidationError
from tests.strategies import logs

GOLDEN = Path(__file__).parent / "fixtures" / "golden-logs" / "v0"

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 3) | st.floats(allow_nan=False) | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=6,
)


def _agree(value: Any) -> None:
    fast = fast_envelope(value)
    try:
        slow = read_envelope(value)
    except ValidationError:
        assert fast is None, f"the fast path accepted what the validating reader refuses: {value!r}"
        return
    assert fast is None or fast == slow
    if fast is not None and fast.type not in ORDERED_TYPES:
        assert encode_event(fast) == codec.canonical_json(value), f"the fast path took a non-canonical {value!r}"
    _canonical_agrees(codec.canonical_json(value))


def _canonical_agrees(raw: bytes) -> None:
    """``decode_canonical`` is ``decode_event`` with ``encode_event`` of its result, on any text."""
    try:
        expected = decode_event(raw)
    except ValidationError:
        try:
            decode_canonical(raw)
        except ValidationError:
            return
        raise AssertionError(f"decode_canonical accepted what decode_event refuses: {raw!r}") from None
    assert decode_canonical(raw) == (expected, encode_event(expected))


def _golden_events() -> list[Any]:
    out: list[Any] = []
    for path in sorted(GOLDEN.glob("*.jsonl")):
        out += [codec.loads(line) for line in path.read_bytes().splitlines()[1:]]
    return out


def test_every_golden_event_decodes_the_same_and_most_take_the_fast_path() -> None:
    events = _golden_events()
    assert len(events) > 100
    fast = 0
    for value in events:
        _agree(value)
        fast += fast_envelope(value) is not None
    assert fast > len(events) // 2


@settings(max_examples=80, deadline=None)
@given(logs)
def test_random_logs_decode_the_same(events: list[Any]) -> None:
    for env in events:
        _agree(codec.loads(encode_event(env)))


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(value, dict):
        for k, v in value.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out += _paths(v, (*prefix, i))
    return out


@settings(max_examples=400, deadline=None)
@given(st.data())
def test_mutated_events_never_slip_through_the_fast_path(data: st.DataObject) -> None:
    """Replace, delete or add one field anywhere in a real event: both paths still agree."""
    original = data.draw(st.sampled_from(_golden_events()))
    value = copy.deepcopy(original)
    path = data.draw(st.sampled_from(_paths(value)[1:] or [()]))
    action = data.draw(st.sampled_from(["replace", "delete", "add"]))
    if not path:
        _agree(value)
        return
    parent: Any = value
    for key in path[:-1]:
        parent = parent[key]
    last = path[-1]
    if action == "replace":
        parent[last] = data.draw(json_values)
    elif action == "delete":
        del parent[last]
    elif isinstance(parent, dict):
        parent[data.draw(st.text(min_size=1, max_size=8))] = data.draw(json_values)
    else:
        parent.append(data.draw(json_values))
    _agree(value)


def test_fields_the_encoder_omits_or_never_writes_leave_the_fast_path() -> None:
    """A default written out (``isError: false``, ``ignorable: false``, a null optional field) decodes, but
    is not canonical: the fast path leaves it to the validating reader, whose event encodes differently."""
    result = {"callId": "c", "name": "t", "content": [{"type": "text", "text": "x"}], "surfaceOp": "append"}
    message = {"id": "m", "role": "assistant", "content": [], "surfaceOp": "append"}
    variants = [
        {"type": "tool/result", "seq": 3, "time": 1, "data": {**result, "isError": False}},
        {"type": "tool/result", "seq": 3, "time": 1, "data": result, "ignorable": False},
        {"type": "assistant/message", "seq": 3, "time": 1, "data": {**message, "stopReason": None}},
        {"type": "assistant/message", "seq": 3, "time": 1, "data": {**message, "usage": None}},
        {
            "type": "user/message",
            "seq": 3,
            "time": 1,
            "data": {**message, "role": "user", "source": "user", "sourceEventSeqs": None},
        },
    ]
    for value in variants:
        assert fast_envelope(value) is None, value
        raw = codec.canonical_json(value)
        try:
            env, canonical = decode_canonical(raw)
        except ValidationError:
            continue
        assert canonical != raw
        assert canonical == encode_event(env)
    kept = {"type": "tool/result", "seq": 3, "time": 1, "data": {**result, "isError": True}}
    fast = fast_envelope(kept)
    assert fast is not None
    assert decode_canonical(codec.canonical_json(kept)) == (fast, codec.canonical_json(kept))
