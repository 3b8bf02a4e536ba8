"""Header snapshot diffs, pure: what changed between consecutive ``request/header`` snapshots.

Each snapshot is full, so a diff is derived by comparing neighbours: call-config keys (old → new), the
system prompt as a unified text diff, and tools added, removed or changed by name. Together with each
snapshot's seq and reason this makes every drift attributable to one logged event.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, assert_never

from .events import (
    AssistantChunk,
    AssistantMessage,
    AttachmentQuarantine,
    CompactionEnd,
    CompactionStart,
    CompactionSummary,
    ControlEvent,
    Envelope,
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
from .header import EpochHeader, HeaderReason
from .wire import config_to_json, tool_spec_to_json

__all__ = ["HeaderDiff", "HeaderSnapshot", "diff_headers", "header_snapshots", "snapshot_diffs"]


@dataclass(frozen=True, slots=True)
class HeaderSnapshot:
    seq: int
    reason: HeaderReason
    header: EpochHeader


@dataclass(frozen=True, slots=True)
class HeaderDiff:
    """Field-level difference of two headers (``config`` maps key → (old, new); None means absent)."""

    config: tuple[tuple[str, Any, Any], ...] = ()
    system: tuple[str, ...] = ()  # unified diff lines; empty when the system prompt is unchanged
    tools_added: tuple[str, ...] = ()
    tools_removed: tuple[str, ...] = ()
    tools_changed: tuple[str, ...] = ()

    @property
    def empty(self) -> bool:
        return not (self.config or self.system or self.tools_added or self.tools_removed or self.tools_changed)

    def to_json(self) -> dict[str, Any]:
        return {
            "config": {key: {"old": old, "new": new} for key, old, new in self.config},
            "system": list(self.system),
            "toolsAdded": list(self.tools_added),
            "toolsRemoved": list(self.tools_removed),
            "toolsChanged": list(self.tools_changed),
        }


def header_snapshots(events: Sequence[Envelope]) -> list[HeaderSnapshot]:
    """Every ``request/header`` snapshot of a log, in seq order."""
    out: list[HeaderSnapshot] = []
    for e in events:
        data = e.data
        match data:
            case RequestHeader(header=header, reason=reason):
                out.append(HeaderSnapshot(e.seq, reason, header))
            case (
                UserMessage()
                | AssistantMessage()
                | ToolResult()
                | TurnStart()
                | TurnEnd()
                | StepStart()
                | StepEnd()
                | ToolCall()
                | RequestDispatch()
                | SessionEndSeed()
                | CompactionStart()
                | CompactionSummary()
                | CompactionEnd()
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
    return out


def diff_headers(old: EpochHeader | None, new: EpochHeader) -> HeaderDiff:
    """The difference from ``old`` (None: nothing before) to ``new``."""
    old_config = config_to_json(old.config) if old is not None else {}
    new_config = config_to_json(new.config)
    config = tuple(
        (key, old_config.get(key), new_config.get(key))
        for key in sorted(old_config.keys() | new_config.keys())
        if old_config.get(key) != new_config.get(key)
    )
    old_system = old.system if old is not None else None
    system: tuple[str, ...] = ()
    if old_system != new.system:
        system = tuple(
            difflib.unified_diff(
                (old_system or "").splitlines(),
                (new.system or "").splitlines(),
                "system (before)",
                "system (after)",
                lineterm="",
                n=1,
            )
        )
    old_tools = {t.name: tool_spec_to_json(t) for t in (old.tools or ())} if old is not None else {}
    new_tools = {t.name: tool_spec_to_json(t) for t in (new.tools or ())}
    added = tuple(name for name in new_tools if name not in old_tools)
    removed = tuple(name for name in old_tools if name not in new_tools)
    changed = tuple(name for name in new_tools if name in old_tools and old_tools[name] != new_tools[name])
    return HeaderDiff(config, system, added, removed, changed)


def snapshot_diffs(events: Sequence[Envelope]) -> list[tuple[HeaderSnapshot, HeaderDiff]]:
    """Each header snapshot with its difference to the one before it (the first against nothing)."""
    out: list[tuple[HeaderSnapshot, HeaderDiff]] = []
    previous: EpochHeader | None = None
    for snap in header_snapshots(events):
        out.append((snap, diff_headers(previous, snap.header)))
        previous = snap.header
    return out
