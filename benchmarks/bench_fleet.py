"""The distributed path at fleet size: concurrent sessions x 10 steps through separate processes.

Two ``foldline projector`` processes (one consumer group), one ``foldline dispatcher`` process and one
loop process — ``foldline fleet --sessions N --steps 10 --json`` — on the local Kafka, Redis and S3, all in
their default configuration (the loop's invariant companion on). Every session is new (a fresh topic, fold
prefix and dispatch stream per run).

* **What foldline adds to a step behind a real model** (the targets): the dispatcher's emulator answers
  each request in ``FOLDLINE_BENCH_FLEET_LATENCY`` (2 s) ± 50 %, as a model does; 100 and 1,000 sessions
  arriving over the first 2 s (``--ramp 2``, as a fleet's sessions arrive: each is opened when it arrives and
  its first step follows at once), and beside each the same fleet started in one instant (every session
  opened first, then its first step a burst of every session). Reported against
  the targets: the added latency of a step (its wall time minus the model's answer) p50 / p99, steps/s,
  failed sessions and requests verified, and the CPU per step of every process and server together (the
  loop, dispatcher and projectors, the Kafka broker, Redis, the S3 server). Beside them, from measured
  figures, how long opening a session took, and where the
  added time goes: each part of a step (p50 / p99) and, for the Kafka appends, each append's mean time
  queued in its group writer, until its group's records were acknowledged, and in the commit.
* **Scaling**: the 1,000-session spread fleet with 1, 2 and 4 projectors and 1 and 2 dispatchers: CPU per
  step of everything together, which must stay flat as processes are added (no hidden global contention).
* **Rebalance under load**: the 1,000-session spread fleet while a third projector joins the group (6 s in) and
  the first is stopped (14 s in): 0 failed sessions and every request verified, and the p99 bump beside the run
  without the moves.
* **Saturated** (one run): the emulator answers at once, so every session steps as fast as the machine lets
  it — steps/s is the capacity, and the CPU each process, the broker and Redis spent per step bounds it on
  this 2-core machine. In a closed loop at capacity a step's wall time is sessions / throughput (Little's
  law), most of it waiting for the CPU: the rows say what an overhead target there would ask of the CPU.

    source .local/env.sh && python -m benchmarks.bench_fleet
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

SESSIONS = int(os.environ.get("FOLDLINE_BENCH_FLEET_SESSIONS", "1000"))
STEPS = int(os.environ.get("FOLDLINE_BENCH_FLEET_STEPS", "10"))
RUNS = int(os.environ.get("FOLDLINE_BENCH_FLEET_RUNS", "1"))  # saturated runs (the host's speed varies)
TARGET_STEPS_PER_S = 500.0
TARGET_OVERHEAD_P99_MS = 500.0
TARGET_NEW_SESSIONS_PER_S = 1000.0
PACED_LATENCY_S = float(os.environ.get("FOLDLINE_BENCH_FLEET_LATENCY", "2.0"))  # a fast model's tool-calling step
RAMP_S = 2.0  # a fleet's sessions arrive over the first seconds, not in one instant
REBALANCE_AT_S = (6.0, 14.0)  # a projector joins 6 s into the run, the first leaves at 14 s (the run lasts ~40 s)
SCALING = os.environ.get("FOLDLINE_BENCH_FLEET_SCALING", "1") != "0"
# the same 1,000-session fleet without the invariant companion, without sealing, and without both (reference rows)
VARIANTS = os.environ.get("FOLDLINE_BENCH_FLEET_VARIANTS", "1") != "0"
#: sessions -> added latency per step p50, p99 (ms) behind the model, sessions spread over RAMP_S
TARGET_ADDED_MS = {100: (15.0, 60.0), 1000: (30.0, 150.0)}
TARGET_PACED_STEPS_PER_S = {1000: 450.0}
TARGET_CPU_PER_STEP_MS = 1.5  # every process and server together, at 1,000 sessions
_CLI = "from foldline.cli.main import main; main()"
#: creates the log's inbox topic (its first use does) and reads its partitions once, in a process of its own
_INBOX_TOPIC = (
    "from foldline.config import Config, open_stores; stores = open_stores(Config.from_env(), writer=True); "
    "stores.log.inbox().sessions(); stores.close()"
)


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of a live process."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _servers() -> dict[str, int]:
    """The local Kafka broker's, Redis's and S3 server's pids (deploy/local/up.sh's pid files), where they run.
    The S3 server counts too: every new session's key is written there, and each process that opens its content
    reads it (docs/ERASURE.md)."""
    state = Path(os.environ.get("FOLDLINE_LOCAL_DIR") or Path(__file__).resolve().parents[1] / ".local") / "run"
    found: dict[str, int] = {}
    for name, label in (("kafka", "Kafka broker"), ("redis", "Redis"), ("s3", "S3 server")):
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


#: A fleet run still going after this long is stuck (the largest here takes ~1 minute): it is asked where its
#: sessions wait (SIGUSR1: its asyncio tasks, on stderr), stopped, and the run fails with that answer.
FLEET_DEADLINE_S = 600.0


def _stuck(loop: subprocess.Popen[bytes], err: Path) -> str:
    loop.send_signal(signal.SIGUSR1)
    time.sleep(3)
    loop.kill()
    loop.wait(10)
    text = err.read_text(errors="replace")
    at = text.rfind("asyncio task(s)")
    dump = text[text.rfind("\n", 0, at) + 1 :] if at >= 0 else text[-4000:]
    return f"foldline fleet was still running after {FLEET_DEADLINE_S:g} s; where its tasks waited:\n{dump[:8000]}"


def measure(
    sessions: int = SESSIONS,
    steps: int = STEPS,
    latency_s: float = 0.0,
    extra_env: dict[str, str] | None = None,
    *,
    ramp_s: float = 0.0,
    projectors: int = 2,
    dispatchers: int = 1,
    rebalance: tuple[float, float] | None = None,
    invariant: bool = True,
) -> dict[str, Any]:
    """One fleet run; ``latency_s``: the dispatcher's emulator answers after that long (a model's time, spread
    ±50 %: the configuration's default); ``extra_env``: settings that differ from the defaults; ``ramp_s``:
    the sessions' first steps spread over that long (``foldline fleet --ramp``); ``projectors`` and
    ``dispatchers``: how many of each process; ``rebalance``: (a, b) — ``a`` seconds into the run one more
    projector starts, ``b`` seconds in the first one is stopped (SIGTERM, as a rolling deploy stops it), each
    move a rebalance of the projectors' group under load."""
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
        # the topics first, as a deployed fleet's are: both projectors subscribe to an existing topic, and the
        # sessions' inbox topic (created on its first use) is there before the first claim — left to the run, the
        # first claims of the first sessions waited ~0.1 s on its creation, a cost a fleet pays once
        subprocess.run([sys.executable, "-c", _CLI, "sessions"], env=env, check=True, capture_output=True)
        subprocess.run([sys.executable, "-c", _INBOX_TOPIC], env=env, check=True, capture_output=True)
        workers = {f"projector-{i}": _spawn(["projector"], env, data / f"projector-{i}.log") for i in range(projectors)}
        for i in range(dispatchers):
            name = "dispatcher" if dispatchers == 1 else f"dispatcher-{i}"
            workers[name] = _spawn(["dispatcher", "--consumer", name], env, data / f"{name}.log")
        try:
            for name, proc in workers.items():
                ready = "projector ready" if name.startswith("projector") else "dispatcher serving"
                _wait_for(data / f"{name}.log", ready, proc)
            before = {name: _cpu_s(p.pid) for name, p in workers.items()}
            servers = _servers()
            servers_before = {name: _cpu_s(pid) for name, pid in servers.items()}
            errors = (data / "fleet.err").open("wb")  # a file: a full pipe nobody reads would stop the fleet
            loop = subprocess.Popen(
                [
                    sys.executable,
                    "-c",
                    _CLI,
                    "fleet",
                    "--sessions",
                    str(sessions),
                    "--steps",
                    str(steps),
                    "--ramp",
                    str(ramp_s),
                    "--invariant" if invariant else "--no-invariant",
                    "--json",
                ],
                env=env,
                stdout=subprocess.PIPE,
                stderr=errors,
            )
            errors.close()  # the child has its own handle
            loop_cpu = 0.0
            started = time.monotonic()
            moves = list(rebalance or ())
            stopped: dict[str, float] = {}
            exits: dict[str, int] = {}
            while loop.poll() is None:
                try:
                    loop_cpu = _cpu_s(loop.pid)
                except (FileNotFoundError, ProcessLookupError, IndexError):
                    break
                if moves and time.monotonic() - started >= moves[0]:
                    moves.pop(0)
                    if len(moves) == 1:  # the first move: one more projector joins the group
                        name = f"projector-{projectors}"
                        workers[name] = _spawn(["projector"], env, data / f"{name}.log")
                        before[name] = 0.0
                    else:  # the second: the first projector leaves it
                        first = workers.pop("projector-0")
                        stopped["projector-0 (stopped)"] = _cpu_s(first.pid) - before["projector-0"]
                        first.terminate()
                        exits["projector-0"] = first.wait(30)
                if time.monotonic() - started > FLEET_DEADLINE_S:
                    raise RuntimeError(_stuck(loop, data / "fleet.err"))
                time.sleep(0.2)
            out, _ = loop.communicate()
            err = (data / "fleet.err").read_bytes()
            cpu = {name: _cpu_s(p.pid) - before[name] for name, p in workers.items()}
            cpu.update(stopped)
            server_cpu = {name: _cpu_s(pid) - servers_before[name] for name, pid in servers.items()}
            if not out.strip():
                raise RuntimeError(f"foldline fleet printed nothing (exit {loop.returncode}): {err.decode()[-2000:]}")
            result: dict[str, Any] = json.loads(out)
            # the loop's own account of its CPU: opening the sessions and running the steps count; its start-up
            # (imports, connections) and the verification after the run (every session read back, every request
            # rebuilt: the benchmark's check, not a fleet's work) do not — the whole process is kept beside it
            phases = result.pop("cpu_s")
            cpu["loop"] = phases["open"] + phases["run"]
            result["loop_cpu_phases_s"] = {**phases, "whole process": loop_cpu}
            result["exit"] = loop.returncode
            result["cpu_s"] = cpu
            result["server_cpu_s"] = server_cpu
            result["latency_s"] = latency_s
            result["processes"] = {"projectors": projectors, "dispatchers": dispatchers}
            result["rebalance"] = list(rebalance) if rebalance else None
            result["stopped_exits"] = exits  # a projector stopped mid-run must leave cleanly
            result["variant"] = ", ".join(
                [f"{k}={v}" for k, v in (extra_env or {}).items()] + ([] if invariant else ["--no-invariant"])
            )
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
            _remove_run(env)


