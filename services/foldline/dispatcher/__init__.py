"""Dispatchers: build each step's request from the fold, prove it against the log, log, send, log the answer.

* :class:`Dispatcher` — the work itself; usable in-process as ``AgentOptions(dispatcher=...)``.
* :class:`RedisStepClient` / :func:`serve_steps` — the same across processes: loops hand steps over a
  Redis stream to ``foldline dispatcher`` workers (docs/DISPATCHER.md).
"""

from __future__ import annotations

from ..ports.step_dispatch import DispatchOutcome, StepDispatcher, StepHandoff
from .dispatcher import Dispatcher, DispatchResult, request_from_fold
from .redis_steps import RedisStepClient, serve_steps

__all__ = [
    "DispatchOutcome",
    "DispatchResult",
    "Dispatcher",
    "RedisStepClient",
    "StepDispatcher",
    "StepHandoff",
    "request_from_fold",
    "serve_steps",
]
