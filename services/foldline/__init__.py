"""foldline: agent loops whose every model request is rebuilt, byte for byte, from the session log.

The public API for people writing agents::

    from foldline import Agent, AgentOptions, CallConfig, Config, Toolset, open_stores

and for testing a change to an agent against recorded sessions (docs/REPLAY.md)::

    from foldline import Change, Recording, ReplayReport, replay_sessions
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .config import Config, Stores, open_stores
    from .core import CallConfig, EpochHeader, ImageBlock, TextBlock, ToolSpec
    from .errors import FoldlineError
    from .loop import Agent, AgentOptions, Enter, Reject, ToolOutput, Toolset, TurnResult
    from .replay import is_loop_request
    from .replayer import Change, Recording, ReplayReport, replay_sessions

__version__ = "0.1.0"

# Each name is imported on first use, so a command that needs little (``foldline show``) starts fast.
_HOMES = {
    **dict.fromkeys(("Config", "Stores", "open_stores"), "config"),
    **dict.fromkeys(("CallConfig", "EpochHeader", "ImageBlock", "TextBlock", "ToolSpec"), "core"),
    "FoldlineError": "errors",
    **dict.fromkeys(("Agent", "AgentOptions", "Enter", "Reject", "ToolOutput", "Toolset", "TurnResult"), "loop"),
    "is_loop_request": "replay",
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
    "Recording",
    "Reject",
    "ReplayReport",
    "Stores",
    "TextBlock",
    "ToolOutput",
    "ToolSpec",
    "Toolset",
    "TurnResult",
    "__version__",
    "is_loop_request",
    "open_stores",
    "replay_sessions",
]
