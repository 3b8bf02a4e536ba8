"""Sub-agents: a tool that runs a child agent — its own session, its own header — with one call, and the lineage.

Inside a tool the loop runs, ``await run_subagent(task, options)`` opens the child's session on the parent's log
(by default ``<parent session>/<call id>``), whose first event is ``session/parent {parentId, callId, tool}``;
runs one turn of it on the task; and returns the child's final text as the tool's output with
``child_session`` set, which the loop logs on the call's ``tool/result`` (``childSessionId``). So each log names
the other: ``foldline show`` and ``foldline sessions --json`` draw the tree, and ``foldline verify`` checks both
ends of every link (:mod:`foldline.replay.lineage`).

A call run again (an idempotent tool after a crash, ``on_crash="continue"``) finds its child session there: the
child's own open turn is continued, or — when its last turn completed — that turn's answer is returned without
running anything again.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..core import codec
from ..core.content import ContentBlock, TextBlock
from ..core.events import AssistantMessage, Envelope, SessionParent, TurnEnd, TurnStart
from ..core.records import SESSION_ID_MAX_BYTES
from ..core.validation import id_problem
from ..providers.base import Provider
from .agent import Agent
from .calls import current_call
from .options import AgentOptions
from .tools import ToolOutput

__all__ = ["child_session_id", "run_subagent"]


def child_session_id(parent_id: str, call_id: str) -> str:
    """The default session id of the sub-agent a call runs: ``<parent>/<call id>``, or — when that is not a valid
    session id (too long) — ``<parent, cut>/<sha256 of both, 24 hex digits>``."""
    plain = f"{parent_id}/{call_id}"
    if id_problem(plain, SESSION_ID_MAX_BYTES) is None:
        return plain
    digest = codec.digest_bytes(f"{parent_id}\x00{call_id}".encode())[7:31]
    head = parent_id.encode("utf-8")[: SESSION_ID_MAX_BYTES - 64].decode("utf-8", "ignore")
    return f"{head}/{digest}"


async def run_subagent(
    task: str | Sequence[ContentBlock],
    options: AgentOptions,
    *,
    provider: Provider | None = None,
    session_id: str | None = None,
) -> ToolOutput:
    """Run a child agent on ``task`` from inside a tool; its answer is the tool's output (an error output when its
    turn did not complete, or paused on approvals of its own). ``provider`` defaults to the parent loop's."""
    call = current_call()
    child_id = session_id or child_session_id(call.session_id, call.call_id)
    done = _completed_answer(await call.log.read_async(child_id))
    if done is not None:  # the call ran before (a crash, then a re-run): its child finished already
        return ToolOutput(done, child_session=child_id)
    agent = await Agent.open(
        child_id,
        call.log,
        provider if provider is not None else call.provider,
        options,
        attachments=call.attachments,
        clock=call.clock,
        parent=SessionParent(call.session_id, call.call_id, call.tool),
    )
    result = await (agent.continue_turn() if agent.turn_open else agent.run_turn(task))
    if result.paused:
        waiting = ", ".join(p.call_id for p in result.pending)
        return ToolOutput(
            f"the sub-agent in session {child_id} paused: its calls {waiting} wait for approval decisions",
            is_error=True,
            child_session=child_id,
        )
    if result.reason != "completed":
        return ToolOutput(
            f"the sub-agent in session {child_id} ended its turn {result.reason}: {result.text}".rstrip(": "),
            is_error=True,
            child_session=child_id,
        )
    return ToolOutput(result.text, child_session=child_id)


def _completed_answer(events: Sequence[Envelope]) -> str | None:
    """The final text of the child's last turn when it completed (a call run again finds its work done)."""
    text: str | None = None
    for e in reversed(events):
        data = e.data
        if isinstance(data, TurnStart) and text is None:
            return None  # the last turn is open: continued, not answered from here
        if isinstance(data, TurnEnd):
            if text is not None:
                return None
            if data.reason != "completed":
                return None
            text = ""
        elif text is not None and isinstance(data, AssistantMessage):
            return "".join(b.text for b in data.content if isinstance(b, TextBlock))
    return None
