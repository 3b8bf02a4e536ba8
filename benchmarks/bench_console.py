"""The operator console at scale: its pages as the server builds them, in a process of their own.

Targets (issue 32):

* the page of a 5,000-step session served in at most 300 ms p50 (server side: the request through the ASGI
  app, the page brought up to the log's head and rendered);
* a page of the sessions list over 10,000 sessions in at most 200 ms p50 (each page a different one of the
  list's sorts and filters, the index brought up to the log's heads first);
* the console process's memory stated: its peak resident set once it has served both.

The data directory is written here, deterministically, on the embedded default (SQLite): 10,000 sessions of
two turns of tool-using steps (each step's ``request/dispatch`` and answer with its usage, so every step is
classified and priced as the console classifies and prices it), and one session of 5,000 such steps. The price
table is the shipped one with rows for the ``claude-bench*`` models (:func:`bench_prices`); ``gpt-bench`` has no
price, so a third of the sessions are of unknown cost, as a fleet with a model missing from the table has. The
measuring process (``python -m benchmarks.bench_console measure DIR``) opens the stores read-only as
``foldline console`` does, so its resident set is the console's; beside each p50 is the first, cold, request (the
index's first read of every session; the session's page folded from its whole log).

    python -m benchmarks.bench_console
"""

from __future__ import annotations

import hashlib
import json
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

from foldline.adapters.sqlite_log import SqliteEventLog
from foldline.core import (
    AssistantMessage,
    CallConfig,
    Envelope,
    EventData,
    RequestHeader,
    StepEnd,
    StepStart,
    TextBlock,
    ToolCall,
    ToolCallBlock,
    ToolResult,
    TurnEnd,
    TurnStart,
    Usage,
    UserMessage,
    make_header,
)
from foldline.core.cost import PriceRow, PriceTable
from foldline.core.events import RequestDispatch

__all__ = ["run", "session_events"]

SESSIONS = 10_000
LONG_STEPS = 5_000
SESSION_TARGET_MS = 300.0
LIST_TARGET_MS = 200.0
REQUESTS = 25
T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z
MODELS = ("claude-bench", "claude-bench-small", "gpt-bench")
LIST_QUERIES: tuple[dict[str, str], ...] = (
    {},
    {"sort": "cost"},
    {"sort": "drops"},
    {"sort": "drop-cost", "order": "asc"},
    {"model": "gpt-bench"},
    {"status": "completed", "page": "7"},
    {"unexplained": "1"},
    {"min_cost": "0.02", "max_cost": "0.025"},
    {"q": "bench-00042"},
    {"per_page": "200", "page": "3"},
)


def session_events(rng: random.Random, model: str, steps: int, *, start_ms: int) -> Iterator[Envelope]:
    """A tool-using session of ``steps`` steps (four to a turn), each dispatched and answered with its usage."""
    header = make_header(CallConfig("anthropic", model, max_tokens=4096), "You are a careful coding agent. " * 20)
    seq = 0

    def one(data: EventData) -> Envelope:
        nonlocal seq
        env = Envelope(seq, start_ms + seq * 200, data)
        seq += 1
        return env

    yield one(RequestHeader(header, "initial"))
    context = 1500
    done = turn = 0
    while done < steps:
        yield one(TurnStart(turn))
        in_turn = min(4, steps - done)
        for step in range(in_turn):
            yield one(StepStart(turn, step))
            if step == 0:
                yield one(
                    UserMessage(f"msg_user_{turn:06d}", (TextBlock(f"turn {turn}: read the next module"),), "user")
                )
            digest = "sha256:" + hashlib.sha256(f"{model}/{turn}/{step}/{context}".encode()).hexdigest()
            yield one(RequestDispatch(turn, step, "anthropic-messages", 1, digest, context * 4))
            dropped = rng.random() < 0.02  # now and then the cache is not read: a drop, most of them unexplained
            usage = Usage(40, 60, 0 if dropped else context, 300 if not dropped else context + 300)
            context += 360
            if step < in_turn - 1:
                call_id = f"toolu_{turn:06d}_{step}"
                args = f'{{"path":"src/module_{rng.randint(0, 999)}.py"}}'
                yield one(
                    AssistantMessage(f"msg_{turn}_{step}", (ToolCallBlock(call_id, "read", args),), usage, "tool_use")
                )
                yield one(ToolCall(turn, step, call_id, "read", args))
                yield one(ToolResult(call_id, "read", (TextBlock("def f():\n    return 1\n" * 8),)))
            else:
                yield one(AssistantMessage(f"msg_{turn}_{step}", (TextBlock("Done."),), usage, "end_turn"))
            yield one(StepEnd(turn, step))
            done += 1
        yield one(TurnEnd(turn, "completed"))
        turn += 1


