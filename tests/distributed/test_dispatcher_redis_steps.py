"""Steps handed to dispatchers over a Redis stream (the real local Redis), answered through the reply list.

What every StepDispatcher must do, the transport does in the contract suite (``test_step_dispatch_contract.py``);
here is what is its own: timeouts that name their cause, a group that vanished, dead dispatchers' hand-overs,
batching, Redis losing its data.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

import pytest
import redis
from redis.typing import EncodableT, FieldT

from foldline.adapters.memory_folds import MemoryFoldStore
from foldline.config import DispatchConfig, RedisConfig
from foldline.core import codec
from foldline.core.events import RequestDispatch, TurnEnd
from foldline.dispatcher import Dispatcher, PreparedStep, RedisStepClient, StepHandoff, serve_steps
from foldline.errors import DispatchLost, DispatchTimeout, FoldTimeout
from foldline.loop import Agent, AgentOptions
from foldline.providers.emulated import emulated_provider
from foldline.providers.emulator import Emulator, FaultPlan, ToolLoopScript
from foldline.replay.verify import verify_events
from tests.contracts.step_dispatch import CONFIG, SYSTEM, ProjectingLog

pytestmark = pytest.mark.redis


def redis_url() -> str:
    url = os.environ.get("FOLDLINE_REDIS_URL")
    if not url:
        pytest.fail("FOLDLINE_REDIS_URL is unset: run `bash deploy/local/up.sh redis` and `source .local/env.sh`")
    return url


@dataclass
class Rig:
    log: ProjectingLog
    client: RedisStepClient
    emulator: Emulator
    dispatcher: Dispatcher
    stream: str
    group: str

    def agent(self, sid: str, **options: Any) -> Agent:
        provider = emulated_provider(emulator=self.emulator)
        return Agent(sid, self.log, provider, AgentOptions(CONFIG, system=SYSTEM, dispatcher=self.client, **options))

    def serve(self, stop: asyncio.Event, *, consumer: str | None = None, claim_idle_s: float = 15.0) -> Any:
        return asyncio.create_task(
            serve_steps(
                self.dispatcher,
                RedisConfig(redis_url()),
                stream=self.stream,
                group=self.group,
                consumer=consumer,
                stop=stop,
                claim_idle_s=claim_idle_s,
            )
        )


def with_rig(
    body: Callable[[Rig], Coroutine[Any, Any, None]],
    *,
    serve: bool = True,
    client_timeout_s: float = 10.0,
    ack_timeout_s: float = 10.0,
    faults: FaultPlan | None = None,
) -> None:
    stream = f"test:dispatch:{uuid.uuid4().hex[:10]}"
    group = DispatchConfig().group

    async def main() -> None:
        folds = MemoryFoldStore()
        emulator = Emulator(ToolLoopScript(tool_steps=1), faults=faults)
        dispatcher = Dispatcher(folds, {"anthropic": emulated_provider(emulator=emulator)}, fold_timeout_s=1)
        client = RedisStepClient(
            RedisConfig(redis_url()),
            stream=stream,
            group=group,
            prepare_timeout_s=client_timeout_s,
            answer_timeout_s=client_timeout_s,
            ack_timeout_s=ack_timeout_s,
        )
        rig = Rig(ProjectingLog(folds), client, emulator, dispatcher, stream, group)
        stop = asyncio.Event()
        server = rig.serve(stop) if serve else None
        try:
            await body(rig)
        finally:
            stop.set()
            if server is not None:
                await server
            await client.aclose()
            await dispatcher.aclose()

    try:
        asyncio.run(main())
    finally:
        r = redis.Redis.from_url(redis_url())
        for key in r.scan_iter(f"{stream}*"):
            r.delete(key)
        r.close()


def test_a_failed_step_comes_back_typed_and_a_missing_dispatcher_times_out_naming_it() -> None:
    async def failing(rig: Rig) -> None:
        # a step the log never opened: the fold never reaches it, and the loop hears the dispatcher's cause
        with pytest.raises(FoldTimeout, match="projector"):
            await rig.client.prepare(StepHandoff("nobody", 3, 0, 0, 1))

    async def no_server(rig: Rig) -> None:
        agent = rig.agent("lonely")
        with pytest.raises(DispatchTimeout, match=r"no dispatcher is reading .*start `foldline dispatcher`"):
            await agent.run_turn("anyone there?")
        events = rig.log.read("lonely")
        assert not any(isinstance(e.data, RequestDispatch) for e in events)
        assert isinstance(events[-1].data, TurnEnd)
        assert events[-1].data.reason == "error"
        assert rig.emulator.requests == 0

    with_rig(failing)
    with_rig(no_server, serve=False, client_timeout_s=1.5, ack_timeout_s=0.5)


def test_a_hand_over_waits_its_whole_timeout_even_past_the_redis_socket_timeout() -> None:
    """The reply wait outlasts the client's socket timeout: a slow answer (a long provider call) must wait,
    not surface as a lost Redis connection."""

    async def main() -> None:
        settings = RedisConfig(redis_url(), socket_timeout_s=0.2, connect_timeout_s=1.0)
        stream = f"test:dispatch:{uuid.uuid4().hex[:10]}"
        client = RedisStepClient(settings, stream=stream, group="g", prepare_timeout_s=1.5, ack_timeout_s=5)
        loop = asyncio.get_running_loop()
        started = loop.time()
        try:
            with pytest.raises(DispatchTimeout, match="no dispatcher is reading"):
                await client.prepare(StepHandoff("nobody", 3, 0, 0, 1))
        finally:
            await client.aclose()
            r = redis.Redis.from_url(settings.url)
            r.delete(stream)
            r.close()
        assert loop.time() - started >= 1.5

    asyncio.run(main())


def test_a_dispatcher_recreates_its_group_after_it_vanished() -> None:
    """Redis flushed or restarted empty: the consumer group is gone; the dispatcher makes it again."""

    async def body(rig: Rig) -> None:
        agent = rig.agent("g-1")
        await agent.run_turn("before")
        r = redis.Redis.from_url(redis_url())
        r.delete(rig.stream)  # the stream and its group, as FLUSHALL would leave them
        r.close()
        await agent.run_turn("after")
        assert verify_events("g-1", rig.log.read("g-1")).ok
        assert rig.emulator.requests == 2

    with_rig(body, ack_timeout_s=1.0)


def _steal(r: redis.Redis, rig: Rig) -> dict[bytes, bytes]:
    """Read the one waiting hand-over as a dispatcher that will never answer it (it is about to be killed)."""
    got: Any = r.xreadgroup(rig.group, "dead", {rig.stream: ">"}, count=10)
    entries = got[0][1] if got else []
    assert len(entries) == 1, entries
    fields: dict[bytes, bytes] = entries[0][1]
    return fields


async def _drained(r: redis.Redis, stream: str) -> None:
    for _ in range(200):
        if not r.xrange(stream):
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"hand-overs still in {stream}: {r.xrange(stream)!r}")


def test_a_dead_dispatchers_hand_overs_are_taken_over_and_a_taken_send_is_never_sent_twice() -> None:
    """Entries a dispatcher read and never answered (it was killed) are claimed by another after the idle
    time: a prepare is served again, a send it had taken is answered ``lost`` and not sent again, and a
    send handed over twice is sent once."""

    async def body(rig: Rig) -> None:
        r = redis.Redis.from_url(redis_url())
        stop = asyncio.Event()
        server = rig.serve(stop)
        agent = rig.agent("d-1")
        await agent.run_turn("first")  # the session exists, its fold is current, the group exists
        stop.set()
        await server
        assert rig.emulator.requests == 1
        handoff = StepHandoff("d-1", rig.log.head("d-1"), 1, 0, agent.lease.epoch)
        try:
            # 1. a prepare read by a dispatcher that then died: another one takes it over and answers it
            call = asyncio.create_task(rig.client.prepare(handoff))
            await asyncio.sleep(0.3)
            _steal(r, rig)
            stop = asyncio.Event()
            server = rig.serve(stop, consumer="alive", claim_idle_s=0.6)
            prepared = await asyncio.wait_for(call, 10)
            stop.set()
            await server

            # 2. a send the dead dispatcher had taken (marked): answered lost, not sent again
            lost = asyncio.create_task(rig.client.send(handoff, prepared))
            await asyncio.sleep(0.3)
            fields = _steal(r, rig)
            r.set(f"{rig.stream}:taken:{fields[b'id'].decode()}", "dead")
            stop = asyncio.Event()
            server = rig.serve(stop, consumer="alive", claim_idle_s=0.6)
            with pytest.raises(DispatchLost, match="may or may not have reached the provider"):
                await asyncio.wait_for(lost, 10)
            assert rig.emulator.requests == 1

            # 3. a send taken by none before its dispatcher died is served; handed over again, it is not resent
            answer = await asyncio.wait_for(rig.client.send(handoff, prepared), 10)
            assert answer.content
            assert rig.emulator.requests == 2
            await _drained(r, rig.stream)  # answered, acknowledged and deleted
            sent: dict[FieldT, EncodableT] = dict(fields.items())
            sent[b"id"] = b"again"
            r.set(f"{rig.stream}:taken:again", "alive")
            r.xadd(rig.stream, sent)
            await _drained(r, rig.stream)
            assert rig.emulator.requests == 2
            stop.set()
            await server
        finally:
            r.close()

    with_rig(body, serve=False)


async def _waiting(r: redis.Redis, stream: str) -> dict[FieldT, EncodableT]:
    """The fields of the one hand-over in the stream, once it is there."""
    for _ in range(200):
        entries: Any = r.xrange(stream)
        if entries:
            assert len(entries) == 1, entries
            return dict(entries[0][1].items())
        await asyncio.sleep(0.05)
    raise AssertionError(f"no hand-over reached {stream}")


def test_hand_overs_read_together_are_answered_in_one_batch_a_send_twice_is_sent_once() -> None:
    """The takes, replies and acknowledgements of hand-overs read together go out in one transaction: of two
    entries of one send, one takes it and sends it; a reply list Redis refuses (its key holds a string) loses
    only its own replies, and every entry is still acknowledged and deleted."""

    async def body(rig: Rig) -> None:
        r = redis.Redis.from_url(redis_url())
        stop = asyncio.Event()
        server = rig.serve(stop)
        agent = rig.agent("b-1")
        await agent.run_turn("first")
        handoff = StepHandoff("b-1", rig.log.head("b-1"), 1, 0, agent.lease.epoch)
        prepared = await rig.client.prepare(handoff)
        stop.set()
        await server
        await _drained(r, rig.stream)
        assert rig.emulator.requests == 1
        try:
            sent = asyncio.create_task(rig.client.send(handoff, prepared))
            entry = await _waiting(r, rig.stream)
            r.xadd(rig.stream, entry)  # the same call handed over again, read in the same batch
            refused = f"{rig.stream}:replies:refused"
            r.set(refused, "not a list")
            r.xadd(rig.stream, {**entry, b"id": b"other", b"op": b"prepare", b"reply": refused.encode()})
            stop = asyncio.Event()
            server = rig.serve(stop)
            answer = await asyncio.wait_for(sent, 10)
            assert answer.content
            await _drained(r, rig.stream)
            assert rig.emulator.requests == 2
            assert r.get(refused) == b"not a list"
            stop.set()
            await server
        finally:
            r.close()

    with_rig(body, serve=False)


async def _entries(r: redis.Redis, stream: str, n: int) -> list[dict[bytes, bytes]]:
    """The fields of the stream's entries once it holds ``n`` of them."""
    for _ in range(400):
        found: Any = r.xrange(stream)
        if len(found) >= n:
            return [fields for _, fields in found]
        await asyncio.sleep(0.05)
    raise AssertionError(f"{stream} never held {n} hand-over(s): {r.xrange(stream)!r}")


