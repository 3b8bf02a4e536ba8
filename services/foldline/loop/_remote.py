"""A step whose model call a dispatcher serves (``AgentOptions.dispatcher``, docs/DISPATCHER.md).

The step's opening (with the previous step's closing, both held by the loop) travels with the hand-over as
a fold delta, with the other events since the last ``request/dispatch``; the dispatcher builds and serializes
the request from the projected fold plus what it lacks of that delta and
answers its digest; the companion checks the loop's request against its rebuild of the log and the held
events, and the dispatcher's digest against its own serialization; the loop writes the held events and
``request/dispatch`` in one append; then each attempt is one dispatcher ``send``, retried and logged by the
loop's sender. The loop appends every event.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Protocol

from ..core.events import Envelope, EventData, RequestDispatch
from ..core.fold import fold_delta
from ..core.limits import check_request_size
from ..core.projection import Session
from ..core.request import GenerateOptions
from ..errors import AttachmentError, DispatchFailed, DispatchLost, ProviderTransportError
from ..ports.step_dispatch import PreparedStep, StepDispatcher, StepHandoff
from ..providers.base import Body, Provider, ProviderResponse, Serializer, serializer_for
from ..providers.streaming import AnswerProgress
from ..replay.invariant import InvariantCompanion
from ..replay.step import quarantine_record
from .options import StepRecord

__all__ = ["DispatchContext", "DispatchedSend", "dispatch_remote"]


class DispatchContext(Protocol):
    """What a dispatched step uses of its loop instance (:attr:`~foldline.loop.Agent.context`): the session
    and its writer's epoch, the provider, the companion, the step's time breakdown, and the loop's own
    append, send (the retrying sender, each failed attempt logged) and answer (logged, tools run, step closed)."""

    @property
    def session_id(self) -> str: ...

    @property
    def session(self) -> Session: ...

    @property
    def epoch(self) -> int:
        """The writer-lease epoch of the loop instance."""
        ...

    @property
    def provider(self) -> Provider: ...

    @property
    def archive_requests(self) -> bool: ...

    @property
    def invariant(self) -> InvariantCompanion | None: ...

    @property
    def timings(self) -> dict[str, float]:
        """The current step's breakdown (``StepRecord.timings``), filled in as it goes."""
        ...

    @property
    def held(self) -> Sequence[Envelope]:
        """The events in the session that are not written yet (the step's opening, the previous closing)."""
        ...

    @property
    def recent(self) -> Sequence[Envelope]:
        """The session's events from its last ``request/dispatch`` on (held or written; the hand-over carries them,
        so the dispatcher's fold need only have folded that one); empty when not known."""
        ...

    async def append(self, *datas: EventData) -> None:
        """Append ``datas``, after the held events and in the same write."""
        ...

    async def send(self, turn: int, step: int, provider: Provider, body: bytes, stream: bool) -> ProviderResponse: ...

    async def answer(
        self, turn: int, step: int, dispatch_seq: int, digest: str, reason: str | None, response: ProviderResponse
    ) -> tuple[StepRecord, ProviderResponse]: ...


