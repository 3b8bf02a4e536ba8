"""Projectors: fold the Kafka session-event log into a fold store (Redis), batch by batch.

* :class:`BatchProjector` — the runtime-independent apply/rebuild logic (:mod:`.fold_apply`);
* :class:`ProjectorRuntime` — what every consumer runtime shares: the apply-retry loop, readiness, lag,
  the one dead-letter path (:mod:`.runtime`);
* :class:`ProjectorWorker`, :func:`start_worker` — the default runtime, a confluent-kafka consumer-group
  member (:mod:`.confluent_runtime`); :mod:`.faust_runtime` is the faust-streaming one;
* ``foldline projector`` — a runtime as a process (docs/PROJECTOR.md).
"""

from __future__ import annotations

from .confluent_runtime import ProjectorWorker, WorkerHandle, start_worker
from .fold_apply import BatchProjector, BatchReport, SeqGap
from .runtime import ProjectorRuntime, WorkerSettings

__all__ = [
    "BatchProjector",
    "BatchReport",
    "ProjectorRuntime",
    "ProjectorWorker",
    "SeqGap",
    "WorkerHandle",
    "WorkerSettings",
    "start_worker",
]
