"""The embedded default at scale, through the ``foldline`` command as a user runs it.

Targets (issue 18):

* ``foldline import`` of a 200 MB export: at most 300 MB peak memory (the process's maximum resident set)
  and at least 20 MB/s (file bytes over the command's wall time, interpreter start included).
* The database it leaves is at most 1.5x the bytes of the events it holds (every file of the log).
* ``foldline show`` of a 100,000-event session starts printing within 1 s (from starting the process to
  its first line), and prints the whole session.

Each command runs in its own process (``python -m foldline.cli``), as a user would run it; the export
files are written here, deterministically, with the events a long tool-using session logs.
"""

from __future__ import annotations

import hashlib
import os
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

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
    encode_event,
    make_header,
)
from foldline.export import ExportHeader

__all__ = ["run", "session_turns", "write_export"]

IMPORT_BYTES = 200_000_000
IMPORT_MEMORY_TARGET_MB = 300.0
IMPORT_RATE_TARGET_MB_S = 20.0
SIZE_RATIO_TARGET = 1.5
SHOW_EVENTS = 100_000
SHOW_FIRST_LINE_TARGET_S = 1.0
T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z

_HEADER = make_header(CallConfig("anthropic", "claude-bench", max_tokens=4096), "You are a careful coding agent. " * 40)
_PROSE = (
    "the parser rejects trailing commas since yesterday so the fixture on line forty two fails and the grammar "
    "module needs a look at how tokens are split before the run method is called again with the new input"
)
_WORDS = _PROSE.split(" ")
_CORPUS = " ".join(random.Random(7).choices(_WORDS, k=40_000))


def _text(rng: random.Random, size: int) -> str:
    """``size`` characters of prose-like text (a window of a fixed word stream)."""
    start = rng.randrange(0, len(_CORPUS) - size - 1)
    return _CORPUS[start : start + size]


def session_turns(rng: random.Random, *, small: bool = False) -> Iterator[EventData]:
    """The events of an endless tool-using session; ``small``: short texts (about 200-byte events)."""
    yield RequestHeader(_HEADER, "initial")
    turn = call = 0
    while True:
        yield TurnStart(turn)
        steps = rng.randint(1, 4)
        for step in range(steps):
            yield StepStart(turn, step)
            if step == 0:
                yield UserMessage(f"msg_user_{turn:08d}", (TextBlock(_text(rng, rng.randint(60, 400))),), "user")
            if step < steps - 1:
                call_id = f"toolu_{call:016d}"
                call += 1
                args = f'{{"path":"src/module_{rng.randint(0, 999)}.py","start":{rng.randint(1, 900)}}}'
                yield AssistantMessage(
                    f"msg_asst_{turn:06d}_{step}",
                    (ToolCallBlock(call_id, "read_file", args),),
                    Usage(1800, 60, 1700, 0),
                    "tool_use",
                )
                yield ToolCall(turn, step, call_id, "read_file", args)
                # tool output: mostly a few hundred bytes to a few KB, sometimes a whole file
                size = rng.randint(80, 300) if small else int(min(24_000, rng.lognormvariate(7.2, 1.0)))
                yield ToolResult(call_id, "read_file", (TextBlock(_text(rng, size)),))
            else:
                size = rng.randint(60, 200) if small else rng.randint(200, 2400)
                yield AssistantMessage(
                    f"msg_asst_{turn:06d}_{step}", (TextBlock(_text(rng, size)),), Usage(1900, 80, 1750, 40), "end_turn"
                )
            yield StepEnd(turn, step)
        yield TurnEnd(turn, "completed")
        turn += 1


def write_export(path: Path, session_id: str, *, min_bytes: int = 0, events: int = 0, small: bool = False) -> int:
    """Write an export of one session with at least ``min_bytes`` of event lines or exactly ``events``
    events (ending on a turn/end when sized by bytes); returns the event bytes written."""
    rng = random.Random(18)
    hasher = hashlib.sha256()
    body = path.with_suffix(".body")
    total = count = 0
    with body.open("wb") as out:
        for data in session_turns(rng, small=small):
            line = encode_event(Envelope(count, T0 + count * 250, data)) + b"\n"
            out.write(line)
            hasher.update(line)
            total += len(line)
            count += 1
            if events and count == events:
                break
            if not events and total >= min_bytes and isinstance(data, TurnEnd):
                break
    header = ExportHeader(session_id, count, "sha256:" + hasher.hexdigest()).to_line()
    with path.open("wb") as out, body.open("rb") as src:
        out.write(header)
        while chunk := src.read(1 << 20):
            out.write(chunk)
    body.unlink()
    return total


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "foldline.cli", *args]


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FOLDLINE_")}
    env["COLUMNS"] = "120"
    return env


