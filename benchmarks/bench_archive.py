"""The session archive against the local broker and SeaweedFS (``deploy/local/up.sh``; ``source .local/env.sh``).

* **archive throughput, one process** — 20 sessions x 10,000 ~200-byte events (the loop's shapes: turns
  of steps with tool rounds) are written to a 12-partition topic first; then one archiver (the engine on
  :class:`~foldline.adapters.kafka.ArchiveFeed`, 16 segment writers) archives all of them to S3, timed
  from its first poll to the last manifest committed; three times (each a new consumer group and archive
  prefix), the median reported with the spread. Target >= 100,000 events/s;
* **reading a 10,000-event session from the archive** — ``SessionArchive.read`` with nothing cached (the
  process's reader, its manifest forgotten before each read and no segment kept): the manifest, the
  segments (10 of 1,000 events), digests, decoding; p50 and p95 of 15 reads, and the CPU time of each.
  Target p50 <= 50 ms. For reference: the same with a new reader and S3 client each time (their fetch
  threads and connections start inside the read), the same events archived as one segment (what the
  default ``segment_events`` of 10,000 writes for a session archived at once), and the same session read
  from Kafka (``KafkaEventLog.read``);
* reference figures: bytes per event in the archive (deflate) and on the topic, the segment build alone.

``run() -> list[dict]`` returns rows {"name", "value", "unit", "target", "ok"}.
"""

from __future__ import annotations

import gc
import os
import statistics
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from confluent_kafka.admin import AdminClient
from tests.distributed.projector_harness import session_log, write_sessions

from foldline.adapters.archive import ArchiveAppender, SegmentEncoder, SessionArchive, build_segment
from foldline.adapters.avro import AvroCodec
from foldline.adapters.kafka import ArchiveFeed, KafkaEventLog
from foldline.adapters.s3_archive import S3ArchiveStore
from foldline.adapters.s3_attachments import s3_client
from foldline.archiver.engine import ArchivePolicy, Archiver

__all__ = ["run"]

THROUGHPUT_TARGET = 100_000.0
READ_TARGET_MS = 50.0
SESSIONS, EVENTS = 20, 10_000
LONG = 10_000
RUNS = 3  # archiving runs over the same topic: the host's speed varies by tens of percent
PARTITIONS = 12


def _row(name: str, value: float, unit: str, target: float | None, higher_is_better: bool = True) -> dict[str, Any]:
    if target is None:
        return {"name": name, "value": round(value, 2), "unit": unit, "target": "(reference)", "ok": True}
    ok = value >= target if higher_is_better else value <= target
    sign = "≥" if higher_is_better else "≤"
    return {"name": name, "value": round(value, 1), "unit": unit, "target": f"{sign} {target:,g} {unit}", "ok": ok}


def _env(name: str) -> str:
    value = os.environ.get(name)
    if not value:
        raise RuntimeError(f"{name} is not set; run deploy/local/up.sh and source .local/env.sh")
    return value


def _store(endpoint: str, bucket: str, prefix: str) -> S3ArchiveStore:
    client = s3_client(
        endpoint_url=endpoint,
        region=None,
        max_attempts=5,
        connect_timeout_s=2.0,
        read_timeout_s=30.0,
        max_connections=32,
    )
    return S3ArchiveStore(bucket, client=client, prefix=prefix)


@contextmanager
def _servers() -> Iterator[tuple[str, str, str, str]]:
    bootstrap, endpoint = _env("FOLDLINE_KAFKA_BOOTSTRAP"), _env("FOLDLINE_S3_ENDPOINT")
    run_id = uuid.uuid4().hex[:10]
    topic, bucket = f"bench.archive.{run_id}", f"foldline-bench-archive-{run_id}"
    store = _store(endpoint, bucket, "")
    store.ensure_bucket()
    try:
        yield bootstrap, endpoint, topic, bucket
    finally:
        for key in list(store.keys()):
            store.delete(key)
        store.client.delete_bucket(Bucket=bucket)
        store.close()
        admin = AdminClient({"bootstrap.servers": bootstrap})
        existing = admin.list_topics(timeout=10).topics
        doomed = [t for t in (topic, topic + ".index", topic + ".dlq") if t in existing]
        if doomed:
            for fut in admin.delete_topics(doomed, operation_timeout=10).values():
                fut.result(timeout=30)