async def dispatch_remote(
    loop: DispatchContext,
    dispatcher: StepDispatcher,
    request: GenerateOptions,
    turn: int,
    step: int,
    reason: str | None,
) -> tuple[StepRecord, ProviderResponse]:
    """The rest of a step when ``AgentOptions.dispatcher`` serves its model call (the opening is held, not
    written; ``request`` is the loop's own build of the step's request, marked as a loop request).

    The dispatcher builds and serializes the request from the fold and a delta of the events since the last
    ``request/dispatch`` (the held ones among them) and answers its digest; the companion checks that digest
    against its own rebuild from the durable log and the held events;
    this instance writes them with ``request/dispatch`` in one append (held events a delta cannot carry — a
    surface replace — are written first, and the fold then holds them); only then does the dispatcher
    send — one attempt per call, through this instance's retrying sender, so each failed attempt is appended
    as ``llm/retry`` before the next. A send whose dispatcher died holding it
    (:class:`~foldline.errors.DispatchLost`) may or may not have reached the provider: it is logged as a
    failed attempt (``dispatch-lost``) and sent again, the same bytes (docs/DISPATCHER.md). This instance is
    the only writer throughout.
    """
    held, recent = loop.held, loop.recent
    pending = fold_delta(recent, loop.epoch) if recent else None
    if held and pending is None:  # a surface replace among them (a refusal's reset): the fold must hold it
        await loop.append()
        held = ()
    boundary = loop.session.next_seq
    handoff = StepHandoff(loop.session_id, boundary, turn, step, loop.epoch, loop.archive_requests, pending=pending)
    timings = loop.timings
    began = time.monotonic()
    try:
        prepared = await dispatcher.prepare(handoff)
    except AttachmentError as exc:  # the dispatcher could not use an object the request references
        await loop.append(quarantine_record(exc))
        raise
    if (prepared.session_id, prepared.boundary) != (loop.session_id, boundary):
        raise DispatchFailed(
            loop.session_id,
            boundary,
            "ReconstructionError",
            f"the dispatcher prepared seq {prepared.boundary} of {prepared.session_id!r} for this step",
        )
    prepared_at = time.monotonic()
    for key in ("fold_wait", "build"):
        timings[key] = prepared.timings.get(key, 0.0)
    timings["handover"] = prepared_at - began - timings["fold_wait"] - timings["build"]
    serializer = serializer_for(prepared.serializer, prepared.serializer_version)
    if loop.invariant is not None:
        await loop.invariant.check(loop.session_id, boundary, request, pending=held)
        loop.invariant.check_body(loop.session_id, boundary, prepared.digest, serializer)
    timings["check"] = time.monotonic() - prepared_at
    check_request_size(prepared.bytes)  # nothing logged for a body over the limit, nothing sent
    await loop.append(
        RequestDispatch(turn, step, prepared.serializer, prepared.serializer_version, prepared.digest, prepared.bytes)
    )
    remote = DispatchedSend(dispatcher, handoff, prepared, loop.provider.name, serializer, timings)
    attempts = timings.get("handover", 0.0) + timings.get("send", 0.0)
    sending = time.monotonic()
    response = await loop.send(turn, step, remote, b"", request.config.stream)
    # the rest of the sender's time: a slot under the provider's concurrency limit, retry backoffs
    attempts = timings.get("handover", 0.0) + timings.get("send", 0.0) - attempts
    timings["queue"] = max(0.0, time.monotonic() - sending - attempts)
    return await loop.answer(turn, step, boundary, prepared.digest, reason, response)


class DispatchedSend(Provider):
    """A dispatched step's send as a provider, for the loop's retrying sender: each attempt is one
    :meth:`StepDispatcher.send` of the prepared body (which the dispatcher holds; ``body`` is unused)."""

    def __init__(
        self,
        dispatcher: StepDispatcher,
        handoff: StepHandoff,
        prepared: PreparedStep,
        name: str,
        serializer: Serializer,
        timings: dict[str, float],
    ) -> None:
        self.dispatcher = dispatcher
        self.handoff = handoff
        self.prepared = prepared
        self.name = name
        self.serializer = serializer
        self.timings = timings  # the step's breakdown: each attempt adds its provider call and its hand-over

    async def send(
        self, body: Body, *, stream: bool = False, progress: AnswerProgress | None = None
    ) -> ProviderResponse:
        began = time.monotonic()
        try:
            if progress is not None and progress.on_delta is not None:  # a caller reads the pieces: relay them
                answer = await self.dispatcher.send(self.handoff, self.prepared, on_delta=progress.delta)
            else:
                answer = await self.dispatcher.send(self.handoff, self.prepared)
        except DispatchLost as exc:
            # it may have reached the provider: the retry record says so, and the next attempt resends
            raise ProviderTransportError(str(exc), error_type="dispatch-lost") from exc
        finally:
            self.timings["handover"] = self.timings.get("handover", 0.0) + time.monotonic() - began
        sent = answer.timings.get("send", 0.0)
        self.timings["send"] = self.timings.get("send", 0.0) + sent
        self.timings["handover"] -= sent
        return ProviderResponse(answer.content, answer.usage, answer.stop_reason, answer.request_id, answer.message_id)
