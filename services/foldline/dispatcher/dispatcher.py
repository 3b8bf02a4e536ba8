"""The dispatcher: builds a step's request from the fold, proves it against the raw log, logs, sends, logs.

For one :class:`~foldline.ports.step_dispatch.StepHandoff`, in order:

1. wait (bounded, :class:`~foldline.errors.FoldTimeout`) until the fold store has applied the last event
   before the boundary; a fold already *past* the boundary means the step is stale
   (:class:`~foldline.errors.ConflictError`, nothing sent);
2. build the request from the fold — its folded header and derived message bytes — never from a loop's
   in-memory session (:func:`~foldline.replay.step.request_at`, as every path does); mark it as a loop request;
3. the invariant companion rebuilds the same request from the raw log prefix through a fresh session
   (:class:`~foldline.replay.invariant.InvariantCompanion`) and refuses to send on a mismatch;
4. the provider adapter's serializer turns it into exact wire bytes, resolving image attachments from
   the attachment store (S3 in the distributed backend); an unusable object appends
   ``attachment/quarantine`` and fails the step before anything is sent;
5. append ``request/dispatch`` with the digest of those bytes, then send them;
6. append the ``assistant/message`` (with usage) and one ``tool/call`` per tool-call block.

Every append carries the handing-off loop's writer lease: a newer loop instance of the session fences
the dispatcher's writes exactly as it fences the old loop's. Many sessions run concurrently; the steps
of one session are dispatched one at a time, in the order they were handed over.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from ..adapters.metered_log import MeteredEventLog
from ..core.events import Envelope, EventData
from ..core.fold import FoldState, decode_header
from ..core.header import CallConfig, EpochHeader
from ..core.projection import Message, MessageSequence
from ..core.request import GenerateOptions
from ..errors import AttachmentError, ConfigError, ConflictError, FencedError, FoldlineError
from ..metrics import DispatcherMetrics
from ..ports.attachments import AttachmentStore
from ..ports.event_log import EventLog
from ..ports.fold_store import FoldStore, FoldTail
from ..ports.step_dispatch import DispatchOutcome, StepHandoff
from ..providers.base import Provider, ProviderResponse, Serializer
from ..providers.framing import IncrementalBody
from ..replay.invariant import InvariantCompanion
from ..replay.registry import mark_loop_request
from ..replay.step import answer_records, dispatch_record, quarantine_record, request_at
from .decode import MessageCache, decode_fold_messages

__all__ = ["DispatchResult", "Dispatcher", "request_from_fold"]


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


def request_from_fold(state: FoldState, cache: MessageCache | None = None) -> GenerateOptions:
    """The loop request a fold describes: its folded header and derived messages, frozen and marked.

    The boundary is the fold's next seq; a fold without a header raises
    :class:`~foldline.errors.MissingHeader` like every other path. ``cache`` reuses messages decoded at
    earlier steps (same bytes, same message)."""
    messages = cache.decode(state.messages) if cache is not None else decode_fold_messages(state.messages)
    return mark_loop_request(request_at(state.session_id, state.applied_seq + 1, state.decoded_header(), messages))


@dataclass(slots=True)
class _View:
    """What the dispatcher holds of one session between its steps: the fold's messages decoded so far (one
    list per surface generation, only appended to), the decoded header, and one incremental body per
    serializer. A step reads only the fold's messages past these and encodes only the wire messages past
    the body's cached prefix, so its cost does not grow with the session."""

    generation: int = -1
    messages: list[Message] = field(default_factory=list)
    header_bytes: bytes | None = None
    header: EpochHeader | None = None
    bodies: dict[tuple[str, int], IncrementalBody] = field(default_factory=dict)

    def advance(self, tail: FoldTail, cache: MessageCache) -> None:
        new = cache.decode(tail.messages)
        if tail.offset == 0:
            self.messages = list(new)  # a new list: snapshots of the old one stay valid, body caches restart
        else:
            self.messages.extend(new)
        self.generation = tail.generation
        if tail.header != self.header_bytes:
            self.header_bytes = tail.header
            self.header = None if tail.header is None else decode_header(tail.header)

    def request(self, session_id: str, boundary: int) -> GenerateOptions:
        messages = MessageSequence(self.messages, len(self.messages))
        return mark_loop_request(request_at(session_id, boundary, self.header, messages))

    def body(self, serializer: Serializer) -> IncrementalBody:
        key = (serializer.name, serializer.version)
        body = self.bodies.get(key)
        if body is None:
            body = self.bodies[key] = IncrementalBody(serializer)
        return body


@dataclass(frozen=True, slots=True)
class DispatchResult(DispatchOutcome):
    """An in-process outcome also carries the parsed provider answer."""

    response: ProviderResponse | None = None


