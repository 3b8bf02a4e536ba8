"""Hook types.

* ``agent/pre-step`` hooks see the claimed batch and return :class:`Reject` (no step opens; the batch
  goes back to the inbox) or :class:`Enter` (optionally with messages that settle with this batch).
* ``agent/request`` hooks receive the frozen call-config seed and return a call config. Their only
  power is over the call config: messages, system prompt and tools are not in their reach.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from ..core.header import CallConfig
from .inbox import InboxItem

__all__ = ["Enter", "PreStepContext", "PreStepHook", "Reject", "RequestHook"]


@dataclass(frozen=True, slots=True)
class PreStepContext:
    session_id: str
    turn: int
    step: int
    batch: tuple[InboxItem, ...]


@dataclass(frozen=True, slots=True)
class Enter:
    messages: tuple[InboxItem, ...] = ()


@dataclass(frozen=True, slots=True)
class Reject:
    reason: str = ""


PreStepHook = Callable[[PreStepContext], Enter | Reject | Awaitable[Enter | Reject]]
RequestHook = Callable[[CallConfig], CallConfig]
