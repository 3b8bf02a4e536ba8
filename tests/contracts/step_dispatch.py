"""The StepDispatcher contract: every adapter (the in-process dispatcher, the Redis transport) runs exactly this suite.

Subclass :class:`StepDispatcherContract` in a ``Test*`` class and implement ``make_folds`` (the fold store the
steps are built from) and ``serving`` (the adapter under test, whose calls an in-process
:class:`~foldline.dispatcher.Dispatcher` on those folds serves in the end). Everything below reaches the
dispatcher only through the port — a loop with ``AgentOptions(dispatcher=port)``, or ``prepare`` and ``send``
called directly — so what holds here holds for a loop whatever dispatcher it is given.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pytest

from foldline.adapters.memory_attachments import MemoryAttachmentStore
from foldline.adapters.memory_log import MemoryEventLog
from foldline.core import CallConfig, codec
from foldline.core.content import ImageBlock, TextBlock
from foldline.core.events import (
    AssistantMessage,
    AttachmentQuarantine,
    Envelope,
    LlmRetry,
    RequestDispatch,
    StepStart,
    TurnEnd,
    TurnStart,
)
from foldline.core.fold import fold_delta, fold_state
from foldline.core.projection import Session
from foldline.dispatcher import Dispatcher
from foldline.errors import AttachmentNotFound, DispatchFailed, FencedError, FoldlineError, FoldTimeout
from foldline.loop import Agent, AgentOptions, Toolset
from foldline.ports.event_log import WriterLease
from foldline.ports.fold_store import FoldStore
from foldline.ports.step_dispatch import PreparedStep, StepDispatcher, StepHandoff
from foldline.providers.emulated import emulated_provider
from foldline.providers.emulator import Emulator, EmulatorResponse, Fault, FaultPlan, ToolLoopScript
from foldline.replay.step import session_request
from foldline.replay.verify import verify_events
from tests.contracts.attachments import png
from tests.factories import LogBuilder

CONFIG = CallConfig("anthropic", "claude-emulated", max_tokens=256)
SYSTEM = "You are a dispatcher test agent. " * 200


class ProjectingLog(MemoryEventLog):
    """An in-memory log whose appends reach a fold store ``lag_s`` later, as a projector would fold them."""

    def __init__(self, folds: FoldStore, lag_s: float = 0.002) -> None:
        super().__init__()
        self.folds = folds
        self.lag_s = lag_s
        self.paused = False

    def append(
        self, session_id: str, expected_seq: int, events: Sequence[Envelope], *, lease: WriterLease | None = None
    ) -> int:
        head = super().append(session_id, expected_seq, events, lease=lease)
        if not self.paused:
            asyncio.get_running_loop().call_later(self.lag_s, self.project, session_id)
        return head

    def project(self, session_id: str) -> None:
        applied = self.folds.applied_seq(session_id)
        events = self.read(session_id, applied + 1)
        if not events:
            return
        delta = fold_delta(events, 0)
        if delta is None:
            self.folds.put(fold_state(Session(session_id, self.read(session_id)), 0))
        else:
            assert self.folds.apply(session_id, delta).status == "applied"


def tools() -> Toolset:
    toolset = Toolset()

    @toolset.tool
    def echo(text: str) -> str:
        """Echo the text back."""
        return text

    return toolset


def ticking_clock() -> Callable[[], int]:
    now = [1_700_000_000_000]

    def clock() -> int:
        now[0] += 1
        return now[0]

    return clock


class RecordingEmulator(Emulator):
    """The emulator, keeping every body it was sent (what reached the provider, byte for byte)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.bodies: list[bytes] = []

    def handle(self, method: str, path: str, headers: Mapping[str, str], body: bytes) -> EmulatorResponse:
        self.bodies.append(bytes(body))
        return super().handle(method, path, headers, body)


@dataclass
class Rig:
    """One test's world: the log (projected into the folds), the emulator behind the dispatcher, the port."""

    log: ProjectingLog
    folds: FoldStore
    emulator: RecordingEmulator
    port: StepDispatcher

    def agent(self, session_id: str, **options: Any) -> Agent:
        opts = AgentOptions(CONFIG, system=SYSTEM, dispatcher=self.port, **options)
        return Agent(session_id, self.log, emulated_provider(emulator=self.emulator), opts, clock=ticking_clock())


def shape(events: Sequence[Envelope]) -> list[tuple[int, object]]:
    """Events without their time."""
    return [(e.seq, e.data) for e in events]


