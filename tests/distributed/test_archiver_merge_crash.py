"""``kill -9`` of an archiver process while it merges the segments of long-lived sessions (real Kafka and S3).

Twelve sessions grow turn by turn, and the writer waits until each turn is archived before the next, so
every turn becomes a segment of its own and the archiver merges them as they come (a session has at most
four). The archiver — ``python -m foldline.archiver``, the shipped entry point — is killed with SIGKILL at
random moments (2 to 5 s after it is back, at least six times) and restarted, so kills land between a merge's
intent, its object and its commit as often as anywhere else. Afterwards every session reads back identical
to the events written, has at most four segments, nothing pending or announced, and every object in the
store is a segment its manifest lists or one it lists as retired: no event lost, nothing left that nothing
names.
"""

from __future__ import annotations

import functools
import random
import threading
import time
import uuid
from collections.abc import Iterator

import boto3
import pytest
from confluent_kafka import ConsumerGroupState, KafkaException
from confluent_kafka.admin import AdminClient

from foldline.adapters.archive import SessionArchive, audit_archive
from foldline.adapters.archive.layout import manifest_key
from foldline.adapters.kafka import KafkaEventLog
from foldline.adapters.s3_archive import S3ArchiveStore
from foldline.adapters.s3_attachments import s3_client
from foldline.core.events import Envelope
from tests.distributed.projector_harness import WorkerProcess, env_or_fail, kafka_topic, wait_until, worker_env
from tests.factories import LogBuilder

pytestmark = [pytest.mark.kafka, pytest.mark.s3]

PARTITIONS = 4
SESSIONS = 12
TURNS = 40


@pytest.fixture
def bucket() -> Iterator[str]:
    name = f"foldline-merge-crash-{uuid.uuid4().hex[:10]}"
    yield name
    s3 = boto3.session.Session().client("s3", endpoint_url=env_or_fail("FOLDLINE_S3_ENDPOINT"))
    try:
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=name):
            for obj in page.get("Contents", []):
                s3.delete_object(Bucket=name, Key=obj["Key"])
        s3.delete_bucket(Bucket=name)
    finally:
        s3.close()


def _turns(index: int) -> list[list[Envelope]]:
    """A session's turns, each ending with ``turn/end`` (the first with the header)."""
    log = LogBuilder().header()
    batches: list[list[Envelope]] = []
    start = 0
    for t in range(TURNS):
        log.turn(t, f"session {index} question {t}", steps=2)
        batches.append(log.events[start:])
        start = len(log.events)
    return batches


