"""A long session under context pressure: verify throughput and the cache-read ratio across compactions.

Target (issue 4): a 2,000-step session with compaction every ~200 steps — ``foldline verify`` still
>= 2,000 requests/s, and the emulated cache-read ratio over all steps >= 0.85.

The session is the demo agent (system prompt, three tools, the emulator's tool-loop script) on the
embedded SQLite log, with a :class:`~foldline.loop.pressure.PressurePolicy` whose budget makes it compact
about every 200 steps. The invariant companion is off (the production default); ``verify`` rebuilds every
request, serializes it with the loop's incremental body cache (bytes equal to a full serialization; only
the messages since the previous request are encoded) and rechecks every compaction. A reference row gives
the rate when every body is serialized in full. The run also counts cache-read drops the log
does not explain (a drop is a request reading less than the previous request's whole prompt; it is
explained by a compaction, a trim or a header snapshot between the two dispatches).
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from pathlib import Path
from typing import Any

from foldline.adapters.sqlite_log import SqliteEventLog
from foldline.core import CallConfig
from foldline.core.events import AssistantMessage, CompactionStart, Envelope, RequestDispatch, RequestHeader, ToolResult
from foldline.demo import SYSTEM_PROMPT, demo_toolset
from foldline.loop import Agent, AgentOptions
from foldline.loop.agent import StepRecord
from foldline.loop.pressure import PressurePolicy
from foldline.providers.base import serializer_for
from foldline.providers.emulated import emulated_provider
from foldline.providers.emulator import Emulator, ToolLoopScript
from foldline.replay.verify import rebuild_requests, verify_events

STEPS = 2_000
POLICY = PressurePolicy(budget_tokens=10_000, keep_recent_tokens=1_500, trim_over_tokens=None)


def run_session(log: SqliteEventLog, sid: str, steps: int = STEPS) -> list[StepRecord]:
    provider = emulated_provider(emulator=Emulator(ToolLoopScript(tool_steps=4)))
    options = AgentOptions(
        config=CallConfig("anthropic", "claude-emulated", max_tokens=512),
        system=SYSTEM_PROMPT,
        tools=demo_toolset(),
        invariant=False,
        pressure=POLICY,
    )
    agent = Agent(sid, log, provider, options)
    records: list[StepRecord] = []
    agent.step_listeners.append(records.append)

    async def main() -> None:
        turn = 0
        try:
            while len(records) < steps:
                agent.options.max_steps_per_turn = min(16, steps - len(records))
                await agent.run_turn(f"question {turn}: what changed since the last answer?")
                turn += 1
        finally:
            await provider.aclose()

    asyncio.run(main())
    return records


def unexplained_drops(events: list[Envelope]) -> int:
    dispatches = [e.seq for e in events if isinstance(e.data, RequestDispatch)]
    answers = {e.seq: e.data.usage for e in events if isinstance(e.data, AssistantMessage) and e.data.usage}
    keys = sorted(answers)
    usage_after = []
    k = 0
    for d in dispatches:
        while keys[k] < d:
            k += 1
        usage_after.append(answers[keys[k]])
    count = 0
    for i in range(1, len(dispatches)):
        if usage_after[i].cache_read >= usage_after[i - 1].prompt_tokens:
            continue
        between = events[dispatches[i - 1] : dispatches[i]]
        if not any(
            isinstance(e.data, CompactionStart | RequestHeader)
            or (isinstance(e.data, ToolResult) and e.data.surface_op != "append")
            for e in between
        ):
            count += 1
    return count


def run() -> list[dict[str, Any]]:
    with tempfile.TemporaryDirectory() as tmp:
        log = SqliteEventLog(Path(tmp))
        t = time.perf_counter()
        records = run_session(log, "long")
        run_seconds = time.perf_counter() - t
        events = log.read("long")
        log.close()
    compactions = sum(isinstance(e.data, CompactionStart) for e in events)
    t = time.perf_counter()
    report = verify_events("long", events)
    verify_seconds = time.perf_counter() - t
    rate = report.checked / verify_seconds
    # reference: the same requests, each body serialized in full (no reuse of earlier messages' bytes)
    t = time.perf_counter()
    full = 0
    for dispatch, _seq, request in rebuild_requests("long", events):
        serializer_for(dispatch.serializer, dispatch.serializer_version).serialize(request, None)
        full += 1
    full_rate = full / (time.perf_counter() - t)
    prompt = sum(r.usage.prompt_tokens for r in records)
    ratio = sum(r.usage.cache_read for r in records) / prompt
    every = len(records) / compactions if compactions else float("inf")
    unexplained = unexplained_drops(events)
    return [
        {
            "name": f"session length (loop run took {run_seconds:.1f} s)",
            "value": len(records),
            "unit": "steps",
            "target": "2,000 steps",
            "ok": len(records) == STEPS,
        },
        {
            "name": f"compactions ({POLICY.budget_tokens:,}-token budget, {POLICY.keep_recent_tokens:,} kept)",
            "value": round(every, 1),
            "unit": "steps per compaction",
            "target": "~200 steps (150..250)",
            "ok": 150 <= every <= 250,
        },
        {
            "name": f"verify throughput, {report.checked:,} requests + {compactions} compaction rechecks (one core)",
            "value": round(rate),
            "unit": "requests/s",
            "target": ">= 2,000 requests/s, all match",
            "ok": rate >= 2000 and report.ok,
        },
        {
            "name": "reference: rebuild + full re-serialization of every body (no byte reuse)",
            "value": round(full_rate),
            "unit": "requests/s",
            "target": "(reference)",
            "ok": True,
        },
        {
            "name": "emulated cache-read ratio over all steps (cache-read / prompt tokens)",
            "value": round(ratio, 3),
            "unit": "ratio",
            "target": ">= 0.85",
            "ok": ratio >= 0.85,
        },
        {
            "name": "cache-read drops the log does not explain",
            "value": unexplained,
            "unit": "drops",
            "target": "0",
            "ok": unexplained == 0,
        },
    ]


if __name__ == "__main__":
    for row in run():
        print(f"{row['name']}: {row['value']} {row['unit']} (target {row['target']}) {'OK' if row['ok'] else 'MISS'}")
