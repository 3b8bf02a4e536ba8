"""Dispatchers: build each step's request from the fold and send it once the loop has logged its digest.

* :class:`Dispatcher` — the work itself; usable in-process as ``AgentOptions(dispatcher=...)``.
* :class:`RedisStepClient` / :func:`serve_steps` — the same across processes: loops hand steps over a
  Redis stream to ``foldline dispatcher`` workers (docs/DISPATCHER.md); the transport is an adapter of the
  StepDispatcher port, :mod:`foldline.adapters.redis_steps`.
"""

from __future__ import annotations

from ..adapters.redis_steps import RedisStepClient, serve_steps
from ..errors import DispatchLost
from ..ports.step_dispatch import PreparedStep, StepAnswer, StepDispatcher, StepHandoff
from .dispatcher import Dispatcher, FoldWatcher, request_from_fold, wait_for_fold, wait_for_fold_tail

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
    "wait_for_fold",
    "wait_for_fold_tail",
]
