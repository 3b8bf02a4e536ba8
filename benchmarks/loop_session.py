"""One foldline loop session in a fresh interpreter, measured step by step; prints one JSON object.

    python -m benchmarks.loop_session --steps 1000 --shape tools            # the default configuration
    python -m benchmarks.loop_session --steps 1000 --shape tools --no-invariant
    python -m benchmarks.loop_session --steps 5000 --shape chat --windows 50,500,1000,5000
    python -m benchmarks.loop_session --steps 1000 --shape tools --sealed   # content sealed (docs/ERASURE.md)

A fresh process per session keeps the figures honest: nothing another benchmark left on the heap makes a
full garbage collection dearer, and the peak RSS is this session's own. Shapes:

* ``tools`` — the loop benchmark's step: system prompt and tools of ``foldline demo``, a provider that
  answers at once with four ``word_count`` tool rounds and then text; a step is one model call.
* ``chat`` — the LangGraph comparison's step (:mod:`benchmarks.vs_langgraph.shape`): one turn with a
  200-character user message and a 400-character text answer, no system prompt and no tools.

Per step it records the wall time excluding the provider call and the time the garbage collector ran
inside it (``gc.callbacks``). At each window (a session length) it records the size of the SQLite log,
database plus WAL after a ``TRUNCATE`` checkpoint, before the last ``--tail`` steps and after them.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from foldline.adapters.sealing import ContentSealer
from foldline.adapters.sqlite_keys import KEYS_NAME, SqliteKeyStore
from foldline.adapters.sqlite_log import SqliteEventLog
from foldline.core import CallConfig, TextBlock, ToolCallBlock, Usage
from foldline.core.events import TurnEnd, TurnStart
from foldline.demo import SYSTEM_PROMPT, demo_toolset
from foldline.loop import Agent, AgentOptions
from foldline.providers.base import Body, Provider, ProviderResponse
from foldline.providers.emulated import emulated_provider
from foldline.providers.emulator import Emulator, ToolLoopScript
from foldline.providers.registry import ANTHROPIC_MESSAGES_V1
from foldline.providers.streaming import AnswerProgress

from .vs_langgraph.measure import GcClock, db_size, memory
from .vs_langgraph.shape import DEFAULT_TAIL, answer_text, question_text

__all__ = ["main", "run_session", "spawn"]

_ROOT = Path(__file__).resolve().parent.parent


class _TimedProvider(Provider):
    """Forwards to the inner provider; accumulates the time spent inside ``send`` and the GC time within it."""

    def __init__(self, inner: Provider, clock: GcClock) -> None:
        self.inner, self.name, self.serializer = inner, inner.name, inner.serializer
        self.clock = clock
        self.send_ns = 0
        self.send_gc_ns = 0

    def reset(self) -> None:
        self.send_ns = self.send_gc_ns = 0

    async def send(
        self, body: Body, *, stream: bool = False, progress: AnswerProgress | None = None
    ) -> ProviderResponse:
        t, gc0 = time.perf_counter_ns(), self.clock.ns
        try:
            return await self.inner.send(body, stream=stream, progress=progress)
        finally:
            self.send_ns += time.perf_counter_ns() - t
            self.send_gc_ns += self.clock.ns - gc0

    async def aclose(self) -> None:
        await self.inner.aclose()


class _ToolRoundsProvider(Provider):
    """Answers like ``ToolLoopScript(tool_steps=4)`` without reading the body: four tool rounds, then text.

    The in-process emulator parses every ~200 KB body and models the provider cache, which takes
    milliseconds per step and evicts the CPU caches the loop's next append runs on; a network provider
    spends that time elsewhere. This provider isolates the loop's own cost.
    """

    def __init__(self) -> None:
        self.name = "anthropic"
        self.serializer = ANTHROPIC_MESSAGES_V1
        self._n = 0

    async def send(
        self, body: Body, *, stream: bool = False, progress: AnswerProgress | None = None
    ) -> ProviderResponse:
        self._n += 1
        usage = Usage(input=10, output=20, cache_read=len(body) // 4, cache_write=50)
        if self._n % 5:
            call = ToolCallBlock(f"call{self._n}", "word_count", f'{{"text":"step {self._n} of the loop"}}')
            return ProviderResponse((TextBlock("Calling word_count."), call), usage, "tool_use")
        return ProviderResponse((TextBlock(f"Answer {self._n}."),), usage, "end_turn")


class _ChatProvider(Provider):
    """Answers every request at once with the comparison's 400-character text."""

    def __init__(self) -> None:
        self.name = "anthropic"
        self.serializer = ANTHROPIC_MESSAGES_V1
        self._n = 0

    async def send(
        self, body: Body, *, stream: bool = False, progress: AnswerProgress | None = None
    ) -> ProviderResponse:
        self._n += 1
        usage = Usage(input=10, output=100, cache_read=len(body) // 4, cache_write=50)
        return ProviderResponse((TextBlock(answer_text(self._n)),), usage, "end_turn")


def run_session(
    steps: int,
    *,
    shape: str = "tools",
    invariant: bool = True,
    emulator: bool = False,
    windows: tuple[int, ...] = (),
    tail: int = DEFAULT_TAIL,
    full_check_every: int | None = None,
    data_dir: Path | None = None,
    sealed: bool = False,
    traced: bool = False,
) -> dict[str, Any]:
    """Run one session of ``steps`` steps in this process and return its measurements (see the module doc);
    ``sealed``: the log seals content under the session's key, as ``open_stores`` does by default
    (docs/ERASURE.md).

    ``traced``: the log goes through :func:`foldline.tracing.traced_log`, as the CLI's loops' logs do — traced
    when the standard ``OTEL_*`` variables turn tracing on (spans priced with the shipped table), the log itself
    when they do not; the spans still buffered are exported after the last step, outside the figures."""
    windows = tuple(sorted(set(windows) | {steps}))
    with tempfile.TemporaryDirectory(dir=data_dir) as tmp:
        sealer = ContentSealer(SqliteKeyStore(Path(tmp) / KEYS_NAME)) if sealed else None
        log = SqliteEventLog(Path(tmp), sealer=sealer)
        inner: Provider
        if shape == "tools":
            inner = _ToolRoundsProvider()
            if emulator:
                inner = emulated_provider(emulator=Emulator(ToolLoopScript(tool_steps=4)))
            options = AgentOptions(
                config=CallConfig("anthropic", "claude-emulated", max_tokens=512),
                system=SYSTEM_PROMPT,
                tools=demo_toolset(),
            )
        elif shape == "chat":
            inner = _ChatProvider()
            options = AgentOptions(config=CallConfig("anthropic", "claude-bench", max_tokens=1024))
        else:
            raise ValueError(f"unknown shape {shape!r}; use tools or chat")
        options.invariant = invariant  # everything else as a user gets it (AgentOptions defaults)
        if full_check_every is not None:
            options.invariant_full_check_every = full_check_every
        clock = GcClock()
        provider = _TimedProvider(inner, clock)
        agent_log: Any = log
        if traced:
            from foldline import tracing
            from foldline.config.prices import builtin_price_table

            tracing.configure("foldline-bench", prices=builtin_price_table())
            agent_log = tracing.traced_log(log)
        agent = Agent("bench", agent_log, provider, options)
        step_us: list[float] = []
        gc_us: list[float] = []
        sizes: dict[int, list[int]] = {}
        marks = {w - tail: w for w in windows if w - tail >= 0}

        def mark() -> None:
            done = len(step_us)
            if done in marks:
                sizes.setdefault(marks[done], []).append(db_size(log.path))
            if done in windows:
                sizes.setdefault(done, []).append(db_size(log.path))

        async def tools_session() -> None:
            turn = 0
            while len(step_us) < steps:
                agent.inject(f"question {turn}")
                t_turn = agent.turn
                agent.turn += 1
                await agent._append(TurnStart(t_turn))
                for step in range(5):
                    mark()
                    provider.reset()
                    gc0 = clock.ns
                    t = time.perf_counter_ns()
                    outcome = await agent._step(t_turn, step)
                    step_us.append((time.perf_counter_ns() - t - provider.send_ns) / 1000)
                    gc_us.append((clock.ns - gc0 - provider.send_gc_ns) / 1000)
                    assert outcome is not None
                    done = len(step_us) >= steps
                    if done or not any(isinstance(b, ToolCallBlock) for b in outcome[1].content):
                        break
                await agent._append(TurnEnd(t_turn, "completed"))
                turn += 1
            mark()

        async def chat_session() -> None:
            for n in range(1, steps + 1):
                mark()
                question = question_text(n)
                provider.reset()
                gc0 = clock.ns
                t = time.perf_counter_ns()
                await agent.run_turn(question)
                step_us.append((time.perf_counter_ns() - t - provider.send_ns) / 1000)
                gc_us.append((clock.ns - gc0 - provider.send_gc_ns) / 1000)
            mark()

        start_memory = memory()
        gc.callbacks.append(clock)
        t0 = time.perf_counter()
        try:
            asyncio.run(tools_session() if shape == "tools" else chat_session())
        finally:
            gc.callbacks.remove(clock)
        seconds = time.perf_counter() - t0
        if traced:
            from foldline import tracing

            tracing.shutdown()
        companion = agent.invariant
        result: dict[str, Any] = {
            "steps": steps,
            "shape": shape,
            "invariant": invariant,
            "full_check_every": options.invariant_full_check_every,
            "fresh_growth": options.invariant_fresh_growth,
            "checked": companion.checked if companion is not None else 0,
            "full_rebuilds": companion.full_rebuilds if companion is not None else 0,
            "seconds": seconds,
            "step_us": step_us,
            "gc_us": gc_us,
            "gc_collections": clock.collections,
            "db_bytes": {str(w): v for w, v in sizes.items()},
            "log_bytes": db_size(log.path),
            "memory_start": start_memory,
            "memory": memory(),
            "gc_tracked_objects": len(gc.get_objects()),
        }
        result["sealed"] = sealed
        asyncio.run(provider.aclose())
        log.close()
        if sealer is not None:
            sealer.close()
    return result


def spawn(
    steps: int,
    *,
    shape: str = "tools",
    invariant: bool = True,
    emulator: bool = False,
    windows: tuple[int, ...] = (),
    full_check_every: int | None = None,
    timeout_s: float = 1800,
    sealed: bool = False,
    traced: bool = False,
    env: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Run :func:`run_session` in a fresh interpreter (this one's) and return its JSON result; ``env``: its
    environment (default: this process's)."""
    cmd = [sys.executable, "-m", "benchmarks.loop_session", "--steps", str(steps), "--shape", shape]
    if sealed:
        cmd.append("--sealed")
    if traced:
        cmd.append("--traced")
    if not invariant:
        cmd.append("--no-invariant")
    if emulator:
        cmd.append("--emulator")
    if windows:
        cmd += ["--windows", ",".join(map(str, windows))]
    if full_check_every is not None:
        cmd += ["--full-check-every", str(full_check_every)]
    done = subprocess.run(cmd, cwd=_ROOT, capture_output=True, text=True, timeout=timeout_s, check=False, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {done.returncode}: {done.stderr.strip()[-2000:]}")
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.loop_session")
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--shape", choices=("tools", "chat"), default="tools")
    parser.add_argument("--no-invariant", dest="invariant", action="store_false")
    parser.add_argument("--emulator", action="store_true", help="tools shape: the in-process HTTP emulator answers")
    parser.add_argument("--windows", default="", help="comma-separated session lengths to measure log growth at")
    parser.add_argument("--tail", type=int, default=DEFAULT_TAIL)
    parser.add_argument("--sealed", action="store_true", help="seal content under the session's key (encryption on)")
    parser.add_argument(
        "--full-check-every", type=int, default=None, help="override AgentOptions.invariant_full_check_every (0: never)"
    )
    parser.add_argument("--traced", action="store_true", help="the log through foldline.tracing.traced_log (OTEL_*)")
    args = parser.parse_args(argv)
    result = run_session(
        args.steps,
        shape=args.shape,
        invariant=args.invariant,
        emulator=args.emulator,
        windows=tuple(int(w) for w in args.windows.split(",") if w),
        tail=args.tail,
        full_check_every=args.full_check_every,
        sealed=args.sealed,
        traced=args.traced,
    )
    json.dump(result, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
