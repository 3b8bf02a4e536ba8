"""Behind a proxy that fails requests the ways a real route to a provider does — a 429, a 529, a connection reset
before the answer, and a streamed answer cut in half — every turn of an agent completes, every attempt puts the
logged bytes on the wire, and ``foldline verify`` proves the session.

The proxy is a real HTTP/1.1 server on a socket between the Anthropic adapter and the emulator's HTTP server: it
reads each request, answers the failures itself, and passes the rest on, writing the emulator's stream back one
chunk per event — or, for the cut, half of the events and then a TCP reset.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import random
import socket
import struct
import subprocess
import sys
from pathlib import Path

import httpx

from foldline.adapters.sqlite_log import SqliteEventLog
from foldline.core import CallConfig
from foldline.core.events import AssistantChunk, LlmRetry, RequestDispatch, StepStart
from foldline.loop import Agent, AgentOptions, AttemptDiscarded, TextDelta, Toolset, TurnFinished
from foldline.providers.anthropic import AnthropicProvider
from foldline.providers.emulator import Emulator, EmulatorServer
from foldline.providers.retry import RetryingSender
from foldline.providers.settings import TransportSettings

FOLDLINE = Path(sys.executable).with_name("foldline")
FAST = TransportSettings(initial_backoff_s=0.001, max_backoff_s=0.002)

_ERRORS = {
    429: ("Too Many Requests", "rate_limit_error"),
    529: ("Overloaded", "overloaded_error"),
}


class CuttingProxy:
    """Forwards POSTs to ``upstream``; request ``i`` gets ``plan[i]`` instead: a status (429, 529, answered by
    the proxy with the API's error body), ``"reset"`` (closed before any answer byte) or ``"cut"`` (the
    upstream's streamed answer, half of its chunks, then a reset)."""

    def __init__(self, upstream: str, plan: dict[int, int | str]) -> None:
        self.upstream = upstream
        self.plan = plan
        self.bodies: list[bytes] = []
        self.cut_at: list[int] = []  # body bytes written before each cut
        self._client = httpx.AsyncClient(base_url=upstream, trust_env=False, timeout=30)
        self._server: asyncio.Server | None = None

    async def start(self) -> str:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        await self._client.aclose()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                if not await self._one(head, reader, writer):
                    return
        finally:
            writer.close()

    async def _one(self, head: bytes, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        """Answer one request; False when the connection is to end (reset or cut)."""
        request_line, *lines = head.decode("latin-1").split("\r\n")
        path = request_line.split(" ")[1]
        headers = dict(line.split(": ", 1) for line in lines if ": " in line)
        size = int(next(v for k, v in headers.items() if k.lower() == "content-length"))
        body = await reader.readexactly(size)
        index = len(self.bodies)
        self.bodies.append(body)
        action = self.plan.get(index)
        if action == "reset":
            _reset(writer)
            return False
        if isinstance(action, int):
            reason, kind = _ERRORS[action]
            error = json.dumps({"type": "error", "error": {"type": kind, "message": reason}}).encode()
            writer.write(
                f"HTTP/1.1 {action} {reason}\r\ncontent-type: application/json\r\nretry-after-ms: 1\r\n"
                f"content-length: {len(error)}\r\n\r\n".encode()
                + error
            )
            await writer.drain()
            return True
        forward = {k: v for k, v in headers.items() if k.lower() not in ("host", "content-length", "connection")}
        async with self._client.stream("POST", path, content=body, headers=forward) as answer:
            chunks = [chunk async for chunk in answer.aiter_raw()]
            kept = [f"{k}: {v}" for k, v in answer.headers.items() if k in ("content-type", "request-id")]
        status = f"HTTP/1.1 {answer.status_code} OK\r\n" + "".join(f"{line}\r\n" for line in kept)
        writer.write(status.encode() + b"transfer-encoding: chunked\r\n\r\n")
        if action == "cut":
            half = chunks[: len(chunks) // 2]
            for chunk in half:
                writer.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            await writer.drain()
            self.cut_at.append(sum(len(c) for c in half))
            _reset(writer)
            return False
        for chunk in chunks:
            writer.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        return True


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with a TCP reset (SO_LINGER 0), as a proxy or a load balancer that drops a connection does."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


def tools() -> Toolset:
    toolset = Toolset()

    @toolset.tool
    def lookup(topic: str) -> str:
        """Look a topic up in the notes."""
        return f"notes on {topic}"

    return toolset


def test_every_turn_completes_behind_a_proxy_that_fails_and_cuts_streams(tmp_path: Path) -> None:
    upstream = EmulatorServer(emulator=Emulator(piece_chars=4)).start()
    log = SqliteEventLog(tmp_path)
    # the first request: a 429, a 529, a reset before the answer, then its stream cut in half; then a clean one
    proxy = CuttingProxy(upstream.url, {0: 429, 1: 529, 2: "reset", 3: "cut"})

    async def main() -> list[list[object]]:
        url = await proxy.start()
        provider = AnthropicProvider(None, None, url, settings=FAST)
        options = AgentOptions(
            config=CallConfig("anthropic", "claude-sonnet-4-5", max_tokens=1024, stream=True),
            system="You are a test agent.",
            tools=tools(),
            sender=RetryingSender(FAST, rng=random.Random(0)),
        )
        agent = Agent("s", log, provider, options)
        turns: list[list[object]] = []
        try:
            for prompt in ("Find the notes.", "And the next ones."):
                turns.append([event async for event in agent.stream(prompt)])
        finally:
            await provider.aclose()
            await proxy.close()
        return turns

    try:
        turns = asyncio.run(main())
    finally:
        upstream.close()
    for events in turns:
        finished = events[-1]
        assert isinstance(finished, TurnFinished)
        assert finished.result.reason == "completed"
    events = turns[0]
    (discarded,) = [e for e in events if isinstance(e, AttemptDiscarded)]
    assert (discarded.step, discarded.attempt) == (0, 4)  # only the cut attempt had shown pieces
    assert any(isinstance(e, TextDelta) for e in events[: events.index(discarded)])  # the cut half reached the reader
    assert proxy.cut_at
    assert proxy.cut_at[0] > 0

    records = log.read("s")
    log.close()
    retries = [e.data for e in records if isinstance(e.data, LlmRetry)]
    assert [(r.step, r.attempt, r.status) for r in retries] == [(0, 1, 429), (0, 2, 529), (0, 3, None), (0, 4, None)]
    assert retries[2].received_bytes == 0  # reset before the answer
    assert retries[3].received_bytes > 0  # cut in the middle of it
    assert all(r.wait_ms is not None for r in retries)
    # what had arrived of the cut answer is in the log with its retry (assistant/chunk of attempt 4), no more
    cut = [e.data for e in records if isinstance(e.data, AssistantChunk)]
    assert cut
    assert {c.attempt for c in cut} == {4}

    # every attempt of a step sent the bytes whose digest its request/dispatch holds
    dispatches = [e.data for e in records if isinstance(e.data, RequestDispatch)]
    steps = sum(1 for e in records if isinstance(e.data, StepStart))
    assert len(dispatches) == steps
    assert len(proxy.bodies) == steps + 4
    sent = iter(proxy.bodies)
    for dispatch in dispatches:
        attempts = 1 + sum(1 for r in retries if (r.turn, r.step) == (dispatch.turn, dispatch.step))
        bodies = {next(sent) for _ in range(attempts)}
        assert len(bodies) == 1  # identical bytes on every attempt
        (body,) = bodies
        assert f"sha256:{hashlib.sha256(body).hexdigest()}" == dispatch.digest

    verified = subprocess.run(
        [str(FOLDLINE), "verify", "--data-dir", str(tmp_path), "--json"],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert verified.returncode == 0, verified.stdout + verified.stderr
    report = json.loads(verified.stdout)
    assert report["status"] == "verified"
    assert report["retries"] == 4
    assert report["checked"] == report["matched"] == steps
