"""The dispatcher: builds each step's request from the fold, serializes it, and sends it once it is logged.

It serves the :class:`~foldline.ports.step_dispatch.StepDispatcher` port — the loop stays the session's only
writer, so a dispatcher writes nothing to the log and needs no Kafka client at all. For one
:class:`~foldline.ports.step_dispatch.StepHandoff`:

**prepare** —

1. wait (bounded) until the fold store has applied the event before the hand-over's pending events (the
   session's last ``request/dispatch``; without pending events, the last event before the boundary)
   (:class:`FoldWatcher`: the fold is read when the store's notice names its session, with a bounded
   fallback round for a lost notice); a fold already *past* the boundary means the step is stale
   (:class:`~foldline.errors.ConflictError`, nothing built), and a fold whose writer epoch is newer than the
   hand-over's means a newer loop instance leased the session (:class:`~foldline.errors.FencedError`, nothing
   built: this instance's next append would be fenced anyway, and the error names why);
2. build the request from the fold, completed with what it lacks of the pending events (as a projector folds
   them: :class:`~foldline.core.fold.FoldDelta`) — folded headers and derived message bytes, never a loop's
   other memory —
   with :func:`~foldline.replay.step.request_at`, as every path does; a session's later steps read and
   decode only the fold's messages past what its previous step held (:class:`_View`);
3. serialize it with the adapter of the header's ``config.provider``, resolving image attachments from the
   attachment store (S3 in the distributed backend) with digest and metadata checks, through the
   session's incremental body cache; an object that cannot be used raises its
   :class:`~foldline.errors.AttachmentError` (the loop logs ``attachment/quarantine``); a store that does
   not answer is waited out for ``outage_s``;
4. keep the body and answer its digest (a :class:`~foldline.ports.step_dispatch.PreparedStep`). The body is
   kept in parts (:class:`~foldline.providers.base.BodyParts`): the blocks of the session's cached prefix,
   which every later body shares, and one part with the rest, so a long session's step does not copy its
   whole body into a fresh object; the provider posts the parts one after another.

The loop checks that digest against its own rebuild from the durable log and its held events, and writes
those with ``request/dispatch`` in one append.

**send** — send exactly the prepared body, once (rebuilt from the fold when this process no longer holds it,
e.g. after a restart or on another dispatcher; a different digest is refused before anything is sent), and
answer the provider's reply (:class:`~foldline.ports.step_dispatch.StepAnswer`) or raise its error as it
came: retrying is the loop's, which logs each failed attempt (``llm/retry``) before it calls ``send`` again.
The body is kept until a send succeeds, so a retry sends the same bytes without building them again.

Many sessions run concurrently; the calls of one session are served one at a time, in order.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from ..backoff import Backoff
from ..core.deltas import AnswerDelta
from ..core.fold import FoldDelta, FoldState, decode_header
from ..core.header import CallConfig, EpochHeader
from ..core.projection import Message, MessageSequence
from ..core.request import GenerateOptions
from ..errors import (
    ConfigError,
    ConflictError,
    DispatchFailed,
    FencedError,
    FoldlineError,
    FoldTimeout,
    StoreUnavailable,
    TransientError,
)
from ..metrics import DispatcherMetrics
from ..ports.attachments import AttachmentStore
from ..ports.fold_store import ERASED, AppliedNotices, FoldStore, FoldTail
from ..ports.step_dispatch import PreparedStep, StepAnswer, StepHandoff
from ..providers.base import Body, Provider, Serializer
from ..providers.framing import IncrementalBody
from ..providers.streaming import AnswerProgress
from ..replay.registry import mark_loop_request
from ..replay.step import request_at
from .decode import MessageCache, decode_fold_messages

__all__ = ["Dispatcher", "FoldWatcher", "request_from_fold", "wait_for_fold", "wait_for_fold_tail"]

#: The attachment store not answering (writing an archived body, reading an image): 100 ms doubling to 2 s.
_STORE_OUTAGE = Backoff(initial_s=0.1, cap_s=2.0)


def request_from_fold(state: FoldState, cache: MessageCache | None = None) -> GenerateOptions:
    """The loop request a fold describes: its folded header and derived messages, frozen and marked.

    The boundary is the fold's next seq; a fold without a header raises
    :class:`~foldline.errors.MissingHeader` like every other path. ``cache`` reuses messages decoded at
    earlier steps (same bytes, same message)."""
    messages = cache.decode(state.messages) if cache is not None else decode_fold_messages(state.messages)
    return mark_loop_request(request_at(state.session_id, state.applied_seq + 1, state.decoded_header(), messages))


# ---------------------------------------------------------------------------- waiting for folds


@dataclass(slots=True, eq=False)  # identity: each wait is its own
class _Wait:
    session_id: str
    seq: int
    generation: int
    known: int
    deadline: float
    future: asyncio.Future[FoldTail]
    loop: asyncio.AbstractEventLoop
    applied: int = -1
    cause: str = ""
    looked: bool = False  # checked at least once since it was added


class FoldWatcher:
    """Waits for many sessions' folds at once, on one thread. A round asks the applied seq of the sessions it
    looks at in one round trip (:meth:`FoldStore.applied_seqs`), then reads the folds that got there in one
    more (:meth:`FoldStore.tails`).

    **Pushed** (a store with :meth:`FoldStore.notices`, e.g. Redis pub/sub; the default): a new wait is looked
    at once, then again whenever a notice names its session — a fold is read the moment its projector applied
    it, with no poll in between. Notices are a hint that may be lost, so every ``fallback_s`` (and at once
    after the subscription was re-established) a round looks at every wait: a lost notice delays a step by at
    most ``fallback_s``, never fails it. **Polled** (a store without notices, or ``notify=False``): rounds
    ``poll_s`` apart while folds keep arriving, backing off to ``max_poll_s`` while nothing does.

    A fold store that fails (Redis restarting) is retried every round until each waiter's own deadline; the
    timeout then names the cause."""

    def __init__(
        self,
        folds: FoldStore,
        *,
        poll_s: float = 0.002,
        max_poll_s: float = 0.02,
        fallback_s: float = 0.1,
        notify: bool = True,
    ) -> None:
        self._folds = folds
        self._poll_s = poll_s
        self._max_poll_s = max_poll_s
        self.fallback_s = fallback_s
        self._cond = threading.Condition()
        self._waits: list[_Wait] = []
        self._waiting: dict[str, int] = {}  # session -> waits of it (which notices matter)
        self._named: set[str] = set()  # waited sessions named by a notice since the last look
        self._missed = False  # notices may have been lost: look at every wait
        self._closed = False
        self.settled_on_notice = 0  # waits settled by a round a notice or a new wait started
        self.settled_on_pause = 0  # waits settled by a round after a pause (fallback or poll)
        self.rounds = 0  # rounds done
        self._notices: AppliedNotices | None = folds.notices() if notify else None
        self._thread = threading.Thread(target=self._run, name="foldline-fold-watcher", daemon=True)
        self._thread.start()
        if self._notices is not None:
            self._notices.start(self._on_applied)

    @property
    def pushed(self) -> bool:
        """Whether notices from the store drive the rounds (else they are polled)."""
        return self._notices is not None

    async def wait(self, session_id: str, seq: int, timeout_s: float, *, generation: int, known: int) -> FoldTail:
        """The session's fold (past the ``known`` messages of ``generation``) once it has applied ``seq``."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[FoldTail] = loop.create_future()
        with self._cond:
            if self._closed:
                raise StoreUnavailable("the dispatcher's fold watcher is closed")
            self._waits.append(_Wait(session_id, seq, generation, known, time.monotonic() + timeout_s, future, loop))
            self._waiting[session_id] = self._waiting.get(session_id, 0) + 1
            self._cond.notify()
        return await future

    def close(self) -> None:
        if self._notices is not None:
            self._notices.close()
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._thread.join(timeout=5)

    def _on_applied(self, sessions: Sequence[str] | None) -> None:
        """A notice (the notices' thread): look at the named sessions' waits now."""
        with self._cond:
            if sessions is None:
                self._missed = True
                self._cond.notify()
                return
            named = [sid for sid in sessions if sid in self._waiting]
            if named:
                self._named.update(named)
                self._cond.notify()

    def _run(self) -> None:
        try:
            self._serve()
        except BaseException as exc:  # a bug here must fail the waiters, not leave them hanging
            with self._cond:
                self._closed = True
                for w in self._waits:
                    w.loop.call_soon_threadsafe(_fail, w.future, StoreUnavailable(f"the fold watcher failed: {exc!r}"))
                self._waits = []
                self._waiting = {}
            raise

    def _serve(self) -> None:
        pauses = Backoff(self._poll_s, self._max_poll_s).pauses()
        due = 0.0  # the next round that looks at every wait
        while True:
            with self._cond:
                while True:
                    while not self._waits and not self._closed:
                        self._cond.wait()
                    if self._closed:
                        for w in self._waits:
                            w.loop.call_soon_threadsafe(_fail, w.future, StoreUnavailable("the fold watcher closed"))
                        return
                    now = time.monotonic()
                    full = now >= due or self._missed
                    if full:
                        waits = list(self._waits)
                        break
                    waits = [w for w in self._waits if not w.looked or w.session_id in self._named]
                    if waits:
                        break
                    self._cond.wait(due - now)
                self._named.clear()
                self._missed = False
                for w in waits:
                    w.looked = True
            done = self._round(waits)
            now = time.monotonic()
            self.rounds += 1
            with self._cond:
                for w in self._waits:
                    if w not in done and now >= w.deadline:
                        done.add(w)
                        w.loop.call_soon_threadsafe(_fail, w.future, _timeout(w))
                if done:
                    self._waits = [w for w in self._waits if w not in done]
                    for w in done:
                        left = self._waiting.pop(w.session_id, 1) - 1
                        if left:
                            self._waiting[w.session_id] = left
            if self._notices is not None:
                if full:
                    due = now + self.fallback_s
                if full:
                    self.settled_on_pause += len(done)
                else:
                    self.settled_on_notice += len(done)
            else:
                if done:
                    pauses.reset()  # folds are arriving: look again soon
                due = now + pauses.next()
                self.settled_on_pause += len(done)

    def _round(self, waits: list[_Wait]) -> set[_Wait]:
        """One round over ``waits``: the waits it settled."""
        settled: set[_Wait] = set()
        try:
            applied = self._folds.applied_seqs(sorted({w.session_id for w in waits}))
            ready = [w for w in waits if applied.get(w.session_id, -1) >= w.seq]
            for w in waits:
                w.applied = applied.get(w.session_id, -1)
            if not ready:
                return settled
            tails = self._folds.tails([(w.session_id, w.generation, w.known) for w in ready])
        except TransientError as exc:
            for w in waits:
                w.cause = f"the fold store failed: {exc}"
            return settled
        for w, tail in zip(ready, tails, strict=True):
            if tail is not None and tail.applied_seq >= w.seq:
                settled.add(w)
                w.loop.call_soon_threadsafe(_deliver, w.future, tail)
        return settled


