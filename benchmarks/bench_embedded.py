"""The embedded default: SQLite append throughput and the cost of deriving messages after one more event.

Targets (issue 2):

* Embedded append: 100,000 events in batches of 10 at >= 50,000 events/s.
* ``Session.derive_messages()`` after one more event costs the same on a 10,000-event session as on a
  1,000-event session (ratio <= 1.5).
"""

from __future__ import annotations

import gc
import statistics
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from foldline.adapters.sqlite_log import SqliteEventLog
from foldline.core import (
    AssistantMessage,
    CallConfig,
    Envelope,
    EventData,
    RequestHeader,
    Session,
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
    encode_event,
    make_header,
)

__all__ = ["run", "session_events"]

APPEND_EVENTS = 100_000
BATCH = 10
APPEND_RUNS = 5
APPEND_TARGET = 50_000.0
RATIO_TARGET = 1.5
T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z; events carry explicit times, the benchmark never reads a clock for them

_HEADER = make_header(CallConfig("anthropic", "claude-bench", max_tokens=1024), "You are a careful coding agent.")
_TEXT = "Please look at the failing test in the parser module and explain what changed since yesterday. " * 2


def _turn(turn: int, seq: int, call_base: int) -> Iterator[EventData]:
    """One realistic turn: a user question, a tool round trip, an answer (~200 bytes per event encoded)."""
    call_id = f"toolu_{call_base:012d}"
    args = '{"path":"src/parser/grammar.py","start_line":120,"end_line":180}'
    yield TurnStart(turn)
    yield StepStart(turn, 0)
    yield UserMessage(f"msg_user_{turn:08d}", (TextBlock(_TEXT[: 150 + turn % 40]),), "user")
    yield AssistantMessage(
        f"msg_asst_{seq:08d}", (ToolCallBlock(call_id, "read_file", args),), Usage(1800, 60, 1700, 0), "tool_use"
    )
    yield ToolCall(turn, 0, call_id, "read_file", args)
    yield ToolResult(call_id, "read_file", (TextBlock("def parse(tokens):\n    return Grammar(tokens).run()\n" * 2),))
    yield StepEnd(turn, 0)
    yield StepStart(turn, 1)
    yield AssistantMessage(
        f"msg_asst_{seq + 8:08d}",
        (
            TextBlock(
                "The grammar now rejects trailing commas; the test feeds one on line 42. " + "x" * (20 + turn % 30)
            ),
        ),
        Usage(1900, 80, 1750, 40),
        "end_turn",
    )
    yield StepEnd(turn, 1)
    yield TurnEnd(turn, "completed")


def session_events(n: int) -> list[Envelope]:
    """A valid session log of exactly ``n`` events: a header, then realistic turns (cut at ``n``)."""
    events: list[Envelope] = [Envelope(0, T0, RequestHeader(_HEADER, "initial"))]
    turn = 0
    while len(events) < n:
        for data in _turn(turn, len(events), turn):
            if len(events) == n:
                break
            seq = len(events)
            events.append(Envelope(seq, T0 + seq * 37, data))
        turn += 1
    return events


def _append_rate(sessions: int, total: int) -> tuple[float, float]:
    """Append ``total`` events spread over ``sessions`` sessions in batches of 10; (events/s, mean bytes)."""
    per_session = total // sessions
    log_events = session_events(per_session)  # the same valid log under every session id
    batches = [log_events[i : i + BATCH] for i in range(0, per_session, BATCH)]
    mean_bytes = statistics.fmean(len(encode_event(e)) for e in log_events)
    with tempfile.TemporaryDirectory(prefix="foldline-bench-") as tmp, SqliteEventLog(Path(tmp)) as log:
        ids = [f"session-{i:04d}" for i in range(sessions)]
        gc.collect()
        start = time.perf_counter()
        for batch in batches:  # round-robin: every session advances one batch at a time
            expected = batch[0].seq
            for sid in ids:
                log.append(sid, expected, batch)
        elapsed = time.perf_counter() - start
        assert sum(log.head(sid) for sid in ids) == per_session * sessions
    return per_session * sessions / elapsed, mean_bytes


def _derive_after_one_more_us(size: int, reps: int = 3000, rebuild_every: int = 100) -> float:
    """Median µs of (append one more surface event to a ``size``-event Session + derive_messages()).

    The session is rebuilt from ``size`` events every ``rebuild_every`` repetitions, so it never grows
    by more than that while measured.
    """
    base = session_events(size)
    samples: list[int] = []
    perf = time.perf_counter_ns
    while len(samples) < reps:
        session = Session("bench", base)
        session.derive_messages()  # warm: the cache is built as a live loop would have it
        gc.collect()
        for i in range(rebuild_every):
            seq = session.next_seq
            data: EventData = (
                UserMessage(f"msg_inject_{seq}", (TextBlock(_TEXT[:150]),), "inject")
                if i % 2 == 0
                else AssistantMessage(f"msg_asst_{seq}", (TextBlock(_TEXT[:150]),), Usage(10, 5, 0, 0), "end_turn")
            )
            event = Envelope(seq, T0 + seq * 37, data)
            t = perf()
            session.append(event)
            messages = session.derive_messages()
            samples.append(perf() - t)
            assert len(messages) > 0
    return statistics.median(samples) / 1000.0


def run() -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for sessions in (1, 100):
        runs = [_append_rate(sessions, APPEND_EVENTS) for _ in range(APPEND_RUNS)]
        rate = statistics.median(r for r, _ in runs)
        mean_bytes = runs[0][1]
        rows.append(
            {
                "name": f"SQLite append, {APPEND_EVENTS:,} events (mean {mean_bytes:.0f} B) in batches of {BATCH}, "
                f"{sessions} session{'s' if sessions > 1 else ''}; median of {APPEND_RUNS} runs "
                f"(min {min(r for r, _ in runs):,.0f}, max {max(r for r, _ in runs):,.0f})",
                "value": round(rate),
                "unit": "events/s",
                "target": f"≥ {APPEND_TARGET:,.0f} events/s",
                "ok": rate >= APPEND_TARGET,
            }
        )
    small = _derive_after_one_more_us(1_000)
    large = _derive_after_one_more_us(10_000)
    ratio = large / small
    rows += [
        {
            "name": "append 1 event + derive_messages(), 1,000-event session (median)",
            "value": round(small, 2),
            "unit": "µs",
            "target": "reported (ratio below)",
            "ok": True,
        },
        {
            "name": "append 1 event + derive_messages(), 10,000-event session (median)",
            "value": round(large, 2),
            "unit": "µs",
            "target": "reported (ratio below)",
            "ok": True,
        },
        {
            "name": "derive_messages() cost ratio, 10,000 vs 1,000 events",
            "value": round(ratio, 3),
            "unit": "x",
            "target": f"≤ {RATIO_TARGET}",
            "ok": ratio <= RATIO_TARGET,
        },
    ]
    return rows


if __name__ == "__main__":  # pragma: no cover
    for row in run():
        print(row)
