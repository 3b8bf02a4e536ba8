"""Handing steps to ``foldline dispatcher`` processes over a Redis stream.

A loop process uses :class:`RedisStepClient` as its ``AgentOptions.dispatcher``: each handoff is one
``XADD`` to the steps stream (fields ``handoff`` — the :class:`StepHandoff` as JSON — and ``reply``, a
key unique to this handoff), then a bounded ``BLPOP`` on the reply key. Dispatcher processes read the
stream in one consumer group (:func:`serve_steps`): every handoff goes to exactly one of them, which
dispatches it and pushes ``{"ok": true, "outcome": ...}`` or ``{"ok": false, "kind", "message"}`` to the
reply key (expiring), then acknowledges and deletes the stream entry.

The stream and the reply are transport, not state: the session log is the record of what was sent and
answered. A lost handoff or reply (Redis flushed or restarted) surfaces at the loop as a typed
:class:`~foldline.errors.DispatchTimeout`; the loop ends the turn with reason ``error`` and the log stays
valid — at worst it holds a ``request/dispatch`` whose answer never arrived, which ``foldline verify``
still proves against its digest. A handoff is never redelivered to a second dispatcher: the dispatcher
appends ``request/dispatch`` at the boundary seq, so a retried or duplicated handoff of the same step
fails with :class:`~foldline.errors.ConflictError` before anything is sent.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import uuid
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import RedisError, ResponseError
from redis.typing import EncodableT, FieldT

from ..config import RedisConfig
from ..core import codec
from ..errors import ConfigError, DispatchFailed, DispatchTimeout, FoldlineError, FormatError, StoreUnavailable
from ..ports.step_dispatch import DispatchOutcome, StepHandoff
from .dispatcher import Dispatcher

__all__ = ["RedisStepClient", "serve_steps"]

_LOG = logging.getLogger("foldline.dispatcher")
_REPLY_TTL_S = 300
_STREAM_MAXLEN = 100_000


def _reply_json(value: dict[str, Any]) -> bytes:
    return codec.canonical_json(value)


class RedisStepClient:
    """A :class:`~foldline.ports.step_dispatch.StepDispatcher` served by ``foldline dispatcher`` processes.

    ``timeout_s`` is how long a handoff waits for its answer (the configuration's
    ``dispatch.handover_timeout_s``). The reply wait is one blocking ``BLPOP``, so this client's socket
    timeout is that wait plus ``redis.socket_timeout_s``: the connection never times out under a wait it
    asked for.
    """

    def __init__(self, redis: RedisConfig, *, stream: str, timeout_s: float) -> None:
        self.redis = redis
        self.stream = stream
        self.timeout_s = timeout_s
        self._redis: aioredis.Redis | None = None

    def _client(self) -> aioredis.Redis:
        if self._redis is None:
            self._redis = _connect(self.redis, blocking_s=self.timeout_s)
        return self._redis

    async def dispatch(self, handoff: StepHandoff) -> DispatchOutcome:
        reply_key = f"{self.stream}:reply:{uuid.uuid4().hex}"
        r = self._client()
        fields: dict[FieldT, EncodableT] = {
            "handoff": codec.canonical_json(handoff.to_json()),
            "reply": reply_key,
        }
        try:
            await r.xadd(self.stream, fields, maxlen=_STREAM_MAXLEN, approximate=True)
            got = await r.blpop([reply_key], timeout=self.timeout_s)
        except RedisError as exc:
            raise StoreUnavailable(
                f"cannot hand the step at seq {handoff.boundary} of session {handoff.session_id!r} to a dispatcher "
                f"through Redis ({type(exc).__name__}); check FOLDLINE_REDIS_URL and that Redis is up"
            ) from exc
        if got is None:
            raise DispatchTimeout(
                handoff.session_id,
                handoff.boundary,
                "DispatchTimeout",
                f"no dispatcher answered within {self.timeout_s:.0f}s; check that `foldline dispatcher` "
                f"processes are running on stream {self.stream!r}",
            )
        try:
            value: Any = codec.loads(got[1])
            if value["ok"]:
                return DispatchOutcome.from_json(value["outcome"])
            kind, message = str(value["kind"]), str(value["message"])
        except (ValueError, KeyError, TypeError) as exc:
            raise FormatError("dispatch-reply", f"malformed dispatcher reply {got[1][:120]!r}: {exc}") from exc
        raise DispatchFailed(handoff.session_id, handoff.boundary, kind, message)

    async def aclose(self) -> None:
        if self._redis is not None:
            await self._redis.aclose()
            self._redis = None


def _connect(redis: RedisConfig, *, blocking_s: float) -> aioredis.Redis:
    """An asyncio client whose socket timeout outlasts its longest blocking command by ``socket_timeout_s``."""
    try:
        return aioredis.Redis.from_url(
            redis.url,
            socket_timeout=blocking_s + redis.socket_timeout_s,
            socket_connect_timeout=redis.connect_timeout_s,
            max_connections=redis.max_connections,
        )
    except ValueError as exc:
        raise ConfigError(f"bad Redis URL (FOLDLINE_REDIS_URL): {exc}") from exc


async def serve_steps(
    dispatcher: Dispatcher,
    redis: RedisConfig,
    *,
    stream: str,
    group: str,
    max_in_flight: int,
    consumer: str | None = None,
    stop: asyncio.Event | None = None,
    block_ms: int = 200,
) -> int:
    """Serve handoffs from ``stream`` until ``stop`` is set; returns how many steps were answered.

    Steps of different sessions run concurrently (at most ``max_in_flight``); the dispatcher keeps the
    steps of one session in handoff order. On stop, steps in flight finish and are answered first.
    """
    stop = stop or asyncio.Event()
    consumer = consumer or f"{socket.gethostname()}-{os.getpid()}"
    r = _connect(redis, blocking_s=block_ms / 1000)
    in_flight: set[asyncio.Task[None]] = set()
    answered = 0

    async def handle(entry_id: bytes, fields: dict[bytes, bytes]) -> None:
        nonlocal answered
        reply_key = fields.get(b"reply", b"").decode()
        try:
            handoff = StepHandoff.from_json(codec.loads(fields[b"handoff"]))
        except (KeyError, ValueError) as exc:
            payload: dict[str, Any] = {"ok": False, "kind": "FormatError", "message": f"bad handoff: {exc}"}
        else:
            try:
                outcome = await dispatcher.dispatch(handoff)
                payload = {"ok": True, "outcome": DispatchOutcome.to_json(outcome)}
            except FoldlineError as exc:
                payload = {"ok": False, "kind": type(exc).__name__, "message": str(exc)}
            except Exception as exc:  # an unexpected bug: answer the loop, keep serving, log the trace
                _LOG.exception("dispatching %s failed unexpectedly", handoff)
                payload = {"ok": False, "kind": type(exc).__name__, "message": "unexpected dispatcher failure"}
        async with r.pipeline(transaction=True) as pipe:
            if reply_key:
                pipe.rpush(reply_key, _reply_json(payload))
                pipe.expire(reply_key, _REPLY_TTL_S)
            pipe.xack(stream, group, entry_id)
            pipe.xdel(stream, entry_id)
            await pipe.execute()
        answered += 1

    def finished(task: asyncio.Task[None]) -> None:
        in_flight.discard(task)
        if not task.cancelled() and task.exception() is not None:
            # the step ran but its reply could not be written (Redis lost): the loop gets DispatchTimeout
            _LOG.error("could not answer a handed-off step: %r", task.exception())

    try:
        try:
            await r.xgroup_create(stream, group, id="0", mkstream=True)
        except ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise
        while not stop.is_set():
            free = max_in_flight - len(in_flight)
            if free <= 0:
                await asyncio.wait(in_flight, return_when=asyncio.FIRST_COMPLETED)
                continue
            got: Any = await r.xreadgroup(group, consumer, {stream: ">"}, count=free, block=block_ms)
            for _name, batch in got or []:
                for entry_id, fields in batch:
                    task = asyncio.create_task(handle(entry_id, fields))
                    in_flight.add(task)
                    task.add_done_callback(finished)
        if in_flight:
            await asyncio.gather(*in_flight)
    except RedisError as exc:
        raise StoreUnavailable(
            f"the dispatcher lost Redis at {stream!r} ({type(exc).__name__}); check FOLDLINE_REDIS_URL"
        ) from exc
    finally:
        await r.aclose()
    return answered