def _deliver(future: asyncio.Future[FoldTail], tail: FoldTail) -> None:
    if not future.done():
        future.set_result(tail)


def _fail(future: asyncio.Future[FoldTail], exc: BaseException) -> None:
    if not future.done():
        future.set_exception(exc)


_FOLD_POLL = Backoff(initial_s=0.0005, cap_s=0.02)  # one session's fold, polled: 0.5 ms apart, doubling to 20 ms
_F = TypeVar("_F", FoldState, FoldTail)


def wait_for_fold(folds: FoldStore, session_id: str, seq: int, timeout_s: float) -> FoldState:
    """The session's fold once it has applied ``seq``, or :class:`~foldline.errors.FoldTimeout` after
    ``timeout_s`` — a bounded wait, never a hang. One session, polled from this thread (tools, tests); a
    dispatcher waits for many at once with :class:`FoldWatcher`."""
    return _wait(folds, session_id, seq, timeout_s, lambda: folds.get(session_id))


def wait_for_fold_tail(
    folds: FoldStore, session_id: str, seq: int, timeout_s: float, *, generation: int, known: int
) -> FoldTail:
    """:func:`wait_for_fold`, answered with :meth:`FoldStore.tail` (the messages past the ``known`` ones)."""
    return _wait(folds, session_id, seq, timeout_s, lambda: folds.tail(session_id, generation=generation, known=known))


