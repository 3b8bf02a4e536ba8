"""A turn as a stream of typed events, for a caller that shows the answer while the model writes it.

``async for event in agent.stream("...")`` (:meth:`foldline.loop.Agent.stream`) runs one turn and yields, in
order: :class:`StepStarted`; the answer's pieces as they arrive — :class:`~foldline.core.deltas.TextDelta`,
:class:`~foldline.core.deltas.ReasoningDelta`, :class:`~foldline.core.deltas.ToolCallStarted`,
:class:`~foldline.core.deltas.ToolArgumentsDelta` (the same for every API; only a request whose header
streams has them); :class:`AttemptDiscarded` when an answer was cut and is being asked for again (drop the pieces
of this step received so far); :class:`ToolCallFinished` per call of the logged answer; :class:`ToolCallResult`
per logged result; :class:`StepFinished` (usage, the request's digest); then :class:`TurnFinished` with the
:class:`~foldline.loop.TurnResult`. Every kind has a literal ``kind``; :data:`StreamEvent` is their union.

Nothing here is logged: the log holds what :meth:`~foldline.loop.Agent.run_turn` logs, whether or not anyone
streams (pieces only as ``assistant/chunk`` when ``TransportSettings.log_chunks`` is on).

A consumer never slows the turn. The loop puts events into an :class:`EventBuffer` without waiting; past
``bound`` events waiting, a piece is merged into the one before it when both are of the same kind (and tool
call), so a slow reader gets fewer, longer pieces — the same text — and the buffer stays within the bound
plus the few events between kinds. Events other than pieces are never merged or dropped: the final ones always
arrive. Breaking out of the iteration (or leaving ``async with``) cancels the turn, which is logged as any
cancelled turn (``aborted``; a streamed answer cut off is kept as an ``interrupted`` message).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any, Literal, TypeAlias

from ..core.content import ToolResultPart, Usage
from ..core.deltas import AnswerDelta, ReasoningDelta, TextDelta, ToolArgumentsDelta, ToolCallStarted
from ..errors import ConfigError
from .options import TurnResult

__all__ = [
    "DEFAULT_STREAM_BUFFER",
    "AttemptDiscarded",
    "EventBuffer",
    "ReasoningDelta",
    "StepFinished",
    "StepStarted",
    "StreamEvent",
    "TextDelta",
    "ToolArgumentsDelta",
    "ToolCallFinished",
    "ToolCallResult",
    "ToolCallStarted",
    "TurnFinished",
    "TurnStream",
]

#: Events a stream holds for its reader before it merges pieces: a reader that takes 10 ms an event is at most
#: ~2.5 s behind the model, and a fast one sees every piece as the provider sent it.
DEFAULT_STREAM_BUFFER = 256


@dataclass(frozen=True, slots=True)
class StepStarted:
    """A step's request was logged and is about to be sent."""

    turn: int
    step: int
    kind: Literal["step-started"] = "step-started"


@dataclass(frozen=True, slots=True)
class AttemptDiscarded:
    """The answer to this step's request was cut (``error_type`` says how) after some of it had arrived; the
    pieces of this step received since :class:`StepStarted` (or the previous discard) are void. The same request
    is sent again when the retry policy allows it (an ``llm/retry`` in the log), else the turn ends."""

    turn: int
    step: int
    attempt: int
    error_type: str
    kind: Literal["attempt-discarded"] = "attempt-discarded"


@dataclass(frozen=True, slots=True)
class ToolCallFinished:
    """A tool call of the logged answer: the arguments are the model's whole JSON text."""

    turn: int
    step: int
    call_id: str
    name: str
    arguments: str
    kind: Literal["tool-call-finished"] = "tool-call-finished"


@dataclass(frozen=True, slots=True)
class ToolCallResult:
    """A tool's logged result (what the model sees next)."""

    turn: int
    step: int
    call_id: str
    name: str
    content: tuple[ToolResultPart, ...]
    is_error: bool
    kind: Literal["tool-call-result"] = "tool-call-result"


@dataclass(frozen=True, slots=True)
class StepFinished:
    """A step closed: the answer's usage and stop reason, and the request's ``request/dispatch`` digest and seq."""

    turn: int
    step: int
    usage: Usage
    stop_reason: str | None
    digest: str
    dispatch_seq: int
    kind: Literal["step-finished"] = "step-finished"


@dataclass(frozen=True, slots=True)
class TurnFinished:
    """The turn ended (always the last event of a stream that was read to its end)."""

    result: TurnResult
    kind: Literal["turn-finished"] = "turn-finished"


StreamEvent: TypeAlias = (
    TextDelta
    | ReasoningDelta
    | ToolCallStarted
    | ToolArgumentsDelta
    | StepStarted
    | AttemptDiscarded
    | ToolCallFinished
    | ToolCallResult
    | StepFinished
    | TurnFinished
)