def bench_throughput(bootstrap: str, endpoint: str, topic: str, bucket: str) -> tuple[list[float], list[float], int]:
    """Events/s and events per CPU-second of one archiver over a written topic, for each of ``RUNS`` runs
    (each a new consumer group archiving the whole topic to its own prefix); segments written by one."""
    logs = {f"b{i:03d}": session_log(i, EVENTS) for i in range(SESSIONS)}
    write_sessions(bootstrap, topic, logs, batch=100, partitions=PARTITIONS, threads=8)
    rates: list[float] = []
    per_cpu: list[float] = []
    segments = 0
    for n in range(RUNS):
        rate, cpu_rate, segments = _archive_once(bootstrap, endpoint, topic, bucket, f"throughput-{n}/")
        rates.append(rate)
        per_cpu.append(cpu_rate)
    return rates, per_cpu, segments


def _archive_once(bootstrap: str, endpoint: str, topic: str, bucket: str, prefix: str) -> tuple[float, float, int]:
    archive = SessionArchive(_store(endpoint, bucket, prefix))
    policy = ArchivePolicy(idle_s=0.05, max_delay_s=60.0)  # segments of up to 10,000 events (the default)
    feed = ArchiveFeed(bootstrap, f"bench-archivers-{uuid.uuid4().hex[:8]}", topic=topic, partitions=PARTITIONS)
    archiver = Archiver(ArchiveAppender(archive), feed, policy, concurrency=16)
    total = SESSIONS * EVENTS
    started = cpu = 0.0
    try:
        while not archiver.archived_events:  # the group join and the first records; not timed
            events, ends = feed.poll(5000, 0.05)
            if events and not started:
                started, cpu = time.perf_counter(), time.process_time()
            archiver.offer(events, ends)
            archiver.step()
            if started and time.perf_counter() - started > 300:
                raise RuntimeError("the archiver made no progress in 300 s")
        while archiver.archived_events < total:
            events, ends = feed.poll(5000, 0.02)
            archiver.offer(events, ends)
            archiver.step()
            if time.perf_counter() - started > 300:
                raise RuntimeError(f"only {archiver.archived_events} of {total} events archived in 300 s")
        elapsed, cpu_s = time.perf_counter() - started, time.process_time() - cpu
        feed.commit(archiver.safe_offsets())
    finally:
        archiver.close()
        feed.close()
        archive.close()
    return total / elapsed, total / cpu_s, archiver.segments