def _wait(folds: FoldStore, session_id: str, seq: int, timeout_s: float, fetch: Callable[[], _F | None]) -> _F:
    waits = _FOLD_POLL.until(timeout_s, clip=True)
    while True:
        if folds.applied_seq(session_id) >= seq:
            state = fetch()
            if state is not None and state.applied_seq >= seq:
                return state
        pause = waits.next()
        if pause is None:
            raise FoldTimeout(
                f"session {session_id!r}: the fold has applied seq {folds.applied_seq(session_id)}, not {seq}, "
                f"after {timeout_s:.3f}s; check that a projector is running and consuming the session's partition"
            )
        time.sleep(pause)


def _timeout(w: _Wait) -> FoldTimeout:
    cause = w.cause or (
        "check that a projector (foldline projector) is running and consuming the session's partition"
        if w.applied >= 0
        else "the session has no fold yet: check that a projector is running (it folds a session on its first events)"
    )
    return FoldTimeout(
        f"session {w.session_id!r}: the fold has applied seq {w.applied}, not {w.seq}, after waiting; {cause}"
    )


# ---------------------------------------------------------------------------- one session's view


@dataclass(slots=True)
class _View:
    """What the dispatcher holds of one session between its steps: the fold's messages decoded so far (one
    list per surface generation, only appended to), the decoded header, one incremental body per
    serializer, and the body it prepared last. A step reads only the fold's messages past these and
    encodes only the wire messages past the body's cached prefix, so its cost does not grow with the
    session."""

    generation: int = -1
    messages: list[Message] = field(default_factory=list)
    header_bytes: bytes | None = None
    header: EpochHeader | None = None
    bodies: dict[tuple[str, int], IncrementalBody] = field(default_factory=dict)
    prepared: tuple[int, str, Body, Provider] | None = None  # boundary, digest, body, its provider
    confirmed: int = 0  # how many of ``messages`` the fold has shown; the rest came as a hand-over's pending
    taken: list[bytes] = field(default_factory=list)  # the bytes of ``messages[confirmed:]``, as handed over

    def advance(self, tail: FoldTail, cache: MessageCache) -> None:
        """Take the fold's messages past ``confirmed``: the pending messages this view took must be the next
        ones, byte for byte (the loop wrote them with its request/dispatch), else the view starts again from
        what the fold holds."""
        raw, k = tail.messages, len(self.taken)
        if tail.offset == 0 and self.confirmed:  # a replace, or a fold read whole
            self.messages = list(cache.decode(raw))  # a new list: snapshots of the old one stay valid
        elif k and raw[:k] != tuple(self.taken):  # not what the log holds (the loop did not write them)
            self.messages = [*self.messages[: self.confirmed], *cache.decode(raw)]  # a new list, as above
        else:
            self.messages.extend(cache.decode(raw[k:]))
        self.confirmed, self.taken = len(self.messages), []
        self.generation = tail.generation
        if tail.header != self.header_bytes:
            self._set_header(tail.header)

    def take(self, pending: FoldDelta, applied: int, cache: MessageCache) -> None:
        """Add what the fold (at ``applied``) lacks of a hand-over's events: their messages after the fold's, their
        header over the fold's."""
        raw = tuple(m for seq, m in pending.messages if seq > applied)
        self.messages.extend(cache.decode(raw))
        self.taken.extend(raw)
        header = pending.header
        if header is not None and header[0] > applied and header[1] != self.header_bytes:
            self._set_header(header[1])

    def _set_header(self, raw: bytes | None) -> None:
        self.header_bytes = raw
        self.header = None if raw is None else decode_header(raw)

    def request(self, session_id: str, boundary: int) -> GenerateOptions:
        messages = MessageSequence(self.messages, len(self.messages))
        return mark_loop_request(request_at(session_id, boundary, self.header, messages))

    def body(self, serializer: Serializer) -> IncrementalBody:
        key = (serializer.name, serializer.version)
        body = self.bodies.get(key)
        if body is None:
            body = self.bodies[key] = IncrementalBody(serializer)
        return body


