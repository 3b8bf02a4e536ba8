"""foldline: agent loops whose every model request is rebuilt, byte for byte, from the session log.

The public API for people writing agents::

    from foldline import Agent, AgentOptions, CallConfig, Config, Toolset, open_stores, verify_events
    from foldline.providers import emulated_provider  # or AnthropicProvider, OpenAIProvider, ...

and for testing a change to an agent against recorded sessions (docs/REPLAY.md)::

    from foldline import Change, Recording, ReplayReport, replay_sessions

``__all__`` below is the whole public surface of this package (``tests/test_public_api.py`` holds it, with
those of :mod:`foldline.loop`, :mod:`foldline.providers` and :mod:`foldline.config`); a module whose name
starts with ``_`` is not public.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .config import Config, Stores, open_stores
    from .core import CallConfig, EpochHeader, ImageBlock, TextBlock, ToolSpec
    from .errors import FoldlineError
    from .loop import Agent, AgentOptions, Enter, OutputType, PressurePolicy, Reject, ToolOutput, Toolset, TurnResult
    from .replay import VerifyReport, is_loop_request, verify_events
    from .replayer import Change, Recording, ReplayReport, replay_sessions

__version__ = "0.1.0"

# Each name is imported on first use, so a command that needs little (``foldline show``) starts fast.
_HOMES = {
    **dict.fromkeys(("Config", "Stores", "open_stores"), "config"),
    **dict.fromkeys(("CallConfig", "EpochHeader", "ImageBlock", "TextBlock", "ToolSpec"), "core"),
    "FoldlineError": "errors",
    **dict.fromkeys(
        (
            "Agent",
            "AgentOptions",
            "Enter",
            "ImageData",
            "MCPServer",
            "OutputType",
            "PressurePolicy",
            "Reject",
            "ToolOutput",
            "Toolset",
            "TurnResult",
        ),
        "loop",
    ),
    **dict.fromkeys(("VerifyReport", "is_loop_request", "verify_events"), "replay"),
    **dict.fromkeys(("Change", "Recording", "ReplayReport", "replay_sessions"), "replayer"),
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'foldline' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{home}", __name__), name)
    globals()[name] = value
    return value


__all__ = [
    "Agent",
    "AgentOptions",
    "CallConfig",
    "Change",
    "Config",
    "Enter",
    "EpochHeader",
    "FoldlineError",
    "ImageBlock",
    "ImageData",
    "MCPServer",
    "OutputType",
    "PressurePolicy",
    "Recording",
    "Reject",
    "ReplayReport",
    "Stores",
    "TextBlock",
    "ToolOutput",
    "ToolSpec",
    "Toolset",
    "TurnResult",
    "VerifyReport",
    "__version__",
    "is_loop_request",
    "open_stores",
    "replay_sessions",
    "verify_events",
]
