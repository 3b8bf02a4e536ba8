"""The StepDispatcher contract, run by both adapters on folds in the real local Redis: the in-process
dispatcher, and the Redis transport (``RedisStepClient`` handing each call over a stream to ``serve_steps``)."""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import AsyncIterator, Iterator

import pytest
import redis

from foldline.adapters.redis_steps import RedisStepClient, serve_steps
from foldline.config import Config, DispatchConfig, FoldsConfig, RedisConfig
from foldline.config.factories import fold_store
from foldline.dispatcher import Dispatcher
from foldline.ports.fold_store import FoldStore
from foldline.ports.step_dispatch import StepDispatcher
from tests.contracts.step_dispatch import StepDispatcherContract, itself

pytestmark = pytest.mark.redis


def redis_url() -> str:
    url = os.environ.get("FOLDLINE_REDIS_URL")
    if not url:
        pytest.fail("FOLDLINE_REDIS_URL is unset: run `bash deploy/local/up.sh redis` and `source .local/env.sh`")
    return url


def _drop(pattern: str) -> None:
    client = redis.Redis.from_url(redis_url())
    try:
        keys = list(client.scan_iter(match=pattern, count=1000))
        for i in range(0, len(keys), 500):
            client.delete(*keys[i : i + 500])
    finally:
        client.close()


class _OnRedisFolds:
    @pytest.fixture(autouse=True)
    def _prefix(self) -> Iterator[None]:
        self.prefix = f"test:contract:{uuid.uuid4().hex[:10]}:"
        yield
        _drop(f"{self.prefix}*")

    def make_folds(self) -> FoldStore:
        return fold_store(Config(redis=RedisConfig(redis_url()), folds=FoldsConfig(self.prefix)))


class TestInProcessDispatcher(_OnRedisFolds, StepDispatcherContract):
    def serving(self, inner: Dispatcher) -> contextlib.AbstractAsyncContextManager[StepDispatcher]:
        return itself(inner)


class TestRedisStepTransport(_OnRedisFolds, StepDispatcherContract):
    @contextlib.asynccontextmanager
    async def _serving(self, inner: Dispatcher) -> AsyncIterator[StepDispatcher]:
        import asyncio

        stream = f"{self.prefix}steps"
        group = DispatchConfig().group
        client = RedisStepClient(
            RedisConfig(redis_url()), stream=stream, group=group, prepare_timeout_s=10.0, answer_timeout_s=10.0
        )
        stop = asyncio.Event()
        server = asyncio.create_task(
            serve_steps(inner, RedisConfig(redis_url()), stream=stream, group=group, stop=stop)
        )
        try:
            yield client
        finally:
            stop.set()
            await server
            await client.aclose()

    def serving(self, inner: Dispatcher) -> contextlib.AbstractAsyncContextManager[StepDispatcher]:
        return self._serving(inner)
