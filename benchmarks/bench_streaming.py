"""Time to the first piece of an answer at the caller (``Agent.stream``), beside the provider's own first token.

The emulator answers over HTTP from another process (``foldline``'s ``EmulatorServer``, each answer streamed
one event per piece of text). One agent on the embedded default (SQLite log, invariant companion on, the
Anthropic adapter) runs turns of one step each; per turn:

* **at the caller**: from ``agent.stream(prompt)`` being read to the first ``TextDelta`` the reader gets — the
  turn's opening append, the request's build, the companion's check, serialization, the ``request/dispatch``
  append, the request on the wire, the provider's first token and the way back through SSE decoding, the
  assembler and the event buffer;
* **the provider's**: the same request's first token as the transport measures it, from the attempt's start
  (``TransportObserver.first_token``: what ``foldline_provider_time_to_first_token_seconds`` exports).

What foldline adds is the difference, per turn. p50 and p99 over ``TURNS`` turns; target: foldline adds at most
5 ms at p50 on the embedded backend.

**Distributed**: the same turns with every step handed over the real local Redis (``RedisStepClient``) to a
dispatcher (``serve_steps`` over :class:`~foldline.dispatcher.Dispatcher`, a task of this process) that builds
the request from a fold and sends it to the same emulator process, relaying the answer's pieces back over Redis
Pub/Sub. The fold is an in-memory store that takes each append 2 ms after it was logged (a projector's lag, a
stand-in for the Kafka-to-Redis projectors). The provider's first token is measured at the dispatcher's adapter.
No target: what the hand-over, the fold wait and the relay add, beside the embedded figure.

    source .local/env.sh && python -m benchmarks.run streaming
    python -m benchmarks.bench_streaming serve PORT   # the emulator process
"""

from __future__ import annotations

import asyncio
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import redis
from tests.contracts.step_dispatch import ProjectingLog

from foldline.adapters.memory_folds import MemoryFoldStore
from foldline.adapters.sqlite_log import SqliteEventLog
from foldline.config import DispatchConfig, RedisConfig
from foldline.core import CallConfig
from foldline.dispatcher import Dispatcher, RedisStepClient, serve_steps
from foldline.loop import Agent, AgentOptions, TextDelta
from foldline.providers.anthropic import AnthropicProvider
from foldline.providers.base import Body, Provider, ProviderResponse
from foldline.providers.emulator import Emulator, EmulatorServer, ToolLoopScript
from foldline.providers.retry import RetryingSender
from foldline.providers.streaming import AnswerProgress

TURNS = int(os.environ.get("FOLDLINE_BENCH_STREAMING_TURNS", "300"))
WARMUP = 20
CONFIG = CallConfig("anthropic", "claude-emulated", max_tokens=512, stream=True)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def serve(port: int) -> None:
    """The emulator process: a text answer to every prompt, streamed in pieces of 16 characters."""
    EmulatorServer("127.0.0.1", port, emulator=Emulator(ToolLoopScript(tool_steps=0))).serve_forever()