def _working(bootstrap: str, group: str) -> bool:
    """The archivers' group is stable with one member (the restarted archiver; a killed one has expired) holding
    every partition: it is at work, not waiting for its first assignment."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    try:
        desc = admin.describe_consumer_groups([group], request_timeout=5)[group].result(timeout=10)
    except KafkaException:
        return False
    held = sum(len(m.assignment.topic_partitions) for m in desc.members if m.assignment is not None)
    return desc.state == ConsumerGroupState.STABLE and len(desc.members) == 1 and held == PARTITIONS


@pytest.mark.slow
def test_kill_9_of_the_archiver_while_it_merges_loses_nothing_and_leaves_nothing_unnamed(bucket: str) -> None:
    rng = random.Random(40)
    endpoint = env_or_fail("FOLDLINE_S3_ENDPOINT")
    with kafka_topic(env_or_fail("FOLDLINE_KAFKA_BOOTSTRAP"), PARTITIONS, "merge-crash") as topic:
        turns = {f"m{i:02d}": _turns(i) for i in range(SESSIONS)}
        written = {sid: [e for batch in batches for e in batch] for sid, batches in turns.items()}
        group = f"test-merge-archivers-{uuid.uuid4().hex[:8]}"
        env = worker_env(
            {
                "FOLDLINE_BACKEND": "kafka",
                "FOLDLINE_KAFKA_BOOTSTRAP": topic.bootstrap,
                "FOLDLINE_KAFKA_TOPIC": topic.name,
                "FOLDLINE_KAFKA_PARTITIONS": str(PARTITIONS),
                "FOLDLINE_ARCHIVE": "s3",
                "FOLDLINE_ARCHIVE_BUCKET": bucket,
                "FOLDLINE_ARCHIVE_GROUP": group,
                "FOLDLINE_ARCHIVE_IDLE": "0.1",
                "FOLDLINE_ARCHIVE_MAX_DELAY": "4",
            }
        )
        archiver = WorkerProcess([], env, module="foldline.archiver").start()
        store = S3ArchiveStore(
            bucket,
            client=s3_client(
                endpoint_url=endpoint,
                region=None,
                max_attempts=5,
                connect_timeout_s=2.0,
                read_timeout_s=30.0,
                max_connections=16,
            ),
            prefix="archive/",
        )
        done = threading.Event()
        failures: list[BaseException] = []

        def archived_to(heads: dict[str, int]) -> bool:
            reader = SessionArchive(store, cache_events=0)
            return all(reader.watermark(sid) >= head for sid, head in heads.items())

        def write() -> None:
            log = KafkaEventLog(topic.bootstrap, topic=topic.name, partitions=PARTITIONS)
            try:
                for t in range(TURNS):
                    for sid, batches in turns.items():
                        log.append(sid, batches[t][0].seq, batches[t])
                    # idle after every session's turn until the archiver (restarted or not) has archived it:
                    # each turn a segment, however slowly a killed archiver comes back
                    heads = {sid: batches[t][-1].seq + 1 for sid, batches in turns.items()}
                    wait_until(functools.partial(archived_to, heads), 120, f"turn {t} archived")
            except BaseException as exc:  # pragma: no cover - reported below
                failures.append(exc)
            finally:
                log.close()
                done.set()

        writer = threading.Thread(target=write)
        writer.start()
        kills = 0
        try:
            while not done.is_set() or kills < 6:
                archiver.wait_ready(120)
                # A restarted archiver is ready before the group assigns it anything: the killed member holds its
                # partitions until its session times out (6 s). Killed again before that — on a quiet machine a
                # restart takes ~1 s, and the kills come 2 to 5 s apart — no member ever got a partition and
                # nothing was archived at all. So each kill lands while the archiver holds every partition.
                wait_until(
                    functools.partial(_working, topic.bootstrap, group), 60, "the archiver assigned its partitions"
                )
                time.sleep(rng.uniform(2.0, 5.0))
                archiver.kill()  # SIGKILL: an intent, object or commit of an append or a merge is cut off
                kills += 1
                archiver.start(wait=False)
            writer.join()
            archiver.wait_ready(120)

            def settled() -> bool:
                reader = SessionArchive(store, cache_events=0)
                for sid, events in written.items():
                    m = reader.manifest(sid)
                    if m is None or m.next_seq != len(events) or m.pending or m.merging or len(m.segments) > 4:
                        return False
                return True

            deadline = time.monotonic() + 180
            while not settled():
                if time.monotonic() > deadline:
                    reader = SessionArchive(store, cache_events=0)
                    states = {
                        sid: None if (m := reader.manifest(sid)) is None else (m.next_seq, len(m.segments), m.merging)
                        for sid in written
                    }
                    raise AssertionError(
                        f"not every session archived and merged 180 s after the last kill (writer: {failures}): "
                        f"{states}; the archiver's log: {archiver.stderr()[-3000:]}"
                    )
                time.sleep(0.2)
        finally:
            archiver.kill()
        assert failures == []
        assert kills >= 6

        report = audit_archive(store, verify=True)
        assert (report.sessions, report.events) == (SESSIONS, sum(map(len, written.values())))
        assert (report.orphans, report.missing, report.corrupt, report.pending, report.merging) == ([],) * 5
        assert report.max_segments <= 4
        reader = SessionArchive(store, cache_events=0)
        merged = 0
        for sid, events in written.items():
            assert reader.read(sid, 0, len(events)) == events, sid
            manifest = reader.manifest(sid)
            assert manifest is not None
            merged += len(manifest.retired)
            directory = manifest_key(sid).rsplit("/", 1)[0] + "/"
            objects = {k.removeprefix(directory) for k in store.keys(directory)}
            named = {"manifest.json", *(r.key for r in manifest.segments), *(r.key for r in manifest.retired)}
            assert objects == named, sid
        assert merged >= 2 * SESSIONS  # the sessions were merged all along (each turn was a segment)
        store.close()
