"""The agent loop as a user gets it: per-step cost against session length, verify throughput, cache reuse.

The loop runs its default configuration — ``AgentOptions`` defaults: the invariant companion on, with its
fresh rebuilds from a full read as shipped (at load, after a surface replace, and each time the session
has doubled) — on the embedded SQLite log. Each session
runs in a fresh interpreter (:mod:`benchmarks.loop_session`), so nothing another benchmark left on the heap
makes a garbage collection dearer and the peak RSS is the session's own. A step is one model call: the
system prompt and tools of ``foldline demo``, a provider that answers at once with four tool rounds and
then text. Per step: wall time excluding the provider call, and the time the garbage collector ran inside
it (``gc.callbacks``). Sessions of 50, 500, 1,000 and 5,000 steps, five of each, interleaved on this
shared machine; each figure is the median of the five, with the spread. Beside every default figure the
same session with ``invariant=False``, as a reference (never instead).

Targets:

* p50 per-step overhead (last 40 steps) <= 400 us on a 1,000-step session, invariant on.
* p50 on a 5,000-step session <= 1.5x the p50 on a 50-step session, invariant on.

Also: ``foldline verify`` >= 2,000 requests/s on one core for 100-step sessions; emulated
cache-read ratio over steps 2..K of ``foldline demo`` with K >= 20 >= 0.9.

    python -m benchmarks.run loop
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from foldline.adapters.sqlite_log import SqliteEventLog
from foldline.config import Config
from foldline.core import CallConfig
from foldline.demo import SYSTEM_PROMPT, demo_toolset, run_demo_cli
from foldline.loop import Agent, AgentOptions
from foldline.providers.emulated import emulated_provider
from foldline.providers.emulator import Emulator, ToolLoopScript
from foldline.replay.invariant import DEFAULT_FRESH_GROWTH, DEFAULT_FULL_CHECK_EVERY
from foldline.replay.verify import verify_events

from .loop_session import spawn
from .vs_langgraph.measure import Window, window
from .vs_langgraph.shape import DEFAULT_TAIL

__all__ = ["RUNS", "SIZES", "run"]

SIZES = (50, 500, 1000, 5000)
RUNS = 5
EMULATOR_RUNS = 3  # ~10 s each: the emulator parses every body
TARGET_LENGTH = 1000
TARGET_P50_US = 400.0
TARGET_GROWTH = 1.5
VERIFY_TARGET = 2000.0
DEFAULT = f"default configuration (invariant on, fresh rebuild each time the session grew {DEFAULT_FRESH_GROWTH:g}x" + (
    f" and every {DEFAULT_FULL_CHECK_EVERY}th step)" if DEFAULT_FULL_CHECK_EVERY else ")"
)


def _spread(values: list[float], unit: str, digits: int = 0) -> str:
    return f"spread {min(values):,.{digits}f}..{max(values):,.{digits}f} {unit}"


def _reference(name: str, value: float, unit: str) -> dict[str, Any]:
    return {"name": name, "value": value, "unit": unit, "target": "(reference)", "ok": True}


def _size_rows(n: int, on: list[dict[str, Any]], off: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], float]:
    """The rows of one session length; also its default-configuration p50 (us)."""
    won: list[Window] = [window(r, n) for r in on]
    woff: list[Window] = [window(r, n) for r in off]
    p50s = [w.p50_us for w in won]
    p50 = statistics.median(p50s)
    pooled = sorted(us for r in on for us in r["step_us"][n - DEFAULT_TAIL : n])
    p99 = statistics.quantiles(pooled, n=100, method="inclusive")[98]
    means = [statistics.fmean(r["step_us"][1:]) for r in on]  # the first step also pays the imports
    gc_shares = [100 * w.gc_share for w in won]
    off_p50s = [w.p50_us for w in woff]
    rss = [r["memory"]["peak_rss"] / 2**20 for r in on]
    heap = [r["memory"]["heap"] / 2**20 for r in on]
    off_rss = statistics.median(r["memory"]["peak_rss"] / 2**20 for r in off)
    off_heap = statistics.median(r["memory"]["heap"] / 2**20 for r in off)
    session = f"{n:,}-step session"
    runs = f"median of {len(on)} runs"
    first = {
        "name": f"loop overhead per step excl. provider call, {DEFAULT}, {session}: p50 of the last "
        f"{DEFAULT_TAIL} steps ({runs}; {_spread(p50s, 'us')})",
        "value": round(p50, 1),
        "unit": "us",
        "target": f"<= {TARGET_P50_US:g} us" if n == TARGET_LENGTH else "(reference)",
        "ok": p50 <= TARGET_P50_US if n == TARGET_LENGTH else True,
    }
    rows = [
        first,
        _reference(
            f"same, {session}: p99 of the last {DEFAULT_TAIL} steps of the {len(on)} runs pooled ({len(pooled)} steps)",
            round(p99, 1),
            "us",
        ),
        _reference(
            f"same, {session}: mean over steps 2..{n:,}, fresh rebuilds included ({runs}; {_spread(means, 'us')})",
            round(statistics.median(means), 1),
            "us",
        ),
        _reference(
            f"same, {session}: share of the last {DEFAULT_TAIL} steps' time spent in garbage collection "
            f"({runs}; {_spread(gc_shares, '%', 1)})",
            round(statistics.median(gc_shares), 1),
            "%",
        ),
        _reference(
            f"same, {session}: peak RSS of the session's process ({runs}; invariant off: {off_rss:.1f} MiB)",
            round(statistics.median(rss), 1),
            "MiB",
        ),
        _reference(
            f"same, {session}: heap in use at the end (pymalloc blocks + malloc'd bytes; {runs}; "
            f"invariant off: {off_heap:.1f} MiB)",
            round(statistics.median(heap), 1),
            "MiB",
        ),
        _reference(
            f"reference: invariant off, {session}: p50 of the last {DEFAULT_TAIL} steps "
            f"({runs}; {_spread(off_p50s, 'us')})",
            round(statistics.median(off_p50s), 1),
            "us",
        ),
    ]
    return rows, p50


async def _verify_sessions(log: SqliteEventLog, sessions: int, steps: int) -> None:
    """``sessions`` sessions of ``steps`` emulator-answered steps (five per turn), through ``run_turn``."""
    options = AgentOptions(
        config=CallConfig("anthropic", "claude-emulated", max_tokens=512), system=SYSTEM_PROMPT, tools=demo_toolset()
    )
    for i in range(sessions):
        provider = emulated_provider(emulator=Emulator(ToolLoopScript(tool_steps=4)))
        agent = Agent(f"v{i}", log, provider, options)
        done = 0
        while done < steps:
            done += len((await agent.run_turn(f"question {done}")).steps)
        await provider.aclose()


def _verify_row() -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        log = SqliteEventLog(Path(tmp))
        asyncio.run(_verify_sessions(log, 5, 100))
        logs = {sid: log.read(sid) for sid in log.sessions()}
        log.close()
    rates: list[float] = []
    checked = 0
    for _ in range(RUNS):
        t = time.perf_counter()
        checked = 0
        for sid, events in logs.items():
            report = verify_events(sid, events)
            assert report.ok, f"verify found a mismatch in {sid}"
            checked += report.checked
        rates.append(checked / (time.perf_counter() - t))
    rate = statistics.median(rates)
    return {
        "name": f"verify throughput, {checked} requests in 100-step sessions, one core "
        f"(median of {RUNS} runs; {_spread(rates, 'requests/s')})",
        "value": round(rate),
        "unit": "requests/s",
        "target": f">= {VERIFY_TARGET:,.0f} requests/s",
        "ok": rate >= VERIFY_TARGET,
    }


def run() -> list[dict[str, Any]]:
    on: dict[int, list[dict[str, Any]]] = {n: [] for n in SIZES}
    off: dict[int, list[dict[str, Any]]] = {n: [] for n in SIZES}
    emulated: list[dict[str, Any]] = []
    for round_ in range(RUNS):  # interleaved, so that load on the machine falls on every size alike
        for n in SIZES:
            on[n].append(spawn(n))
            off[n].append(spawn(n, invariant=False))
        if round_ < EMULATOR_RUNS:
            emulated.append(spawn(500, emulator=True))

    rows: list[dict[str, Any]] = []
    p50: dict[int, float] = {}
    for n in SIZES:
        size_rows, p50[n] = _size_rows(n, on[n], off[n])
        rows += size_rows
    growth = p50[SIZES[-1]] / p50[SIZES[0]]
    rows.append(
        {
            "name": f"loop overhead growth, {DEFAULT}: p50 at {SIZES[-1]:,} steps / p50 at {SIZES[0]} steps",
            "value": round(growth, 2),
            "unit": "x",
            "target": f"<= {TARGET_GROWTH:g}x",
            "ok": growth <= TARGET_GROWTH,
        }
    )
    em = [window(r, 500).p50_us for r in emulated]
    rows.append(
        _reference(
            f"loop overhead per step, {DEFAULT}, 500-step session with the in-process HTTP emulator answering "
            f"(its parsing evicts CPU caches): p50 of the last {DEFAULT_TAIL} steps (median of {EMULATOR_RUNS} runs; "
            f"{_spread(em, 'us')})",
            round(statistics.median(em), 1),
            "us",
        )
    )
    rows.append(_verify_row())
    with tempfile.TemporaryDirectory() as tmp:
        result = run_demo_cli(
            Config(data_dir=Path(tmp) / "demo", backend="embedded"), sessions=4, steps=24, fresh=True, quiet=True
        )
    demo_ratio = result.cache_read_ratio()
    rows.append(
        {
            "name": "emulated cache-read ratio over steps 2..24 of `foldline demo` (4 sessions)",
            "value": round(demo_ratio, 3),
            "unit": "ratio",
            "target": ">= 0.9",
            "ok": demo_ratio >= 0.9 and result.verified_ok,
        }
    )
    return rows


if __name__ == "__main__":
    for row in run():
        print(f"{row['name']}: {row['value']} {row['unit']} (target {row['target']}) {'OK' if row['ok'] else 'MISS'}")
