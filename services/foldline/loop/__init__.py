"""The agent loop: inbox, hooks, tools, invariant companion, and the step that builds each request."""

from .agent import Agent, AgentOptions, StepRecord, TurnResult
from .hooks import Enter, PreStepContext, Reject
from .inbox import Inbox, InboxItem
from .pressure import PressurePolicy
from .tools import ToolOutput, Toolset

__all__ = [
    "Agent",
    "AgentOptions",
    "Enter",
    "Inbox",
    "InboxItem",
    "PreStepContext",
    "PressurePolicy",
    "Reject",
    "StepRecord",
    "ToolOutput",
    "Toolset",
    "TurnResult",
]
