"""Fork points and fork seeds, pure.

A fork child's log begins with its parent's events ``0..at_seq`` (same seqs, same times), then
``session/end-seed {parentId, seedLength}``. If the cut falls between two steps of a turn, the child
closes that turn with ``turn/end`` reason ``interrupted``; its own turns follow. When the fork overrides
the model or the system prompt, the child also gets a full ``request/header`` snapshot with reason
``resume`` carrying them, so the drift is a logged, diffable event before the child's first request.

A cut inside a step (between ``step/start`` and ``step/end``), inside a compaction, or past the parent's
last event is refused with :class:`~foldline.errors.ForkError`, naming the nearest valid seqs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import assert_never

import msgspec

from ..errors import ForkError
from .events import (
    AssistantChunk,
    AssistantMessage,
    AttachmentQuarantine,
    CompactionEnd,
    CompactionStart,
    CompactionSummary,
    ControlEvent,
    Envelope,
    EventData,
    LlmRetry,
    RequestDispatch,
    RequestHeader,
    SessionEndSeed,
    SessionErased,
    StepEnd,
    StepStart,
    ToolCall,
    ToolResult,
    TurnEnd,
    TurnStart,
    UnknownEvent,
    UserMessage,
)
from .header import EpochHeader
from .projection import fold_request_header
from .validation import check_log

__all__ = ["ForkPoint", "fork_point", "fork_seed", "lineage"]


@dataclass(frozen=True, slots=True)
class ForkPoint:
    """A valid cut of a parent log: keep ``0..at_seq``; ``open_turn`` is a turn left open by the cut."""

    at_seq: int
    open_turn: int | None
    header: EpochHeader | None


def fork_point(parent: Sequence[Envelope], at_seq: int) -> ForkPoint:
    """Check that ``parent`` can be cut after ``at_seq``; ForkError says why not and where it could."""
    n = len(parent)
    if n == 0:
        raise ForkError("the parent session has no events; there is nothing to fork")
    if not 0 <= at_seq < n:
        raise ForkError(f"--at {at_seq} is past the end: the parent has seqs 0..{n - 1}; choose a seq within them")
    step_open: tuple[int, int, int] | None = None  # (seq of step/start, turn, step)
    compaction_open: int | None = None
    turn_open: int | None = None
    for e in parent[: at_seq + 1]:
        data = e.data
        match data:
            case StepStart(turn=turn, step=step):
                step_open = (e.seq, turn, step)
            case StepEnd():
                step_open = None
            case CompactionStart():
                compaction_open = e.seq
            case CompactionEnd():
                compaction_open = None
            case TurnStart(turn=turn):
                turn_open = turn
            case TurnEnd():
                turn_open = None
            case (
                UserMessage()
                | AssistantMessage()
                | ToolResult()
                | ToolCall()
                | RequestHeader()
                | RequestDispatch()
                | SessionEndSeed()
                | CompactionSummary()
                | AttachmentQuarantine()
                | LlmRetry()
                | AssistantChunk()
                | LlmRetry()
                | AssistantChunk()
                | SessionErased()
                | ControlEvent()
                | UnknownEvent()
            ):
                pass
            case _:
                assert_never(data)
    if step_open is not None:
        opened, turn, step = step_open
        closes = next((e.seq for e in parent[at_seq + 1 :] if isinstance(e.data, StepEnd)), None)
        after = f" or at {closes} (its step/end)" if closes is not None else ""
        raise ForkError(
            f"--at {at_seq} is inside turn {turn} step {step} (step/start at seq {opened}); "
            f"a child cannot begin in the middle of a request: fork at {opened - 1} (before it){after}"
        )
    if compaction_open is not None:
        raise ForkError(
            f"--at {at_seq} is inside the compaction that starts at seq {compaction_open}; "
            f"fork at {compaction_open - 1} or after its compaction/end"
        )
    prefix = parent[: at_seq + 1]
    check_log(prefix)  # the prefix must stand on its own (it does for any log that validated)
    return ForkPoint(at_seq, turn_open, fold_request_header(prefix))


def fork_seed(
    parent: Sequence[Envelope],
    parent_id: str,
    at_seq: int,
    time: int,
    *,
    model: str | None = None,
    system: str | None = None,
) -> list[Envelope]:
    """The whole initial log of a fork child (validated): prefix, end-seed, closing, override snapshot."""
    point = fork_point(parent, at_seq)
    events = list(parent[: at_seq + 1])
    own: list[EventData] = [SessionEndSeed(parent_id, at_seq + 1)]
    if point.open_turn is not None:
        own.append(TurnEnd(point.open_turn, "interrupted"))
    if model is not None or system is not None:
        if point.header is None:
            raise ForkError(
                f"--at {at_seq} is before the parent's first request/header, so there is no model or system "
                "prompt to override; fork at or after the first request"
            )
        header = point.header
        if model is not None:
            header = msgspec.structs.replace(header, config=header.config.with_overrides(model=model))
        if system is not None:
            header = EpochHeader(header.config, system or None, header.tools)
        own.append(RequestHeader(header, "resume"))
    events += [Envelope(at_seq + 1 + i, time, data) for i, data in enumerate(own)]
    check_log(events)
    return events


def lineage(events: Sequence[Envelope]) -> SessionEndSeed | None:
    """The ``session/end-seed`` of a fork child (its parent and seed length), or None.

    A fork of a fork holds its ancestors' end-seeds inside its prefix; the last one is its own.
    """
    for e in reversed(events):
        if isinstance(e.data, SessionEndSeed):
            return e.data
    return None
