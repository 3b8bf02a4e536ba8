"""What both sides measure, the same way: garbage-collection time, database growth, memory, windows.

Standard library only (the LangGraph side imports it in an environment without foldline).
"""

from __future__ import annotations

import ctypes
import os
import re
import resource
import sqlite3
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .shape import DEFAULT_TAIL

__all__ = ["GcClock", "Window", "db_size", "heap_bytes", "memory", "window"]


class GcClock:
    """Accumulates the wall time of every garbage collection; register it in ``gc.callbacks``."""

    def __init__(self) -> None:
        self.ns = 0
        self.collections = 0
        self._start = 0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._start = time.perf_counter_ns()
        else:
            self.ns += time.perf_counter_ns() - self._start
            self.collections += 1


def db_size(path: Path) -> int:
    """Bytes of the SQLite database at ``path`` plus its WAL, after a ``TRUNCATE`` checkpoint."""
    db = sqlite3.connect(str(path), timeout=30)
    try:
        for _ in range(100):
            busy, _log, _done = db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
            if not busy:
                break
            time.sleep(0.01)
    finally:
        db.close()
    wal = path.with_name(path.name + "-wal")
    return path.stat().st_size + (wal.stat().st_size if wal.exists() else 0)


class _MallInfo2(ctypes.Structure):
    _NAMES = "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost"
    _fields_ = [(name, ctypes.c_size_t) for name in _NAMES.split()]


def heap_bytes() -> int:
    """Heap in use now: pymalloc's allocated blocks (objects up to 512 bytes, from ``sys._debugmallocstats``)
    plus the bytes glibc's malloc has handed out (larger objects, SQLite's page cache, other C code)."""
    with tempfile.TemporaryFile() as out:
        sys.stderr.flush()
        saved = os.dup(2)
        os.dup2(out.fileno(), 2)
        try:
            sys._debugmallocstats()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        out.seek(0)
        stats = out.read().decode("utf-8", "replace")
    found = re.search(r"# bytes in allocated blocks\s*=\s*([\d,]+)", stats)
    small = int(found.group(1).replace(",", "")) if found else 0
    mallinfo2 = ctypes.CDLL(None).mallinfo2
    mallinfo2.restype = _MallInfo2
    info = mallinfo2()
    return small + int(info.uordblks) + int(info.hblkhd)


def memory() -> dict[str, int]:
    """Peak RSS of this process and the heap in use now, in bytes."""
    return {"peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, "heap": heap_bytes()}


@dataclass(frozen=True, slots=True)
class Window:
    """The figures of one session at one length: its last ``tail`` steps before that length."""

    p50_us: float
    p99_us: float
    gc_share: float  # garbage collection's share of the window's wall time
    bytes_per_step: float | None  # growth of the database per step over the window, when it was measured


def window(result: dict[str, Any], length: int, tail: int = DEFAULT_TAIL) -> Window:
    """The window of a session result (either side's JSON) ending at ``length`` steps."""
    steps: list[float] = result["step_us"][length - tail : length]
    gcs: list[float] = result["gc_us"][length - tail : length]
    if len(steps) != tail:
        raise ValueError(f"the session ran {len(result['step_us'])} steps; no {tail}-step window ends at {length}")
    sizes = result["db_bytes"].get(str(length))
    per_step = (sizes[1] - sizes[0]) / tail if sizes is not None and len(sizes) == 2 else None
    p99 = statistics.quantiles(steps, n=100, method="inclusive")[98]
    return Window(statistics.median(steps), p99, sum(gcs) / sum(steps), per_step)
