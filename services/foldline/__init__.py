"""foldline: agent loops whose every model request is rebuilt, byte for byte, from the session log.

The public API for people writing agents::

    from foldline import Agent, AgentOptions, CallConfig, Config, Toolset, open_stores
"""

from .config import Config, Stores, open_stores
from .core import CallConfig, EpochHeader, ImageBlock, TextBlock, ToolSpec
from .errors import FoldlineError
from .loop import Agent, AgentOptions, Enter, Reject, ToolOutput, Toolset, TurnResult
from .replay import is_loop_request

__version__ = "0.1.0"
__all__ = [
    "Agent",
    "AgentOptions",
    "CallConfig",
    "Config",
    "Enter",
    "EpochHeader",
    "FoldlineError",
    "ImageBlock",
    "Reject",
    "Stores",
    "TextBlock",
    "ToolOutput",
    "ToolSpec",
    "Toolset",
    "TurnResult",
    "__version__",
    "is_loop_request",
    "open_stores",
]
