"""foldline's loop against LangGraph, side by side in one run: time per step and bytes per step.

Both systems run the same session (:mod:`benchmarks.vs_langgraph.shape`): one conversation, each step a
200-character user message and a 400-character answer from a model that answers at once, persisted to a
SQLite file on every step.

* **foldline** — the loop with ``AgentOptions`` defaults (the invariant companion on, its fresh rebuilds
  as shipped), on the embedded SQLite log; and the same with ``invariant=False`` as a reference.
  One step is ``Agent.run_turn(question)``. Run by :mod:`benchmarks.loop_session` in a fresh interpreter.
* **LangGraph** — a ``StateGraph`` with a messages state and one model node, compiled with
  ``SqliteSaver`` on a file (``synchronous=NORMAL``, foldline's durability); once with ``add_messages``
  (each checkpoint holds the whole list) and once with ``DeltaChannel`` (checkpoints hold the writes, with
  a snapshot every 100 updates). One step is ``graph.invoke({"messages": [question]})``. Run by
  :mod:`benchmarks.vs_langgraph.graph_session` in its own virtual environment (``.bench/langgraph``,
  created on first use from pinned requirements), so LangGraph's objects never share a heap — or a
  garbage collector — with foldline's.

Per step: wall time excluding the model call, p50 of the last 40 steps before a session length; bytes
added to the SQLite file (database plus WAL after a ``TRUNCATE`` checkpoint) per step over those 40
steps. Session lengths 50, 500 and 1,000, and 5,000 for foldline. LangGraph stops at 1,000: its cost per
step grows with the session, so a session costs O(n²) — 1,000 ``SqliteSaver`` steps take minutes and
leave a file of ~1.5 GB here, and 5,000 would take an hour and ~35 GB.

Each system runs three sessions, interleaved so that load on this shared machine falls on all of them:
foldline three of 5,000 steps, with the invariant on and with it off; LangGraph one of 1,000 and two of
500. A figure is the median over the sessions that reached its length (the row says how many). Writes the rows, plus
``docs/LOOP_VS_LANGGRAPH.md`` (tables) and ``docs/images/loop-vs-langgraph.png`` (drawn in the LangGraph
environment, which holds matplotlib).

Target: foldline, invariant on, >= 50x faster per step than ``SqliteSaver`` at 1,000 steps.

    python -m benchmarks.run langgraph
"""

from __future__ import annotations

import json
import statistics
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from .loop_session import spawn
from .run import machine_info
from .vs_langgraph import venv
from .vs_langgraph.measure import Window, window
from .vs_langgraph.shape import ANSWER_CHARS, DEFAULT_TAIL, QUESTION_CHARS

__all__ = ["LENGTHS", "SYSTEMS", "run"]

LENGTHS = (50, 500, 1000, 5000)
TARGET_LENGTH = 1000
TARGET_SPEEDUP = 50.0
DOC = venv.ROOT / "docs" / "LOOP_VS_LANGGRAPH.md"
PLOT = venv.ROOT / "docs" / "images" / "loop-vs-langgraph.png"

FOLDLINE_ON = "foldline, invariant on (default)"
FOLDLINE_OFF = "foldline, invariant off"
SQLITE_SAVER = "LangGraph SqliteSaver"
DELTA_CHANNEL = "LangGraph DeltaChannel"


@dataclass
class System:
    label: str
    sessions: tuple[int, ...]  # the length of each of its sessions, in run order
    start: Callable[[int], dict[str, Any]]  # runs one session of that many steps
    results: list[dict[str, Any]] = field(default_factory=list)

    def windows(self, length: int) -> list[Window]:
        return [window(r, length) for r in self.results if len(r["step_us"]) >= length]


def _foldline(invariant: bool) -> Callable[[int], dict[str, Any]]:
    def start(steps: int) -> dict[str, Any]:
        windows = tuple(n for n in LENGTHS if n <= steps)
        return spawn(steps, shape="chat", invariant=invariant, windows=windows)

    return start


