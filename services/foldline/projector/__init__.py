"""Projectors: fold the Kafka session-event log into a fold store (Redis), batch by batch.

* :class:`BatchProjector` — the runtime-independent apply/rebuild logic (:mod:`.apply`);
* :class:`ProjectorWorker`, :func:`start_worker` — the consumer-group worker (:mod:`.worker`);
* ``foldline projector`` — the same worker as a process (docs/PROJECTOR.md).
"""

from __future__ import annotations

from .apply import BatchProjector, BatchReport, SeqGap
from .worker import DEFAULT_GROUP, ProjectorWorker, WorkerHandle, WorkerSettings, start_worker

__all__ = [
    "DEFAULT_GROUP",
    "BatchProjector",
    "BatchReport",
    "ProjectorWorker",
    "SeqGap",
    "WorkerHandle",
    "WorkerSettings",
    "start_worker",
]
