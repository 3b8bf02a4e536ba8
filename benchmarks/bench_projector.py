"""Projector figures against the local Kafka and Redis (deploy/local/up.sh; source .local/env.sh).

* fold throughput of ONE projector (a ``ProjectorWorker``, batched): 500 sessions x 200 events
  (~200-byte Avro events: header, turns with tool rounds) written through ``KafkaEventLog`` first, then
  folded from offset 0 by a fresh consumer group into a fresh Redis prefix; events/s from the first
  applied batch to the last. Median and spread of 3 runs on the same topic.
* Redis memory per session / its serialized fold (message bytes + header bytes), ``MEMORY USAGE``
  of the session's keys, over every session of the throughput run (median and max).
* append -> fold visible: a writer appends batches of 50 events every 10 ms (5,000 events/s) to 50
  sessions round robin while one projector runs; for each append, the time from calling ``append`` to
  the fold's applied seq reaching the batch's last seq (p50/p99).

``run() -> list[dict]`` returns rows {"name", "value", "unit", "target", "ok"}; ``python -m
benchmarks.bench_projector`` prints them.
"""

from __future__ import annotations

import os
import statistics
import threading
import time
import uuid
from typing import Any

from tests.distributed.projector_harness import drop_prefix, kafka_topic, session_log, write_sessions

from foldline.adapters.redis_folds import RedisFoldStore
from foldline.config import Config, FoldsConfig, RedisConfig
from foldline.config.factories import fold_store
from foldline.projector import BatchReport, WorkerSettings, start_worker

THROUGHPUT_TARGET = 20_000.0
MEMORY_TARGET = 1.3
P99_TARGET_MS = 100.0
SESSIONS = 500
EVENTS_PER_SESSION = 200
PARTITIONS = 12
RUNS = 3
RATE = 5_000
BATCH = 50


def _env(name: str) -> str:
    value = os.environ.get(name)
    if not value:
        raise RuntimeError(f"{name} is not set; run deploy/local/up.sh and source .local/env.sh")
    return value


def _row(name: str, value: float, unit: str, target: float, higher_is_better: bool = True) -> dict[str, Any]:
    ok = value >= target if higher_is_better else value <= target
    shown = f"{'>=' if higher_is_better else '<='} {target:,g} {unit}"
    return {"name": name, "value": round(value, 2), "unit": unit, "target": shown, "ok": ok}


def _fold_once(bootstrap: str, topic: str, redis_url: str, total: int) -> tuple[float, float, RedisFoldStore, str]:
    """(events/s wall clock, events per CPU-second of this process, the store, its prefix)."""
    prefix = f"bench:fold:{uuid.uuid4().hex[:8]}:"
    marks: list[float] = []
    cpu: list[float] = []
    done = threading.Event()
    seen = [0]
    first = [0]

    def on_batch(report: BatchReport) -> None:
        if not marks:
            first[0] = report.events
            marks.append(time.perf_counter())
            cpu.append(time.process_time())
            return  # the first batch includes the group join: measure from its end
        seen[0] += report.events
        if seen[0] >= total - first[0]:
            marks.append(time.perf_counter())
            cpu.append(time.process_time())
            done.set()

    settings = WorkerSettings(
        Config().overridden(
            kafka__bootstrap=bootstrap,
            kafka__topic=topic,
            kafka__projector_group=f"bench-{uuid.uuid4().hex[:8]}",
            redis__url=redis_url,
            folds__prefix=prefix,
            kafka__partitions=PARTITIONS,
        )
    )
    handle = start_worker(settings, on_batch=on_batch)
    try:
        if not done.wait(300):
            raise RuntimeError(f"the projector folded {seen[0]} of {total} events in 300 s")
    finally:
        handle.stop()
    # events after the first batch, over the time from the end of the first batch to the last apply
    counted = seen[0]
    return (
        counted / (marks[1] - marks[0]),
        counted / (cpu[1] - cpu[0]),
        fold_store(Config(redis=RedisConfig(redis_url), folds=FoldsConfig(prefix))),
        prefix,
    )


def bench_throughput_and_memory(bootstrap: str, redis_url: str) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    with kafka_topic(bootstrap, PARTITIONS, "bench-projector") as topic:
        logs = {f"s{i:04d}": session_log(i, EVENTS_PER_SESSION) for i in range(SESSIONS)}
        total = write_sessions(bootstrap, topic.name, logs, batch=100, partitions=PARTITIONS, threads=16)
        rates: list[float] = []
        cpu_rates: list[float] = []
        ratios: list[float] = []
        for attempt in range(RUNS):
            rate, per_cpu, store, prefix = _fold_once(bootstrap, topic.name, redis_url, total)
            rates.append(rate)
            cpu_rates.append(per_cpu)
            print(f"  run {attempt + 1}: {rate:,.0f} events/s, {per_cpu:,.0f} events per CPU-second", flush=True)
            if attempt == 0:
                for sid in logs:
                    state = store.get(sid)
                    if state is None:
                        raise RuntimeError(f"no fold for {sid}")
                    serialized = sum(len(m) for m in state.messages) + len(state.header or b"")
                    ratios.append(store.memory_usage(sid) / serialized)
            store.close()
            drop_prefix(redis_url, prefix)
        median = statistics.median(rates)
        rows.append(_row("fold throughput, one projector (median of 3)", median, "events/s", THROUGHPUT_TARGET))
        rows.append(_row("fold throughput, min of 3", min(rates), "events/s", THROUGHPUT_TARGET))
        rows.append(_row("fold throughput, max of 3", max(rates), "events/s", THROUGHPUT_TARGET))
        rows.append(
            _row(
                "fold throughput per CPU-second of the projector process (median of 3)",
                statistics.median(cpu_rates),
                "events/CPU-s",
                THROUGHPUT_TARGET,
            )
        )
        rows.append(
            _row("Redis memory / serialized fold, median session", statistics.median(ratios), "x", MEMORY_TARGET, False)
        )
        rows.append(_row("Redis memory / serialized fold, worst session", max(ratios), "x", MEMORY_TARGET, False))
    return rows