def _run_measured(args: list[str]) -> tuple[float, float, bytes]:
    """Run a command; (wall seconds, peak resident MB, stderr)."""
    start = time.perf_counter()
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=_env())
    assert proc.stderr is not None
    err = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    elapsed = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(args[3:])} exited {proc.returncode}: {err.decode(errors='replace')[-500:]}")
    return elapsed, usage.ru_maxrss / 1024, err


def _first_line(args: list[str]) -> tuple[float, float, int]:
    """Run a command reading its stdout; (seconds to its first line, seconds to its end, lines)."""
    start = time.perf_counter()
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_env())
    assert proc.stdout is not None
    assert proc.stderr is not None
    proc.stdout.readline()
    first = time.perf_counter() - start
    lines = 1 + sum(1 for _ in proc.stdout)
    err = proc.stderr.read()
    if proc.wait() != 0:
        raise RuntimeError(f"{' '.join(args[3:])} exited {proc.returncode}: {err.decode(errors='replace')[-500:]}")
    return first, time.perf_counter() - start, lines


def _log_bytes(data_dir: Path) -> int:
    return sum(p.stat().st_size for p in data_dir.glob("log.sqlite3*"))


def run() -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="foldline-bench-cli-") as tmp:
        root = Path(tmp)
        big = root / "big.jsonl"
        event_bytes = write_export(big, "big", min_bytes=IMPORT_BYTES)
        size = big.stat().st_size
        data = root / "data"
        seconds, peak_mb, _ = _run_measured(_cli("import", str(big), "--data-dir", str(data)))
        rate = size / 1e6 / seconds
        ratio = _log_bytes(data) / event_bytes
        rows += [
            {
                "name": f"foldline import of a {size / 1e6:.0f} MB export: peak resident memory of the process",
                "value": round(peak_mb, 1),
                "unit": "MB",
                "target": f"≤ {IMPORT_MEMORY_TARGET_MB:.0f} MB",
                "ok": peak_mb <= IMPORT_MEMORY_TARGET_MB,
            },
            {
                "name": f"foldline import of a {size / 1e6:.0f} MB export: throughput (took {seconds:.1f} s, "
                "interpreter start included)",
                "value": round(rate, 1),
                "unit": "MB/s",
                "target": f"≥ {IMPORT_RATE_TARGET_MB_S:.0f} MB/s",
                "ok": rate >= IMPORT_RATE_TARGET_MB_S,
            },
            {
                "name": f"database size after the import: {_log_bytes(data) / 1e6:.0f} MB of log files for "
                f"{event_bytes / 1e6:.0f} MB of events",
                "value": round(ratio, 3),
                "unit": "x",
                "target": f"≤ {SIZE_RATIO_TARGET}x",
                "ok": ratio <= SIZE_RATIO_TARGET,
            },
        ]
        big.unlink()

        long = root / "long.jsonl"
        write_export(long, "long", events=SHOW_EVENTS, small=True)
        _run_measured(_cli("import", str(long), "--data-dir", str(data)))
        first, total, lines = _first_line(_cli("show", "long", "--data-dir", str(data)))
        seconds, peak_mb, _ = _run_measured(_cli("show", "long", "--data-dir", str(data)))
        rows += [
            {
                "name": f"foldline show of a {SHOW_EVENTS:,}-event session: first line printed after (whole "
                f"session: {lines:,} lines in {total:.1f} s)",
                "value": round(first, 3),
                "unit": "s",
                "target": f"≤ {SHOW_FIRST_LINE_TARGET_S:g} s",
                "ok": first <= SHOW_FIRST_LINE_TARGET_S and lines == SHOW_EVENTS + 1,
            },
            {
                "name": f"foldline show of a {SHOW_EVENTS:,}-event session: peak resident memory (streamed)",
                "value": round(peak_mb, 1),
                "unit": "MB",
                "target": "(reference)",
                "ok": True,
            },
        ]
    return rows


if __name__ == "__main__":  # pragma: no cover
    for row in run():
        print(row)