# ---------------------------------------------------------------------------- the dispatcher


class Dispatcher:
    """Serves handed-over steps; usable in-process (``AgentOptions.dispatcher``) and by ``foldline dispatcher``.

    ``providers`` maps a call config's ``provider`` (``"anthropic"``, ``"openai"``) to its adapter.
    ``fold_timeout_s`` bounds the wait for a step's fold; ``outage_s`` how long an attachment store that
    does not answer is waited out; ``max_concurrency`` bounds the calls in flight across sessions;
    ``max_sessions`` sessions keep their view (least recently served first out); ``decode_cache`` is how
    many decoded fold messages are kept for folds read whole.
    """

    def __init__(
        self,
        folds: FoldStore,
        providers: Mapping[str, Provider],
        *,
        attachments: AttachmentStore | None = None,
        fold_timeout_s: float = 60.0,
        outage_s: float = 60.0,
        max_concurrency: int = 1024,
        metrics: DispatcherMetrics | None = None,
        decode_cache: int = 20_000,
        max_sessions: int = 8192,
    ) -> None:
        if not providers:
            raise ConfigError("a dispatcher needs at least one provider adapter")
        if max_concurrency < 1:
            raise ConfigError("max_concurrency must be at least 1")
        self.folds = folds
        self.providers = dict(providers)
        self.attachments = attachments
        self.fold_timeout_s = fold_timeout_s
        self.outage_s = outage_s
        self.metrics = metrics
        self.dispatched = 0
        self.rebuilt_for_send = 0  # sends whose body had to be prepared again (another process prepared it)
        self.messages = MessageCache(decode_cache)  # decoded fold messages, for folds read whole
        self.max_sessions = max_sessions
        self._views: OrderedDict[str, _View] = OrderedDict()
        self._slots = asyncio.Semaphore(max_concurrency)
        self._sessions: dict[str, tuple[asyncio.Lock, int]] = {}  # per-session lock and its user count
        self._watcher = FoldWatcher(folds)

    async def prepare(self, handoff: StepHandoff) -> PreparedStep:
        """Build and serialize the step's request from the fold (see the module docstring)."""
        async with self._session(handoff.session_id):
            try:
                return await self._prepare(handoff, exact=True)
            except FoldlineError as exc:
                self._count_error(exc)
                raise

    async def send(
        self, handoff: StepHandoff, prepared: PreparedStep, *, on_delta: Callable[[AnswerDelta], None] | None = None
    ) -> StepAnswer:
        """Send the prepared body and answer the provider's reply (see the module docstring); a streamed answer's
        pieces go to ``on_delta`` as they arrive."""
        async with self._session(handoff.session_id):
            try:
                return await self._send(handoff, prepared, on_delta)
            except FoldlineError as exc:
                self._count_error(exc)
                raise

    async def aclose(self) -> None:
        """Close the provider adapters and the fold watcher."""
        for provider in self.providers.values():
            await provider.aclose()
        self._watcher.close()

    # ------------------------------------------------------------------ one session at a time

    def _session(self, session_id: str) -> _SessionSlot:
        return _SessionSlot(self, session_id)

    async def _prepare(self, h: StepHandoff, *, exact: bool) -> PreparedStep:
        started = time.perf_counter()
        view = self._views.pop(h.session_id, None) or _View()
        # a prepare builds from the fold plus what it lacks of the hand-over's events (those since the session's
        # last request/dispatch: the fold holds that one, written before its model call, so there is rarely a wait);
        # a send's rebuild comes after the loop wrote them with request/dispatch, and reads them folded
        pending = h.pending if exact else None
        upto = (pending.first_seq if pending is not None else h.boundary) - 1
        if upto < 0:  # a new session's first step: nothing is logged before it, so there is no fold to wait for
            tail = FoldTail(h.session_id, -1, h.epoch, 0, None, None, 0, ())
        else:
            tail = await self._watcher.wait(
                h.session_id, upto, self.fold_timeout_s, generation=view.generation, known=view.confirmed
            )
        waited = time.perf_counter() - started
        if self.metrics is not None:
            self.metrics.fold_wait(waited)
        # A prepare at a boundary the log moved past is stale; a send's rebuild comes after the loop logged
        # request/dispatch (and perhaps failed attempts), none of which changes the request.
        last = h.boundary - 1 if pending is not None else upto  # the last seq this prepare may find folded
        if tail.epoch > h.epoch and tail.applied_seq != ERASED:  # a newer instance leased the session
            raise FencedError(h.session_id, h.epoch, tail.epoch)
        if tail.applied_seq > last if exact else tail.applied_seq < upto:
            raise ConflictError(h.session_id, last + 1, tail.applied_seq + 1)
        view.advance(tail, self.messages)
        if pending is not None:
            view.take(pending, tail.applied_seq, self.messages)
        self._views[h.session_id] = view
        while len(self._views) > self.max_sessions:
            self._views.popitem(last=False)
        # The body this view kept (a step prepared and not sent, or sent and failed) is replaced: let it
        # go before the new one is assembled (its last part is not shared with the new body).
        view.prepared = None
        built = time.perf_counter()
        request = view.request(h.session_id, h.boundary)
        provider = self._provider_for(request.config)
        serializer = provider.serializer
        body, digest = await self._serialize(view.body(serializer), request)
        if h.archive and self.attachments is not None:
            await self._archive(body)
        view.prepared = (h.boundary, digest, body, provider)
        return PreparedStep(
            h.session_id,
            h.boundary,
            serializer.name,
            serializer.version,
            digest,
            len(body),
            {"fold_wait": waited, "build": time.perf_counter() - built},
        )

    async def _archive(self, body: Body) -> None:
        """Keep the exact body in the attachment store (off the event loop: the store's client blocks, and the
        parts are joined there); a store that does not answer is waited out (``outage_s``)."""
        store = self.attachments
        assert store is not None
        waits = _STORE_OUTAGE.until(self.outage_s)
        while True:
            try:
                await asyncio.to_thread(lambda: store.put(bytes(body), "application/json"))
                return
            except TransientError:
                pause = waits.next()
                if pause is None:
                    raise
            await asyncio.sleep(pause)

    async def _serialize(self, cache: IncrementalBody, request: GenerateOptions) -> tuple[Body, str]:
        """The body (in parts) and its digest; an attachment store that does not answer is waited out
        (``outage_s``)."""
        waits = _STORE_OUTAGE.until(self.outage_s)
        while True:
            try:
                return cache.parts(request, self.attachments)
            except TransientError:  # an object the store could not read now; one it lacks or that is corrupt: at once
                pause = waits.next()
                if pause is None:
                    raise
            await asyncio.sleep(pause)

    async def _send(
        self, h: StepHandoff, prepared: PreparedStep, on_delta: Callable[[AnswerDelta], None] | None = None
    ) -> StepAnswer:
        started = time.perf_counter()
        view = self._views.get(h.session_id)
        held = view.prepared if view is not None else None
        if held is None or held[:2] != (h.boundary, prepared.digest):
            again = await self._prepare(h, exact=False)  # not held here: build it again, from the fold
            self.rebuilt_for_send += 1
            view = self._views.get(h.session_id)
            held = view.prepared if view is not None else None
            if held is None or again.digest != prepared.digest:
                raise DispatchFailed(
                    h.session_id,
                    h.boundary,
                    "ReconstructionError",
                    f"the fold now builds a body with digest {again.digest}, not the logged {prepared.digest}; "
                    "nothing was sent — rebuild the fold from the log (foldline projector --rebuild)",
                )
        _, _, body, provider = held
        stream = view.header.config.stream if view is not None and view.header is not None else False
        sent = time.perf_counter()
        progress = AnswerProgress(on_delta=on_delta) if on_delta is not None else None
        # one attempt: the loop logs and drives retries
        response = await provider.send(body, stream=stream, progress=progress)
        if view is not None:
            view.prepared = None
        self.dispatched += 1
        if self.metrics is not None:
            self.metrics.dispatch_latency(provider.name, _model(view), time.perf_counter() - started)
        return StepAnswer(
            response.content,
            response.usage,
            response.stop_reason,
            {"send": time.perf_counter() - sent},
            response.request_id,
            response.message_id,
        )

    def _provider_for(self, config: CallConfig) -> Provider:
        try:
            return self.providers[config.provider]
        except KeyError:
            known = ", ".join(sorted(self.providers))
            raise ConfigError(
                f"this dispatcher has no adapter for provider {config.provider!r} (it has: {known}); "
                "start it with that provider configured"
            ) from None

    def _count_error(self, exc: FoldlineError) -> None:
        if self.metrics is not None:
            self.metrics.dispatch_error(exc)


def _model(view: _View | None) -> str:
    return view.header.config.model if view is not None and view.header is not None else "unknown"


class _SessionSlot:
    """One session's calls one at a time (in arrival order), within the dispatcher's concurrency bound."""

    __slots__ = ("_dispatcher", "_lock", "_session_id")

    def __init__(self, dispatcher: Dispatcher, session_id: str) -> None:
        self._dispatcher = dispatcher
        self._session_id = session_id
        self._lock: asyncio.Lock | None = None

    async def __aenter__(self) -> None:
        sessions = self._dispatcher._sessions
        lock, users = sessions.get(self._session_id) or (asyncio.Lock(), 0)
        sessions[self._session_id] = (lock, users + 1)
        self._lock = lock
        await lock.acquire()
        try:
            await self._dispatcher._slots.acquire()
        except BaseException:
            self._release_lock()
            raise

    async def __aexit__(self, *exc: object) -> None:
        self._dispatcher._slots.release()
        self._release_lock()

    def _release_lock(self) -> None:
        assert self._lock is not None
        self._lock.release()
        sessions = self._dispatcher._sessions
        lock, users = sessions[self._session_id]
        if users == 1:
            del sessions[self._session_id]
        else:
            sessions[self._session_id] = (lock, users - 1)
