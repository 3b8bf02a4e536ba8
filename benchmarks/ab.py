"""Same-minute A/B of this checkout against another one (e.g. the commit before a change), figure by figure.

    python -m benchmarks.ab --base /path/to/other/checkout                 # every figure below
    python -m benchmarks.ab --base ../before --rounds 5 wire archive      # only these

Each figure is measured by a small program that uses only what both checkouts have (the core's constructors
and codecs, the benchmark modules' own functions), run by each checkout's own interpreter
(``<checkout>/.venv/bin/python``, in that directory) — this one, the other, this one, the other … for
``--rounds`` rounds, so that a busy minute on the shared host falls on both alike. It prints, per figure, the
median of each side and their ratio (this / other; the unit says which way is better). The figures:

* ``wire`` — decode a 10,000-event session of the loop's shapes from its canonical JSON lines
  (``decode_event`` each), best of 5, ms of CPU;
* ``archive`` — read a 10,000-event session from the S3 archive, p50 ms (``bench_archive.bench_read``;
  Kafka and S3 of ``deploy/local``, ``source .local/env.sh``);
* ``projector`` — fold throughput of one projector, median of 3, events/s (``bench_projector``; Kafka and
  Redis);
* ``loop`` — the loop's overhead per step at 1,000 steps, p50 of the last steps, µs (``loop_session``).

Both checkouts need an installed ``.venv`` (``make .venv/.installed``). The figures of a shared machine are
indicative; run it on a quiet one for numbers to keep.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

__all__ = ["FIGURES", "WIRE_SESSION", "Compared", "ab", "main", "measure"]

ROOT = Path(__file__).resolve().parent.parent

#: Builds ``LINES``: the canonical JSON lines of a 10,000-event session of the loop's shapes, through
#: constructors both checkouts have.
WIRE_SESSION = """
from foldline.core import (AssistantMessage, Envelope, RequestDispatch, StepEnd, StepStart, TextBlock, ToolCall,
    ToolCallBlock, ToolResult, TurnEnd, TurnStart, Usage, UserMessage)
from foldline.core.wire import decode_event, encode_event
EVENTS = []
def add(data):
    EVENTS.append(Envelope(len(EVENTS), 1767225600000 + len(EVENTS), data))
DIGEST = "sha256:" + "ab" * 32
for t in range(1000):
    args = '{"path":"src/f%d.py"}' % t
    add(TurnStart(t))
    add(StepStart(t, 0))
    add(UserMessage("u%d" % t, (TextBlock("please read file number %d and summarize it" % t),), "user"))
    add(RequestDispatch(t, 0, "anthropic-messages", 3, DIGEST, 4000 + t))
    add(AssistantMessage("a%d" % t, (TextBlock("I will read it."), ToolCallBlock("c%d" % t, "read", args)),
        Usage(100, 20, 4000, 10), "tool_use", provider_request_id="req_%d" % t, provider_message_id="msg_%d" % t))
    add(ToolCall(t, 0, "c%d" % t, "read", args))
    add(ToolResult("c%d" % t, "read", (TextBlock("contents of the file " * 5),)))
    add(StepEnd(t, 0))
    add(StepStart(t, 1))
    add(TurnEnd(t, "completed"))
LINES = [encode_event(e) for e in EVENTS]
"""

_WIRE = (
    WIRE_SESSION
    + """
import json, time
best = float("inf")
for _ in range(5):
    t0 = time.process_time()
    for line in LINES:
        decode_event(line)
    best = min(best, time.process_time() - t0)
print(json.dumps({"value": best * 1000, "unit": "ms (lower is better)"}))
"""
)

_ARCHIVE = """
import json
from benchmarks.bench_archive import _servers, bench_read
with _servers() as servers:
    read = bench_read(*servers)
print(json.dumps({"value": read["p50"], "unit": "ms (lower is better)"}))
"""

_PROJECTOR = """
import json, os
from benchmarks.bench_projector import bench_throughput_and_memory
rows = bench_throughput_and_memory(os.environ["FOLDLINE_KAFKA_BOOTSTRAP"], os.environ["FOLDLINE_REDIS_URL"])
print(json.dumps({"value": rows[0]["value"], "unit": "events/s (higher is better)"}))
"""

_LOOP = """
import json
from benchmarks.loop_session import spawn
from benchmarks.vs_langgraph.measure import window
print(json.dumps({"value": window(spawn(1000), 1000).p50_us, "unit": "us (lower is better)"}))
"""

FIGURES: dict[str, tuple[str, str]] = {
    "wire": ("wire decode of a 10,000-event session (decode_event each, best of 5, CPU)", _WIRE),
    "archive": ("read a 10,000-event session from the archive, p50", _ARCHIVE),
    "projector": ("fold throughput, one projector (median of 3)", _PROJECTOR),
    "loop": ("loop overhead per step at 1,000 steps, p50", _LOOP),
}


def _python(checkout: Path) -> str:
    venv = checkout / ".venv" / "bin" / "python"
    return str(venv) if venv.exists() else sys.executable


def measure(checkout: Path, program: str, timeout_s: float = 1800) -> tuple[float, str]:
    """Run ``program`` with ``checkout``'s interpreter in that directory; its last output line is the figure."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run(
        [_python(checkout), "-c", program],
        cwd=checkout,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env=env,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"{checkout}: the program exited {done.returncode}: {done.stderr.strip()[-1500:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    return float(result["value"]), str(result["unit"])


@dataclass(frozen=True, slots=True)
class Compared:
    figure: str
    name: str
    this: float  # median of this checkout's runs
    base: float  # median of the other checkout's runs
    ratio: float  # this / base
    unit: str
    this_runs: list[float]
    base_runs: list[float]


def ab(base: Path, names: list[str], rounds: int) -> list[Compared]:
    """For each figure: ``rounds`` alternating measurements of this checkout and ``base``."""
    rows: list[Compared] = []
    for name in names:
        title, program = FIGURES[name]
        this: list[float] = []
        other: list[float] = []
        unit = ""
        for _ in range(rounds):
            value, unit = measure(ROOT, program)
            this.append(value)
            value, unit = measure(base, program)
            other.append(value)
        a, b = statistics.median(this), statistics.median(other)
        rows.append(
            Compared(
                name,
                title,
                round(a, 2),
                round(b, 2),
                round(a / b, 3) if b else float("nan"),
                unit,
                [round(v, 2) for v in this],
                [round(v, 2) for v in other],
            )
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.ab", description=__doc__.split("\n")[0])
    parser.add_argument("--base", type=Path, required=True, help="the other checkout (with its .venv)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("figures", nargs="*", help=f"any of {', '.join(FIGURES)} (default: all)")
    args = parser.parse_args(argv)
    names = args.figures or list(FIGURES)
    unknown = [n for n in names if n not in FIGURES]
    if unknown:
        print(f"error: unknown figure(s) {unknown}; known: {', '.join(FIGURES)}", file=sys.stderr)
        return 2
    if not (args.base / "services" / "foldline").is_dir():
        print(f"error: {args.base} is not a foldline checkout", file=sys.stderr)
        return 2
    rows = ab(args.base.resolve(), names, args.rounds)
    if args.json:
        print(json.dumps([dataclasses.asdict(r) for r in rows], indent=2))
    else:
        for r in rows:
            print(
                f"{r.name}: this {r.this} vs base {r.base} {r.unit} — ratio {r.ratio} "
                f"(runs: this {r.this_runs}, base {r.base_runs})"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
