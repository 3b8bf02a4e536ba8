"""Dispatchers: build each step's request from the fold and send it once the loop has logged its digest.

* :class:`Dispatcher` — the work itself; usable in-process as ``AgentOptions(dispatcher=...)``.
* :class:`RedisStepClient` / :func:`serve_steps` — the same across processes: loops hand steps over a
  Redis stream to ``foldline dispatcher`` workers (docs/DISPATCHER.md).
"""

from __future__ import annotations

from ..errors import DispatchLost
from ..ports.step_dispatch import PreparedStep, StepAnswer, StepDispatcher, StepHandoff
from .dispatcher import Dispatcher, FoldWatcher, request_from_fold
from .redis_steps import RedisStepClient, serve_steps

__all__ = [
    "DispatchLost",
    "Dispatcher",
    "FoldWatcher",
    "PreparedStep",
    "RedisStepClient",
    "StepAnswer",
    "StepDispatcher",
    "StepHandoff",
    "request_from_fold",
    "serve_steps",
]
