"""Fold throughput of one projector process, faust runtime beside the confluent-kafka runtime.

Both runtimes run the shipped entry point (``python -m foldline.projector --runtime faust|confluent``) as a
child process against the local Kafka and Redis (deploy/local/up.sh; source .local/env.sh). The topic
holds 500 sessions x 200 events (~200-byte Avro events, 12 partitions), written first; each run folds it
from offset 0 with a fresh consumer group into a fresh Redis prefix. The clock runs from the first fold
visible in Redis to every session's fold at its log head (Redis polled every 50 ms), so process start and
the group join are not counted; the CPU time of the child process over the same span gives events per
CPU-second (the machine is shared, so wall-clock rates swing with load). Runs alternate between the
runtimes; medians of 3 per runtime.

``run() -> list[dict]`` returns rows {"name", "value", "unit", "target", "ok"}; ``python -m
benchmarks.bench_projector_faust`` prints them.
"""

from __future__ import annotations

import os
import statistics
import time
import uuid
from typing import Any

from tests.distributed.projector_harness import (
    WorkerProcess,
    drop_prefix,
    kafka_topic,
    session_log,
    worker_env,
    write_sessions,
)

from foldline.config import Config, FoldsConfig, RedisConfig
from foldline.config.factories import fold_store

THROUGHPUT_TARGET = 20_000.0
SESSIONS = 500
EVENTS_PER_SESSION = 200
PARTITIONS = 12
RUNS = 3
POLL_S = 0.05
_TICKS = os.sysconf("SC_CLK_TCK")


def _env(name: str) -> str:
    value = os.environ.get(name)
    if not value:
        raise RuntimeError(f"{name} is not set; run deploy/local/up.sh and source .local/env.sh")
    return value


def _row(name: str, value: float, unit: str, target: float) -> dict[str, Any]:
    shown = f">= {target:,.0f} {unit}"
    return {"name": name, "value": round(value, 2), "unit": unit, "target": shown, "ok": value >= target}


def _cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (/proc/<pid>/stat)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS


def _fold_once(runtime: str, topic: str, redis_url: str, heads: dict[str, int]) -> tuple[float, float]:
    """(events/s, events per CPU-second of the projector process) for one fold of the whole topic."""
    prefix = f"bench:fold-{runtime}:{uuid.uuid4().hex[:8]}:"
    args = [
        "--runtime",
        runtime,
        "--group",
        f"bench-{runtime}-{uuid.uuid4().hex[:8]}",
        "--topic",
        topic,
        "--partitions",
        str(PARTITIONS),
        "--fold-prefix",
        prefix,
    ]
    store = fold_store(Config(redis=RedisConfig(redis_url), folds=FoldsConfig(prefix)))
    ids = sorted(heads)
    total = sum(heads.values())
    worker = WorkerProcess(args, worker_env({"FOLDLINE_REDIS_URL": redis_url}))
    try:
        worker.start()
        assert worker.proc is not None
        pid = worker.proc.pid
        deadline = time.monotonic() + 300
        start: tuple[float, float, int] | None = None
        while True:
            seqs = store.applied_seqs(ids)
            now = time.perf_counter()
            done = sum(seqs[sid] + 1 for sid in ids)
            if start is None and done > 0:
                start = (now, _cpu_seconds(pid), done)
            if done >= total:
                assert start is not None
                folded = total - start[2]
                return folded / (now - start[0]), folded / max(1e-9, _cpu_seconds(pid) - start[1])
            if time.monotonic() > deadline:
                raise RuntimeError(f"the {runtime} projector folded {done} of {total} events in 300 s")
            time.sleep(POLL_S)
    finally:
        worker.kill()
        store.close()
        drop_prefix(redis_url, prefix)


def run() -> list[dict[str, Any]]:
    bootstrap = _env("FOLDLINE_KAFKA_BOOTSTRAP")
    redis_url = _env("FOLDLINE_REDIS_URL")
    rates: dict[str, list[float]] = {"faust": [], "confluent": []}
    cpu_rates: dict[str, list[float]] = {"faust": [], "confluent": []}
    with kafka_topic(bootstrap, PARTITIONS, "bench-projector-faust") as topic:
        logs = {f"s{i:04d}": session_log(i, EVENTS_PER_SESSION) for i in range(SESSIONS)}
        write_sessions(bootstrap, topic.name, logs, batch=100, partitions=PARTITIONS, threads=16)
        heads = {sid: len(events) for sid, events in logs.items()}
        for attempt in range(RUNS):
            for runtime in ("faust", "confluent"):
                rate, per_cpu = _fold_once(runtime, topic.name, redis_url, heads)
                rates[runtime].append(rate)
                cpu_rates[runtime].append(per_cpu)
                print(
                    f"  run {attempt + 1} {runtime}: {rate:,.0f} events/s, {per_cpu:,.0f} events per CPU-second",
                    flush=True,
                )
    rows: list[dict[str, Any]] = []
    for runtime in ("faust", "confluent"):
        r = rates[runtime]
        rows.append(
            _row(
                f"fold throughput, one {runtime} projector process (median of 3)",
                statistics.median(r),
                "events/s",
                THROUGHPUT_TARGET,
            )
        )
        rows.append(_row(f"fold throughput, {runtime}, min of 3", min(r), "events/s", THROUGHPUT_TARGET))
        rows.append(_row(f"fold throughput, {runtime}, max of 3", max(r), "events/s", THROUGHPUT_TARGET))
        rows.append(
            _row(
                f"fold throughput per CPU-second, {runtime} (median of 3)",
                statistics.median(cpu_rates[runtime]),
                "events/CPU-s",
                THROUGHPUT_TARGET,
            )
        )
    return rows


if __name__ == "__main__":
    for row in run():
        print(row)
