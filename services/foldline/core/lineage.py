"""Lineage: which session a session came from, and which sessions its tool calls ran. Pure, from the log alone.

Two kinds of child are told apart by their logs:

* a **fork** child begins with a copy of its parent's prefix, closed by ``session/end-seed {parentId,
  seedLength}``; its own events follow (``foldline fork``);
* a **sub-agent** child is a session of its own that a parent's tool call ran: its first event is
  ``session/parent {parentId, callId, tool}``, and the parent's ``tool/result`` of that call names it
  (``childSessionId``).

A fork child of a sub-agent carries the sub-agent's ``session/parent`` in its copied prefix; its own lineage is
the fork (the ``session/end-seed``), so the copy never makes it a second child of the same call.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from .events import Envelope, SessionEndSeed, SessionParent, ToolCall, ToolResult

__all__ = ["ChildLink", "Lineage", "called", "child_links", "lineage"]


@dataclass(frozen=True, slots=True)
class Lineage:
    """Where a session came from: ``kind`` ``fork`` (``seq``: its ``session/end-seed``) or ``subagent`` (``seq`` 0,
    its ``session/parent``; ``call_id`` and ``tool`` name the parent's call)."""

    kind: Literal["fork", "subagent"]
    parent_id: str | None  # a fork seeded by an older foldline may not name its parent
    seq: int
    call_id: str | None = None
    tool: str | None = None

    def to_json(self) -> dict[str, object]:
        out: dict[str, object] = {"kind": self.kind, "parent": self.parent_id, "seq": self.seq}
        if self.call_id is not None:
            out["callId"] = self.call_id
            out["tool"] = self.tool
        return out


@dataclass(frozen=True, slots=True)
class ChildLink:
    """A ``tool/result`` that names the sub-agent session its call ran."""

    call_id: str
    child_id: str
    seq: int  # of the tool/result
    tool: str


def lineage(events: Iterable[Envelope]) -> Lineage | None:
    """The session's own lineage (``None``: a session of its own). The last ``session/end-seed`` makes it a fork
    child; otherwise a ``session/parent`` at seq 0 makes it a sub-agent."""
    first: SessionParent | None = None
    fork: Lineage | None = None
    for e in events:
        data = e.data
        if e.seq == 0 and isinstance(data, SessionParent):
            first = data
        elif isinstance(data, SessionEndSeed):
            fork = Lineage("fork", data.parent_id, e.seq)
    if fork is not None:
        return fork
    if first is not None:
        return Lineage("subagent", first.parent_id, 0, first.call_id, first.tool)
    return None


def child_links(events: Iterable[Envelope]) -> list[ChildLink]:
    """Every sub-agent session the session's own tool results name (a fork child's copied prefix excluded)."""
    links: list[ChildLink] = []
    for e in events:
        data = e.data
        if isinstance(data, SessionEndSeed):
            links = []  # what came before is the parent's prefix
        elif isinstance(data, ToolResult) and data.child_session_id is not None and data.surface_op == "append":
            links.append(ChildLink(data.call_id, data.child_session_id, e.seq, data.name))
    return links


def called(events: Iterable[Envelope], call_id: str) -> ToolCall | None:
    """The session's ``tool/call`` of ``call_id``, if it has one."""
    for e in events:
        if isinstance(e.data, ToolCall) and e.data.call_id == call_id:
            return e.data
    return None
