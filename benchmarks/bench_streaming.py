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

    python -m benchmarks.run streaming
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
from pathlib import Path
from typing import Any

from foldline.adapters.sqlite_log import SqliteEventLog
from foldline.core import CallConfig
from foldline.loop import Agent, AgentOptions, TextDelta
from foldline.providers.anthropic import AnthropicProvider
from foldline.providers.emulator import Emulator, EmulatorServer, ToolLoopScript
from foldline.providers.retry import RetryingSender

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


async def _measure(url: str, data_dir: Path) -> tuple[list[float], list[float]]:
    log = SqliteEventLog(data_dir)
    observer = _FirstTokens()
    provider = AnthropicProvider(None, None, url)
    options = AgentOptions(config=CONFIG, system="Be brief.", sender=RetryingSender(observer=observer))
    agent = Agent("stream-bench", log, provider, options)
    caller: list[float] = []
    try:
        for turn in range(TURNS + WARMUP):
            began = time.perf_counter()
            first: float | None = None
            async for event in agent.stream(f"Question {turn}: what does the prefix cache keep?"):
                if first is None and isinstance(event, TextDelta):
                    first = time.perf_counter() - began
            if first is None:
                raise RuntimeError("a streamed turn gave the caller no text")
            caller.append(first)
    finally:
        await provider.aclose()
        log.close()
    return caller[WARMUP:], observer.seconds[WARMUP:]


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def run() -> list[dict[str, Any]]:
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen([sys.executable, "-m", "benchmarks.bench_streaming", "serve", str(port)])
    try:
        _wait_up(url, proc)
        with tempfile.TemporaryDirectory() as tmp:
            caller, provider = asyncio.run(_measure(url, Path(tmp)))
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    added = [c - p for c, p in zip(caller, provider, strict=True)]
    ms = 1000.0
    rows: list[dict[str, Any]] = []
    for name, values in (
        ("embedded: first delta at the caller", caller),
        ("embedded: the provider's first token (transport)", provider),
    ):
        for label, q in (("p50", 0.5), ("p99", 0.99)):
            rows.append(
                {"name": f"{name}, {label}", "value": _pct(values, q) * ms, "unit": "ms", "target": "—", "ok": True}
            )
    p50 = statistics.median(added) * ms
    rows.append(
        {"name": "embedded: foldline adds, p50", "value": p50, "unit": "ms", "target": "<= 5 ms", "ok": p50 <= 5.0}
    )
    rows.append(
        {
            "name": "embedded: foldline adds, p99",
            "value": _pct(added, 0.99) * ms,
            "unit": "ms",
            "target": "—",
            "ok": True,
        }
    )
    rows.append({"name": "turns measured", "value": len(caller), "unit": "turns", "target": "—", "ok": True})
    return rows


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "serve":
        serve(int(sys.argv[2]))
    else:
        for row in run():
            print(row)
