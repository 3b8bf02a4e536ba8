"""`foldline fleet`: concurrent loops in one process against projector and dispatcher processes started
separately (here by :func:`~foldline.worker_processes.worker_processes`), every session verified."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from foldline.config import Config, open_stores
from foldline.core.events import RequestDispatch
from foldline.replay.verify import verify_events
from foldline.worker_processes import worker_processes

pytestmark = [pytest.mark.kafka, pytest.mark.redis, pytest.mark.s3]

_CLI = "from foldline.cli.main import main; main()"


def _fleet_json(args: list[str], env: dict[str, str]) -> dict[str, Any]:
    """``foldline <args>`` (a fleet with --json) as a process: its report, once it exited 0."""
    done = subprocess.run(
        [sys.executable, "-c", _CLI, *args], check=False, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stdout + done.stderr
    report: dict[str, Any] = json.loads(done.stdout)
    return report


def test_fleet_runs_new_sessions_through_external_workers_and_verifies_them(
    distributed_env: dict[str, str], tmp_path: Path
) -> None:
    config = Config.from_env().overridden(data_dir=tmp_path, backend="distributed")
    stores = open_stores(config)
    try:
        with worker_processes(config, stores, projectors=1, dispatchers=1) as workers:
            assert workers.stream is not None
            env = {**os.environ, **config.to_env(), "FOLDLINE_BACKEND": "distributed"}
            args = ["fleet", "--sessions", "6", "--steps", "4", "--prefix", "fl", "--stream", workers.stream]
            args += ["--ramp", "0.5", "--json"]  # the sessions' first steps spread over half a second
            report = _fleet_json(args, env)
            assert (report["sessions"], report["steps"], report["failed"], report["ok"]) == (6, 24, [], True)
            assert report["verified"] == report["checked"] == 24
            parts = report["step_seconds"]
            assert {
                "append",
                "handover",
                "fold_wait",
                "build",
                "check",
                "queue",
                "send",
                "answer",
                "total",
                "overhead",
            } <= set(parts)
            assert parts["total"]["p50"] >= parts["send"]["p50"] > 0
            # means add up: the parts of the added latency never exceed it (the rest is the tools and the loop)
            added = [parts[name]["mean"] for name in ("append", "handover", "fold_wait", "build", "check", "queue")]
            assert sum(added) + parts["answer"]["mean"] <= parts["overhead"]["mean"] + 1e-6
            assert report["ramp_s"] == 0.5
            assert report["warm_s"] > 0  # the log was warmed before the first session, and timed
            # sessions arriving over the ramp are each opened as they arrive, not all of them first
            assert report["open_s"] == 0
            assert report["new_sessions_per_s"] is None
            opens = report["open_ms"]
            assert 0 < opens["p50"] <= opens["p99"]
            # the added latency by the step's place: each session's first step apart from its later ones
            places = report["overhead_by_place_ms"]
            assert (places["first"]["steps"], places["later"]["steps"]) == (6, 18)
            assert all(0 < p["p50"] <= p["p99"] for p in places.values())
            # the event loop's lag through the run: probes were taken, and their quantiles are ordered
            lag = report["loop_lag_ms"]
            assert lag["probes"] > 0
            assert 0 <= lag["p50"] <= lag["p90"] <= lag["p99"] <= lag["max"]
            # the loop's own CPU by phase: what a step costs (open + run) apart from the verification afterwards
            assert set(report["cpu_s"]) == {"open", "run", "verify"}
            assert report["cpu_s"]["open"] == 0  # the openings ran with the steps, and count in the run
            assert report["cpu_s"]["run"] > 0
            assert report["cpu_s"]["verify"] > 0
            times = report["log_times"]  # where the run's appends spent their time, from the group writers
            assert times["appends"] >= 24 * 2  # at least the opening and request/dispatch of every step
            assert times["groups"] >= 1
            assert min(times["queued_ms"], times["acked_ms"], times["committed_ms"]) >= 0
            assert times["acked_ms"] > 0
            assert report["invariant"] is True  # every loop checked its requests against the log
            # --no-invariant: the same fleet without the companion's check (what it costs, measured), still verified
            args[args.index("fl")] = "fl-plain"
            unchecked = _fleet_json([*args, "--no-invariant"], env)
            assert (unchecked["invariant"], unchecked["ok"], unchecked["verified"]) == (False, True, 24)
            # kill -USR1 prints where a dispatcher's coroutines wait, and leaves it serving
            (served,) = [c for c in workers.children if c.name.startswith("dispatcher")]
            served.process.send_signal(signal.SIGUSR1)
            deadline = time.monotonic() + 30
            while "asyncio task(s)" not in served.output():
                assert served.process.poll() is None, served.output()[-2000:]
                assert time.monotonic() < deadline, served.output()[-2000:]
                time.sleep(0.05)
            assert "serve_steps" in served.output()
            assert served.process.poll() is None
        for i in range(6):  # the log itself says so, read back by another process
            events = stores.log.read(f"fl-{i:05d}")
            assert sum(isinstance(e.data, RequestDispatch) for e in events) == 4
            assert verify_events(f"fl-{i:05d}", events, stores.attachments).ok
    finally:
        stores.close()


def test_fleet_names_the_missing_dispatchers(distributed_env: dict[str, str], tmp_path: Path) -> None:
    """No dispatcher serves the stream: the sessions fail with the cause named, and the exit status says so."""
    env = {
        **os.environ,
        "FOLDLINE_BACKEND": "distributed",
        "FOLDLINE_DATA_DIR": str(tmp_path),
        "FOLDLINE_DISPATCH_HANDOVER_TIMEOUT": "2",
    }
    args = ["fleet", "--sessions", "2", "--steps", "1", "--stream", f"test:nobody:{tmp_path.name}", "--json"]
    # a run that hangs prints every thread's stack (then exits) well before the test gives up on it
    cli = f"import faulthandler; faulthandler.dump_traceback_later(240, exit=True); {_CLI}"
    try:
        done = subprocess.run(
            [sys.executable, "-c", cli, *args], check=False, env=env, capture_output=True, text=True, timeout=300
        )
    except subprocess.TimeoutExpired as exc:  # pragma: no cover - the stacks say where it hung
        pytest.fail(f"foldline fleet did not end: {exc.stderr!r}")
    assert done.returncode == 1, done.stdout + done.stderr
    report = json.loads(done.stdout)
    assert len(report["failed"]) == 2
    assert not report["ok"]
    assert all("start `foldline dispatcher`" in f["error"] for f in report["failed"]), report["failed"]
