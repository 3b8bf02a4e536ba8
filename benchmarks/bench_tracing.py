"""What tracing costs the loop: per-step overhead with OpenTelemetry tracing on, exporting to a real trace backend,
against tracing off — and off against the loop as it runs without the tracing hook at all.

The loop benchmark's session (:mod:`benchmarks.loop_session`, shape ``tools``: the demo's system prompt and tools,
a provider that answers at once, the invariant companion on), 1,000 steps, each in a fresh interpreter. Three
configurations, interleaved, ``RUNS`` runs each:

* **plain** — the agent's log as it is (no tracing code on the path);
* **off** — the log through :func:`foldline.tracing.traced_log` with no ``OTEL_*`` variable set, as every CLI loop
  runs when tracing is off (it returns the log itself: the path is plain's);
* **on** — ``OTEL_TRACES_EXPORTER=otlp`` over HTTP/protobuf to Arize Phoenix started by ``deploy/local/phoenix.sh``:
  an ``invoke_agent``, ``chat`` and ``execute_tool`` span per step, priced, batched and exported while the session
  runs (the export thread's CPU counts against the steps it overlaps).

Figures: the per-step wall time excluding the provider call — its p50 over the last 40 steps, as the loop
benchmark reports it, and its mean over steps 2..1,000 (the span building and the export's bursts included) —
each the median of the runs. Targets, on the p50: on / off <= 1.10; off / plain <= 1.05 (no measurable change:
the two run the same code; the runs' own spread on a shared host is of that order).

    python -m benchmarks.run tracing
"""

from __future__ import annotations

import os
import statistics
import subprocess
import uuid
from pathlib import Path
from typing import Any

from .loop_session import spawn
from .vs_langgraph.measure import window

__all__ = ["RUNS", "STEPS", "run"]

STEPS = 1000
RUNS = 5
TARGET_ON = 1.10
TARGET_OFF = 1.05
_ROOT = Path(__file__).resolve().parent.parent
_SCRIPT = _ROOT / "deploy" / "local" / "phoenix.sh"


def _phoenix() -> str:
    """Start the local Phoenix (installed on first use); its OTLP/HTTP endpoint."""
    for action in ("start", "env"):
        done = subprocess.run(
            ["bash", str(_SCRIPT), action], capture_output=True, text=True, timeout=900, check=False, cwd=_ROOT
        )
        if done.returncode != 0:
            raise RuntimeError(f"deploy/local/phoenix.sh {action} failed: {done.stderr[-2000:]}")
    env = dict(line.removeprefix("export ").split("=", 1) for line in done.stdout.splitlines())
    return env["FOLDLINE_LOCAL_PHOENIX_URL"]


def _figures(result: dict[str, Any]) -> tuple[float, float]:
    """(mean over steps 2..N, p50 of the last 40 steps), in us."""
    return statistics.fmean(result["step_us"][1:]), window(result, STEPS).p50_us


def run() -> list[dict[str, Any]]:
    endpoint = _phoenix()
    quiet = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    project = f"foldline-bench-{uuid.uuid4().hex[:8]}"
    traced = {
        **quiet,
        "OTEL_TRACES_EXPORTER": "otlp",
        "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
        "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
        "OTEL_RESOURCE_ATTRIBUTES": f"openinference.project.name={project}",
    }
    runs: dict[str, list[tuple[float, float]]] = {"plain": [], "off": [], "on": []}
    for _ in range(RUNS):
        runs["plain"].append(_figures(spawn(STEPS, env=quiet)))
        runs["off"].append(_figures(spawn(STEPS, env=quiet, traced=True)))
        runs["on"].append(_figures(spawn(STEPS, env=traced, traced=True)))
    mean = {k: statistics.median(m for m, _ in v) for k, v in runs.items()}
    p50 = {k: statistics.median(p for _, p in v) for k, v in runs.items()}
    ratio_on, ratio_off = p50["on"] / p50["off"], p50["off"] / p50["plain"]

    def spread(name: str, at: int) -> str:
        values = [v[at] for v in runs[name]]
        return f"median of {RUNS} runs; spread {min(values):,.0f}..{max(values):,.0f} us"

    def reference(name: str, value: float) -> dict[str, Any]:
        return {"name": name, "value": round(value, 1), "unit": "us", "target": "(reference)", "ok": True}

    p50_of = f"{STEPS:,}-step session, p50 of the last 40 steps excl. provider call"
    mean_of = f"mean over steps 2..{STEPS:,}"
    phoenix = "tracing on (OTLP/HTTP to Arize Phoenix)"
    return [
        reference(f"loop per-step overhead, {phoenix}, {p50_of} ({spread('on', 1)})", p50["on"]),
        reference(f"same, tracing off ({spread('off', 1)})", p50["off"]),
        reference(f"same, without the tracing hook at all ({spread('plain', 1)})", p50["plain"]),
        reference(f"{mean_of}, {phoenix} ({spread('on', 0)})", mean["on"]),
        reference(f"{mean_of}, tracing off ({spread('off', 0)})", mean["off"]),
        {
            "name": "tracing on / tracing off, per-step p50",
            "value": round(ratio_on, 3),
            "unit": "x",
            "target": f"<= {TARGET_ON:g}x",
            "ok": ratio_on <= TARGET_ON,
        },
        {
            "name": f"tracing on / tracing off, {mean_of} (the export's bursts included)",
            "value": round(mean["on"] / mean["off"], 3),
            "unit": "x",
            "target": "(reference)",
            "ok": True,
        },
        {
            "name": "tracing off / without the hook, per-step p50 (no measurable change)",
            "value": round(ratio_off, 3),
            "unit": "x",
            "target": f"<= {TARGET_OFF:g}x",
            "ok": ratio_off <= TARGET_OFF,
        },
    ]
