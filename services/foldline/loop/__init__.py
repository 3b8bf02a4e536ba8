"""The agent loop: inbox, hooks, typed tools and MCP servers, the invariant companion, each request's step, a
turn read as typed events while it runs (``Agent.stream``), and pauses: approvals decided from any process, the
durable inbox, sub-agents."""

from .agent import Agent, AgentOptions, StepRecord, TurnResult
from .approvals import decide
from .hooks import Enter, PreStepContext, Reject
from .inbox import Inbox, InboxItem, inject
from .mcp import MCPServer
from .output import OUTPUT_RETRY_SOURCE, OutputType
from .pressure import PressurePolicy
from .stream import (
    AttemptDiscarded,
    ReasoningDelta,
    StepFinished,
    StepStarted,
    StreamEvent,
    TextDelta,
    ToolArgumentsDelta,
    ToolCallFinished,
    ToolCallResult,
    ToolCallStarted,
    TurnFinished,
    TurnStream,
)
from .subagents import run_subagent
from .tools import ImageData, ToolOutput, Toolset

__all__ = [
    "OUTPUT_RETRY_SOURCE",
    "Agent",
    "AgentOptions",
    "AttemptDiscarded",
    "Enter",
    "ImageData",
    "Inbox",
    "InboxItem",
    "MCPServer",
    "OutputType",
    "PreStepContext",
    "PressurePolicy",
    "ReasoningDelta",
    "Reject",
    "StepFinished",
    "StepRecord",
    "StepStarted",
    "StreamEvent",
    "TextDelta",
    "ToolArgumentsDelta",
    "ToolCallFinished",
    "ToolCallResult",
    "ToolCallStarted",
    "ToolOutput",
    "Toolset",
    "TurnFinished",
    "TurnResult",
    "TurnStream",
    "decide",
    "inject",
    "run_subagent",
]