async def _popped(r: redis.Redis, key: str) -> None:
    for _ in range(400):
        if not r.exists(key):
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"the client never read its replies from {key}")


def test_replies_lost_with_redis_data_are_noticed_a_send_is_lost_and_a_prepare_handed_over_again() -> None:
    """Redis loses its data (a flush) after a dispatcher's ``accepted`` reached the loop, and with it the answer
    the dispatcher pushed meanwhile: the client notices its own key is gone; the send ends as ``DispatchLost``
    (a logged retry sends it anew) instead of waiting out its answer timeout, the prepare is handed over
    again and answered."""

    async def body(rig: Rig) -> None:
        r = redis.Redis.from_url(redis_url())
        client = rig.client
        handoff = StepHandoff("g-1", 5, 1, 0, 1)
        prepared = PreparedStep("g-1", 5, "anthropic-messages", 1, "0" * 64, 10)
        try:
            send = asyncio.create_task(client.send(handoff, prepared))
            (fields,) = await _entries(r, rig.stream, 1)
            r.rpush(client.reply_key, codec.canonical_json({"id": fields[b"id"].decode(), "kind": "accepted"}))
            await _popped(r, client.reply_key)
            assert r.exists(client.alive_key)
            r.delete(client.alive_key)  # the flush: the dispatcher's answer, pushed after the acceptance, is gone
            with pytest.raises(DispatchLost, match="Redis lost its data"):
                await asyncio.wait_for(send, 60)
            r.delete(rig.stream)

            prepare = asyncio.create_task(client.prepare(handoff))
            (first,) = await _entries(r, rig.stream, 1)
            call_id = first[b"id"].decode()
            r.rpush(client.reply_key, codec.canonical_json({"id": call_id, "kind": "accepted"}))
            await _popped(r, client.reply_key)
            r.delete(client.alive_key)
            _, again = await _entries(r, rig.stream, 2)  # handed over again, the same call
            assert again[b"id"].decode() == call_id
            assert again[b"op"] == b"prepare"
            ok = {"id": call_id, "kind": "ok", "result": prepared.to_json()}
            r.rpush(client.reply_key, codec.canonical_json(ok))
            assert await asyncio.wait_for(prepare, 60) == prepared
        finally:
            r.close()

    with_rig(body, serve=False, ack_timeout_s=1.0, client_timeout_s=120.0)


