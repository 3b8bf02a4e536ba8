"""Pure pieces of issue 4: the pressure plans, the summarize input, fork points and header diffs."""

from __future__ import annotations

import pytest

from foldline.core import CallConfig, TextBlock, ToolSpec, make_header
from foldline.core.compaction import (
    SUMMARIZE_SYSTEM,
    SUMMARY_HEADING,
    TRIM_MARKER,
    estimate_tokens,
    plan_compaction,
    plan_trims,
    summarize_request,
    summary_content,
    trimmed_parts,
)
from foldline.core.content import ImageBlock, ImageRef, ToolCallBlock, ToolResultBlock
from foldline.core.diff import diff_headers, snapshot_diffs
from foldline.core.events import (
    CompactionStart,
    CompactionSummary,
    ReplaceOp,
    RequestHeader,
    SessionEndSeed,
    TurnEnd,
    UserMessage,
)
from foldline.core.fork import fork_point, fork_seed, lineage
from foldline.core.projection import Message, Session
from foldline.core.validation import check_log
from foldline.errors import ForkError

from .factories import HEADER, LogBuilder, env, simple_log

IMG = ImageRef("sha256:" + "ab" * 32, "image/png", 100, 30, 50)


def _conversation() -> list[Message]:
    return [
        Message("user", (TextBlock("question"), ImageBlock(IMG))),
        Message("assistant", (TextBlock("calling"), ToolCallBlock("c1", "dump", '{"topic":"x"}'))),
        Message("tool", (ToolResultBlock("c1", (TextBlock("y" * 4000),)),)),
        Message("assistant", (TextBlock("done"),)),
        Message("user", (TextBlock("next"),)),
        Message("assistant", (ToolCallBlock("c2", "note", "{}"),)),
        Message("tool", (ToolResultBlock("c2", (TextBlock("short"),)),)),
    ]


def test_estimate_is_deterministic_and_counts_images_by_area() -> None:
    msgs = _conversation()
    assert estimate_tokens(msgs) == estimate_tokens(list(msgs))
    assert estimate_tokens([Message("user", (ImageBlock(IMG),))]) == 4 + 2  # 30*50/750 = 2
    assert estimate_tokens([Message("user", (TextBlock("abcdefgh"),))]) == 4 + 2


def test_compaction_never_cuts_between_a_call_and_its_result() -> None:
    msgs = _conversation()
    for keep in range(0, 1500, 7):
        span = plan_compaction(msgs, keep_recent_tokens=keep)
        if span is None:
            continue
        start, end = span
        assert start == 0
        assert end >= 1
        assert msgs[end + 1].role != "tool"
    assert plan_compaction(msgs[:2], keep_recent_tokens=1) is None
    # a region no larger than the summary could be is not worth a cache miss
    span = plan_compaction(msgs, keep_recent_tokens=1)
    assert span is not None
    region = estimate_tokens(msgs[: span[1] + 1])
    assert plan_compaction(msgs, keep_recent_tokens=1, min_region_tokens=region - 1) == span
    assert plan_compaction(msgs, keep_recent_tokens=1, min_region_tokens=region) is None


def test_trims_pick_old_large_results_and_keep_the_call_id() -> None:
    msgs = [*_conversation(), Message("assistant", (TextBlock("end"),))]
    # surface nodes of a real log of the same shape (user, call, result, answer; twice)
    surface = Session("s", simple_log(turns=2, steps=2)).rules.surface
    assert [n.type.split("/")[0] for n in surface] == [m.role for m in msgs]
    trims = plan_trims(msgs, surface, keep_recent_tokens=10, trim_over_tokens=100, keep_chars=50)
    assert [t.position for t in trims] == [2]
    assert trims[0].call_id == surface[2].call_id
    text = trims[0].parts[0]
    assert isinstance(text, TextBlock)
    assert TRIM_MARKER in text.text
    assert text.text.startswith("y" * 50)
    # an already trimmed result is left alone
    again = [*msgs[:2], Message("tool", (ToolResultBlock("c1", trims[0].parts),)), *msgs[3:]]
    assert plan_trims(again, surface, keep_recent_tokens=10, trim_over_tokens=10, keep_chars=50) == []
    with pytest.raises(ValueError, match="surface nodes"):
        plan_trims(msgs[:6], surface, keep_recent_tokens=10, trim_over_tokens=100, keep_chars=50)


def test_trimmed_parts_count_dropped_images() -> None:
    parts = trimmed_parts((TextBlock("abcdef"), ImageBlock(IMG)), 3)
    assert parts == (TextBlock(f"abc\n{TRIM_MARKER} 3 of 6 characters and 1 image(s) removed to save context]"),)


