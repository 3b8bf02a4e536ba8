"""The agent loop: inbox, hooks, typed tools and MCP servers, the invariant companion, and each request's step."""

from .agent import Agent, AgentOptions, StepRecord, TurnResult
from .hooks import Enter, PreStepContext, Reject
from .inbox import Inbox, InboxItem
from .mcp import MCPServer
from .pressure import PressurePolicy
from .tools import ImageData, ToolOutput, Toolset

__all__ = [
    "Agent",
    "AgentOptions",
    "Enter",
    "Inbox",
    "ImageData",
    "InboxItem",
    "MCPServer",
    "PreStepContext",
    "PressurePolicy",
    "Reject",
    "StepRecord",
    "ToolOutput",
    "Toolset",
    "TurnResult",
]