def _langgraph(variant: str) -> Callable[[int], dict[str, Any]]:
    def start(steps: int) -> dict[str, Any]:
        python = venv.ensure()
        windows = ",".join(str(n) for n in LENGTHS if n <= steps)
        cmd = [str(python), "-m", "benchmarks.vs_langgraph.graph_session", "--steps", str(steps)]
        cmd += ["--variant", variant, "--windows", windows]
        done = subprocess.run(cmd, cwd=venv.ROOT, capture_output=True, text=True, timeout=3600, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} exited {done.returncode}: {done.stderr.strip()[-2000:]}")
        result: dict[str, Any] = json.loads(done.stdout)
        return result

    return start


SYSTEMS: tuple[System, ...] = (
    System(FOLDLINE_ON, (5000, 5000, 5000), _foldline(True)),
    System(FOLDLINE_OFF, (5000, 5000, 5000), _foldline(False)),
    System(SQLITE_SAVER, (1000, 500, 500), _langgraph("sqlite")),
    System(DELTA_CHANNEL, (1000, 500, 500), _langgraph("delta")),
)


def _runs(n: int) -> str:
    return "one run" if n == 1 else f"median of {n} runs"


def _spread_ms(values: list[float]) -> str:
    return "" if len(values) < 2 else f"; spread {min(values) / 1000:.3g}..{max(values) / 1000:.3g} ms"


def _figures(systems: tuple[System, ...]) -> dict[str, dict[int, dict[str, Any]]]:
    """label → length → {"p50_us", "bytes", "gc_share", "runs", "p50s"} (medians over the sessions)."""
    out: dict[str, dict[int, dict[str, Any]]] = {}
    for system in systems:
        per_length: dict[int, dict[str, Any]] = {}
        for length in LENGTHS:
            ws = system.windows(length)
            if not ws:
                continue
            sizes = [w.bytes_per_step for w in ws if w.bytes_per_step is not None]
            per_length[length] = {
                "p50_us": statistics.median(w.p50_us for w in ws),
                "p50s": [w.p50_us for w in ws],
                "bytes": statistics.median(sizes) if sizes else None,
                "gc_share": statistics.median(w.gc_share for w in ws),
                "runs": len(ws),
            }
        out[system.label] = per_length
    return out


def _rows(figures: dict[str, dict[int, dict[str, Any]]]) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for label, per_length in figures.items():
        for length, f in per_length.items():
            rows.append(
                {
                    "name": f"{label}, {length:,}-step session: wall time per step excl. model call, p50 of the "
                    f"last {DEFAULT_TAIL} steps ({_runs(f['runs'])}{_spread_ms(f['p50s'])})",
                    "value": round(f["p50_us"] / 1000, 3),
                    "unit": "ms",
                    "target": "(reference)",
                    "ok": True,
                }
            )
        for length, f in per_length.items():
            if f["bytes"] is not None:
                rows.append(
                    {
                        "name": f"{label}, {length:,}-step session: bytes added to the SQLite file per step "
                        f"(last {DEFAULT_TAIL} steps, {_runs(f['runs'])})",
                        "value": round(f["bytes"]),
                        "unit": "B",
                        "target": "(reference)",
                        "ok": True,
                    }
                )
    ours = figures[FOLDLINE_ON].get(TARGET_LENGTH)
    for other, target in ((SQLITE_SAVER, TARGET_SPEEDUP), (DELTA_CHANNEL, None)):
        theirs = figures[other].get(TARGET_LENGTH)
        if ours is None or theirs is None:
            raise RuntimeError(f"no {TARGET_LENGTH}-step figure for {FOLDLINE_ON} or {other}")
        speedup = theirs["p50_us"] / ours["p50_us"]
        rows.append(
            {
                "name": f"speed per step at {TARGET_LENGTH:,} steps, {FOLDLINE_ON} over {other} (same run)",
                "value": round(speedup, 1),
                "unit": "x",
                "target": f">= {target:g}x" if target is not None else "(reference)",
                "ok": target is None or speedup >= target,
            }
        )
    return rows