def _wait_up(url: str, proc: subprocess.Popen[bytes]) -> None:
    for _ in range(400):
        if proc.poll() is not None:
            raise RuntimeError(f"the emulator process exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=5):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError("the emulator process did not start listening")


class _FirstTokens:
    """The transport's observer: keeps each request's first-token time."""

    def __init__(self) -> None:
        self.seconds: list[float] = []

    def retried(self, provider: str, status_class: str) -> None:
        return None

    def failed(self, provider: str, status_class: str) -> None:
        return None

    def first_token(self, provider: str, stream: bool, seconds: float) -> None:
        self.seconds.append(seconds)

    def concurrency(self, provider: str, limit: float, in_flight: int) -> None:
        return None


async def _turns(agent: Agent) -> list[float]:
    """Seconds from each turn's start to the first text piece its reader got."""
    caller: list[float] = []
    for turn in range(TURNS + WARMUP):
        began = time.perf_counter()
        first: float | None = None
        async for event in agent.stream(f"Question {turn}: what does the prefix cache keep?"):
            if first is None and isinstance(event, TextDelta):
                first = time.perf_counter() - began
        if first is None:
            raise RuntimeError("a streamed turn gave the caller no text")
        caller.append(first)
    return caller[WARMUP:]


async def _measure(url: str, data_dir: Path) -> tuple[list[float], list[float]]:
    log = SqliteEventLog(data_dir)
    observer = _FirstTokens()
    provider = AnthropicProvider(None, None, url)
    options = AgentOptions(config=CONFIG, system="Be brief.", sender=RetryingSender(observer=observer))
    agent = Agent("stream-bench", log, provider, options)
    try:
        caller = await _turns(agent)
    finally:
        await provider.aclose()
        log.close()
    return caller, observer.seconds[WARMUP:]


class _Timed(Provider):
    """The dispatcher's adapter, keeping each streamed answer's first-token time."""

    def __init__(self, inner: AnthropicProvider, seconds: list[float]) -> None:
        self.inner = inner
        self.name = inner.name
        self.serializer = inner.serializer
        self.seconds = seconds

    async def send(
        self, body: Body, *, stream: bool = False, progress: AnswerProgress | None = None
    ) -> ProviderResponse:
        progress = progress if progress is not None else AnswerProgress()
        response = await self.inner.send(body, stream=stream, progress=progress)
        if progress.first_token_at is not None:
            self.seconds.append(progress.first_token_at - progress.started_at)
        return response

    async def aclose(self) -> None:
        await self.inner.aclose()


async def _measure_distributed(url: str, redis_url: str) -> tuple[list[float], list[float]]:
    stream = f"bench:stream:{uuid.uuid4().hex[:10]}"
    group = DispatchConfig().group
    folds = MemoryFoldStore()
    provider_seconds: list[float] = []
    dispatcher = Dispatcher(folds, {"anthropic": _Timed(AnthropicProvider(None, None, url), provider_seconds)})
    client = RedisStepClient(RedisConfig(redis_url), stream=stream, group=group)
    stop = asyncio.Event()
    server = asyncio.create_task(serve_steps(dispatcher, RedisConfig(redis_url), stream=stream, group=group, stop=stop))
    loop_provider = AnthropicProvider(None, None, url)  # names the adapter; the dispatcher sends
    options = AgentOptions(config=CONFIG, system="Be brief.", dispatcher=client)
    agent = Agent("stream-bench", ProjectingLog(folds), loop_provider, options)
    try:
        caller = await _turns(agent)
    finally:
        stop.set()
        await server
        await client.aclose()
        await dispatcher.aclose()
        await loop_provider.aclose()
        r = redis.Redis.from_url(redis_url)
        for key in r.scan_iter(f"{stream}*"):
            r.delete(key)
        r.close()
    return caller, provider_seconds[WARMUP:]


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def run() -> list[dict[str, Any]]:
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen([sys.executable, "-m", "benchmarks.bench_streaming", "serve", str(port)])
    redis_url = os.environ.get("FOLDLINE_REDIS_URL")
    if not redis_url:
        raise RuntimeError(
            "FOLDLINE_REDIS_URL is unset: run `bash deploy/local/up.sh redis` and `source .local/env.sh`"
        )
    try:
        _wait_up(url, proc)
        with tempfile.TemporaryDirectory() as tmp:
            embedded = asyncio.run(_measure(url, Path(tmp)))
        distributed = asyncio.run(_measure_distributed(url, redis_url))
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    rows: list[dict[str, Any]] = []
    for backend, (caller, provider), target in (("embedded", embedded, 5.0), ("distributed", distributed, None)):
        rows += _rows(backend, caller, provider, target)
    rows.append({"name": "turns measured per backend", "value": TURNS, "unit": "turns", "target": "—", "ok": True})
    return rows


def _rows(backend: str, caller: list[float], provider: list[float], target_ms: float | None) -> list[dict[str, Any]]:
    ms = 1000.0
    added = [c - p for c, p in zip(caller, provider, strict=True)]
    rows: list[dict[str, Any]] = []
    for name, values in (
        (f"{backend}: first delta at the caller", caller),
        (f"{backend}: the provider's first token", provider),
        (f"{backend}: foldline adds", added),
    ):
        for label, q in (("p50", 0.5), ("p99", 0.99)):
            value = (statistics.median(values) if q == 0.5 else _pct(values, q)) * ms
            gated = target_ms is not None and name.endswith("adds") and label == "p50"
            rows.append(
                {
                    "name": f"{name}, {label}",
                    "value": value,
                    "unit": "ms",
                    "target": f"<= {target_ms:g} ms" if gated else "—",
                    "ok": value <= target_ms if gated and target_ms is not None else True,
                }
            )
    return rows


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "serve":
        serve(int(sys.argv[2]))
    else:
        for row in run():
            print(row)
