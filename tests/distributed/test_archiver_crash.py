"""``kill -9`` of archiver processes while 50,000 events across 500 sessions are written (real Kafka and S3).

Two ``python -m foldline.archiver`` processes share the archivers' consumer group; one of them is killed
with SIGKILL at random moments (at least five times), mid-segment more often than not — segments are cut
every 40 events, so an archiver is always between an intent, a segment and a commit — and restarted.
Afterwards every session reads back from the archive identical to the events written, every manifest's
segments are contiguous from seq 0 and none overlaps another, nothing is left pending, and the audit finds
no object that a manifest does not name.
"""

from __future__ import annotations

import itertools
import random
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Iterator

import boto3
import pytest

from foldline.adapters.archive import SessionArchive, audit_archive
from foldline.adapters.archive.layout import MANIFEST_NAME
from foldline.adapters.s3_archive import S3ArchiveStore
from foldline.adapters.s3_attachments import s3_client
from tests.distributed.projector_harness import (
    WorkerProcess,
    env_or_fail,
    kafka_topic,
    session_log,
    wait_until,
    worker_env,
    write_sessions,
)

pytestmark = [pytest.mark.kafka, pytest.mark.s3]

PARTITIONS = 12


@pytest.fixture
def bucket() -> Iterator[str]:
    name = f"foldline-archive-crash-{uuid.uuid4().hex[:10]}"
    yield name
    s3 = boto3.session.Session().client("s3", endpoint_url=env_or_fail("FOLDLINE_S3_ENDPOINT"))
    try:
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=name):
            for obj in page.get("Contents", []):
                s3.delete_object(Bucket=name, Key=obj["Key"])
        s3.delete_bucket(Bucket=name)
    finally:
        s3.close()


@pytest.mark.slow
@pytest.mark.alone  # kill -9 at scale: its timing limits assume the machine to itself
def test_kill_9_archivers_during_50000_events_across_500_sessions(bucket: str) -> None:
    rng = random.Random(16)
    endpoint = env_or_fail("FOLDLINE_S3_ENDPOINT")
    with kafka_topic(env_or_fail("FOLDLINE_KAFKA_BOOTSTRAP"), PARTITIONS, "archiver-crash") as topic:
        logs = {f"a{i:03d}": session_log(i, 100) for i in range(500)}
        assert sum(len(events) for events in logs.values()) == 50_000
        env = worker_env(
            {
                "FOLDLINE_BACKEND": "kafka",
                "FOLDLINE_KAFKA_BOOTSTRAP": topic.bootstrap,
                "FOLDLINE_KAFKA_TOPIC": topic.name,
                "FOLDLINE_KAFKA_PARTITIONS": str(PARTITIONS),
                "FOLDLINE_ARCHIVE": "s3",
                "FOLDLINE_ARCHIVE_BUCKET": bucket,
                "FOLDLINE_ARCHIVE_GROUP": f"test-archivers-{uuid.uuid4().hex[:8]}",
                "FOLDLINE_ARCHIVE_SEGMENT_EVENTS": "40",
                "FOLDLINE_ARCHIVE_IDLE": "0.3",
                "FOLDLINE_ARCHIVE_MAX_DELAY": "2",
            }
        )
        workers = [WorkerProcess([], env, module="foldline.archiver").start() for _ in range(2)]
        written: list[int] = []
        writer = threading.Thread(
            target=lambda: written.append(
                write_sessions(topic.bootstrap, topic.name, logs, batch=10, partitions=PARTITIONS, threads=12)
            )
        )
        writer.start()
        store = S3ArchiveStore(
            bucket,
            client=s3_client(
                endpoint_url=endpoint,
                region=None,
                max_attempts=5,
                connect_timeout_s=2.0,
                read_timeout_s=30.0,
                max_connections=32,
            ),
            prefix="archive/",
        )
        kills = 0
        try:
            while writer.is_alive() or kills < 5:
                time.sleep(rng.uniform(0.5, 1.5))
                victim = rng.randrange(len(workers))
                workers[victim].kill()  # SIGKILL: whatever intent, segment or commit was in flight is cut off
                kills += 1
                workers[victim].start(wait=False)  # the other one works on meanwhile
            writer.join()
            for w in workers:
                w.wait_ready()

            def archived() -> bool:
                reader = SessionArchive(store, cache_events=0)
                return all(reader.watermark(sid) == len(events) for sid, events in logs.items())

            wait_until(archived, 180, "every session archived after the last kill")
        finally:
            for w in workers:
                w.kill()
        assert written == [50_000]
        assert kills >= 5

        report = audit_archive(store)  # reading every session below checks every segment's digest
        assert report.sessions == 500
        assert report.events == 50_000
        assert report.orphans == []
        assert report.missing == []
        assert report.corrupt == []
        assert report.pending == []
        # no segment overlaps another: in every session directory the live segments' ranges tile 0..100 exactly
        # (a merge's inputs stay in the store, retired in its manifest, until the grace period ends: a kill can
        # leave a session with more small segments than the merge policy keeps, and those are merged)
        retired = set(report.retired)
        ranges: dict[str, list[tuple[int, int]]] = defaultdict(list)
        for key in store.keys("sessions/"):
            directory, name = key.rsplit("/", 1)
            if name != MANIFEST_NAME and key not in retired:
                first, end = name.removeprefix("seg-").removesuffix(".avro").split("-")
                ranges[directory].append((int(first), int(end)))
        assert len(ranges) == 500
        for spans in ranges.values():
            spans.sort()
            assert spans[0][0] == 0
            assert spans[-1][1] == 100
            assert all(a[1] == b[0] for a, b in itertools.pairwise(spans)), spans
        reader = SessionArchive(store, cache_events=0)
        mismatched = [sid for sid, events in logs.items() if reader.read(sid, 0, len(events)) != events]
        assert mismatched == []
        store.close()