def _cell_ms(f: dict[str, Any] | None) -> str:
    if f is None:
        return "—"
    return f"{f['p50_us'] / 1000:.3g} ms" + (f" ({f['gc_share']:.0%} GC)" if f["gc_share"] >= 0.005 else "")


def _cell_bytes(f: dict[str, Any] | None) -> str:
    if f is None or f["bytes"] is None:
        return "—"
    b = f["bytes"]
    return f"{b / 1e6:.3g} MB" if b >= 1e6 else f"{b / 1e3:.3g} KB" if b >= 1e3 else f"{b:.0f} B"


def _document(figures: dict[str, dict[int, dict[str, Any]]], systems: tuple[System, ...], when: datetime) -> str:
    labels = [s.label for s in systems]
    header = "| steps in the session | " + " | ".join(labels) + " |"
    rule = "|---:|" + "---:|" * len(labels)

    def table(cell: Callable[[dict[str, Any] | None], str]) -> list[str]:
        lines = [header, rule]
        for length in LENGTHS:
            lines.append(f"| {length:,} | " + " | ".join(cell(figures[lb].get(length)) for lb in labels) + " |")
        return lines

    pins = {
        line.split("==")[0]: line.split("==")[1]
        for line in venv.REQUIREMENTS.read_text(encoding="utf-8").splitlines()
        if "==" in line and not line.startswith("#")
    }
    versions = ", ".join(f"{p} {pins[p]}" for p in ("langgraph", "langgraph-checkpoint-sqlite", "langgraph-checkpoint"))
    ours, theirs = figures[FOLDLINE_ON][TARGET_LENGTH], figures[SQLITE_SAVER][TARGET_LENGTH]
    big = figures[SQLITE_SAVER][TARGET_LENGTH]["bytes"] or 0.0
    saver = next(s for s in systems if s.label == SQLITE_SAVER)

    def growth(label: str) -> float:
        at = figures[label]
        return float(at[TARGET_LENGTH]["p50_us"] / at[LENGTHS[0]]["p50_us"])

    saver_s = max(r["seconds"] for r in saver.results if r["steps"] == TARGET_LENGTH)
    durations = "; ".join(
        f"{s.label}: " + ", ".join(f"{r['steps']:,} steps {r['seconds']:.1f} s" for r in s.results) for s in systems
    )
    memory = "; ".join(
        f"{s.label} ({max(r['steps'] for r in s.results):,} steps): "
        f"{max(r['memory']['peak_rss'] for r in s.results) / 2**20:.0f} MiB"
        for s in systems
    )
    lines = [
        "# foldline's loop against LangGraph",
        "",
        "Generated by `benchmarks/bench_langgraph.py` (`make bench`, or `python -m benchmarks.run langgraph`); "
        "do not edit by hand. Rows with the same figures are in [BENCHMARKS.md](BENCHMARKS.md).",
        "",
        f"Run {when.strftime('%Y-%m-%d %H:%M UTC')} on {machine_info()}; {versions}.",
        "",
        f"One session; each step a {QUESTION_CHARS}-character user message and a {ANSWER_CHARS}-character "
        "answer from a model that answers at once; every step persisted to a SQLite file. foldline runs "
        "`Agent.run_turn` with `AgentOptions` defaults on the embedded log; LangGraph runs `graph.invoke` on a "
        "one-node `StateGraph` with a messages state, checkpointed by `SqliteSaver` (`synchronous=NORMAL`, as "
        "foldline's log), once with `add_messages` and once with `DeltaChannel`. Each side runs in a fresh "
        "interpreter (LangGraph in its own virtual environment), so neither's objects make the other's garbage "
        "collections dearer. Figures are medians of three sessions, except LangGraph at 1,000 steps (one "
        "session; its 500-step figures are medians of three).",
        "",
        f"![per-step time and bytes per step against session length](images/{PLOT.name})",
        "",
        f"## Wall time per step, excluding the model call (p50 of the last {DEFAULT_TAIL} steps)",
        "",
        "In brackets: the share of that time spent in garbage collection (`gc.callbacks`), when at least 0.5%.",
        "",
        *table(_cell_ms),
        "",
        f"At {TARGET_LENGTH:,} steps foldline with the invariant on is "
        f"{theirs['p50_us'] / ours['p50_us']:.0f}x faster per step than `SqliteSaver` "
        f"(target ≥ {TARGET_SPEEDUP:g}x).",
        "",
        f"## Bytes added to the SQLite file per step (last {DEFAULT_TAIL} steps, WAL checkpointed)",
        "",
        *table(_cell_bytes),
        "",
        "`SqliteSaver` stores the whole message list in every checkpoint (three per `invoke`), so its bytes per "
        "step grow with the session; `DeltaChannel` stores the step's writes and a full snapshot every 100 "
        "updates; foldline appends the step's events (with the request's digest) once, whether the invariant is "
        "on or off (the companion only reads).",
        "",
        "## Why LangGraph stops at 1,000 steps",
        "",
        f"Per step, `SqliteSaver` costs {growth(SQLITE_SAVER):.1f}x and `DeltaChannel` {growth(DELTA_CHANNEL):.1f}x "
        f"as much at {TARGET_LENGTH:,} steps as at {LENGTHS[0]}: the cost of a step grows with the session, so a "
        f"session costs O(n²). At {TARGET_LENGTH:,} steps `SqliteSaver` adds {big / 1e6:.1f} MB per step; a "
        f"5,000-step session would write about {big * 5000 * 5000 / TARGET_LENGTH / 2 / 1e9:.0f} GB and run for about "
        f"{25 * saver_s / 60:.0f} minutes on this machine (25x the {TARGET_LENGTH:,}-step session's "
        f"{saver_s:.0f} s), too long for `make bench`.",
        "",
        "## Session durations and memory",
        "",
        f"Wall time of each session: {durations}.",
        "",
        f"Peak RSS of the longest session's process: {memory}.",
        "",
    ]
    return "\n".join(lines)