def test_a_take_whose_exec_answer_was_lost_is_retried_and_sent_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Redis applies a send's take (its mark set, its ``accepted`` pushed) and the connection drops before the
    answer arrives: the retried transaction finds the take's own mark, so the send goes out at once and once —
    not after the loop's answer timeout as a lost dispatch."""
    from foldline.adapters import redis_steps

    real_send = redis_steps._Writes._send
    armed: list[bool] = []
    dropped: list[int] = []

    async def drop_the_first_take_answer(self: Any, batch: list[Any]) -> list[Any]:
        results = await real_send(self, batch)
        if armed and not dropped and any(w.op == "take" for w in batch):
            dropped.append(len(batch))
            raise redis.exceptions.ConnectionError("Connection closed by server.")  # after Redis applied it
        return results

    monkeypatch.setattr(redis_steps._Writes, "_send", drop_the_first_take_answer)

    async def body(rig: Rig) -> None:
        agent = rig.agent("x-1")
        await agent.run_turn("first")
        handoff = StepHandoff("x-1", rig.log.head("x-1"), 1, 0, agent.lease.epoch)
        prepared = await rig.client.prepare(handoff)
        sent_before = rig.emulator.requests
        armed.append(True)
        answer = await asyncio.wait_for(rig.client.send(handoff, prepared), 5)  # the answer timeout is 10 s
        assert answer.content
        assert dropped, "no take's answer was dropped"
        assert rig.emulator.requests == sent_before + 1

    with_rig(body)