def test_summarize_request_renders_the_region_with_images_and_is_deterministic() -> None:
    config = CallConfig("anthropic", "claude-emulated", max_tokens=300)
    region = _conversation()[:4]
    req = summarize_request(region, config)
    assert req.same_as(summarize_request(list(region), config))
    assert req.system == SUMMARIZE_SYSTEM
    assert req.tools is None
    assert req.config == config
    [message] = req.messages
    assert message.role == "user"
    kinds = [type(b).__name__ for b in message.content]
    assert kinds == ["TextBlock", "ImageBlock", "TextBlock"]
    last = message.content[-1]
    assert isinstance(last, TextBlock)
    assert "calls dump" in last.text
    assert "tool result for call c1" in last.text
    with pytest.raises(ValueError, match="at least one message"):
        summarize_request([], config)
    assert summary_content("s") == (TextBlock(f"{SUMMARY_HEADING}\ns"),)


# ---------------------------------------------------------------------------- fork


def test_fork_past_the_end_is_refused() -> None:
    events = simple_log()
    with pytest.raises(ForkError, match=r"past the end: the parent has seqs 0\.\.\d+"):
        fork_point(events, len(events))
    with pytest.raises(ForkError, match="past the end"):
        fork_point(events, -1)
    with pytest.raises(ForkError, match="no events"):
        fork_point([], 0)


def test_fork_inside_a_step_names_valid_points() -> None:
    events = simple_log()
    inside = next(e.seq for e in events if isinstance(e.data, UserMessage))  # within step 0 of turn 0
    with pytest.raises(ForkError, match=r"inside turn 0 step 0 \(step/start at seq \d+\)") as info:
        fork_point(events, inside)
    assert "fork at" in str(info.value)


def test_fork_inside_a_compaction_is_refused() -> None:
    b = LogBuilder().header()
    b.turn(0, "hello", 1)
    b.add(CompactionStart(0, 1, 99))
    b.add(CompactionSummary("sum", "anthropic", "m", 64))
    with pytest.raises(ForkError, match="inside the compaction"):
        fork_point(b.events, b.seq - 1)
    b.add(UserMessage("u", (TextBlock("sum"),), "compaction", ReplaceOp(0, 1), (1, 2)))
    with pytest.raises(ForkError, match="inside the compaction"):
        fork_point(b.events, b.seq - 1)


def test_fork_seed_between_steps_closes_the_turn_and_records_lineage() -> None:
    events = simple_log(turns=2, steps=2)
    # the step/end of turn 0 step 0: the turn is still open
    from foldline.core.events import StepEnd

    cut = next(e.seq for e in events if isinstance(e.data, StepEnd))
    seed = fork_seed(events, "parent", cut, 123, model="other-model")
    assert seed[: cut + 1] == events[: cut + 1]
    own = [e.data for e in seed[cut + 1 :]]
    assert own[0] == SessionEndSeed("parent", cut + 1)
    assert own[1] == TurnEnd(0, "interrupted")
    assert isinstance(own[2], RequestHeader)
    assert own[2].reason == "resume"
    assert own[2].header.config.model == "other-model"
    assert all(e.time == 123 for e in seed[cut + 1 :])
    check_log(seed)
    assert lineage(seed) == SessionEndSeed("parent", cut + 1)
    assert lineage(events) is None
    grandchild = fork_seed(seed, "child", len(seed) - 1, 456)
    assert lineage(grandchild) == SessionEndSeed("child", len(seed))


def test_fork_override_before_any_header_is_refused() -> None:
    events = [env(0, UserMessage("u0", (TextBlock("hi"),)))]
    with pytest.raises(ForkError, match="no model or system prompt to override"):
        fork_seed(events, "p", 0, 0, system="new")
    assert len(fork_seed(events, "p", 0, 0)) == 2


# ---------------------------------------------------------------------------- diff


def _tool(name: str, description: str = "d") -> ToolSpec:
    return ToolSpec(name, description, {"type": "object", "properties": {}})


def test_header_diff_lists_config_keys_system_lines_and_tools_by_name() -> None:
    old = make_header(CallConfig("anthropic", "m1", max_tokens=100), "line one\nline two", [_tool("a"), _tool("b")])
    new = make_header(
        CallConfig("anthropic", "m2", max_tokens=100, temperature=0.5),
        "line one\nline 2",
        [_tool("b", "changed"), _tool("c")],
    )
    d = diff_headers(old, new)
    assert d.config == (("model", "m1", "m2"), ("temperature", None, 0.5))
    assert "-line two" in d.system
    assert "+line 2" in d.system
    assert (d.tools_added, d.tools_removed, d.tools_changed) == (("c",), ("a",), ("b",))
    assert not d.empty
    assert diff_headers(old, old).empty
    assert d.to_json()["config"] == {"model": {"old": "m1", "new": "m2"}, "temperature": {"old": None, "new": 0.5}}


def test_snapshot_diffs_walk_consecutive_snapshots() -> None:
    b = LogBuilder().header()
    b.turn(0, "q", 1)
    b.header(HEADER, "resume")
    changed = make_header(HEADER.config.with_overrides(model="m3"), HEADER.system)
    b.header(changed, "change")
    diffs = snapshot_diffs(b.events)
    assert [(s.seq, s.reason) for s, _ in diffs] == [(0, "initial"), (7, "resume"), (8, "change")]
    assert diffs[0][1].config
    assert diffs[1][1].empty
    assert diffs[2][1].config == (("model", "claude-emulated", "m3"),)
