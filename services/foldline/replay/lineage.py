"""Lineage checks of ``foldline verify``: both ends of every sub-agent link say the same thing.

A sub-agent's first event, ``session/parent {parentId, callId}``, and the parent's ``tool/result`` of that call,
``childSessionId``, are written by two loop instances into two logs. Verify reads the other end of each link:

* a session whose first event names a parent: the parent is in the log, has a ``tool/call`` of that id, and its
  result of the call — once there is one — names this session;
* a session whose tool result names a child: the child is in the log and its first event names this session
  and that call.

A broken link is reported like a request that cannot be rebuilt (:class:`~.verify.Unreconstructable`, the reason
starting ``lineage:``): the log claims a tree the other log does not confirm.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ..core.events import Envelope, ToolResult
from ..core.lineage import called, child_links, lineage

__all__ = ["lineage_problems"]


def lineage_problems(
    session_id: str, events: Sequence[Envelope], read: Callable[[str], list[Envelope]]
) -> list[tuple[int, str]]:
    """``(seq, reason)`` for each end of a link of ``session_id`` that the other log does not confirm."""
    problems: list[tuple[int, str]] = []
    own = lineage(events)
    if own is not None and own.kind == "subagent" and own.parent_id is not None and own.call_id is not None:
        parent = read(own.parent_id)
        if not parent:
            problems.append((0, f"lineage: its parent session {own.parent_id!r} is not in the log"))
        elif called(parent, own.call_id) is None:
            problems.append((0, f"lineage: its parent {own.parent_id!r} has no tool/call {own.call_id!r}"))
        else:
            result = next(
                (
                    e.data
                    for e in parent
                    if isinstance(e.data, ToolResult)
                    and e.data.call_id == own.call_id
                    and e.data.surface_op == "append"
                ),
                None,
            )
            if result is not None and result.child_session_id not in (None, session_id):
                problems.append(
                    (
                        0,
                        f"lineage: the parent's result of call {own.call_id!r} names session "
                        f"{result.child_session_id!r}, not this one",
                    )
                )
            elif result is not None and result.child_session_id is None and not result.is_error:
                problems.append((0, f"lineage: the parent's result of call {own.call_id!r} names no child session"))
    for link in child_links(events):
        child = read(link.child_id)
        found = lineage(child) if child else None
        if not child:
            problems.append(
                (
                    link.seq,
                    f"lineage: the result of call {link.call_id!r} names session "
                    f"{link.child_id!r}, which is not in the log",
                )
            )
        elif (
            found is None or found.kind != "subagent" or (found.parent_id, found.call_id) != (session_id, link.call_id)
        ):
            problems.append(
                (
                    link.seq,
                    f"lineage: session {link.child_id!r}, named by the result of call {link.call_id!r}, does not "
                    "name this session and call in its first event",
                )
            )
    return problems
