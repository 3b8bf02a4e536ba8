"""The pure core of foldline: events, validation, projection, header fold, request build, encoding.

Nothing in this package performs I/O, reads a clock, draws randomness or imports a vendor SDK;
``tests/test_core_purity.py`` enforces it. Time and ids arrive as values.
"""

from .content import ImageBlock, ImageRef, TextBlock, ToolCallBlock, ToolResultBlock, Usage
from .events import (
    SESSION_FORMAT_VERSION,
    AssistantMessage,
    AttachmentQuarantine,
    CompactionEnd,
    CompactionStart,
    CompactionSummary,
    Envelope,
    EventData,
    ReplaceOp,
    RequestDispatch,
    RequestHeader,
    SessionEndSeed,
    StepEnd,
    StepStart,
    ToolCall,
    ToolResult,
    TurnEnd,
    TurnStart,
    UnknownEvent,
    UserMessage,
)
from .header import CallConfig, EpochHeader, ToolSpec, header_equals, make_header
from .projection import (
    Message,
    MessageSequence,
    Session,
    derive_event_message,
    fold_messages,
    fold_request_header,
)
from .request import GenerateOptions, build_request
from .validation import LogRules, check_log
from .wire import decode_event, encode_event, envelope_from_json, envelope_to_json

__all__ = [
    "SESSION_FORMAT_VERSION",
    "AssistantMessage",
    "AttachmentQuarantine",
    "CallConfig",
    "CompactionEnd",
    "CompactionStart",
    "CompactionSummary",
    "Envelope",
    "EpochHeader",
    "EventData",
    "GenerateOptions",
    "ImageBlock",
    "ImageRef",
    "LogRules",
    "Message",
    "MessageSequence",
    "ReplaceOp",
    "RequestDispatch",
    "RequestHeader",
    "Session",
    "SessionEndSeed",
    "StepEnd",
    "StepStart",
    "TextBlock",
    "ToolCall",
    "ToolCallBlock",
    "ToolResult",
    "ToolResultBlock",
    "ToolSpec",
    "TurnEnd",
    "TurnStart",
    "UnknownEvent",
    "Usage",
    "UserMessage",
    "build_request",
    "check_log",
    "decode_event",
    "derive_event_message",
    "encode_event",
    "envelope_from_json",
    "envelope_to_json",
    "fold_messages",
    "fold_request_header",
    "header_equals",
    "make_header",
]