def _remove_run(env: dict[str, str]) -> None:
    """Delete what one run created on the local servers — its topics (the log's, its index, inbox and dead
    letters) and its Redis keys (folds, the dispatch stream and its replies) — so runs do not pile up: a broker
    left with hundreds of benchmark topics (thousands of partitions) measured slower run after run."""
    import redis
    from confluent_kafka.admin import AdminClient

    topic = env["FOLDLINE_KAFKA_TOPIC"]
    admin = AdminClient({"bootstrap.servers": env["FOLDLINE_KAFKA_BOOTSTRAP"]})
    names = [t for t in admin.list_topics(timeout=30).topics if t == topic or t.startswith(f"{topic}.")]
    for future in admin.delete_topics(names, operation_timeout=30).values() if names else ():
        future.result(60)
    client = redis.Redis.from_url(env["FOLDLINE_REDIS_URL"], socket_timeout=30)
    try:
        for pattern in (f"{env['FOLDLINE_FOLD_PREFIX']}*", f"{env['FOLDLINE_DISPATCH_STREAM']}*"):
            batch: list[bytes] = []
            for key in client.scan_iter(match=pattern, count=1000):
                batch.append(key)
                if len(batch) >= 1000:
                    client.unlink(*batch)
                    batch = []
            if batch:
                client.unlink(*batch)
    finally:
        client.close()


