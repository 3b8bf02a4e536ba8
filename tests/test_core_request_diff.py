"""core/request_diff.py: field paths, the first differing message and byte, the prompt-order shared prefix."""

from __future__ import annotations

import msgspec
from hypothesis import given
from hypothesis import strategies as st

from foldline.core import CallConfig
from foldline.core.content import TextBlock, ToolResultBlock
from foldline.core.header import EpochHeader, ToolSpec
from foldline.core.projection import Message
from foldline.core.request import build_request
from foldline.core.request_diff import (
    FieldChange,
    first_byte_difference,
    first_message_change,
    header_changes,
    json_changes,
    shared_prompt_prefix,
)

TOOLS = (
    ToolSpec("read", "Read a file.", {"type": "object", "properties": {"path": {"type": "string"}}}),
    ToolSpec("write", "Write a file.", {"type": "object"}),
)
HEADER = EpochHeader(CallConfig("anthropic", "m", max_tokens=100), "Be careful.", TOOLS)
MESSAGES = (
    Message("user", (TextBlock("hello there"),)),
    Message("assistant", (TextBlock("hi"),)),
    Message("tool", (ToolResultBlock("c1", (TextBlock("contents"),)),)),
)


def with_header(**changes: object) -> EpochHeader:
    return msgspec.structs.replace(HEADER, **changes)


def test_json_changes_name_every_differing_leaf_by_path() -> None:
    old = {"a": 1, "b": {"c": [1, 2, 3], "d": "x"}, "gone": True}
    new = {"a": 1.0, "b": {"c": [1, 5], "d": "x"}, "new": None}
    assert json_changes(old, new) == [
        FieldChange("a", 1, 1.0),  # an integer and a float differ
        FieldChange("b.c[1]", 2, 5),
        FieldChange("b.c[2]", 3, None),
        FieldChange("gone", True, None),
        FieldChange("new", None, None),
    ]
    assert json_changes({"x": [1]}, {"x": [1]}) == []


def test_header_changes_use_the_logged_names() -> None:
    tools = (TOOLS[0], msgspec.structs.replace(TOOLS[1], description="Write a whole file."))
    changed = EpochHeader(HEADER.config.with_overrides(model="m2", temperature=0.5), "Be bold.", tools)
    assert [c.path for c in header_changes(HEADER, changed)] == [
        "config.model",
        "config.temperature",
        "system",
        "tools[1].description",
    ]
    schema = ToolSpec("read", "Read a file.", {"type": "object", "properties": {"path": {"type": "integer"}}})
    assert [c.path for c in header_changes(HEADER, with_header(tools=(schema, TOOLS[1])))] == [
        "tools[0].inputSchema.properties.path.type"
    ]
    assert [c.path for c in header_changes(HEADER, with_header(system=None))] == ["system"]


def test_a_long_string_is_shown_around_its_first_difference() -> None:
    change = FieldChange("system", "x" * 500 + "old tail", "x" * 500 + "new tail")
    assert change.at == 500
    old, new = change.excerpts(40)
    assert (old, new) == ("…" + "x" * 20 + "old tail", "…" + "x" * 20 + "new tail")
    assert change.to_json()["at"] == 500
    assert "system (from character 500)" in change.describe()


def test_first_message_change() -> None:
    changed = (*MESSAGES[:2], Message("tool", (ToolResultBlock("c1", (TextBlock("contents, trimmed"),)),)))
    index, change = first_message_change(MESSAGES, changed) or (None, None)
    assert index == 2
    assert change == FieldChange("messages[2].content[0].content[0].text", "contents", "contents, trimmed")
    assert first_message_change(MESSAGES, MESSAGES) is None
    index, change = first_message_change(MESSAGES, MESSAGES[:2]) or (None, None)
    assert index == 2
    assert change is not None
    assert change.path == "messages[2]"
    assert change.new is None


@given(st.binary(max_size=300), st.binary(max_size=300), st.binary(max_size=40))
def test_first_byte_difference_is_the_first_offset_that_differs(prefix: bytes, a: bytes, b: bytes) -> None:
    old, new = prefix + a, prefix + b
    found = first_byte_difference(old, new, context=8)
    if old == new:
        assert found is None
        return
    assert found is not None
    expected = next((i for i, (x, y) in enumerate(zip(old, new, strict=False)) if x != y), min(len(old), len(new)))
    assert found.offset == expected
    assert old[: found.offset] == new[: found.offset]
    assert found.old_context == old[max(0, expected - 8) : expected + 8]
    assert found.new_context == new[max(0, expected - 8) : expected + 8]


def test_the_shared_prefix_in_prompt_order() -> None:
    base = build_request(MESSAGES, HEADER)
    whole = shared_prompt_prefix(base, base)
    assert (whole.stops_at, whole.share) == (None, 1.0)
    assert whole.shared_bytes == whole.total_bytes > 0
    # appended messages: the recorded request is a prefix of the new one
    longer = build_request((*MESSAGES, Message("user", (TextBlock("more"),))), HEADER)
    grown = shared_prompt_prefix(base, longer)
    assert grown.stops_at == "messages[3]"
    assert grown.shared_tokens == whole.total_tokens
    # a system prompt change keeps the tools; a tool change keeps only the tools before it
    system = shared_prompt_prefix(base, build_request(MESSAGES, with_header(system="Be bold.")))
    assert system.stops_at == "system"
    assert 0 < system.shared_tokens < system.total_tokens
    tool = shared_prompt_prefix(
        base,
        build_request(
            MESSAGES,
            with_header(tools=(TOOLS[0], msgspec.structs.replace(TOOLS[1], description="W."))),
        ),
    )
    assert tool.stops_at == "tools[1]"
    assert tool.shared_tokens < system.shared_tokens
    # another model shares nothing; thinking settings share the tools and the system prompt only
    model = shared_prompt_prefix(
        base, build_request(MESSAGES, with_header(config=HEADER.config.with_overrides(model="n")))
    )
    assert (model.shared_tokens, model.stops_at) == (0, "config.model")
    thinking = shared_prompt_prefix(
        base,
        build_request(MESSAGES, with_header(config=HEADER.config.with_overrides(reasoning_effort="high"))),
    )
    assert thinking.stops_at == "config.reasoningEffort"
    assert thinking.shared_tokens == system.shared_tokens + 3  # the tools, then "Be careful." (11 bytes: 3 tokens)
    # sampling settings do not touch the cache
    warm = shared_prompt_prefix(
        base,
        build_request(MESSAGES, with_header(config=HEADER.config.with_overrides(temperature=1.0))),
    )
    assert warm.share == 1.0
