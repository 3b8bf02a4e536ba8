"""The distributed path at fleet size: 1,000 concurrent sessions x 10 steps through separate processes.

Two ``foldline projector`` processes (one consumer group), one ``foldline dispatcher`` process and one
loop process — ``foldline fleet --sessions 1000 --steps 10 --json`` — on the local Kafka, Redis and S3,
all in their default configuration (the loop's invariant companion on). Every session is new (a fresh
topic, fold prefix and dispatch stream per run), so the open phase is the new sessions per second of one
process.

* **Saturated** (three runs; the host's speed varies by tens of percent from minute to minute): the
  dispatcher's emulator answers at once, so every session steps as fast as the machine lets it — steps/s is
  the capacity. Reported against the targets: steps/s end to end, failed sessions, step overhead p99 (a
  step's wall time minus the provider call), new sessions/s, requests verified — the runs' medians with their
  spread; beside them the breakdown of a step (p50/p99 of each part) and the CPU seconds each process, the
  broker and Redis spent per step, which on this 2-core machine bound the throughput. In a closed loop at
  capacity, a step's wall time is sessions / throughput (Little's law), most of it waiting for the CPU.
* **Paced** (one run): the same fleet behind a model that takes ``FOLDLINE_BENCH_FLEET_LATENCY`` (2 s, ±50 %)
  to answer, as a model does: what foldline adds to a step when the model sets the pace. Beside it, the
  same with the provider's concurrency limit starting at the fleet's size instead of 64, which shows how
  much of the default's p99 is the limiter's slow start (docs/TRANSPORT.md).

    source .local/env.sh && python -m benchmarks.bench_fleet
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

SESSIONS = int(os.environ.get("FOLDLINE_BENCH_FLEET_SESSIONS", "1000"))
STEPS = int(os.environ.get("FOLDLINE_BENCH_FLEET_STEPS", "10"))
RUNS = int(os.environ.get("FOLDLINE_BENCH_FLEET_RUNS", "3"))  # the host's speed varies by tens of percent
TARGET_STEPS_PER_S = 500.0
TARGET_OVERHEAD_P99_MS = 500.0
TARGET_NEW_SESSIONS_PER_S = 1000.0
PACED_LATENCY_S = float(os.environ.get("FOLDLINE_BENCH_FLEET_LATENCY", "2.0"))  # a fast model's tool-calling step
_CLI = "from foldline.cli.main import main; main()"


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of a live process."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _servers() -> dict[str, int]:
    """The local Kafka broker's and Redis's pids (deploy/local/up.sh's pid files), where they run."""
    state = Path(os.environ.get("FOLDLINE_LOCAL_DIR") or Path(__file__).resolve().parents[1] / ".local") / "run"
    found: dict[str, int] = {}
    for name, label in (("kafka", "Kafka broker"), ("redis", "Redis")):
        try:
            pid = int((state / f"{name}.pid").read_text().strip())
            _cpu_s(pid)
        except (OSError, ValueError, IndexError):
            continue
        found[label] = pid
    return found


def _spawn(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    out = log.open("wb")
    return subprocess.Popen([sys.executable, "-c", _CLI, *args], env=env, stdout=out, stderr=subprocess.STDOUT)


def _wait_for(path: Path, text: str, proc: subprocess.Popen[bytes], timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while text not in path.read_text(errors="replace"):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"{path.name}: no {text!r}: {path.read_text(errors='replace')[-2000:]}")
        time.sleep(0.05)


def measure(
    sessions: int = SESSIONS, steps: int = STEPS, latency_s: float = 0.0, extra_env: dict[str, str] | None = None
) -> dict[str, Any]:
    """One fleet run; ``latency_s``: the dispatcher's emulator answers after that long (a model's time, spread
    ±50 %: the configuration's default); ``extra_env``: settings that differ from the defaults."""
    if not os.environ.get("FOLDLINE_KAFKA_BOOTSTRAP"):
        raise RuntimeError("needs the local servers: source .local/env.sh (make bench starts them)")
    run = uuid.uuid4().hex[:8]
    with tempfile.TemporaryDirectory(prefix="foldline-bench-fleet-") as tmp:
        data = Path(tmp)
        env = {
            **os.environ,
            "FOLDLINE_BACKEND": "distributed",
            "FOLDLINE_DATA_DIR": str(data),
            "FOLDLINE_KAFKA_TOPIC": f"bench.fleet.{run}",
            "FOLDLINE_FOLD_PREFIX": f"bench:fleet:{run}:",
            "FOLDLINE_DISPATCH_STREAM": f"foldline:dispatch:bench:{run}",
            "FOLDLINE_PROJECTOR_GROUP": f"bench-fleet-{run}",
            "FOLDLINE_EMULATOR_LATENCY": str(latency_s),
            **(extra_env or {}),
        }
        for key in ("FOLDLINE_METRICS_PORT", "FOLDLINE_ANTHROPIC_URL", "FOLDLINE_OPENAI_URL"):
            env.pop(key, None)
        # the topics first, so both projectors subscribe to an existing topic
        subprocess.run([sys.executable, "-c", _CLI, "sessions"], env=env, check=True, capture_output=True)
        workers = {
            "projector-0": _spawn(["projector"], env, data / "projector-0.log"),
            "projector-1": _spawn(["projector"], env, data / "projector-1.log"),
            "dispatcher": _spawn(["dispatcher"], env, data / "dispatcher.log"),
        }
        try:
            for name in ("projector-0", "projector-1"):
                _wait_for(data / f"{name}.log", "projector ready", workers[name])
            _wait_for(data / "dispatcher.log", "dispatcher serving", workers["dispatcher"])
            before = {name: _cpu_s(p.pid) for name, p in workers.items()}
            servers = _servers()
            servers_before = {name: _cpu_s(pid) for name, pid in servers.items()}
            loop = subprocess.Popen(
                [sys.executable, "-c", _CLI, "fleet", "--sessions", str(sessions), "--steps", str(steps), "--json"],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )
            loop_cpu = 0.0
            while loop.poll() is None:
                try:
                    loop_cpu = _cpu_s(loop.pid)
                except (FileNotFoundError, ProcessLookupError, IndexError):
                    break
                time.sleep(0.2)
            out, err = loop.communicate()
            cpu = {name: _cpu_s(p.pid) - before[name] for name, p in workers.items()}
            cpu["loop"] = loop_cpu
            server_cpu = {name: _cpu_s(pid) - servers_before[name] for name, pid in servers.items()}
            if not out.strip():
                raise RuntimeError(f"foldline fleet printed nothing (exit {loop.returncode}): {err.decode()[-2000:]}")
            result: dict[str, Any] = json.loads(out)
            result["exit"] = loop.returncode
            result["cpu_s"] = cpu
            result["server_cpu_s"] = server_cpu
            result["latency_s"] = latency_s
            result["variant"] = ", ".join(f"{k}={v}" for k, v in (extra_env or {}).items())
            return result
        finally:
            for p in workers.values():
                p.terminate()
            for p in workers.values():
                try:
                    p.wait(20)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait(5)


def _spread(values: list[float], fmt: str = ",.0f") -> str:
    if len(values) < 2:
        return "one run"
    return f"median of {len(values)} runs; spread {min(values):{fmt}}..{max(values):{fmt}}"


def _part_rows(size: str, phases: dict[str, Any], names: tuple[str, ...]) -> list[dict[str, Any]]:
    """Reference rows of the p50 / p99 of each named part of a step (milliseconds)."""
    return [
        {
            "name": f"{size}: step part {name!r}, p50 / p99",
            "value": f"{phases[name]['p50'] * 1000:.1f} / {phases[name]['p99'] * 1000:.1f}",
            "unit": "ms",
            "target": "(reference)",
            "ok": True,
        }
        for name in names
        if name in phases
    ]


def rows(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Target rows over every run (each must have no failure and verify whole; the figures are the runs'
    medians with their spread), then the breakdown and CPU of the median run by steps/s."""
    ordered = sorted(runs, key=lambda r: r["steps_per_s"] or 0.0)
    r = ordered[len(ordered) // 2]
    steps, sessions = r["steps"], r["sessions"]
    phases = r["step_seconds"]
    rates = [x["steps_per_s"] or 0.0 for x in runs]
    p99s = [x["step_seconds"]["overhead"]["p99"] * 1000 for x in runs]
    opens = [x["new_sessions_per_s"] or 0.0 for x in runs]
    rate, overhead_p99, opened = (
        sorted(rates)[len(rates) // 2],
        sorted(p99s)[len(p99s) // 2],
        sorted(opens)[len(opens) // 2],
    )
    failed = sum(len(x["failed"]) for x in runs)
    verified, checked = sum(x["verified"] for x in runs), sum(x["checked"] for x in runs)
    all_ok = all(
        bool(x["ok"]) and x["checked"] == x["steps"] == x["sessions"] * x["steps_per_session"] and x["exit"] == 0
        for x in runs
    )
    size = f"{sessions:,} sessions x {r['steps_per_session']} steps"
    out = [
        {
            "name": f"{size}, 2 projectors + 1 dispatcher + 1 loop process: steps/s end to end ({_spread(rates)})",
            "value": round(rate, 1),
            "unit": "steps/s",
            "target": f">= {TARGET_STEPS_PER_S:g} steps/s",
            "ok": rate >= TARGET_STEPS_PER_S,
        },
        {
            "name": f"{size}: failed sessions (all {len(runs)} runs)",
            "value": failed,
            "unit": "sessions",
            "target": "0",
            "ok": failed == 0,
        },
        {
            "name": f"{size}: step overhead p99, a step's wall time minus the provider call, the provider answering "
            f"at once ({_spread(p99s)})",
            "value": round(overhead_p99, 1),
            "unit": "ms",
            "target": f"<= {TARGET_OVERHEAD_P99_MS:g} ms",
            "ok": overhead_p99 <= TARGET_OVERHEAD_P99_MS,
        },
        {
            "name": f"new sessions opened per second by the loop process ({sessions:,} at once; {_spread(opens)})",
            "value": round(opened, 1),
            "unit": "sessions/s",
            "target": f">= {TARGET_NEW_SESSIONS_PER_S:g} sessions/s",
            "ok": opened >= TARGET_NEW_SESSIONS_PER_S,
        },
        {
            "name": f"requests verified byte for byte ({verified:,} of {checked:,}; all {len(runs)} runs)",
            "value": round(100.0 * verified / checked, 2) if checked else 0.0,
            "unit": "%",
            "target": "100 % of every step",
            "ok": all_ok,
        },
    ]
    out += _part_rows(
        size, phases, ("total", "append", "handover", "fold_wait", "build", "check", "queue", "send", "answer")
    )
    total_cpu = sum(r["cpu_s"].values())
    for name, seconds in sorted(r["cpu_s"].items()):
        out.append(
            {
                "name": f"CPU per step of the {name} process(es) (the broker and Redis not included)",
                "value": round(1000 * seconds / max(steps, 1), 2),
                "unit": "ms",
                "target": "(reference)",
                "ok": True,
            }
        )
    for name, seconds in sorted(r.get("server_cpu_s", {}).items()):
        out.append(
            {
                "name": f"CPU per step of the local {name} (the whole run: open, steps and verify)",
                "value": round(1000 * seconds / max(steps, 1), 2),
                "unit": "ms",
                "target": "(reference)",
                "ok": True,
            }
        )
    out.append(
        {
            "name": "CPU per step of the foldline processes together (2 cores: 2,000 ms/s is the machine)",
            "value": round(1000 * total_cpu / max(steps, 1), 2),
            "unit": "ms",
            "target": "(reference)",
            "ok": True,
        }
    )
    return out + budget_rows(r)


def budget_rows(r: dict[str, Any]) -> list[dict[str, Any]]:
    """What the overhead target asks of the CPU, against what one step costs (measured, the median run).

    In a closed loop whose provider answers at once, a step's mean wall time is sessions / (steps/s) (Little's
    law), and a p99 is never below the mean: p99 <= 500 ms at 1,000 sessions needs >= 2,000 steps/s, so every
    process and server together may spend at most cores x 1,000 / 2,000 ms of CPU per step."""
    steps = max(r["steps"], 1)
    needed = r["sessions"] / (TARGET_OVERHEAD_P99_MS / 1000)  # steps/s for a mean step of 500 ms
    cores = os.cpu_count() or 1
    server = r.get("server_cpu_s", {})
    all_in = 1000 * (sum(r["cpu_s"].values()) + sum(server.values())) / steps
    below = 1000 * (sum(server.values()) + sum(v for k, v in r["cpu_s"].items() if k.startswith("projector"))) / steps
    budget = cores * 1000 / needed
    return [
        {
            "name": f"CPU per step the overhead target leaves: p99 <= {TARGET_OVERHEAD_P99_MS:g} ms needs >= "
            f"{needed:,.0f} steps/s at {r['sessions']:,} sessions (Little's law), which {cores} cores carry at "
            f"<= {budget:.2f} ms per step, every process and server together",
            "value": round(all_in, 2),
            "unit": "ms",
            "target": f"(reference: budget {budget:.2f} ms)",
            "ok": True,
        },
        {
            "name": "of which the Kafka broker, Redis and the two projectors alone (no loop, no dispatcher)",
            "value": round(below, 2),
            "unit": "ms",
            "target": f"(reference: budget {budget:.2f} ms)",
            "ok": True,
        },
        {
            "name": f"cores the measured CPU per step needs for {needed:,.0f} steps/s, fully busy",
            "value": round(all_in * needed / 1000, 1),
            "unit": "cores",
            "target": f"(reference: this machine has {cores})",
            "ok": True,
        },
    ]


def paced_rows(r: dict[str, Any]) -> list[dict[str, Any]]:
    """The same fleet behind a model that takes ``latency_s`` to answer: what foldline adds to each step when
    the model, not foldline, sets the pace (reference rows; failures and verification still must hold)."""
    phases = r["step_seconds"]
    size = (
        f"{r['sessions']:,} sessions x {r['steps_per_session']} steps behind a model answering in {r['latency_s']:g} s"
    )
    size += f" ({r['variant']})" if r.get("variant") else " (default configuration)"
    overhead = phases["overhead"]
    out = [
        {
            "name": f"{size}: steps/s end to end",
            "value": round(r["steps_per_s"] or 0.0, 1),
            "unit": "steps/s",
            "target": "(reference)",
            "ok": True,
        },
        {
            "name": f"{size}: step overhead p50 / p99 (wall time minus the provider call)",
            "value": f"{overhead['p50'] * 1000:.1f} / {overhead['p99'] * 1000:.1f}",
            "unit": "ms",
            "target": "(reference)",
            "ok": True,
        },
        {
            "name": f"{size}: failed sessions; requests verified ({r['verified']:,} of {r['checked']:,})",
            "value": len(r["failed"]),
            "unit": "sessions",
            "target": "0 failed, 100 % verified",
            "ok": not r["failed"] and bool(r["ok"]) and r["exit"] == 0,
        },
    ]
    out += _part_rows(size, phases, ("queue", "handover", "append", "answer"))
    return out


def run() -> list[dict[str, Any]]:
    saturated = [measure() for _ in range(RUNS)]
    paced = paced_rows(measure(latency_s=PACED_LATENCY_S))
    # beside it, not instead: the provider limit starting at the fleet's size, so no step waits for the
    # limiter's slow start (64 doubling per answer time) — how much of the default's p99 that warm-up is
    started = paced_rows(measure(latency_s=PACED_LATENCY_S, extra_env={"FOLDLINE_PROVIDER_CONCURRENCY": str(SESSIONS)}))
    return rows(saturated) + paced + started


if __name__ == "__main__":
    for row in run():
        mark = "ok" if row["ok"] else "MISSED"
        print(f"{row['value']!s:>14} {row['unit']:<10} (target {row['target']})  {mark}  {row['name']}")