def bench_latency(bootstrap: str, redis_url: str, seconds: float = 8.0) -> list[dict[str, Any]]:
    sessions = [f"lat{i:02d}" for i in range(50)]
    per_session = int(RATE * seconds / len(sessions)) + BATCH
    logs = {sid: session_log(i, per_session + 1) for i, sid in enumerate(sessions)}
    prefix = f"bench:fold:{uuid.uuid4().hex[:8]}:"
    with kafka_topic(bootstrap, PARTITIONS, "bench-latency") as topic:
        log = topic.log()
        for sid in sessions:  # sessions exist before the clock starts (writer set-up is not the figure)
            log.append(sid, 0, logs[sid][:1])
        store = fold_store(Config(redis=RedisConfig(redis_url), folds=FoldsConfig(prefix)))
        handle = start_worker(
            WorkerSettings(
                Config().overridden(
                    kafka__bootstrap=bootstrap,
                    kafka__topic=topic.name,
                    kafka__projector_group=f"bench-{uuid.uuid4().hex[:8]}",
                    redis__url=redis_url,
                    folds__prefix=prefix,
                    kafka__partitions=PARTITIONS,
                )
            )
        )
        pending: dict[str, list[tuple[int, float, float]]] = {sid: [] for sid in sessions}
        lock = threading.Lock()
        latencies: list[float] = []  # from calling append
        after_append: list[float] = []  # from append returning (the projector's share)
        stop = threading.Event()

        def watch() -> None:
            while not stop.is_set() or any(pending.values()):
                with lock:
                    waiting = [sid for sid, p in pending.items() if p]
                if not waiting:
                    time.sleep(0.0005)
                    continue
                seqs = store.applied_seqs(waiting)
                now = time.perf_counter()
                with lock:
                    for sid in waiting:
                        while pending[sid] and pending[sid][0][0] <= seqs[sid]:
                            _seq, called, returned = pending[sid].pop(0)
                            latencies.append(now - called)
                            after_append.append(now - returned)

        try:
            handle.wait_ready(60)
            watcher = threading.Thread(target=watch)
            watcher.start()
            pos = dict.fromkeys(sessions, 1)
            interval = BATCH / RATE
            start = time.perf_counter()
            i = 0
            while time.perf_counter() - start < seconds:
                sid = sessions[i % len(sessions)]
                batch = logs[sid][pos[sid] : pos[sid] + BATCH]
                t0 = time.perf_counter()
                log.append(sid, pos[sid], batch)
                t1 = time.perf_counter()
                with lock:
                    pending[sid].append((batch[-1].seq, t0, t1))
                pos[sid] += len(batch)
                i += 1
                delay = start + i * interval - time.perf_counter()
                if delay > 0:
                    time.sleep(delay)
            achieved = i * BATCH / (time.perf_counter() - start)
            stop.set()
            watcher.join(30)
        finally:
            handle.stop()
            log.close()
            store.close()
            drop_prefix(redis_url, prefix)
    p50, p99 = _quantile(latencies, 0.5), _quantile(latencies, 0.99)
    return [
        _row("append -> fold visible, achieved rate", achieved, "events/s", RATE * 0.9),
        _row(f"append -> fold visible p50 at {RATE} events/s", p50, "ms", P99_TARGET_MS, False),
        _row(f"append -> fold visible p99 at {RATE} events/s", p99, "ms", P99_TARGET_MS, False),
        _row(
            "append returned -> fold visible p99 (projector share)",
            _quantile(after_append, 0.99),
            "ms",
            P99_TARGET_MS,
            False,
        ),
    ]


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))] * 1000


def run() -> list[dict[str, Any]]:
    bootstrap = _env("FOLDLINE_KAFKA_BOOTSTRAP")
    redis_url = _env("FOLDLINE_REDIS_URL")
    return bench_throughput_and_memory(bootstrap, redis_url) + bench_latency(bootstrap, redis_url)


if __name__ == "__main__":
    for row in run():
        mark = "ok" if row["ok"] else "MISS"
        print(f"{row['name']}: {row['value']} {row['unit']} (target {row['target']}) {mark}")
