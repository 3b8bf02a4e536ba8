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
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

from .content import TextBlock, ToolCallBlock
from .events import (
    AssistantMessage,
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

_Entry = tuple[Literal["assistant", "result", "user"], tuple[str, ...]]


def interrupted_result(call_id: str, name: str) -> ToolResult:
    """The synthetic ``tool/result`` that answers an unanswered call."""
    return ToolResult(call_id, name, (TextBlock(INTERRUPTED_RESULT),), is_error=True)


def closing_events(events: Iterable[Envelope], reason: TurnEndReason = "error") -> list[EventData]:
    """The events that close ``events`` (a session log, or its tail from the open turn's ``turn/start``).

    In order: a synthetic ``tool/result`` for each tool call of the last visible ``assistant/message``
    that no ``tool/result`` answers yet (only while nothing else follows it on the surface, so the results
    land right after the answer they belong to), ``step/end`` for an open step and ``turn/end`` with
    ``reason`` for an open turn. Empty when nothing is open.
    """
    surface: list[_Entry] = []
    names: dict[str, str] = {}  # callId -> tool name, of every tool/call
    answered: set[str] = set()  # callIds with an appended tool/result
    open_turn: int | None = None
    open_step: tuple[int, int] | None = None
    for e in events:
        data = e.data
        entry: _Entry | None = None
        op: object = "append"
        match data:
            case TurnStart():
                open_turn, open_step = data.turn, None
            case TurnEnd():
                open_turn, open_step = None, None
            case StepStart():
                open_step = (data.turn, data.step)
            case StepEnd():
                open_step = None
            case ToolCall():
                names[data.call_id] = data.name
            case AssistantMessage():
                ids = tuple(b.id for b in data.content if isinstance(b, ToolCallBlock))
                entry, op = ("assistant", ids), data.surface_op
            case ToolResult():
                if data.surface_op == "append":
                    answered.add(data.call_id)
                entry, op = ("result", (data.call_id,)), data.surface_op
            case UserMessage():
                entry, op = ("user", ()), data.surface_op
            case _:
                pass
        if entry is None:
            continue
        if isinstance(op, ReplaceOp):
            surface[op.start : op.end + 1] = [entry]
        else:
            surface.append(entry)

    closing: list[EventData] = []
    trailing: set[str] = set()
    i = len(surface) - 1
    while i >= 0 and surface[i][0] == "result":
        trailing.update(surface[i][1])
        i -= 1
    if i >= 0 and surface[i][0] == "assistant":
        for call_id in surface[i][1]:
            # a call needs its tool/call event to be answered (rule tool-result-call), and one append at most
            if call_id not in trailing and call_id not in answered and call_id in names:
                closing.append(interrupted_result(call_id, names[call_id]))
                answered.add(call_id)
    if open_step is not None:
        closing.append(StepEnd(*open_step))
    if open_turn is not None:
        closing.append(TurnEnd(open_turn, reason))
    return closing
