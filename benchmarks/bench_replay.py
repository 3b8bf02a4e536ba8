"""Replay throughput: a 1,000-step recorded session replayed through a changed agent until it diverges at its last step.

The session is the demo agent (system prompt, three tools, the emulator's tool-loop script, the invariant
companion on as shipped) on the embedded SQLite log. Its system prompt changed before its last request (a
``request/header`` with reason ``change`` at step 1,000); the replayed agent keeps the first prompt, so every
request but the last is built identically and answered from the recording, and the last one diverges in
``system``. The rate is replayed steps per second of wall time: the recorded log read from SQLite, the loop's
1,000 steps on its scratch log with the recorded answers and tool results, and the divergence report (the
recorded body rebuilt and checked against its digest, the field and byte diff, the cost). One row without the
determinism check (one run) and one with it (a second run of the same agent to the divergence, as
``foldline replay`` does by default). Median of three runs each.
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from foldline.adapters.sqlite_log import SqliteEventLog
from foldline.core import CallConfig
from foldline.demo import SYSTEM_PROMPT, demo_toolset
from foldline.loop import Agent, AgentOptions
from foldline.loop.agent import StepRecord
from foldline.ports.event_log import EventLog
from foldline.providers.emulated import emulated_provider
from foldline.providers.emulator import Emulator, ToolLoopScript
from foldline.replayer import Change, Recording, replay_recording

STEPS = 1_000
RUNS = 3
#: A 1,000-step session replays in at most 2 s, so a CI job replays hundreds of recorded sessions in minutes.
TARGET = 500.0  # steps/s
LAST_PROMPT = SYSTEM_PROMPT + "\n\nFrom now on, answer in one sentence."


def record(log: EventLog, sid: str) -> list[StepRecord]:
    """The recorded session: ``STEPS`` requests, the system prompt changed before the last one."""
    rendered = 0

    def system() -> str:
        nonlocal rendered
        rendered += 1
        return SYSTEM_PROMPT if rendered < STEPS else LAST_PROMPT

    provider = emulated_provider(emulator=Emulator(ToolLoopScript(tool_steps=4)))
    options = AgentOptions(
        config=CallConfig("anthropic", "claude-emulated", max_tokens=512), system=system, tools=demo_toolset()
    )
    agent = Agent(sid, log, provider, options)
    records: list[StepRecord] = []
    agent.step_listeners.append(records.append)

    async def main() -> None:
        turn = 0
        try:
            while len(records) < STEPS:
                agent.options.max_steps_per_turn = min(16, STEPS - len(records))
                await agent.run_turn(f"question {turn}: what changed since the last answer?")
                turn += 1
        finally:
            await provider.aclose()

    asyncio.run(main())
    return records


def replay_seconds(path: Path, sid: str, check_determinism: bool) -> tuple[float, int]:
    """Seconds to read the recording and replay it to its divergence; the index of the diverging request."""
    began = time.perf_counter()
    with SqliteEventLog(path, read_only=True) as log:
        recording = Recording.from_log(log, sid)
    result = asyncio.run(replay_recording(recording, Change(system=SYSTEM_PROMPT), check_determinism=check_determinism))
    seconds = time.perf_counter() - began
    assert result.divergence is not None
    assert result.divergence.request is not None
    assert [f.path for f in result.divergence.fields] == ["system"]
    return seconds, result.divergence.request


def run() -> list[dict[str, Any]]:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp)
        with SqliteEventLog(path) as log:
            records = record(log, "long")
        assert len(records) == STEPS
        rows: list[dict[str, Any]] = []
        for check, label in ((False, "one run"), (True, "two runs: with the determinism check")):
            runs = [replay_seconds(path, "long", check) for _ in range(RUNS)]
            assert all(request == STEPS - 1 for _, request in runs), "the replay must diverge at the last step"
            seconds = statistics.median(s for s, _ in runs)
            rate = STEPS / seconds
            rows.append(
                {
                    "name": f"replay of a {STEPS:,}-step session to a divergence at its last step, {label}",
                    "value": round(rate),
                    "unit": "steps/s",
                    "target": f">= {TARGET:,.0f} steps/s" if not check else "reported",
                    "ok": rate >= TARGET if not check else True,
                }
            )
            rows.append(
                {
                    "name": f"… the same, {label}: seconds for the whole session, median of {RUNS}",
                    "value": round(seconds, 3),
                    "unit": "s",
                    "target": "reported",
                    "ok": True,
                }
            )
    return rows