#: the parts of the added latency (a step's wall time minus the model's answer): all of PHASES but send and total
_ADDED_PARTS = ("append", "handover", "fold_wait", "build", "check", "queue", "answer")


def _mean_rows(size: str, phases: dict[str, Any]) -> list[dict[str, Any]]:
    """Where the added latency goes, in means (which add up, unlike percentiles): each part's mean and the rest —
    the tools' own run and the loop's work between the parts."""
    if "mean" not in phases.get("overhead", {}):
        return []
    total = phases["overhead"]["mean"] * 1000
    parts = {name: phases[name]["mean"] * 1000 for name in _ADDED_PARTS if name in phases}
    rest = total - sum(parts.values())
    return [
        {
            "name": f"{size}: where the mean added latency goes — "
            + " + ".join(f"{name} {ms:.1f}" for name, ms in parts.items())
            + f" + the rest {rest:.1f} (the tools' own run, the loop's work between the parts)",
            "value": round(total, 1),
            "unit": "ms",
            "target": "(reference)",
            "ok": True,
        }
    ]


def _budget_row(size: str, cpu_ms: float, rate: float) -> dict[str, Any]:
    """What the steps/s target asks of the machine at the CPU a step costs now (measured)."""
    cores = os.cpu_count() or 1
    need = rate * cpu_ms / 1000
    return {
        "name": f"{size}: cores the steps/s target needs at the measured CPU per step ({rate:g} steps/s x "
        f"{cpu_ms:.2f} ms), fully busy — this machine has {cores}; it carries {rate:g} steps/s only at <= "
        f"{1000 * cores / rate:.2f} ms per step with every core busy, <= {700 * cores / rate:.2f} ms at 70 % busy",
        "value": round(need, 2),
        "unit": "cores",
        "target": f"(reference: {cores} here)",
        "ok": True,
    }


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
            "target": "(reference: at capacity a step waits for the CPU — Little's law, below)",
            "ok": True,
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
            "name": f"CPU per step a saturated overhead p99 <= {TARGET_OVERHEAD_P99_MS:g} ms would leave: it needs >= "
            f"{needed:,.0f} steps/s at {r['sessions']:,} sessions (Little's law), which {cores} cores carry at "
            f"<= {budget:.2f} ms per step, every process and server together",
            "value": round(all_in, 2),
            "unit": "ms",
            "target": f"(reference: budget {budget:.2f} ms)",
            "ok": True,
        },
        {
            "name": "of which the servers (Kafka broker, Redis, S3) and the two projectors alone (no loop, no "
            "dispatcher)",
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


def _cpu_ms(r: dict[str, Any]) -> float:
    """CPU per step (ms) of every process and server together."""
    seconds = float(sum(r["cpu_s"].values())) + float(sum(r.get("server_cpu_s", {}).values()))
    return 1000 * seconds / max(int(r["steps"]), 1)


def latency_rows(r: dict[str, Any]) -> list[dict[str, Any]]:
    """What foldline adds to each step behind the model, against the targets when the sessions are spread
    (reference rows for the all-at-once start), and where that time goes (measured)."""
    sessions, ramp = r["sessions"], r.get("ramp_s") or 0.0
    spread = f"first steps spread over {ramp:g} s" if ramp else "all started in one instant"
    model = f"a {r['latency_s']:g} s ± 50 % model"
    size = f"{sessions:,} sessions x {r['steps_per_session']} steps behind {model}, {spread}"
    phases, added = r["step_seconds"], r["step_seconds"]["overhead"]
    p50, p99 = added["p50"] * 1000, added["p99"] * 1000
    target = TARGET_ADDED_MS.get(sessions) if ramp else None
    rate, rate_target = r["steps_per_s"] or 0.0, TARGET_PACED_STEPS_PER_S.get(sessions) if ramp else None
    cpu = _cpu_ms(r)
    cpu_target = TARGET_CPU_PER_STEP_MS if ramp and sessions >= 1000 else None
    ok_run = not r["failed"] and bool(r["ok"]) and r["exit"] == 0 and r["checked"] == r["steps"]
    out = [
        {
            "name": f"{size}: added latency per step p50 / p99 (wall time minus the model's answer)",
            "value": f"{p50:.1f} / {p99:.1f}",
            "unit": "ms",
            "target": f"<= {target[0]:g} / <= {target[1]:g} ms" if target else "(reference)",
            "ok": target is None or (p50 <= target[0] and p99 <= target[1]),
        },
        {
            "name": f"{size}: steps/s end to end",
            "value": round(rate, 1),
            "unit": "steps/s",
            "target": f">= {rate_target:g} steps/s" if rate_target else "(reference)",
            "ok": rate_target is None or rate >= rate_target,
        },
        {
            "name": f"{size}: failed sessions; requests verified ({r['verified']:,} of {r['checked']:,})",
            "value": len(r["failed"]),
            "unit": "sessions",
            "target": "0 failed, 100 % verified",
            "ok": ok_run,
        },
        {
            "name": f"{size}: CPU per step, every process and server together (loop, dispatcher, projectors, "
            "Kafka broker, Redis, S3 server; the loop's opening and running of the sessions, the others' whole run)",
            "value": round(cpu, 2),
            "unit": "ms",
            "target": f"<= {cpu_target:g} ms" if cpu_target else "(reference)",
            "ok": cpu_target is None or cpu <= cpu_target,
        },
    ]
    opens = r.get("open_ms")
    if opens:
        how = "each opened as it arrived" if ramp else "all opened together before their first steps"
        out.append(
            {
                "name": f"{size}: opening a session ({how}: created in the log, its loop loaded; not part of a "
                f"step's added latency; before the first, the loop process warmed its log in "
                f"{1000 * float(r.get('warm_s') or 0):.0f} ms), p50 / p99",
                "value": f"{opens['p50']:.1f} / {opens['p99']:.1f}",
                "unit": "ms",
                "target": "(reference)",
                "ok": True,
            }
        )
    places = r.get("overhead_by_place_ms") or {}
    first, later = places.get("first"), places.get("later")
    if first and later:
        against = f"; the p99 target {target[1]:g} ms" if target else ""
        starts = f"{sessions:,} starts come in {ramp:g} s" if ramp else f"{sessions:,} start in one instant"
        out.append(
            {
                "name": f"{size}: added latency by the step's place in its session — each session's first step "
                f"({first['steps']:,}: its start is behind it — created in the log, its key made, its first "
                f"hand-over — and {starts}) p50 / p99, then every later step "
                f"({later['steps']:,}) p50 / p99{against}",
                "value": f"{first['p50']:.1f} / {first['p99']:.1f}; {later['p50']:.1f} / {later['p99']:.1f}",
                "unit": "ms",
                "target": "(reference)",
                "ok": True,
            }
        )
    out += _part_rows(size, phases, ("append", "handover", "fold_wait", "build", "check", "queue", "answer"))
    out += _mean_rows(size, phases)
    if sessions >= 1000 and rate_target:
        out.append(_budget_row(size, cpu, rate_target))
    lag, loop_cpu = r.get("loop_lag_ms"), (r.get("loop_cpu_phases_s") or {}).get("run")
    if lag:
        busy = f"; its CPU {100 * loop_cpu / r['run_s']:.0f} % of one core" if loop_cpu and r.get("run_s") else ""
        out.append(
            {
                "name": f"{size}: the loop process's event loop — how late a callback that was due ran, p50 / p90 / "
                f"p99 ({lag['probes']:,} probes; the wait every reply, hand-over answer and acknowledgement has "
                f"before its session goes on{busy})",
                "value": f"{lag['p50']:.1f} / {lag['p90']:.1f} / {lag['p99']:.1f}",
                "unit": "ms",
                "target": "(reference)",
                "ok": True,
            }
        )
    times = r.get("log_times")
    if times:
        out.append(
            {
                "name": f"{size}: each Kafka append's mean time queued in its group writer / until its group's "
                f"records were acknowledged / in the commit ({times['appends']:,} appends in {times['groups']:,} "
                f"transactions, {times['appends_per_group']:g} a transaction)",
                "value": f"{times['queued_ms']:.1f} / {times['acked_ms']:.1f} / {times['committed_ms']:.1f}",
                "unit": "ms",
                "target": "(reference)",
                "ok": True,
            }
        )
    parts = {**r["cpu_s"], **{f"local {k}": v for k, v in r.get("server_cpu_s", {}).items()}}
    loop = r.get("loop_cpu_phases_s") or {}
    counted = (
        f" (the loop's open {loop['open']:.1f} s + run {loop['run']:.1f} s of CPU; not counted: its verification "
        f"of every request afterwards, {loop['verify']:.1f} s, and its start-up — {loop['whole process']:.1f} s in all)"
        if loop
        else ""
    )
    out.append(
        {
            "name": f"{size}: CPU per step of each: "
            + ", ".join(f"{k} {1000 * v / max(r['steps'], 1):.2f}" for k, v in sorted(parts.items()))
            + counted,
            "value": round(cpu, 2),
            "unit": "ms",
            "target": "(reference)",
            "ok": True,
        }
    )
    return out


def scaling_rows(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """CPU per step of everything together as projectors and dispatchers are added (same fleet)."""
    base = _cpu_ms(runs[0])
    out = []
    for r in runs:
        n = r["processes"]
        cpu = _cpu_ms(r)
        added = r["step_seconds"]["overhead"]
        out.append(
            {
                "name": f"scaling, {r['sessions']:,} sessions spread over {r.get('ramp_s') or 0:g} s behind the model, "
                f"{n['projectors']} projector(s) + {n['dispatchers']} dispatcher(s): CPU per step of everything "
                f"together (added latency p50 / p99 "
                f"{added['p50'] * 1000:.0f} / {added['p99'] * 1000:.0f} ms; "
                f"{len(r['failed'])} failed, {r['verified']:,} of {r['checked']:,} verified)",
                "value": round(cpu, 2),
                "unit": "ms",
                "target": f"(reference: {cpu / base:.2f}x the first)",
                "ok": not r["failed"] and bool(r["ok"]) and r["exit"] == 0,
            }
        )
    return out


def rebalance_rows(moved: dict[str, Any], steady: dict[str, Any]) -> list[dict[str, Any]]:
    """The same fleet with a projector added and the first stopped mid-run, beside the run without them."""
    a, b = moved["rebalance"]
    added, before = moved["step_seconds"]["overhead"], steady["step_seconds"]["overhead"]
    fold, fold_before = moved["step_seconds"]["fold_wait"], steady["step_seconds"]["fold_wait"]
    exits = moved.get("stopped_exits") or {}
    ok = not moved["failed"] and bool(moved["ok"]) and moved["exit"] == 0 and all(rc == 0 for rc in exits.values())
    size = f"{moved['sessions']:,} sessions spread over {moved.get('ramp_s') or 0:g} s behind the model"
    return [
        {
            "name": f"rebalance under load, {size}: a third projector started {a:g} s into the run and the first "
            f"stopped (SIGTERM) at {b:g} s — failed sessions, requests verified ({moved['verified']:,} of "
            f"{moved['checked']:,}), the stopped projector's exit status {exits}",
            "value": len(moved["failed"]),
            "unit": "sessions",
            "target": "0 failed, 100 % verified",
            "ok": ok,
        },
        {
            "name": f"rebalance under load, {size}: added latency per step p50 / p99 (the same fleet without the "
            f"moves: {before['p50'] * 1000:.1f} / {before['p99'] * 1000:.1f} ms; fold wait p99 "
            f"{fold['p99'] * 1000:.1f} against {fold_before['p99'] * 1000:.1f} ms) — the p99 bump is the difference",
            "value": f"{added['p50'] * 1000:.1f} / {added['p99'] * 1000:.1f}",
            "unit": "ms",
            "target": f"(reference: p99 bump {1000 * (added['p99'] - before['p99']):+.1f} ms)",
            "ok": True,
        },
    ]


#: the durable appends on a dispatched step's path, one after another (docs/DISPATCHER.md, "One dispatched step"):
#: the opening (step/start, user messages, header — after the previous step's tool results and step/end, held for
#: it) with request/dispatch, then the answer (assistant message, tool calls)
STEP_APPENDS = 2


def append_floor(cycles: int = 300) -> dict[str, float]:
    """One durable append alone, as the group writer makes it (one transaction: three event records to a partition
    and their acknowledgement, then an index record, then the commit, on two producers taking turns), timed
    ``cycles`` times on the otherwise idle
    broker: the least a step's appends can take, whatever foldline does around them (p50 / p99, seconds)."""
    from confluent_kafka.admin import AdminClient
    from confluent_kafka.cimpl import NewTopic

    from foldline.adapters.kafka.clients import GROUP_PRODUCER, KafkaClients, flush

    bootstrap = os.environ["FOLDLINE_KAFKA_BOOTSTRAP"]
    clients = KafkaClients(bootstrap)
    admin = AdminClient(clients.base)
    topic = f"bench.floor.{uuid.uuid4().hex[:8]}"
    names = [topic, f"{topic}.index"]
    for future in admin.create_topics([NewTopic(t, 12, 1) for t in names]).values():
        future.result(30)
    # two producers taking turns, as the group writer's do: one producer's back-to-back transactions meet
    # the coordinator still completing the previous one (CONCURRENT_TRANSACTIONS, retried 20 ms later)
    producers = [clients.transactional_producer(f"{topic}/floor/{k}", GROUP_PRODUCER) for k in range(2)]
    took: list[float] = []
    try:
        for producer in producers:
            producer.init_transactions(30)
        for i in range(cycles):
            producer = producers[i % 2]
            began = time.perf_counter()
            producer.begin_transaction()
            for _ in range(3):
                producer.produce(topic, value=b"e" * 400, key=f"s{i % 100}", partition=i % 12)
            if flush(producer, 30):
                raise RuntimeError("the broker did not acknowledge the floor's records")
            producer.produce(f"{topic}.index", value=b"i" * 120, key=f"s{i % 100}", partition=i % 12)
            producer.commit_transaction(30)
            took.append(time.perf_counter() - began)
    finally:
        for producer in producers:
            flush(producer, 5)
        for future in admin.delete_topics(names, operation_timeout=30).values():
            future.result(60)
    took.sort()
    return {"p50": took[len(took) // 2], "p99": took[int(len(took) * 0.99)]}


def floor_rows(floor: dict[str, float], at_100: dict[str, Any]) -> list[dict[str, Any]]:
    """What the added-latency targets leave once the appends' own floor is paid (measured, not assumed)."""
    p50, p99 = floor["p50"] * 1000, floor["p99"] * 1000
    added = at_100["step_seconds"]["overhead"]["p50"] * 1000
    target = TARGET_ADDED_MS[100][0]
    return [
        {
            "name": "one durable append alone on the idle broker, as the group writer makes it (a transaction: three "
            "event records acknowledged, an index record, the commit), p50 / p99",
            "value": f"{p50:.1f} / {p99:.1f}",
            "unit": "ms",
            "target": "(reference)",
            "ok": True,
        },
        {
            "name": f"the floor of a dispatched step's added latency: its {STEP_APPENDS} durable appends one after "
            f"another, each at that p50 — against the p50 target of {target:g} ms at 100 sessions (measured there: "
            f"{added:.1f} ms; the rest above the floor: {added - STEP_APPENDS * p50:.1f} ms)",
            "value": round(STEP_APPENDS * p50, 1),
            "unit": "ms",
            "target": f"(reference: target {target:g} ms)",
            "ok": True,
        },
    ]


_SEALING_OFF = {"FOLDLINE_ENCRYPTION": "off"}


def variant_rows(default: dict[str, Any], variants: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Reference rows beside the default 1,000-session row: the same fleet without the invariant companion,
    without sealing, and without both — what each costs the fleet, measured (the defaults stay on)."""
    out = []
    base_p50, base_p99 = (default["step_seconds"]["overhead"][q] * 1000 for q in ("p50", "p99"))
    for r in variants:
        added = r["step_seconds"]["overhead"]
        ok = not r["failed"] and bool(r["ok"]) and r["exit"] == 0 and r["checked"] == r["steps"]
        what = " and ".join(
            (["the invariant companion off (--no-invariant)"] if not r.get("invariant", True) else [])
            + (["sealing off (FOLDLINE_ENCRYPTION=off)"] if "FOLDLINE_ENCRYPTION=off" in r.get("variant", "") else [])
        )
        out.append(
            {
                "name": f"variant, 1,000 sessions spread over 2 s behind the model, {what}: added latency per step "
                f"p50 / p99 (the default: {base_p50:.0f} / {base_p99:.0f} ms); {r['steps_per_s']:.0f} steps/s, "
                f"{_cpu_ms(r):.2f} ms of CPU per step (the default: {default['steps_per_s']:.0f}, "
                f"{_cpu_ms(default):.2f}); {len(r['failed'])} failed, {r['verified']:,} of {r['checked']:,} verified",
                "value": f"{added['p50'] * 1000:.0f} / {added['p99'] * 1000:.0f}",
                "unit": "ms",
                "target": "(reference: a variant, not the default)",
                "ok": ok,
            }
        )
    return out


def run() -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    # a broker that just started compiles its hot paths for its first minutes (the JIT; after a restart the
    # 100-session rows came out ~2x slower, and its CPU per step ~2x higher): a 3,000-step fleet first, so the
    # rows measure a warm broker, as a fleet's long-running one is (it is not reported)
    measure(sessions=1000, steps=3, latency_s=0.5, ramp_s=1.0)
    floor = append_floor()
    spread: dict[int, dict[str, Any]] = {}
    for sessions in (100, 1000):
        spread[sessions] = measure(sessions=sessions, latency_s=PACED_LATENCY_S, ramp_s=RAMP_S)
        out += latency_rows(spread[sessions])
        if sessions == 100:
            out += floor_rows(floor, spread[100])
        out += latency_rows(measure(sessions=sessions, latency_s=PACED_LATENCY_S))
    if SCALING:
        scaled = [
            measure(sessions=1000, latency_s=PACED_LATENCY_S, ramp_s=RAMP_S, projectors=p, dispatchers=d)
            for p, d in ((1, 1), (4, 1), (2, 2))
        ]
        out += scaling_rows([scaled[0], spread[1000], *scaled[1:]])
    if VARIANTS:
        out += variant_rows(
            spread[1000],
            [
                measure(sessions=1000, latency_s=PACED_LATENCY_S, ramp_s=RAMP_S, invariant=False),
                measure(sessions=1000, latency_s=PACED_LATENCY_S, ramp_s=RAMP_S, extra_env=_SEALING_OFF),
                measure(
                    sessions=1000, latency_s=PACED_LATENCY_S, ramp_s=RAMP_S, extra_env=_SEALING_OFF, invariant=False
                ),
            ],
        )
    moved = measure(sessions=1000, latency_s=PACED_LATENCY_S, ramp_s=RAMP_S, rebalance=REBALANCE_AT_S)
    out += rebalance_rows(moved, spread[1000])
    saturated = [measure() for _ in range(RUNS)]
    return out + rows(saturated)


if __name__ == "__main__":
    for row in run():
        mark = "ok" if row["ok"] else "MISSED"
        print(f"{row['value']!s:>14} {row['unit']:<10} (target {row['target']})  {mark}  {row['name']}")