def kind(exc: FoldlineError) -> str:
    """The error's kind as the port carries it (a dispatcher process's error type travels as ``kind``)."""
    return exc.kind if type(exc) is DispatchFailed else type(exc).__name__


class StepDispatcherContract(abc.ABC):
    @abc.abstractmethod
    def make_folds(self) -> FoldStore:
        """The fold store the steps are built from (isolated to this test)."""

    @abc.abstractmethod
    def serving(self, inner: Dispatcher) -> contextlib.AbstractAsyncContextManager[StepDispatcher]:
        """The adapter under test, each of whose calls ``inner`` serves in the end."""

    def run(
        self,
        body: Callable[[Rig], Awaitable[None]],
        *,
        faults: FaultPlan | None = None,
        tool_steps: int = 1,
        fold_timeout_s: float = 2.0,
        attachments: MemoryAttachmentStore | None = None,
    ) -> None:
        folds = self.make_folds()

        async def main() -> None:
            emulator = RecordingEmulator(ToolLoopScript(tool_steps=tool_steps), faults=faults)
            inner = Dispatcher(
                folds,
                {"anthropic": emulated_provider(emulator=emulator)},
                attachments=attachments,
                fold_timeout_s=fold_timeout_s,
            )
            try:
                async with self.serving(inner) as port:
                    await body(Rig(ProjectingLog(folds), folds, emulator, port))
            finally:
                await inner.aclose()

        try:
            asyncio.run(main())
        finally:
            folds.close()

    # ------------------------------------------------------------------ a loop on the port

    def test_a_dispatched_session_logs_what_a_local_loop_logs_each_request_sent_once(self) -> None:
        local = MemoryEventLog()

        async def locally() -> None:
            options = AgentOptions(CONFIG, system=SYSTEM, tools=tools())
            provider = emulated_provider(emulator=Emulator(ToolLoopScript(tool_steps=2)))
            agent = Agent("d-1", local, provider, options, clock=ticking_clock())
            await agent.run_turn("[d-1] first question")
            await agent.run_turn("[d-1] second question")

        asyncio.run(locally())

        async def body(rig: Rig) -> None:
            agent = rig.agent("d-1", tools=tools())
            await agent.run_turn("[d-1] first question")
            await agent.run_turn("[d-1] second question")
            events = rig.log.read("d-1")
            assert shape(events) == shape(local.read("d-1"))
            dispatches = [e.data for e in events if isinstance(e.data, RequestDispatch)]
            assert len(dispatches) == len(rig.emulator.bodies) == 6
            # what reached the provider is, byte for byte, what each request/dispatch names
            assert [d.digest for d in dispatches] == [codec.digest_bytes(b) for b in rig.emulator.bodies]
            report = verify_events("d-1", events)
            assert (report.ok, report.checked) == (True, 6)

        self.run(body, tool_steps=2)

    def test_many_sessions_at_once_each_keep_their_own_order(self) -> None:
        async def body(rig: Rig) -> None:
            async def session(sid: str) -> None:
                agent = rig.agent(sid, tools=tools())
                await agent.run_turn(f"[{sid}] first question")
                await agent.run_turn(f"[{sid}] second question")

            ids = [f"m-{i}" for i in range(8)]
            await asyncio.gather(*(session(sid) for sid in ids))
            for sid in ids:
                events = rig.log.read(sid)
                report = verify_events(sid, events)
                assert (report.ok, report.checked) == (True, 4), sid
                for i, e in enumerate(events):  # every dispatch is followed by its answer
                    if isinstance(e.data, RequestDispatch):
                        assert isinstance(events[i + 1].data, AssistantMessage), sid
            assert len(rig.emulator.bodies) == 4 * len(ids)

        self.run(body)

    def test_a_fold_that_never_arrives_is_a_fold_timeout_and_nothing_is_sent(self) -> None:
        async def body(rig: Rig) -> None:
            rig.log.paused = True  # no projector
            agent = rig.agent("t-1", tools=tools())
            with pytest.raises(FoldTimeout, match="projector"):
                await agent.run_turn("[t-1] anyone there?")
            events = rig.log.read("t-1")
            # a new session's first step is built from its opening alone (nothing is logged before it); the
            # second waits for the fold of the first, which never comes, and sends nothing
            assert len(rig.emulator.bodies) == 1
            assert [(e.data.turn, e.data.step) for e in events if isinstance(e.data, RequestDispatch)] == [(0, 0)]
            assert isinstance(events[-1].data, TurnEnd)
            assert events[-1].data.reason == "error"

        self.run(body, fold_timeout_s=0.2)

    def test_a_provider_failure_comes_back_typed_and_the_loop_sends_the_same_bytes_again(self) -> None:
        async def body(rig: Rig) -> None:
            agent = rig.agent("r-1", tools=tools())
            await agent.run_turn("[r-1] question")
            events = rig.log.read("r-1")
            retries = [e.data for e in events if isinstance(e.data, LlmRetry)]
            assert [(r.attempt, r.status) for r in retries] == [(1, 429)]
            dispatches = [e.data for e in events if isinstance(e.data, RequestDispatch)]
            assert len(dispatches) == 2  # a tool step and the answer: the retried step was logged once ...
            assert len(rig.emulator.bodies) == 3  # ... and sent twice, the same bytes
            assert rig.emulator.bodies[0] == rig.emulator.bodies[1]
            assert codec.digest_bytes(rig.emulator.bodies[0]) == dispatches[0].digest
            assert verify_events("r-1", events).ok

        self.run(body, faults=FaultPlan({0: Fault.rate_limited(retry_after_s=0.01)}))

    def test_an_unusable_image_is_an_attachment_error_the_loop_quarantines_and_nothing_is_sent(self) -> None:
        image = MemoryAttachmentStore().put(png(12, 8), "image/png")  # the dispatcher's store lacks it

        async def body(rig: Rig) -> None:
            agent = rig.agent("q-1")
            with pytest.raises(AttachmentNotFound) as failed:
                await agent.run_turn([TextBlock("look"), ImageBlock(image.image_ref())])
            assert failed.value.attachment_id == image.attachment_id
            [quarantine] = [e.data for e in rig.log.read("q-1") if isinstance(e.data, AttachmentQuarantine)]
            assert quarantine.attachment_id == image.attachment_id
            assert rig.emulator.bodies == []

        self.run(body, attachments=MemoryAttachmentStore())

    # ------------------------------------------------------------------ prepare and send, directly

    @staticmethod
    def _opened(folds: FoldStore, session_id: str) -> LogBuilder:
        """A session folded up to a step's opening (three answered turns, then a question)."""
        builder = LogBuilder().header()
        for turn in range(3):
            builder.turn(turn, f"question {turn}")
        builder.add(TurnStart(3))
        builder.add(StepStart(3, 0))
        builder.user("the pending question")
        folds.put(fold_state(Session(session_id, builder.events), 0))
        return builder

    @classmethod
    def _pending(cls, folds: FoldStore, session_id: str) -> StepHandoff:
        """The hand-over of :meth:`_opened`'s step."""
        return StepHandoff(session_id, cls._opened(folds, session_id).seq, 3, 0, 1)

    def test_prepare_sends_nothing_and_send_sends_exactly_the_prepared_body_once(self) -> None:
        async def body(rig: Rig) -> None:
            handoff = self._pending(rig.folds, "p-1")
            prepared = await rig.port.prepare(handoff)
            assert (prepared.session_id, prepared.boundary) == ("p-1", handoff.boundary)
            assert (prepared.serializer, prepared.serializer_version) == ("anthropic-messages", 5)  # the default
            assert rig.emulator.bodies == []
            again = await rig.port.prepare(handoff)  # a repeated prepare builds the same body
            assert (again.digest, again.bytes) == (prepared.digest, prepared.bytes)
            answer = await rig.port.send(handoff, prepared)
            assert answer.content
            assert answer.usage.output > 0
            assert [codec.digest_bytes(b) for b in rig.emulator.bodies] == [prepared.digest]
            assert len(rig.emulator.bodies[0]) == prepared.bytes

        self.run(body)

    def test_a_pending_opening_builds_the_body_the_fold_builds_once_it_holds_the_opening(self) -> None:
        text = 'the pending question: "naïve" ✓ \u2028 <tag> \\ 🙂'  # what JSON escapes, and more than ASCII

        async def body(rig: Rig) -> None:
            builder = LogBuilder().header()
            for turn in range(3):
                builder.turn(turn, f"question {turn}")
            folded = builder.seq
            rig.folds.put(fold_state(Session("o-1", builder.events), 0))
            builder.add(TurnStart(3))
            builder.add(StepStart(3, 0))
            builder.user(text)
            pending = builder.events[folded:]
            carried = StepHandoff("o-1", builder.seq, 3, 0, 1, pending=fold_delta(pending, 1))
            prepared = await rig.port.prepare(carried)  # the fold stops before the opening: it travels along
            rig.folds.put(fold_state(Session("o-1", builder.events), 0))  # the opening written and folded
            folded_prepared = await rig.port.prepare(StepHandoff("o-1", builder.seq, 3, 0, 1))
            assert (prepared.digest, prepared.bytes) == (folded_prepared.digest, folded_prepared.bytes)
            answer = await rig.port.send(carried, prepared)  # sent once the opening is logged: the same body
            assert answer.content
            assert [codec.digest_bytes(b) for b in rig.emulator.bodies] == [prepared.digest]
            # and it is the body of the request the whole log builds
            request = session_request(Session("o-1", builder.events))
            local = emulated_provider(emulator=rig.emulator).serializer.serialize(request, None)
            assert codec.digest_bytes(local) == prepared.digest

        self.run(body)

    def test_a_hand_over_takes_only_what_the_fold_lacks_and_a_fold_past_it_is_a_conflict(self) -> None:
        async def body(rig: Rig) -> None:
            events = self._opened(rig.folds, "c-1").events  # folded up to and with the opening
            handoff = StepHandoff("c-1", len(events), 3, 0, 1)
            # the hand-over carries the events from the last answered turn on: the fold holds them all already
            carried = StepHandoff("c-1", handoff.boundary, 3, 0, 1, pending=fold_delta(events[-8:], 1))
            taken = await rig.port.prepare(carried)
            plain = await rig.port.prepare(handoff)
            assert (taken.digest, taken.bytes) == (plain.digest, plain.bytes)
            # a fold that holds part of them (another session, folded partway): the rest comes from the hand-over
            rig.folds.put(fold_state(Session("c-2", events[:-4]), 0))
            partway = await rig.port.prepare(dataclasses.replace(carried, session_id="c-2"))
            assert (partway.digest, partway.bytes) == (plain.digest, plain.bytes)
            # a fold past the hand-over's boundary: the step is stale
            stale = StepHandoff("c-1", handoff.boundary - 2, 3, 0, 1, pending=fold_delta(events[-8:-2], 1))
            with pytest.raises(FoldlineError) as refused:
                await rig.port.prepare(stale)
            assert kind(refused.value) == "ConflictError", refused.value
            assert rig.emulator.bodies == []

        self.run(body)

    def test_a_stale_boundary_or_a_digest_the_fold_does_not_build_sends_nothing(self) -> None:
        async def body(rig: Rig) -> None:
            handoff = self._pending(rig.folds, "f-1")
            prepared = await rig.port.prepare(handoff)
            stale = StepHandoff("f-1", handoff.boundary - 2, 3, 0, 1)  # the fold moved past this boundary
            with pytest.raises(FoldlineError) as refused:
                await rig.port.prepare(stale)
            assert kind(refused.value) == "ConflictError", refused.value
            forged = PreparedStep(
                "f-1", handoff.boundary, prepared.serializer, prepared.serializer_version, "sha256:" + "0" * 64, 10
            )
            with pytest.raises(DispatchFailed, match="not the logged"):
                await rig.port.send(handoff, forged)
            assert rig.emulator.bodies == []

        self.run(body)

    def test_a_fold_a_newer_instance_leased_fences_the_older_one_and_sends_nothing(self) -> None:
        async def body(rig: Rig) -> None:
            handoff = self._pending(rig.folds, "n-1")  # epoch 1 prepares the step the fold holds...
            prepared = await rig.port.prepare(handoff)
            events = self._opened(rig.folds, "n-1").events
            rig.folds.put(fold_state(Session("n-1", events), 2))  # ...then epoch 2 leases the session
            for stale in (handoff, StepHandoff("n-1", handoff.boundary - 2, 3, 0, 1)):
                with pytest.raises(FencedError) as fenced:  # at its boundary or a stale one: fenced, not a conflict
                    await rig.port.prepare(stale)
                assert (fenced.value.session_id, fenced.value.epoch, fenced.value.current_epoch) == ("n-1", 1, 2)
            assert rig.emulator.bodies == []
            newer = await rig.port.prepare(dataclasses.replace(handoff, epoch=2))  # the newer instance steps on
            assert newer.digest == prepared.digest

        self.run(body)


@contextlib.asynccontextmanager
async def itself(inner: Dispatcher) -> AsyncIterator[StepDispatcher]:
    """The in-process dispatcher is its own port."""
    yield inner
