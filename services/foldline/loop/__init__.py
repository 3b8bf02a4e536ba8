"""The agent loop: inbox, hooks, tools, invariant companion, and the step that builds each request."""

from .agent import Agent, AgentOptions, TurnResult
from .hooks import Enter, PreStepContext, Reject
from .inbox import Inbox, InboxItem
from .tools import ToolOutput, Toolset

__all__ = [
    "Agent",
    "AgentOptions",
    "Enter",
    "Inbox",
    "InboxItem",
    "PreStepContext",
    "Reject",
    "ToolOutput",
    "Toolset",
    "TurnResult",
]
