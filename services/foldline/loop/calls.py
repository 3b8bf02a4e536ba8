"""The tool call being run: what code inside a tool may know of it (the session, the call, the loop's stores).

The loop sets it around each call it runs (:data:`CURRENT_CALL`, a context variable, so concurrent calls and
tasks a tool starts each see their own); :func:`current_call` reads it. A sub-agent (:mod:`.subagents`) uses it
to name its parent session and call, and to run on the parent's log and provider.
"""

from __future__ import annotations

from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass

from ..errors import ConfigError
from ..ports.attachments import AttachmentStore
from ..ports.event_log import EventLog
from ..providers.base import Provider

__all__ = ["CURRENT_CALL", "ToolCallContext", "current_call"]


@dataclass(frozen=True, slots=True)
class ToolCallContext:
    """One tool call the loop is running, and the loop instance's stores and provider."""

    session_id: str
    call_id: str
    tool: str
    turn: int
    step: int
    log: EventLog
    provider: Provider
    attachments: AttachmentStore | None
    clock: Callable[[], int]


CURRENT_CALL: ContextVar[ToolCallContext | None] = ContextVar("foldline_tool_call", default=None)


def current_call() -> ToolCallContext:
    """The call being run; :class:`~foldline.errors.ConfigError` outside a tool the loop runs."""
    call = CURRENT_CALL.get()
    if call is None:
        raise ConfigError(
            "no tool call is running here: a sub-agent runs from inside a tool the agent loop calls "
            "(register the function with Toolset.tool and let the model call it)"
        )
    return call
