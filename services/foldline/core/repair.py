"""Crash repair: the events that close what a log left open when its writer stopped mid-step.

A loop instance that crashes, is killed or cannot write (a full disk) between the model's answer and
the tool results leaves a log whose last step is half open: an ``assistant/message`` with tool calls and
no ``tool/result`` for some of them, a ``step/start`` without ``step/end``, a ``turn/start`` without
``turn/end``. The next request built from such a log would carry a ``tool_use`` with no ``tool_result``,
which the real APIs refuse (HTTP 400).

:func:`closing_events` is a pure function of the log: it returns the events that close it again — one
synthetic ``tool/result`` per unanswered call of the model's last answer (``isError``, with
:data:`INTERRUPTED_RESULT` as its text: the typed outcome a reader and the model can see), then
``step/end`` and ``turn/end`` for what is still open. A new loop instance appends them once, when it
loads the session, before its first step; a loop closing a turn after a failure appends them too.
A log with nothing open gets none.

It is total: for any prefix of a valid log — not only the ones a crash can leave, which always end
between two appends — the closing events make a valid log whose next request the APIs accept. So it
also closes a compaction that stopped before its ``compaction/end`` (after its summary, it first writes
the replacing ``user/message`` the summary implies, exactly as the loop would have), and logs the
``tool/call`` of an answer's call that has none before answering it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from .compaction import summary_content
from .content import TextBlock, ToolCallBlock
from .events import (
    AssistantMessage,
    CompactionEnd,
    CompactionStart,
    CompactionSummary,
    Envelope,
    EventData,
    ReplaceOp,
    StepEnd,
    StepStart,
    ToolCall,
    ToolResult,
    TurnEnd,
    TurnEndReason,
    TurnStart,
    UserMessage,
)

__all__ = ["INTERRUPTED_RESULT", "closing_events", "interrupted_result"]

#: The text of a synthetic ``tool/result``: the call's outcome is unknown, and it was not run again.
INTERRUPTED_RESULT = (
    "interrupted: the loop stopped before this tool call's result was logged (a crash or a failed write); "
    "whether the tool ran is unknown, and it was not run again"
)


@dataclass(frozen=True, slots=True)
class _Entry:
    """One visible surface entry: its seq, and the calls of an assistant message / the call a result answers."""

    seq: int
    kind: str  # "assistant" | "result" | "user"
    calls: tuple[ToolCallBlock, ...] = ()
    answers: str | None = None


def interrupted_result(call_id: str, name: str) -> ToolResult:
    """The synthetic ``tool/result`` that answers an unanswered call."""
    return ToolResult(call_id, name, (TextBlock(INTERRUPTED_RESULT),), is_error=True)


def closing_events(
    events: Iterable[Envelope], reason: TurnEndReason = "error", answers: Mapping[str, ToolResult] | None = None
) -> list[EventData]:
    """The events that close ``events`` (a session log, or its tail from the open turn's ``turn/start``).

    In order: the end of an unfinished compaction; a synthetic ``tool/result`` for each tool call of the last
    visible ``assistant/message`` that no ``tool/result`` answers yet (only while nothing else follows it on
    the surface, so the results land right after the answer they belong to) — ``answers[callId]`` where the
    caller knows the answer (a denied call), else the interrupted result; ``step/end`` for an open step;
    ``turn/end`` with ``reason`` for an open turn. Empty when nothing is open.
    """
    surface: list[_Entry] = []
    logged: set[str] = set()  # callIds of every tool/call
    answered: set[str] = set()  # callIds with an appended tool/result
    open_turn: int | None = None
    open_step: tuple[int, int] | None = None
    last_step = (0, 0)
    compaction: CompactionStart | None = None
    summary: CompactionSummary | None = None
    next_seq = 0
    for e in events:
        data = e.data
        next_seq = e.seq + 1
        entry: _Entry | None = None
        op: object = "append"
        match data:
            case TurnStart():
                open_turn, open_step = data.turn, None
            case TurnEnd():
                open_turn, open_step = None, None
            case StepStart():
                open_step = last_step = (data.turn, data.step)
            case StepEnd():
                open_step = None
            case ToolCall():
                logged.add(data.call_id)
            case CompactionStart():
                compaction, summary = data, None
            case CompactionSummary():
                summary = data
            case CompactionEnd():
                compaction = summary = None
            case AssistantMessage():
                calls = tuple(b for b in data.content if isinstance(b, ToolCallBlock))
                entry, op = _Entry(e.seq, "assistant", calls), data.surface_op
            case ToolResult():
                if data.surface_op == "append":
                    answered.add(data.call_id)
                entry, op = _Entry(e.seq, "result", answers=data.call_id), data.surface_op
            case UserMessage():
                entry, op = _Entry(e.seq, "user"), data.surface_op
                if data.source == "compaction":
                    summary = None  # the summary's replacement is in
            case _:
                pass
        if entry is not None:
            if isinstance(op, ReplaceOp):
                surface[op.start : op.end + 1] = [entry]
            else:
                surface.append(entry)

    closing: list[EventData] = []
    if compaction is not None:
        if summary is not None and 0 <= compaction.start <= compaction.end < len(surface):
            hidden = tuple(x.seq for x in surface[compaction.start : compaction.end + 1])
            replace = ReplaceOp(compaction.start, compaction.end)
            closing.append(UserMessage(f"u{next_seq}", summary_content(summary.summary), "compaction", replace, hidden))
            surface[compaction.start : compaction.end + 1] = [_Entry(next_seq, "user")]
        closing.append(CompactionEnd())
    trailing: set[str] = set()
    i = len(surface) - 1
    while i >= 0 and surface[i].kind == "result":
        trailing.add(surface[i].answers or "")
        i -= 1
    if i >= 0 and surface[i].kind == "assistant":
        turn, step = open_step or last_step
        for call in surface[i].calls:
            if call.id in trailing or call.id in answered:
                continue  # answered (a second append for one callId is refused by the log rules)
            if call.id not in logged:  # a tool/result needs its tool/call before it
                closing.append(ToolCall(turn, step, call.id, call.name, call.arguments))
                logged.add(call.id)
            known = answers.get(call.id) if answers else None
            closing.append(known if known is not None else interrupted_result(call.id, call.name))
            answered.add(call.id)
    if open_step is not None:
        closing.append(StepEnd(*open_step))
    if open_turn is not None:
        closing.append(TurnEnd(open_turn, reason))
    return closing
