"""Serving steps across processes: loops hand them to ``foldline dispatcher`` processes through Redis.

This is the Redis transport of the :class:`~foldline.ports.step_dispatch.StepDispatcher` port: an adapter, like
the fold store on Redis. Its two ends carry calls of the port and nothing else — the client is a
StepDispatcher, and the server hands each call to a StepDispatcher (``foldline dispatcher`` gives it its
:class:`~foldline.dispatcher.Dispatcher`). Redis errors are translated here, where redis-py is called.

**The loop's end** (:class:`RedisStepClient`, the loop's ``AgentOptions.dispatcher``): each call —
``prepare`` or ``send`` — is one ``XADD`` to the steps stream (fields ``op``, ``id``, ``reply``,
``handoff``, and for ``send`` the ``prepared`` step). Every reply comes back on one Redis list per client
(``<stream>:replies:<client id>``), read by one task in batches (``BLMPOP``): a thousand sessions in flight
hold one connection, not a thousand.

**The dispatchers' end** (:func:`serve_steps`): dispatcher processes read the stream as one consumer group;
an entry goes to one of them, which answers ``accepted`` (a ``prepare`` only when it takes longer than
``_ACCEPT_AFTER_S``), then the result, acknowledging and deleting the entry in the same transaction.
Taking a ``send`` marks its call id taken (``<stream>:taken:<id>``, ``SET NX``) in the same transaction as
the ``accepted`` reply: a send handed over twice, or re-claimed, is sent by at most one dispatcher.

**What survives what.** The stream and the replies are transport, not state: the log records what was
sent and answered.

* Redis restarted or flushed: a dispatcher reconnects and recreates its group; a loop whose call was not
  ``accepted`` within ``ack_timeout_s`` hands it over again (``prepare`` is safe to repeat; a ``send``
  that was not accepted was taken by no dispatcher, and the taken mark stops a second one). Redis calls
  that fail are retried for ``outage_s`` before the error names Redis.
* A dispatcher killed mid-call: its entries stay pending in the group; every dispatcher heartbeats the
  entries it works on (re-claims them to itself) and takes over entries idle for ``claim_idle_s``. A taken
  ``prepare`` is served again, and so is a ``send`` its first dispatcher had not taken yet; a taken ``send``
  may or may not have reached the provider, so no dispatcher sends it again: it is answered ``lost`` and
  the loop resolves it by the rule in docs/DISPATCHER.md.
* No dispatcher at all: the loop's wait is bounded, and its error says whether the group has consumers.

**Pieces of a streamed answer** (a ``send`` given ``on_delta``: a caller reads ``Agent.stream``): the hand-over
names a Pub/Sub channel (``<stream>:deltas:<call id>``, field ``deltas``) that the client subscribes to first, on
one Pub/Sub connection per client shared by all its calls. The dispatcher publishes the pieces there as the
provider's stream arrives — batched: one ``PUBLISH`` in flight at a time, the pieces that arrive meanwhile in the
next, so the provider's read never waits for Redis — then an end mark, before the reply. Pub/Sub keeps nothing:
a relay that is lost (a Redis hiccup, a client that subscribed late) costs pieces, never the answer or the log.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import functools
import gc
import itertools
import logging
import os
import socket
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.typing import EncodableT, FieldT

from ..backoff import OUTAGE
from ..core import codec
from ..core.deltas import AnswerDelta, pieces_from_json, pieces_to_json
from ..errors import (
    ConfigError,
    DispatchLost,
    DispatchTimeout,
    FoldlineError,
    FormatError,
    StoreUnavailable,
)
from ..ports.step_dispatch import (
    PreparedStep,
    StepAnswer,
    StepDispatcher,
    StepHandoff,
    error_from_json,
    error_to_json,
)

__all__ = ["RedisConnection", "RedisStepClient", "serve_steps"]

_LOG = logging.getLogger("foldline.dispatcher")
_REPLY_TTL_S = 600
_TAKEN_TTL_S = 86_400  # a send's taken mark outlives any re-claim of its hand-over
_STREAM_MAXLEN = 200_000
_REPLY_BATCH = 512
_ACCEPT_AFTER_S = 1.0  # a prepare still running after this long is answered `accepted` first
_ALIVE_EVERY_S = 1.0  # how often a client checks that Redis kept its data
_WRITE_BATCH = 1024  # writes per transaction of a dispatcher
_RELAY_END = b"end"  # the last message on a send's pieces channel
_RELAY_GRACE_S = 1.0  # a reply that overtook its last pieces waits this long for them (relay alive only)
_T = TypeVar("_T")
_W = TypeVar("_W")


class RedisConnection(Protocol):
    """Where Redis is and how long to wait for it (:class:`foldline.config.RedisConfig` is one)."""

    @property
    def url(self) -> str: ...

    @property
    def socket_timeout_s(self) -> float: ...

    @property
    def connect_timeout_s(self) -> float: ...

    @property
    def max_connections(self) -> int: ...


def _json(value: dict[str, Any]) -> bytes:
    return codec.canonical_json(value)


def _connect(redis: RedisConnection, *, blocking_s: float = 0.0) -> aioredis.Redis:
    """A client whose socket timeout outlasts any blocking wait it issues (``blocking_s``), on a pool of
    ``max_connections`` that a call waits on (up to the socket timeout) instead of failing when all are busy:
    a thousand sessions handing steps over at once share the pool, each command holding a connection for a
    round trip."""
    try:
        pool = aioredis.BlockingConnectionPool.from_url(
            redis.url,
            max_connections=redis.max_connections,
            timeout=redis.socket_timeout_s,
            socket_timeout=redis.socket_timeout_s + blocking_s,
            socket_connect_timeout=redis.connect_timeout_s,
            health_check_interval=30,
        )
    except ValueError as exc:
        raise ConfigError(f"bad Redis URL: {exc}") from exc
    return aioredis.Redis.from_pool(pool)


def _pool_exhausted(exc: BaseException) -> bool:
    return isinstance(exc, RedisConnectionError) and "No connection available" in str(exc)


async def _retrying(what: str, outage_s: float, call: Callable[[], Awaitable[_T]]) -> _T:
    """``call()``, retried while Redis does not answer, for up to ``outage_s``; then a StoreUnavailable that
    names Redis and the call (or the process's own connection pool, when that is what was exhausted)."""
    waits = OUTAGE.until(outage_s)
    while True:
        try:
            return await call()
        except (RedisConnectionError, RedisTimeoutError, OSError) as exc:
            pause = waits.next()
            if pause is None:
                if _pool_exhausted(exc):
                    raise StoreUnavailable(
                        f"{what}: every connection of this process's Redis pool stayed busy for {outage_s:g}s; "
                        "raise FOLDLINE_REDIS_MAX_CONNECTIONS or lower the steps in flight"
                    ) from exc
                raise StoreUnavailable(
                    f"Redis did not answer {what} for {outage_s:g}s ({type(exc).__name__}: {exc}); "
                    "check that Redis is running and FOLDLINE_REDIS_URL points at it"
                ) from exc
        await asyncio.sleep(pause)


class _Batches(abc.ABC, Generic[_W]):
    """Writes to Redis batched: those queued while one batch is in flight go out together in the next (one
    round trip), in queue order. A batch Redis does not take is retried for ``outage_s``; then each of its
    writes fails with the :class:`StoreUnavailable`. :meth:`_send` says what each write got: its result, or
    the error of the command that carried it (which fails that write alone)."""

    what = "writing to Redis"  # names the writes in the error of an outage

    def __init__(self, outage_s: float) -> None:
        self.outage_s = outage_s
        self._queue: list[tuple[_W, asyncio.Future[Any]]] = []
        self._flusher: asyncio.Task[None] | None = None

    @abc.abstractmethod
    async def _send(self, batch: list[_W]) -> list[Any]:
        """Write the batch in one round trip; what each write got (its result or its command's error)."""

    def _queued(self, write: _W) -> asyncio.Future[Any]:
        loop = asyncio.get_running_loop()
        done: asyncio.Future[Any] = loop.create_future()
        self._queue.append((write, done))
        if self._flusher is None or self._flusher.done():
            self._flusher = loop.create_task(self._flush(), name=f"foldline-batches-{id(self):x}")
        return done

    async def drain(self) -> None:
        """Wait until every queued write went out (or failed)."""
        while self._flusher is not None and not self._flusher.done():
            await asyncio.wait({self._flusher})

    async def cancel(self) -> None:
        """Stop writing: the writes still queued are cancelled."""
        if self._flusher is not None and not self._flusher.done():
            self._flusher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._flusher

    async def _flush(self) -> None:
        while self._queue:
            batch, self._queue = self._queue[:_WRITE_BATCH], self._queue[_WRITE_BATCH:]
            writes = [w for w, _ in batch]
            try:
                results = await _retrying(self.what, self.outage_s, functools.partial(self._send, writes))
            except Exception as exc:
                for _, done in batch:
                    if not done.done():
                        done.set_exception(exc)
                continue
            except BaseException:
                for _, done in batch + self._queue:
                    done.cancel()
                self._queue = []
                raise
            for (_, done), result in zip(batch, results, strict=True):
                if done.done():
                    continue
                if isinstance(result, BaseException):
                    done.set_exception(result)
                else:
                    done.set_result(result)


# ---------------------------------------------------------------------------- the loop's end


class _Handovers(_Batches[dict[FieldT, EncodableT]]):
    """A loop's hand-overs (``XADD`` of each call's entry), batched: every hand-over queued while one batch is
    in flight goes out in the next, one pipeline."""

    what = "handing steps over"

    def __init__(self, client: Callable[[], aioredis.Redis], *, stream: str, outage_s: float) -> None:
        super().__init__(outage_s)
        self._client = client
        self.stream = stream

    def add(self, fields: dict[FieldT, EncodableT]) -> asyncio.Future[Any]:
        return self._queued(fields)

    async def _send(self, batch: list[dict[FieldT, EncodableT]]) -> list[Any]:
        async with self._client().pipeline(transaction=False) as pipe:
            for fields in batch:
                pipe.xadd(self.stream, fields, maxlen=_STREAM_MAXLEN, approximate=True)
            answers: list[Any] = await pipe.execute(raise_on_error=False)
        return answers


@dataclass(slots=True)
class _Call:
    op: str
    fields: dict[FieldT, EncodableT]
    reply: asyncio.Future[dict[str, Any]]
    accepted: asyncio.Future[None] = field(default_factory=lambda: asyncio.get_running_loop().create_future())
    # set when Redis lost its data (a flush, a restart without persistence) after the call was accepted: its
    # reply may have been lost with the reply list
    gone: asyncio.Future[None] = field(default_factory=lambda: asyncio.get_running_loop().create_future())


class RedisStepClient:
    """A :class:`~foldline.ports.step_dispatch.StepDispatcher` served by ``foldline dispatcher`` processes.

    ``prepare_timeout_s`` bounds the wait for a prepared step (it includes the dispatcher's wait for the
    fold); ``ack_timeout_s`` how long a ``send`` waits to be taken by a dispatcher before it is re-sent;
    ``answer_timeout_s`` how long a taken ``send`` waits for the provider's answer; ``outage_s`` how long a
    Redis that does not answer is retried.
    """

    def __init__(
        self,
        redis: RedisConnection,
        *,
        stream: str,
        group: str,
        prepare_timeout_s: float = 120.0,
        ack_timeout_s: float = 10.0,
        answer_timeout_s: float = 600.0,
        outage_s: float = 60.0,
    ) -> None:
        self.redis = redis
        self.stream = stream
        self.group = group
        self.prepare_timeout_s = prepare_timeout_s
        self.ack_timeout_s = ack_timeout_s
        self.answer_timeout_s = answer_timeout_s
        self.outage_s = outage_s
        self.reply_key = f"{stream}:replies:{uuid.uuid4().hex}"
        self.alive_key = f"{self.reply_key}:alive"  # gone from Redis: Redis lost its data, replies with it
        # call ids: this client's random prefix and a counter — unique like a uuid4 per call, without the
        # system's random source on every call
        self._call_prefix = f"{uuid.uuid4().hex}-"
        self._call_numbers = itertools.count()
        self._redis: aioredis.Redis | None = None
        self._calls: dict[str, _Call] = {}
        self._reader: asyncio.Task[None] | None = None
        self._alive = False  # the alive key was set (and is renewed) by the reply reader
        self._handovers = _Handovers(self._client, stream=stream, outage_s=outage_s)
        self._relay = _PiecesRelay(self._client)

    # -- the port

    async def prepare(self, handoff: StepHandoff) -> PreparedStep:
        reply = await self._call("prepare", handoff, None, self.prepare_timeout_s)
        return PreparedStep.from_json(reply)

    async def send(
        self, handoff: StepHandoff, prepared: PreparedStep, *, on_delta: Callable[[AnswerDelta], None] | None = None
    ) -> StepAnswer:
        reply = await self._call("send", handoff, prepared, self.answer_timeout_s, on_delta)
        return StepAnswer.from_json(reply)

    async def aclose(self) -> None:
        await self._relay.aclose()
        await self._handovers.cancel()
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader
            self._reader = None
        if self._redis is not None:
            await self._redis.aclose()
            self._redis = None

    # -- internals

    def _client(self) -> aioredis.Redis:
        if self._redis is None:
            self._redis = _connect(self.redis, blocking_s=1.0)
        if self._reader is None or self._reader.done():
            self._reader = asyncio.create_task(self._read_replies(), name=f"foldline-replies-{self.reply_key}")
        return self._redis

    async def _call(
        self,
        op: str,
        h: StepHandoff,
        prepared: PreparedStep | None,
        timeout_s: float,
        on_delta: Callable[[AnswerDelta], None] | None = None,
    ) -> Any:
        call_id = f"{self._call_prefix}{next(self._call_numbers)}"
        fields: dict[FieldT, EncodableT] = {
            "op": op,
            "id": call_id,
            "reply": self.reply_key,
            "handoff": codec.canonical_json(h.to_json()),
        }
        if prepared is not None:
            fields["prepared"] = codec.canonical_json(prepared.to_json())
        relayed: _Relayed | None = None
        if on_delta is not None:
            channel = f"{self.stream}:deltas:{call_id}"
            relayed = await self._relay.open(channel, on_delta)
            if relayed is not None:  # subscribed: the dispatcher publishes the pieces there
                fields["deltas"] = channel
        try:
            return await self._handed_over(op, h, call_id, fields, timeout_s)
        finally:
            if relayed is not None:
                await self._relay.close(relayed)

    async def _handed_over(
        self, op: str, h: StepHandoff, call_id: str, fields: dict[FieldT, EncodableT], timeout_s: float
    ) -> Any:
        call = _Call(op, fields, asyncio.get_running_loop().create_future())
        self._calls[call_id] = call
        try:
            deadline = time.monotonic() + timeout_s
            while True:
                await self._handovers.add(fields)
                # a call must be taken by a dispatcher within ack_timeout_s, or it reached none: hand it over again
                first = call.accepted if not call.accepted.done() else call.reply
                wait = self.ack_timeout_s if first is call.accepted else deadline - time.monotonic()
                # a reply answers at once: a quick prepare is answered without an `accepted` first
                await asyncio.wait({first, call.reply}, timeout=max(0.0, wait), return_when=asyncio.FIRST_COMPLETED)
                if call.reply.done():
                    return self._result(h, call.reply.result())
                if call.accepted.done():
                    left = deadline - time.monotonic()
                    either: set[asyncio.Future[Any]] = {call.reply, call.gone}
                    await asyncio.wait(either, timeout=max(0.0, left), return_when=asyncio.FIRST_COMPLETED)
                    if call.reply.done():
                        return self._result(h, call.reply.result())
                    if call.gone.done():
                        if op == "send":  # the answer may be lost with Redis's data: a logged retry resends it
                            raise DispatchLost(h.session_id, h.boundary, "DispatchLost", _GONE)
                        _LOG.info(
                            "Redis lost its data while the prepare of %s seq %d was served; handing it over again",
                            h.session_id,
                            h.boundary,
                        )
                        call.accepted = asyncio.get_running_loop().create_future()
                        call.gone = asyncio.get_running_loop().create_future()
                        continue
                    if op == "send":  # taken, then no answer: it may have been sent — a logged retry resends it
                        raise DispatchLost(h.session_id, h.boundary, "DispatchLost", _UNANSWERED.format(timeout_s))
                    raise await self._timeout(h, op, timeout_s, taken=True)
                if op == "send":
                    # No acceptance in time: no dispatcher took it, or one did and Redis lost the acceptance
                    # (a flush, a restart without data) while it sends. Handing the same call over again could
                    # then send it twice unseen; a new attempt, logged as an llm/retry first, never can.
                    raise DispatchLost(h.session_id, h.boundary, "DispatchLost", _UNACCEPTED.format(self.ack_timeout_s))
                if time.monotonic() >= deadline:
                    raise await self._timeout(h, op, timeout_s, taken=False)
                _LOG.info(
                    "no dispatcher took the %s of %s seq %d in time; handing it over again",
                    op,
                    h.session_id,
                    h.boundary,
                )
        finally:
            self._calls.pop(call_id, None)

    def _result(self, h: StepHandoff, reply: dict[str, Any]) -> Any:
        kind = reply.get("kind")
        if kind == "ok":
            return reply.get("result")
        if kind == "lost":
            raise DispatchLost(h.session_id, h.boundary, "DispatchLost", str(reply.get("message", "")))
        raise error_from_json(reply.get("error") or {}, h.session_id, h.boundary)

    async def _timeout(self, h: StepHandoff, op: str, timeout_s: float, *, taken: bool) -> DispatchTimeout:
        """The timeout, naming what the group shows: no dispatcher, dispatchers behind, or one that took it."""
        try:
            groups = await self._client().xinfo_groups(self.stream)
            group = next((g for g in groups if _text(g.get("name")) == self.group), None)
        except (RedisError, OSError):
            group = None
        if taken:
            cause = f"a dispatcher took the {op} but answered nothing within {timeout_s:g}s"
        elif group is None or not int(group.get("consumers", 0)):
            cause = (
                f"no dispatcher is reading stream {self.stream!r} (group {self.group!r} has no consumers): "
                "start `foldline dispatcher`"
            )
        else:
            cause = (
                f"{group.get('consumers')} dispatcher(s) read {self.stream!r} but none answered within {timeout_s:g}s "
                f"({group.get('pending')} hand-over(s) pending): they are overloaded or stuck"
            )
        return DispatchTimeout(h.session_id, h.boundary, "DispatchTimeout", cause)

    async def _check_alive(self) -> None:
        """Renew this client's alive key; when it is gone, Redis lost its data since the last check (a flush,
        a restart without persistence), and with it, perhaps, replies to accepted calls: those calls are told
        (:attr:`_Call.gone`) and the key is set again."""
        assert self._redis is not None
        if self._alive and await self._redis.set(self.alive_key, b"1", ex=_REPLY_TTL_S, xx=True):
            return
        if self._alive:
            waiting = [c for c in self._calls.values() if c.accepted.done() and not c.reply.done()]
            _LOG.warning(
                "Redis lost its data (this client's key %s is gone); %d accepted call(s) may have lost their reply",
                self.alive_key,
                len(waiting),
            )
            for call in waiting:
                if not call.gone.done():
                    call.gone.set_result(None)
        await self._redis.set(self.alive_key, b"1", ex=_REPLY_TTL_S)
        self._alive = True

    async def _read_replies(self) -> None:
        """Resolve pending calls from the reply list, in batches, until closed (reconnecting through outages);
        about every second, check that Redis kept its data (:meth:`_check_alive`)."""
        pauses = OUTAGE.pauses()
        check_at = 0.0
        while True:
            try:
                assert self._redis is not None
                if time.monotonic() >= check_at:
                    await self._check_alive()
                    check_at = time.monotonic() + _ALIVE_EVERY_S
                got: Any = await self._redis.blmpop(1, 1, self.reply_key, direction="LEFT", count=_REPLY_BATCH)
                pauses.reset()
            except asyncio.CancelledError:
                raise
            except (RedisError, OSError) as exc:
                _LOG.warning("reading dispatcher replies failed (%s); retrying", exc)
                await asyncio.sleep(pauses.next())
                continue
            if not got:
                continue
            for raw in got[1]:
                try:
                    value: Any = codec.loads(raw)
                    call = self._calls.get(str(value["id"]))
                except (ValueError, KeyError, TypeError):
                    _LOG.error("a malformed dispatcher reply was dropped: %r", raw[:200])
                    continue
                if call is None:
                    continue  # a call that was answered already (a repeated hand-over) or given up
                if value.get("kind") == "accepted":
                    if not call.accepted.done():
                        call.accepted.set_result(None)
                elif not call.reply.done():
                    call.reply.set_result(value)


@dataclass(slots=True)
class _Relayed:
    """One send's pieces channel on the client: where its pieces go, and whether the end mark came."""

    channel: bytes
    sink: Callable[[AnswerDelta], None]
    received: int = 0
    ended: asyncio.Event = field(default_factory=asyncio.Event)


class _PiecesRelay:
    """The client's one Pub/Sub connection: a channel per streamed send, read by one task, each message handed to
    its send's sink. Best effort throughout: a Redis error loses pieces (logged), never fails a send."""

    def __init__(self, client: Callable[[], aioredis.Redis]) -> None:
        self._client = client
        self._pubsub: Any = None
        self._channels: dict[bytes, _Relayed] = {}
        self._reader: asyncio.Task[None] | None = None

    async def open(self, channel: str, sink: Callable[[AnswerDelta], None]) -> _Relayed | None:
        """Subscribe to ``channel`` (None when Redis would not: the send goes on without pieces)."""
        relayed = _Relayed(channel.encode(), sink)
        self._channels[relayed.channel] = relayed
        try:
            if self._pubsub is None:
                self._pubsub = self._client().pubsub()
            await self._pubsub.subscribe(channel)
        except (RedisError, OSError) as exc:
            _LOG.warning(
                "could not subscribe to the pieces of a streamed answer (%s); it is answered without them", exc
            )
            self._channels.pop(relayed.channel, None)
            return None
        if self._reader is None or self._reader.done():
            self._reader = asyncio.create_task(self._read(), name="foldline-pieces-relay")
        return relayed

    async def close(self, relayed: _Relayed) -> None:
        """The send has its reply: wait briefly for pieces the reply overtook (only when pieces came at all), then
        unsubscribe."""
        if relayed.received and not relayed.ended.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(relayed.ended.wait(), _RELAY_GRACE_S)
        self._channels.pop(relayed.channel, None)
        try:
            await self._pubsub.unsubscribe(relayed.channel)
        except (RedisError, OSError) as exc:
            _LOG.debug("unsubscribing from a pieces channel: %s", exc)

    async def _read(self) -> None:
        pauses = OUTAGE.pauses()
        while True:
            try:
                message = await self._pubsub.get_message(ignore_subscribe_messages=True, timeout=1.0)
                pauses.reset()
            except asyncio.CancelledError:
                raise
            except (RedisError, OSError) as exc:
                _LOG.warning("reading relayed pieces failed (%s); pieces in flight are lost", exc)
                await asyncio.sleep(pauses.next())
                continue
            if not message or message.get("type") != "message":
                continue
            relayed = self._channels.get(message["channel"])
            if relayed is None:
                continue
            data = message["data"]
            if data == _RELAY_END:
                relayed.ended.set()
                continue
            try:
                pieces = pieces_from_json(codec.loads(data))
            except ValueError:
                continue
            relayed.received += len(pieces)
            for piece in pieces:
                relayed.sink(piece)

    async def aclose(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader
            self._reader = None
        if self._pubsub is not None:
            with contextlib.suppress(RedisError, OSError):
                await self._pubsub.aclose()
            self._pubsub = None


class _Publisher:
    """A dispatcher's side of one send's pieces: :meth:`push` never waits (it runs inside the provider's read);
    one ``PUBLISH`` is in flight at a time and the pieces that arrive meanwhile go in the next."""

    def __init__(self, r: aioredis.Redis, channel: str) -> None:
        self.r = r
        self.channel = channel
        self._pending: list[AnswerDelta] = []
        self._flushing: asyncio.Task[None] | None = None
        self._broken = False

    def push(self, piece: AnswerDelta) -> None:
        if self._broken:
            return
        self._pending.append(piece)
        if self._flushing is None or self._flushing.done():
            self._flushing = asyncio.get_running_loop().create_task(self._flush())

    async def _flush(self) -> None:
        while self._pending and not self._broken:
            batch, self._pending = self._pending, []
            try:
                await self.r.publish(self.channel, codec.canonical_json(pieces_to_json(batch)))
            except (RedisError, OSError) as exc:  # the relay is lost: pieces only, the answer is the reply
                _LOG.warning("relaying the pieces of a streamed answer failed (%s); the rest are not relayed", exc)
                self._broken = True

    async def close(self) -> None:
        """Publish what is left, then the end mark (bounded: a Redis that does not answer costs pieces only)."""
        try:
            await asyncio.wait_for(self._finish(), _RELAY_GRACE_S)
        except (TimeoutError, RedisError, OSError) as exc:
            _LOG.debug("ending a pieces relay: %s", exc)

    async def _finish(self) -> None:
        if self._flushing is not None:
            await self._flushing
        await self._flush()
        if not self._broken:
            await self.r.publish(self.channel, _RELAY_END)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


# ---------------------------------------------------------------------------- the dispatchers' end


class _Server:
    def __init__(
        self,
        dispatcher: StepDispatcher,
        redis: RedisConnection,
        *,
        stream: str,
        group: str,
        consumer: str,
        max_in_flight: int,
        block_ms: int,
        claim_idle_s: float,
        outage_s: float,
    ) -> None:
        self.dispatcher = dispatcher
        self.stream = stream
        self.group = group
        self.consumer = consumer
        self.max_in_flight = max_in_flight
        self.block_ms = block_ms
        self.claim_idle_s = claim_idle_s
        self.outage_s = outage_s
        self.r = _connect(redis, blocking_s=block_ms / 1000)
        self.writes = _Writes(self.r, stream=stream, group=group, consumer=consumer, outage_s=outage_s)
        self.in_flight: dict[str, asyncio.Task[None]] = {}  # entry id -> its task
        self.answered = 0

    async def ensure_group(self) -> None:
        try:
            await self.r.xgroup_create(self.stream, self.group, id="0", mkstream=True)
        except ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise

    async def serve(self, stop: asyncio.Event) -> int:
        pauses = OUTAGE.pauses()
        next_claim = time.monotonic() + self.claim_idle_s / 3
        group_ready = False
        while not stop.is_set():
            try:
                if not group_ready:
                    await self.ensure_group()
                    group_ready = True
                if time.monotonic() >= next_claim:
                    await self.heartbeat_and_reclaim()
                    next_claim = time.monotonic() + self.claim_idle_s / 3
                free = self.max_in_flight - len(self.in_flight)
                if free <= 0:
                    await asyncio.wait(set(self.in_flight.values()), timeout=0.2, return_when=asyncio.FIRST_COMPLETED)
                    continue
                got: Any = await self.r.xreadgroup(
                    self.group, self.consumer, {self.stream: ">"}, count=free, block=self.block_ms
                )
                pauses.reset()
            except ResponseError as exc:
                # Redis was flushed or restarted without data (NOGROUP), or the stream was deleted while this
                # read blocked on it (UNBLOCKED): make the group again
                if "NOGROUP" in str(exc) or "UNBLOCKED" in str(exc):
                    _LOG.warning("the dispatch group %r is gone (%s); creating it again", self.group, exc)
                    group_ready = False
                    continue
                raise StoreUnavailable(f"Redis refused the dispatcher's read of {self.stream!r}: {exc}") from exc
            except (RedisError, OSError) as exc:
                pause = pauses.next()
                _LOG.warning("the dispatcher lost Redis (%s: %s); retrying in %.2fs", type(exc).__name__, exc, pause)
                group_ready = False
                await asyncio.sleep(pause)
                continue
            for _name, batch in got or []:
                for entry_id, fields in batch:
                    self.start(_text(entry_id), fields, claimed=False)
        if self.in_flight:
            await asyncio.gather(*self.in_flight.values(), return_exceptions=True)
        await self.writes.drain()
        return self.answered

    def start(self, entry_id: str, fields: dict[bytes, bytes], *, claimed: bool) -> None:
        if entry_id in self.in_flight:
            return
        task = asyncio.create_task(self.handle(entry_id, fields, claimed=claimed))
        self.in_flight[entry_id] = task
        task.add_done_callback(functools.partial(self.finished, entry_id))

    def finished(self, entry_id: str, task: asyncio.Task[None]) -> None:
        self.in_flight.pop(entry_id, None)
        if not task.cancelled() and task.exception() is not None:
            _LOG.error("serving hand-over %s failed: %r", entry_id, task.exception())

    async def heartbeat_and_reclaim(self) -> None:
        """Re-claim the entries this process works on (their idle time restarts) and take over entries other
        dispatchers left idle for ``claim_idle_s`` (they died)."""
        mine: list[int | bytes | str | memoryview[int]] = list(self.in_flight)
        if mine:
            await self.r.xclaim(self.stream, self.group, self.consumer, 0, mine, justid=True)
        start = "0-0"
        while True:
            reply: Any = await self.r.xautoclaim(
                self.stream, self.group, self.consumer, int(self.claim_idle_s * 1000), start_id=start, count=100
            )
            start, claimed = _text(reply[0]), reply[1]
            for entry_id, fields in claimed:
                if fields:
                    _LOG.warning("taking over hand-over %s from a dispatcher that stopped", _text(entry_id))
                    self.start(_text(entry_id), fields, claimed=True)
            if start == "0-0" or not claimed:
                return

    async def handle(self, entry_id: str, fields: dict[bytes, bytes], *, claimed: bool) -> None:
        reply_key = fields.get(b"reply", b"").decode()
        call_id = fields.get(b"id", b"").decode()
        op = fields.get(b"op", b"").decode()
        payload = await self.serve_one(op, call_id, reply_key, fields, claimed=claimed)
        # the reply and the acknowledgement go out in the same batch, the reply first
        # (a reply Redis would not take is logged by reply(); the acknowledgement, queued after it, settles last)
        if payload is not None:
            self.reply(reply_key, payload)
        try:
            await self.writes.ack(entry_id)
        except ResponseError as exc:  # the group is gone (Redis lost its data): the reply was pushed all the same
            _LOG.warning("acknowledging hand-over %s: %s", entry_id, exc)
        except StoreUnavailable as exc:  # the loop hands it over again after its own timeout
            _LOG.error("could not acknowledge hand-over %s: %s", entry_id, exc)
        self.answered += 1

    async def serve_one(
        self, op: str, call_id: str, reply_key: str, fields: dict[bytes, bytes], *, claimed: bool
    ) -> dict[str, Any] | None:
        """The reply to one hand-over (errors included: a loop always hears back), or None for a repeated
        hand-over of a send that another dispatcher took (that one answers it)."""
        try:
            handoff = StepHandoff.from_json(codec.loads(fields[b"handoff"]))
            if op == "prepare":  # safe to repeat: served again whenever handed over again or re-claimed
                # a prepare answered within _ACCEPT_AFTER_S needs no `accepted` first (its reply says it all);
                # a longer one (a fold wait) tells the loop it was taken well inside its ack timeout — queued,
                # not awaited: it goes out while the fold is waited for, ahead of the result
                preparing = asyncio.ensure_future(self.dispatcher.prepare(handoff))
                done, _ = await asyncio.wait({preparing}, timeout=_ACCEPT_AFTER_S)
                if not done:
                    self.reply(reply_key, {"id": call_id, "kind": "accepted"})
                return {"id": call_id, "kind": "ok", "result": (await preparing).to_json()}
            if op != "send":
                raise FormatError("step-handoff", f"unknown hand-over operation {op!r}")
            prepared = PreparedStep.from_json(codec.loads(fields[b"prepared"]))
            if not await self.writes.take(call_id, reply_key, _json({"id": call_id, "kind": "accepted"})):
                if claimed:  # the dispatcher that took it died: it may or may not have sent it
                    return {"id": call_id, "kind": "lost", "message": _LOST}
                return None  # a repeated hand-over of a send another dispatcher took: that one answers
            channel = fields.get(b"deltas")
            if channel is None:
                answer = await self.dispatcher.send(handoff, prepared)
            else:  # a caller reads the pieces: publish them as they arrive, all of them before the reply
                publisher = _Publisher(self.r, channel.decode())
                try:
                    answer = await self.dispatcher.send(handoff, prepared, on_delta=publisher.push)
                finally:
                    await publisher.close()
            return {"id": call_id, "kind": "ok", "result": answer.to_json()}
        except (KeyError, ValueError) as exc:
            error: dict[str, Any] = {"kind": "FormatError", "message": f"bad hand-over: {exc}"}
        except FoldlineError as exc:
            error = error_to_json(exc)
        except Exception as exc:  # an unexpected bug: answer the loop, keep serving, log the trace
            _LOG.exception("serving a %s of %r failed unexpectedly", op, fields.get(b"handoff", b"")[:200])
            error = {"kind": type(exc).__name__, "message": "unexpected dispatcher failure"}
        return {"id": call_id, "kind": "error", "error": error}

    def reply(self, reply_key: str, payload: dict[str, Any]) -> asyncio.Future[bool] | None:
        """Queue a reply; the future settles once it is in Redis. A reply Redis would not take is logged (the
        loop hands the call over again after its own timeout), never raised."""
        if not reply_key:
            return None
        future = self.writes.push(reply_key, _json(payload))
        future.add_done_callback(_log_unanswered)
        return future


def _log_unanswered(future: asyncio.Future[bool]) -> None:
    if not future.cancelled() and (exc := future.exception()) is not None:
        _LOG.error("could not answer a hand-over: %s", exc)


@dataclass(slots=True)
class _Write:
    op: str  # "push" (a reply), "take" (a send's taken mark and its accepted reply) or "ack"
    key: str  # the reply list (push, take) or the entry id (ack)
    value: bytes = b""  # the reply (push, take)
    call_id: str = ""  # the call a take marks
    token: str = ""  # a take's mark: this consumer and a number of its own, the same when its batch is retried


class _Writes(_Batches[_Write]):
    """A dispatcher's writes — replies, taking sends, acknowledging entries — batched, each batch one
    ``MULTI``/``EXEC``: the ``SET NX`` of each take, a reply list's replies in one ``RPUSH`` and one
    ``EXPIRE``, every acknowledgement in one ``XACK`` and one ``XDEL``. A thousand calls in flight then cost a
    few round trips per event-loop turn, not three transactions each. A call's replies reach its list in the
    order queued, and its entry is acknowledged in the batch of its last reply or a later one."""

    what = "answering hand-overs"

    def __init__(self, r: aioredis.Redis, *, stream: str, group: str, consumer: str, outage_s: float) -> None:
        super().__init__(outage_s)
        self.r = r
        self.stream = stream
        self.group = group
        self.consumer = consumer
        self._takes = itertools.count()

    def push(self, reply_key: str, reply: bytes) -> asyncio.Future[bool]:
        return self._queued(_Write("push", reply_key, reply))

    def take(self, call_id: str, reply_key: str, accepted: bytes) -> asyncio.Future[bool]:
        """Mark the send taken (``SET NX``) and push its ``accepted`` reply in one transaction; the future is
        whether this take set the mark — the one that may send it.

        The mark is a token of this take alone, and the ``SET`` answers the mark it found: a batch retried
        because the answer to its ``EXEC`` was lost (Redis applied it) finds its own token and knows it took
        the send. Any other take of the call — another dispatcher's, or this one's of a re-claimed entry —
        finds a token not its own."""
        return self._queued(_Write("take", reply_key, accepted, call_id, f"{self.consumer} {next(self._takes)}"))

    def ack(self, entry_id: str) -> asyncio.Future[bool]:
        return self._queued(_Write("ack", entry_id))

    async def _send(self, batch: list[_Write]) -> list[bool | BaseException]:
        """One transaction for the batch; each write's outcome (its command's error, if Redis refused it)."""
        pushes: dict[str, list[bytes]] = {}
        marks: list[_Write] = []
        acks: list[str] = []
        for w in batch:
            if w.op == "ack":
                acks.append(w.key)
            else:
                pushes.setdefault(w.key, []).append(w.value)
                if w.op == "take":
                    marks.append(w)
        async with self.r.pipeline(transaction=True) as pipe:
            for w in marks:
                # SET NX GET (Redis 7, as BLMPOP): nothing when it set the mark, else the mark that was there
                pipe.set(f"{self.stream}:taken:{w.call_id}", w.token, nx=True, get=True, ex=_TAKEN_TTL_S)
            for key, values in pushes.items():
                pipe.rpush(key, *values)
                pipe.expire(key, _REPLY_TTL_S)
            if acks:
                pipe.xack(self.stream, self.group, *acks)
                pipe.xdel(self.stream, *acks)
            answers: list[Any] = await pipe.execute(raise_on_error=False)
        # a take holds the mark when it set it now, or when the mark there is its own token (set by this
        # batch's first EXEC, whose answer was lost)
        marked: dict[int, Any] = {}
        for w, was in zip(marks, answers, strict=False):
            marked[id(w)] = was if isinstance(was, Exception) else was is None or was in (w.token, w.token.encode())
        pushed: dict[str, Any] = {}
        at = len(marks)
        for key in pushes:
            pushed[key] = next((a for a in answers[at : at + 2] if isinstance(a, Exception)), True)
            at += 2
        acked: Any = next((a for a in answers[at:] if isinstance(a, Exception)), True)
        out: list[bool | BaseException] = []
        for w in batch:
            if w.op == "ack":
                out.append(acked)
            elif isinstance(pushed[w.key], Exception):
                out.append(pushed[w.key])
            elif w.op == "take":
                took = marked[id(w)]
                out.append(took if isinstance(took, Exception) else bool(took))
            else:
                out.append(True)
        return out


_LOST = "the dispatcher that took this send stopped before answering; it may or may not have reached the provider"
_UNACCEPTED = (
    "no dispatcher accepted this send within {:g}s (none is running, or Redis lost the acceptance); "
    "it may or may not have reached the provider"
)
_GONE = (
    "Redis lost its data (flushed, or restarted without persistence) while a dispatcher held this send; "
    "its answer may be lost with it, and the send may or may not have reached the provider"
)
_UNANSWERED = (
    "the dispatcher that took this send answered nothing within {:g}s; it may or may not have reached the provider"
)


async def serve_steps(
    dispatcher: StepDispatcher,
    redis: RedisConnection,
    *,
    stream: str,
    group: str,
    consumer: str | None = None,
    stop: asyncio.Event | None = None,
    max_in_flight: int = 1024,
    block_ms: int = 200,
    claim_idle_s: float = 15.0,
    outage_s: float = 60.0,
) -> int:
    """Serve hand-overs from ``stream`` with ``dispatcher`` (each call is one of its ``prepare`` or ``send``)
    until ``stop`` is set; returns how many were answered.

    Never exits for a Redis outage: it reconnects and recreates its group. On stop, calls in flight finish
    and are answered first."""
    server = _Server(
        dispatcher,
        redis,
        stream=stream,
        group=group,
        consumer=consumer or f"{socket.gethostname()}-{os.getpid()}",
        max_in_flight=max_in_flight,
        block_ms=block_ms,
        claim_idle_s=claim_idle_s,
        outage_s=outage_s,
    )
    # A dispatcher's heap is mostly what lives as long as it serves (each session's view, the decoded
    # messages); a young collection every 700 allocations promotes, and a full one walks, all of it many
    # times a second. What the calls allocate is freed by reference counting; cycles are collected per
    # 50,000 allocations instead.
    thresholds = gc.get_threshold()
    gc.set_threshold(50_000, 50, 100)
    try:
        return await server.serve(stop or asyncio.Event())
    finally:
        gc.set_threshold(*thresholds)
        await server.writes.cancel()
        await server.r.aclose()