class Dispatcher:
    """Dispatches handed-off steps; usable in-process (``AgentOptions.dispatcher``) and by ``foldline dispatcher``.

    ``providers`` maps a call config's ``provider`` (``"anthropic"``, ``"openai"``) to its adapter.
    ``invariant`` (default on) rebuilds every request from the raw log before sending. ``fold_timeout_s``
    bounds the wait for the fold; ``max_concurrency`` bounds steps in flight across sessions;
    ``decode_cache`` is how many decoded fold messages are kept for later steps.
    """

    def __init__(
        self,
        log: EventLog,
        folds: FoldStore,
        providers: Mapping[str, Provider],
        *,
        attachments: AttachmentStore | None = None,
        invariant: bool = True,
        fold_timeout_s: float = 10.0,
        max_concurrency: int = 64,
        metrics: DispatcherMetrics | None = None,
        clock: Callable[[], int] = wall_clock_ms,
        decode_cache: int = 20_000,
        max_sessions: int = 4096,
    ) -> None:
        if not providers:
            raise ConfigError("a dispatcher needs at least one provider adapter")
        if max_concurrency < 1:
            raise ConfigError("max_concurrency must be at least 1")
        if metrics is not None:  # steps, their usage and cache-read drops are counted from what it appends
            log = MeteredEventLog(log, metrics.loop)
        self.log = log
        self.folds = folds
        self.providers = dict(providers)
        self.attachments = attachments
        self.invariant = (
            InvariantCompanion(
                log,
                attachments=attachments,
                on_violation=metrics.invariant_violation if metrics is not None else None,
            )
            if invariant
            else None
        )
        self.fold_timeout_s = fold_timeout_s
        self.metrics = metrics
        self.clock = clock
        self.dispatched = 0
        self.messages = MessageCache(decode_cache)  # decoded fold messages, for folds read whole
        self.max_sessions = max_sessions
        self._views: OrderedDict[str, _View] = OrderedDict()  # per session: what the last step read and built
        self._slots = asyncio.Semaphore(max_concurrency)
        self._sessions: dict[str, tuple[asyncio.Lock, int]] = {}  # per-session lock and its user count
        # fold waits block (the FoldStore port is synchronous); they get their own threads so a slow
        # projector never starves the event loop or the default executor
        self._waiters = ThreadPoolExecutor(max_workers=max_concurrency, thread_name_prefix="foldline-fold-wait")

    async def dispatch(self, handoff: StepHandoff) -> DispatchResult:
        """Dispatch one step (see the module docstring); steps of one session run in handoff order."""
        sid = handoff.session_id
        lock, users = self._sessions.get(sid) or (asyncio.Lock(), 0)
        self._sessions[sid] = (lock, users + 1)
        try:
            async with lock, self._slots:
                return await self._dispatch(handoff)
        finally:
            lock, users = self._sessions[sid]
            if users == 1:
                del self._sessions[sid]
            else:
                self._sessions[sid] = (lock, users - 1)

    async def aclose(self) -> None:
        """Close the provider adapters and the fold-wait threads."""
        for provider in self.providers.values():
            await provider.aclose()
        self._waiters.shutdown(wait=False, cancel_futures=True)

    # ------------------------------------------------------------------ one step

    async def _dispatch(self, h: StepHandoff) -> DispatchResult:
        started = time.perf_counter()
        try:
            view = await self._wait_for_fold(h)
            request = view.request(h.session_id, h.boundary)
            if self.invariant is not None:
                self.invariant.check(h.session_id, h.boundary, request)
            provider = self._provider_for(request.config)
            serializer = provider.serializer
            try:
                body, digest = view.body(serializer).serialize(request, self.attachments)
            except AttachmentError as exc:
                self._append(h, h.boundary, [quarantine_record(exc)])
                raise
            if self.invariant is not None:
                self.invariant.check_body(h.session_id, h.boundary, digest, serializer)
            if h.archive and self.attachments is not None:
                self.attachments.put(body, "application/json")
            self._append(h, h.boundary, [dispatch_record(h.turn, h.step, serializer, body, digest)])
            response = await provider.send(body)
            head = self._append(h, h.boundary + 1, answer_records(h.turn, h.step, h.boundary + 1, response))
        except FoldlineError as exc:
            self._count_error(exc)
            raise
        self.dispatched += 1
        if self.metrics is not None:
            self.metrics.dispatch_latency(request.config.provider, request.config.model, time.perf_counter() - started)
        return DispatchResult(h.session_id, h.boundary, digest, head, response)

    async def _wait_for_fold(self, h: StepHandoff) -> _View:
        """The session's view at the boundary: the fold read past what the last step of the session read."""
        started = time.perf_counter()
        view = self._views.pop(h.session_id, None) or _View()
        loop = asyncio.get_running_loop()
        wait = functools.partial(
            self.folds.wait_for_tail,
            h.session_id,
            h.boundary - 1,
            self.fold_timeout_s,
            generation=view.generation,
            known=len(view.messages),
        )
        tail = await loop.run_in_executor(self._waiters, wait)
        if self.metrics is not None:
            self.metrics.fold_wait(time.perf_counter() - started)
        if tail.applied_seq != h.boundary - 1:
            # the log moved past this boundary: another writer (or an earlier attempt) answered the step
            raise ConflictError(h.session_id, h.boundary, tail.applied_seq + 1)
        view.advance(tail, self.messages)
        self._views[h.session_id] = view
        while len(self._views) > self.max_sessions:
            self._views.popitem(last=False)
        return view

    def _provider_for(self, config: CallConfig) -> Provider:
        try:
            return self.providers[config.provider]
        except KeyError:
            known = ", ".join(sorted(self.providers))
            raise ConfigError(
                f"this dispatcher has no adapter for provider {config.provider!r} (it has: {known}); "
                "start it with that provider configured"
            ) from None

    def _append(self, h: StepHandoff, seq: int, datas: list[EventData]) -> int:
        now = self.clock()
        events = [Envelope(seq + i, now, d) for i, d in enumerate(datas)]
        return self.log.append(h.session_id, seq, events, lease=h.lease)

    def _count_error(self, exc: FoldlineError) -> None:
        if self.metrics is None:
            return
        self.metrics.dispatch_error(exc)  # invariant violations: counted by the companion; attachment errors:
        if isinstance(exc, FencedError):  # counted from the quarantine record the dispatcher appended
            self.metrics.fenced_write()
