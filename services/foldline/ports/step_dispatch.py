"""The StepDispatcher port: how a loop hands one step's model call to a dispatcher.

A loop appends its step's ``step/start``, ``user/message`` batch and (when owed) ``request/header``,
then hands the step over as a :class:`StepHandoff`: the session, the *boundary* (the next seq: the
request is the pure function of the log prefix ``[0, boundary)``), the step's turn/step numbers and
the epoch of the loop's writer lease. The dispatcher builds the request from the fold, appends
``request/dispatch`` (the digest, before sending), sends, and appends the ``assistant/message`` and its
``tool/call`` events — all under the loop's lease, while the loop itself writes nothing. It answers
with a :class:`DispatchOutcome`; the loop then catches its session up from the log, which is the
source of truth for what the model answered.

Adapters: :class:`foldline.dispatcher.Dispatcher` (in-process) and
:class:`foldline.dispatcher.RedisStepClient` (a ``foldline dispatcher`` process, over a Redis stream).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from ..errors import FormatError
from .event_log import WriterLease

__all__ = ["DispatchOutcome", "StepDispatcher", "StepHandoff"]


@dataclass(frozen=True, slots=True)
class StepHandoff:
    """One step boundary handed from a loop to a dispatcher."""

    session_id: str
    boundary: int  # the request is built from the log prefix [0, boundary); request/dispatch gets this seq
    turn: int
    step: int
    epoch: int  # the loop instance's writer-lease epoch; the dispatcher appends under it
    archive: bool = False  # keep the exact wire body in the attachment store, keyed by its digest

    @property
    def lease(self) -> WriterLease:
        return WriterLease(self.session_id, self.epoch)

    def to_json(self) -> dict[str, Any]:
        return {
            "session": self.session_id,
            "boundary": self.boundary,
            "turn": self.turn,
            "step": self.step,
            "epoch": self.epoch,
            "archive": self.archive,
        }

    @staticmethod
    def from_json(value: Any) -> StepHandoff:
        try:
            handoff = StepHandoff(
                str(value["session"]),
                int(value["boundary"]),
                int(value["turn"]),
                int(value["step"]),
                int(value["epoch"]),
                bool(value.get("archive", False)),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise FormatError("step-handoff", f"malformed step handoff {value!r}: {exc}") from exc
        if handoff.boundary < 1:
            raise FormatError("step-handoff", f"a step boundary is at least 1 (after step/start), got {value!r}")
        return handoff


@dataclass(frozen=True, slots=True)
class DispatchOutcome:
    """What a dispatcher did with a step: ``request/dispatch`` at ``dispatch_seq``, log head now ``head``."""

    session_id: str
    dispatch_seq: int
    digest: str
    head: int

    def to_json(self) -> dict[str, Any]:
        return {"session": self.session_id, "dispatchSeq": self.dispatch_seq, "digest": self.digest, "head": self.head}

    @staticmethod
    def from_json(value: Any) -> DispatchOutcome:
        try:
            return DispatchOutcome(
                str(value["session"]), int(value["dispatchSeq"]), str(value["digest"]), int(value["head"])
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise FormatError("dispatch-outcome", f"malformed dispatch outcome {value!r}: {exc}") from exc


class StepDispatcher(Protocol):
    async def dispatch(self, handoff: StepHandoff) -> DispatchOutcome:
        """Build, check, log, send and log the answer of one step; raise a FoldlineError on failure."""
        ...

    async def aclose(self) -> None:
        """Release connections and provider clients."""
        ...
