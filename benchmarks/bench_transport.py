"""The provider transport at fleet scale, and what streaming costs the loop.

1. **Fleet through faults.** 1,000 concurrent sessions x 5 streamed steps (a turn of four tool steps and an
   answer) in this process, against the HTTP emulator in another process (``foldline emulator``) that
   answers 5% of requests 429 (with ``retry-after``) and 1% 529. One provider (one connection pool, HTTP/1.1
   to the emulator's plain ``http://``), one :class:`~foldline.providers.retry.RetryingSender` (one adaptive
   limiter) shared by every session, the embedded SQLite log. Checked: every session completes; the log
   holds one ``llm/retry`` per injected fault (the requests the emulator faulted are exactly the attempts the
   log records as failed) and the emulator received exactly the attempts the log records; ``foldline
   verify`` matches every request. Reported: steps/s of this process, the limiter's lowest and final limit,
   and the run with a floor of 256 on the limit (the random faults here are not load, so AIMD's backing off
   only costs throughput; a fleet operator who knows its rate limit sets the floor).
2. **Loop overhead per streamed step.** One session at a time against the in-process emulator, through the
   real adapter, httpx and SSE decoding, with the default loop options (invariant companion on); each step's
   wall time minus the time the emulator itself spent answering (parsing, cache model, rendering the answer
   or its event stream). p50 over 300 steps, streamed against unstreamed; target <= 1.5x.

    python -m benchmarks.run transport
    python -m benchmarks.bench_transport serve PORT   # the emulator process of part 1
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from foldline.adapters.sqlite_log import SqliteEventLog
from foldline.core import CallConfig
from foldline.core.events import LlmRetry, RequestDispatch, TurnEnd
from foldline.demo import SYSTEM_PROMPT, demo_toolset
from foldline.loop import Agent, AgentOptions
from foldline.providers.anthropic import AnthropicProvider
from foldline.providers.emulator import (
    Emulator,
    EmulatorResponse,
    EmulatorServer,
    EmulatorTransport,
    Fault,
    FaultPlan,
    ToolLoopScript,
)
from foldline.providers.retry import RetryingSender
from foldline.providers.settings import TransportSettings
from foldline.replay.verify import VerifyReport, verify_events

SESSIONS = int(os.environ.get("FOLDLINE_BENCH_TRANSPORT_SESSIONS", "1000"))
STEPS = 5  # per session: four tool steps and the answer
PLAN = FaultPlan(rates=[(0.05, Fault.rate_limited(retry_after_s=0.05)), (0.01, Fault.overloaded())], seed=15)
CONFIG = CallConfig("anthropic", "claude-emulated", max_tokens=512, stream=True)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def serve(port: int) -> None:
    """The emulator process of part 1: tool loops of four steps, the faults of :data:`PLAN`."""
    server = EmulatorServer("127.0.0.1", port, emulator=Emulator(ToolLoopScript(tool_steps=4), faults=PLAN))
    server.serve_forever()


def _stats(url: str) -> dict[str, int]:
    with urllib.request.urlopen(f"{url}/stats", timeout=10) as answer:
        value: dict[str, int] = json.loads(answer.read())
        return value


def _wait_up(url: str, proc: subprocess.Popen[bytes]) -> None:
    for _ in range(200):
        if proc.poll() is not None:
            raise RuntimeError(f"the emulator process exited with {proc.returncode}")
        try:
            _stats(url)
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError("the emulator process did not start listening")


def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _fleet(data_dir: Path, settings: TransportSettings) -> dict[str, Any]:
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen([sys.executable, "-m", "benchmarks.bench_transport", "serve", str(port)])
    try:
        _wait_up(url, proc)
        log = SqliteEventLog(data_dir)
        sender = RetryingSender(settings)
        provider = AnthropicProvider(None, None, url, settings=settings)
        lowest = [settings.initial_limit]

        async def one(i: int) -> str:
            agent = Agent(
                f"s{i:04d}",
                log,
                provider,
                AgentOptions(config=CONFIG, system=SYSTEM_PROMPT, tools=demo_toolset(), sender=sender),
            )
            result = await agent.run_turn(f"Session {i}: count the words of the prefix cache notes.")
            lowest[0] = min(lowest[0], sender.limiter(provider.name).limit)
            return result.reason

        async def main() -> list[str]:
            try:
                return await asyncio.gather(*(one(i) for i in range(SESSIONS)))
            finally:
                await provider.aclose()

        t, cpu = time.perf_counter(), time.process_time()
        reasons = asyncio.run(main())
        seconds, cpu = time.perf_counter() - t, time.process_time() - cpu
        stats = _stats(url)
        server_cpu = _cpu_seconds(proc.pid)
        report = VerifyReport()
        retries = dispatches = steps = completed = 0
        for sid in log.sessions():
            events = log.read(sid)
            report.merge(verify_events(sid, events))
            retries += sum(isinstance(e.data, LlmRetry) for e in events)
            dispatches += sum(isinstance(e.data, RequestDispatch) for e in events)
            completed += sum(isinstance(e.data, TurnEnd) and e.data.reason == "completed" for e in events)
        steps = dispatches
        log.close()
        attempts = dispatches + retries
        expected = sum(PLAN.fault_for(i) is not None for i in range(stats["requests"]))
        return {
            "seconds": seconds,
            "steps": steps,
            "completed": completed,
            "reasons_ok": all(r == "completed" for r in reasons),
            "retries": retries,
            "faults": stats["faults"],
            "expected_faults": expected,
            "requests": stats["requests"],
            "attempts": attempts,
            "verify_ok": report.ok and report.checked == steps and report.retries == retries,
            "lowest": lowest[0],
            "final": sender.limiter(provider.name).limit,
            "cpu": cpu,
            "server_cpu": server_cpu,
        }
    finally:
        proc.terminate()
        proc.wait(timeout=30)


class _TimedEmulator(Emulator):
    """The emulator, with the time it spends answering (parse, cache model, answer, its event stream)."""

    spent_ns = 0

    def handle(self, method: str, path: str, headers: Mapping[str, str], body: bytes) -> EmulatorResponse:
        t = time.perf_counter_ns()
        try:
            return super().handle(method, path, headers, body)
        finally:
            self.spent_ns += time.perf_counter_ns() - t


def _overhead(stream: bool, data_dir: Path, steps: int = 300) -> list[float]:
    """Per-step loop overhead (us): a step's wall time minus the emulator's own time."""
    emulator = _TimedEmulator(ToolLoopScript(tool_steps=4))
    provider = AnthropicProvider(EmulatorTransport(emulator), None, "http://emulator.invalid")
    log = SqliteEventLog(data_dir)
    config = CallConfig("anthropic", "claude-emulated", max_tokens=512, stream=stream)
    agent = Agent("o", log, provider, AgentOptions(config=config, system=SYSTEM_PROMPT, tools=demo_toolset()))
    out: list[float] = []
    t, spent = 0, 0

    def listen(_record: object) -> None:
        nonlocal t, spent
        now = time.perf_counter_ns()
        out.append((now - t - (emulator.spent_ns - spent)) / 1000)
        t, spent = now, emulator.spent_ns

    agent.step_listeners.append(listen)

    async def main() -> None:
        nonlocal t, spent
        turn = 0
        while len(out) < steps:
            t, spent = time.perf_counter_ns(), emulator.spent_ns
            await agent.run_turn(f"question {turn}")
            turn += 1
        await provider.aclose()

    asyncio.run(main())
    log.close()
    return out[20:]  # past the first turns' warm-up


def run() -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        fleet = _fleet(root / "fleet", TransportSettings())
        floor = _fleet(root / "floor", TransportSettings(concurrency_min=256, concurrency_initial=256))
        plain = statistics.median(_overhead(False, root / "plain"))
        streamed = statistics.median(_overhead(True, root / "streamed"))
    ok = (
        fleet["reasons_ok"]
        and fleet["completed"] == SESSIONS
        and fleet["steps"] == SESSIONS * STEPS
        and fleet["retries"] == fleet["faults"] == fleet["expected_faults"]
        and fleet["attempts"] == fleet["requests"]
        and fleet["verify_ok"]
    )
    rows.append(
        {
            "name": (
                f"{SESSIONS} concurrent sessions x {STEPS} streamed steps, HTTP emulator answering 5% 429 "
                f"(retry-after) and 1% 529: sessions completed; {fleet['retries']} llm/retry events = "
                f"{fleet['faults']} faults injected; {fleet['requests']} requests received = attempts logged; verify"
            ),
            "value": fleet["completed"],
            "unit": "sessions",
            "target": f"all {SESSIONS}, every retry logged, verify 100%",
            "ok": ok,
        }
    )
    load = os.getloadavg()[0]
    rows.append(
        {
            "name": (
                f"same: steps/s of this one process, wall clock (adaptive limit: start 64, lowest {fleet['lowest']}, "
                f"final {fleet['final']}; machine load average {load:.1f} on {os.cpu_count()} cores)"
            ),
            "value": round(fleet["steps"] / fleet["seconds"]),
            "unit": "steps/s",
            "target": "(reported)",
            "ok": True,
        }
    )
    rows.append(
        {
            "name": (
                f"same: steps per CPU-second of the loop process ({fleet['cpu']:.1f} s CPU; the emulator process used "
                f"{fleet['server_cpu']:.1f} s) — the process's capacity on one core, whatever else the machine runs"
            ),
            "value": round(fleet["steps"] / fleet["cpu"]),
            "unit": "steps/CPU-s",
            "target": "(reported)",
            "ok": True,
        }
    )
    floor_ok = floor["completed"] == SESSIONS and floor["verify_ok"] and floor["retries"] == floor["faults"]
    rows.append(
        {
            "name": (
                f"same, with the limit's floor at 256 (lowest {floor['lowest']}, final {floor['final']}; "
                f"{floor['steps'] / floor['cpu']:.0f} steps per loop CPU-second); all complete and verify"
            ),
            "value": round(floor["steps"] / floor["seconds"]),
            "unit": "steps/s",
            "target": "(reported; all sessions complete and verify)",
            "ok": floor_ok,
        }
    )
    rows.append(
        {
            "name": "loop overhead per unstreamed step, excl. the emulator's own time (p50 of 280 steps, invariant on)",
            "value": round(plain, 1),
            "unit": "us",
            "target": "(reference)",
            "ok": True,
        }
    )
    rows.append(
        {
            "name": "loop overhead per streamed step, same measure (SSE decoding and assembly included)",
            "value": round(streamed, 1),
            "unit": "us",
            "target": "(reference)",
            "ok": True,
        }
    )
    ratio = streamed / plain
    rows.append(
        {
            "name": "streamed / unstreamed loop overhead per step (p50)",
            "value": round(ratio, 2),
            "unit": "x",
            "target": "<= 1.5x",
            "ok": ratio <= 1.5,
        }
    )
    return rows


if __name__ == "__main__":
    if sys.argv[1:2] == ["serve"]:
        serve(int(sys.argv[2]))
    else:
        for row in run():
            print(row)