def bench_read(bootstrap: str, endpoint: str, topic: str, bucket: str) -> dict[str, float]:
    """A 10,000-event session in 10 segments: cold reads from the archive, reads from Kafka, sizes."""
    sid = "long-session"
    events = session_log(7, LONG)
    encoder = SegmentEncoder()
    bodies = [encoder.body(e) for e in events]
    store = _store(endpoint, bucket, "read/")
    appender = ArchiveAppender(SessionArchive(store))
    for end in range(1000, LONG + 1, 1000):
        appender.append(sid, end, lambda a, b: build_segment(sid, a, bodies[a:b], encoder.fingerprint))
    t = time.perf_counter()
    segment = build_segment(sid, 0, bodies[:1000], encoder.fingerprint)
    build_us = (time.perf_counter() - t) / 1000 * 1e6
    reads: list[float] = []
    cpu: list[float] = []
    fresh: list[float] = []
    reader = SessionArchive(store, cache_events=0)  # a process's reader: its fetch threads stay
    reader.read(sid, 0, LONG)  # they start
    for _ in range(15):
        reader.forget(sid)  # the manifest; no segment is kept (cache_events=0)
        t, c = time.perf_counter(), time.process_time()
        got = reader.read(sid, 0, LONG)
        reads.append((time.perf_counter() - t) * 1000)
        cpu.append((time.process_time() - c) * 1000)
        if got != events:
            raise RuntimeError("the archive read back other events than were archived")
    for _ in range(15):
        new = SessionArchive(_store(endpoint, bucket, "read/"), cache_events=0)  # its own client, threads
        gc.collect()  # what building the client left (the service model's objects) is not the read's
        t = time.perf_counter()
        new.read(sid, 0, LONG)
        fresh.append((time.perf_counter() - t) * 1000)
        new.close()
    one = SessionArchive(_store(endpoint, bucket, "read-one-segment/"), cache_events=0)
    ArchiveAppender(one).append(sid, LONG, lambda a, b: build_segment(sid, a, bodies[a:b], encoder.fingerprint))
    single: list[float] = []
    for _ in range(15):
        one.forget(sid)
        t = time.perf_counter()
        if one.read(sid, 0, LONG) != events:
            raise RuntimeError("the archive read back other events than were archived")
        single.append((time.perf_counter() - t) * 1000)
    one.close()
    log = KafkaEventLog(bootstrap, topic=topic, partitions=PARTITIONS)
    kafka_reads: list[float] = []
    try:
        for i in range(0, LONG, 500):
            log.append(sid, i, events[i : i + 500])
        for _ in range(7):
            t = time.perf_counter()
            log.read(sid)
            kafka_reads.append((time.perf_counter() - t) * 1000)
    finally:
        log.close()
    reader.close()  # and the store
    codec = AvroCodec()
    return {
        "p50": statistics.median(reads),
        "p95": sorted(reads)[int(0.95 * (len(reads) - 1))],
        "cpu_p50": statistics.median(cpu),
        "fresh_p50": statistics.median(fresh),
        "single_p50": statistics.median(single),
        "kafka_p50": statistics.median(kafka_reads),
        "archive_bytes": len(segment) / 1000,
        "topic_bytes": sum(len(codec.encode(e)) for e in events[:1000]) / 1000,
        "build_us": build_us,
    }


def run() -> list[dict[str, Any]]:
    with _servers() as (bootstrap, endpoint, topic, bucket):
        rates, per_cpu_rates, segments = bench_throughput(bootstrap, endpoint, topic, bucket)
        read = bench_read(bootstrap, endpoint, topic, bucket)
    return [
        _row(
            f"archive throughput, one archiver, {SESSIONS} sessions x {EVENTS:,} events, {PARTITIONS} partitions "
            f"({segments} segments; median of {len(rates)} runs, spread {min(rates):,.0f}..{max(rates):,.0f})",
            statistics.median(rates),
            "events/s",
            THROUGHPUT_TARGET,
        ),
        _row(
            "the same per CPU-second of the archiver (median)", statistics.median(per_cpu_rates), "events/CPU-s", None
        ),
        _row(
            f"read a {LONG:,}-event session from the archive (10 segments, nothing cached), p50",
            read["p50"],
            "ms",
            READ_TARGET_MS,
            higher_is_better=False,
        ),
        _row("the same, p95", read["p95"], "ms", None),
        _row("the same, CPU time of the reading process, p50", read["cpu_p50"], "ms", None),
        _row(
            "the same, a new reader and S3 client each time (their threads and connections start), p50",
            read["fresh_p50"],
            "ms",
            None,
        ),
        _row(
            f"the same {LONG:,} events archived as one segment (the default segment_events), p50",
            read["single_p50"],
            "ms",
            None,
        ),
        _row(f"read the same {LONG:,} events from Kafka (KafkaEventLog.read), p50", read["kafka_p50"], "ms", None),
        _row("archive bytes per event (deflate, container file of 1,000 events)", read["archive_bytes"], "bytes", None),
        _row("topic bytes per event (single-object Avro)", read["topic_bytes"], "bytes", None),
        _row("segment build per event (raw bodies → container file)", read["build_us"], "µs", None),
    ]


if __name__ == "__main__":
    for r in run():
        print(r)