def _plot(figures: dict[str, dict[int, dict[str, Any]]], when: datetime) -> None:
    series = [
        {
            "label": label,
            "lengths": list(per_length),
            "step_us": [f["p50_us"] for f in per_length.values()],
            "bytes_per_step": [f["bytes"] for f in per_length.values()],
        }
        for label, per_length in figures.items()
    ]
    title = (
        f"One session, {QUESTION_CHARS}-char question + {ANSWER_CHARS}-char answer per step, "
        f"persisted to SQLite each step ({when.strftime('%Y-%m-%d')}, {machine_info().split(',')[0]})"
    )
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump({"title": title, "series": series}, f)
        data = Path(f.name)
    try:
        cmd = [str(venv.ensure()), "-m", "benchmarks.vs_langgraph.plot", str(data), str(PLOT)]
        done = subprocess.run(cmd, cwd=venv.ROOT, capture_output=True, text=True, timeout=300, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"drawing {PLOT} failed: {done.stderr.strip()[-2000:]}")
    finally:
        data.unlink()


def run() -> list[dict[str, Any]]:
    venv.ensure()  # before any timing: the first run installs LangGraph (about a minute)
    for system in SYSTEMS:
        system.results.clear()
    for round_ in range(max(len(s.sessions) for s in SYSTEMS)):
        for system in SYSTEMS:
            if round_ < len(system.sessions):
                system.results.append(system.start(system.sessions[round_]))
    figures = _figures(SYSTEMS)
    when = datetime.now(UTC)
    DOC.write_text(_document(figures, SYSTEMS, when), encoding="utf-8")
    _plot(figures, when)
    return _rows(figures)


if __name__ == "__main__":
    for row in run():
        print(f"{row['name']}: {row['value']} {row['unit']} (target {row['target']}) {'OK' if row['ok'] else 'MISS'}")
