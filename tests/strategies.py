"""Hypothesis strategies: random *valid* session logs built from random actions."""

from __future__ import annotations

from hypothesis import strategies as st

from foldline.core import (
    AssistantMessage,
    CallConfig,
    CompactionEnd,
    CompactionStart,
    CompactionSummary,
    Envelope,
    ReplaceOp,
    RequestHeader,
    TextBlock,
    ToolCall,
    ToolCallBlock,
    ToolResult,
    Usage,
    UserMessage,
    make_header,
)
from foldline.core.events import EventData
from foldline.core.validation import LogRules

ACTIONS = ("user", "assistant", "tool", "trim", "compact", "header", "noise")


def build_log(actions: list[tuple[str, int]]) -> list[Envelope]:
    """Turn (action, argument) pairs into a valid log; impossible actions are turned into user messages."""
    rules = LogRules()
    events: list[Envelope] = []
    calls = 0

    def add(data: EventData) -> None:
        e = Envelope(len(events), 1_000 + len(events), data)
        rules.check(e)
        events.append(e)

    add(RequestHeader(make_header(CallConfig("anthropic", "m"), "sys"), "initial"))
    for action, arg in actions:
        surface = rules.surface
        if action == "assistant":
            add(
                AssistantMessage(
                    f"a{len(events)}",
                    (TextBlock(f"reply {arg}"),),
                    Usage(1, 1, 0, 0, arg if arg % 2 else None),
                    "end_turn",
                )
            )
        elif action == "tool":
            cid = f"c{calls}"
            calls += 1
            add(AssistantMessage(f"a{len(events)}", (ToolCallBlock(cid, "read", "{}"),), None, "tool_use"))
            add(ToolCall(0, 0, cid, "read", "{}"))
            add(ToolResult(cid, "read", (TextBlock("r" * (arg % 50 + 1)),)))
        elif action == "trim" and any(n.type == "tool/result" for n in surface):
            results = [i for i, n in enumerate(surface) if n.type == "tool/result"]
            pos = results[arg % len(results)]
            node = surface[pos]
            assert node.call_id is not None
            assert node.name is not None
            add(
                ToolResult(
                    node.call_id, node.name, (TextBlock("[trimmed]"),), node.is_error, ReplaceOp(pos, pos), (node.seq,)
                )
            )
        elif action == "compact" and len(surface) >= 2:
            end = arg % (len(surface) - 1) + 1
            hidden = tuple(n.seq for n in surface[: end + 1])
            add(CompactionStart(0, end, 100))
            add(CompactionSummary(f"summary {arg}", "anthropic", "m", 256))
            add(UserMessage(f"c{len(events)}", (TextBlock(f"summary {arg}"),), "compaction", ReplaceOp(0, end), hidden))
            add(CompactionEnd())
        elif action == "header":
            add(RequestHeader(make_header(CallConfig("anthropic", "m"), f"sys {arg}"), "change"))
        elif action == "noise":
            add(CompactionEnd())  # a non-surface event
        else:
            add(UserMessage(f"u{len(events)}", (TextBlock(f"hello {arg}"),)))
    return events


actions_st = st.lists(st.tuples(st.sampled_from(ACTIONS), st.integers(0, 1_000)), min_size=0, max_size=40)
logs = actions_st.map(build_log)