_PIECES = (TextDelta, ReasoningDelta, ToolArgumentsDelta)


@dataclass(slots=True)
class _Run:
    """Pieces of one kind merged while the reader was behind (joined when it is read)."""

    first: TextDelta | ReasoningDelta | ToolArgumentsDelta
    parts: list[str] = field(default_factory=list)

    def takes(self, delta: AnswerDelta) -> bool:
        return type(delta) is type(self.first) and (
            not isinstance(delta, ToolArgumentsDelta)
            or (isinstance(self.first, ToolArgumentsDelta) and delta.index == self.first.index)
        )

    def event(self) -> StreamEvent:
        text = self.first.text + "".join(self.parts)
        if isinstance(self.first, ToolArgumentsDelta):
            return ToolArgumentsDelta(self.first.index, text)
        return type(self.first)(text)


class EventBuffer:
    """The events of one stream between the loop (:meth:`push`, never waits) and the reader (:meth:`get`)."""

    __slots__ = ("_closed", "_queue", "_waiter", "bound", "merged", "pushed")

    def __init__(self, bound: int = DEFAULT_STREAM_BUFFER) -> None:
        if bound < 1:
            raise ConfigError(f"a stream's buffer holds at least one event (agent.stream(..., buffer=N)), got {bound}")
        self.bound = bound
        self._queue: deque[StreamEvent | _Run] = deque()
        self._waiter: asyncio.Future[None] | None = None
        self._closed = False
        self.pushed = 0  # events put in
        self.merged = 0  # pieces merged into the one before them

    def __len__(self) -> int:
        return len(self._queue)

    def push(self, event: StreamEvent) -> None:
        """Take ``event`` (from the loop, inside its step: O(1), no wait)."""
        if self._closed:
            return
        self.pushed += 1
        queue = self._queue
        if isinstance(event, _PIECES) and len(queue) >= self.bound and queue:
            last = queue[-1]
            if isinstance(last, _Run) and last.takes(event):
                last.parts.append(event.text)
                self.merged += 1
                return
            if isinstance(last, _PIECES) and _Run(last).takes(event):
                queue[-1] = _Run(last, [event.text])
                self.merged += 1
                return
        if isinstance(event, AttemptDiscarded):
            # pieces of the void attempt the reader has not taken yet need not reach it at all
            while queue and isinstance(queue[-1], (*_PIECES, ToolCallStarted, _Run)):
                queue.pop()
        queue.append(event)
        self._wake()

    def close(self) -> None:
        """No more events; the reader gets what is buffered, then the end."""
        self._closed = True
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def get(self) -> StreamEvent | None:
        """The next event, or None once the buffer is closed and drained."""
        while not self._queue:
            if self._closed:
                return None
            self._waiter = asyncio.get_running_loop().create_future()
            await self._waiter
            self._waiter = None
        item = self._queue.popleft()
        return item.event() if isinstance(item, _Run) else item


class TurnStream:
    """One turn run as a task, read as events (:meth:`foldline.loop.Agent.stream`). Iterate it, or use it as an
    async context manager to know the turn has stopped (and was logged) when the block is left."""

    def __init__(self, run: Coroutine[Any, Any, TurnResult], buffer: EventBuffer) -> None:
        self.buffer = buffer
        self._run: Coroutine[Any, Any, TurnResult] | None = run
        self._task: asyncio.Task[TurnResult] | None = None

    def _start(self) -> asyncio.Task[TurnResult]:
        if self._task is None:
            run, self._run = self._run, None
            assert run is not None
            self._task = asyncio.get_running_loop().create_task(run)
            buffer = self.buffer  # not self: a reader that drops the stream must let it go (see __del__)
            self._task.add_done_callback(lambda _: buffer.close())
        return self._task

    def __aiter__(self) -> TurnStream:
        return self

    async def __anext__(self) -> StreamEvent:
        task = self._start()
        event = await self.buffer.get()
        if event is None:
            task.result()  # the turn's exception, if it raised one
            raise StopAsyncIteration
        return event

    async def aclose(self) -> None:
        """Stop reading: a turn still running is cancelled, and this returns once it was logged as such."""
        if self._run is not None:  # never started: nothing ran, nothing to log
            self._run.close()
            self._run = None
            self.buffer.close()
            return
        task = self._task
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def __aenter__(self) -> TurnStream:
        self._start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def __del__(self) -> None:
        # the reader broke out of `async for` without closing: the turn is cancelled (and logged as such)
        if self._run is not None:
            self._run.close()
        task = self._task
        if task is not None and not task.done():
            task.cancel()