def write_data(root: Path) -> None:
    rng = random.Random(32)
    with SqliteEventLog(root) as log:
        for i in range(SESSIONS):
            model = MODELS[i % len(MODELS)]
            log.create(f"bench-{i:05d}", list(session_events(rng, model, 8, start_ms=T0 + i * 37_000)))
        log.create("bench-long", list(session_events(rng, MODELS[0], LONG_STEPS, start_ms=T0)))


def _timed(client: Any, path: str, params: dict[str, str]) -> float:
    started = time.perf_counter()
    answer = client.get(path, params=params)
    elapsed = (time.perf_counter() - started) * 1000
    if answer.status_code != 200:
        raise RuntimeError(f"GET {path} {params}: {answer.status_code} {answer.text[:300]}")
    return elapsed


def bench_prices() -> PriceTable:
    """The shipped price table with the ``claude-bench*`` models priced (``gpt-bench`` left without a price)."""
    from foldline.config.prices import load_price_table

    rates = {"input": "3", "cache-read": "0.3", "cache-write-5m": "3.75", "output": "15"}
    rows = [
        PriceRow("anthropic", "claude-bench*", cls, Decimal(rate), "USD", "2025-01-01", "benchmark")
        for cls, rate in rates.items()
    ]
    return load_price_table().merged(rows)


def measure(root: Path) -> dict[str, Any]:
    """In this process: the console's app over ``root``, each page timed through it (run in a child process)."""
    from starlette.testclient import TestClient

    from foldline.config import Config, open_stores
    from foldline.console.app import create_app
    from foldline.console.data import ConsoleData

    data = ConsoleData(open_stores(Config(data_dir=root), read_only=True), bench_prices(), min_refresh_s=0.0)
    try:
        with TestClient(create_app(data), base_url="http://127.0.0.1") as client:
            list_cold = _timed(client, "/sessions", {})
            lists = [_timed(client, "/sessions", LIST_QUERIES[i % len(LIST_QUERIES)]) for i in range(REQUESTS * 2)]
            session_cold = _timed(client, "/session", {"id": "bench-long"})
            sessions = [_timed(client, "/session", {"id": "bench-long"}) for _ in range(REQUESTS)]
            steps = len(data.page("bench-long").steps)
            listed = len(data.index)
    finally:
        data.close()
    return {
        "list_cold_ms": list_cold,
        "list_p50_ms": statistics.median(lists),
        "session_cold_ms": session_cold,
        "session_p50_ms": statistics.median(sessions),
        "steps": steps,
        "sessions": listed,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def run() -> list[dict[str, Any]]:
    with tempfile.TemporaryDirectory(prefix="foldline-bench-console-") as tmp:
        root = Path(tmp) / "data"
        write_data(root)
        done = subprocess.run(
            [sys.executable, "-m", "benchmarks.bench_console", "measure", str(root)],
            capture_output=True,
            text=True,
            check=False,
            cwd=Path(__file__).resolve().parent.parent,
        )
        if done.returncode != 0:
            raise RuntimeError(f"the measuring process failed: {done.stderr[-3000:]}")
        m = json.loads(done.stdout.strip().splitlines()[-1])
    if m["steps"] != LONG_STEPS or m["sessions"] != SESSIONS + 1:
        raise RuntimeError(f"the console saw {m['steps']} steps and {m['sessions']} sessions")
    return [
        {
            "name": f"session page, {LONG_STEPS:,}-step session, p50 (server side)",
            "value": round(m["session_p50_ms"], 1),
            "unit": "ms",
            "target": f"<= {SESSION_TARGET_MS:g}",
            "ok": m["session_p50_ms"] <= SESSION_TARGET_MS,
        },
        {
            "name": "session page, first (cold) request",
            "value": round(m["session_cold_ms"], 1),
            "unit": "ms",
            "target": "stated",
            "ok": True,
        },
        {
            "name": f"sessions list, {SESSIONS:,} sessions, p50 per page",
            "value": round(m["list_p50_ms"], 1),
            "unit": "ms",
            "target": f"<= {LIST_TARGET_MS:g}",
            "ok": m["list_p50_ms"] <= LIST_TARGET_MS,
        },
        {
            "name": "sessions list, first (cold) page: the index reads every session",
            "value": round(m["list_cold_ms"], 1),
            "unit": "ms",
            "target": "stated",
            "ok": True,
        },
        {
            "name": "console process, peak resident set",
            "value": round(m["peak_rss_mb"], 1),
            "unit": "MB",
            "target": "stated",
            "ok": True,
        },
    ]


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "measure":
        print(json.dumps(measure(Path(sys.argv[2]))))
    else:
        for row in run():
            print(row)
