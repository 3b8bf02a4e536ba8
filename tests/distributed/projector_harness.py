"""Shared by the projector tests and benchmarks/bench_projector.py: session logs to write, parallel writers,
fold comparisons and subprocess workers against the real local Kafka and Redis."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import redis
from confluent_kafka.admin import AdminClient

from foldline.adapters.kafka import KafkaEventLog
from foldline.adapters.redis_folds import RedisFoldStore
from foldline.config import Config
from foldline.core import Envelope
from foldline.core.fold import FoldState, fold_state
from foldline.core.projection import Session
from foldline.ports.partition_marks import PartitionMarks
from foldline.projector import WorkerSettings
from foldline.projector.runtime import MARK_DONE
from tests.factories import LogBuilder

REPO = Path(__file__).resolve().parents[2]


def session_log(index: int, n_events: int) -> list[Envelope]:
    """A valid session log of exactly ``n_events`` events (header, turns with tool rounds), ~200 bytes each."""
    b = LogBuilder().header()
    turn = 0
    while len(b.events) < n_events + 20:
        b.turn(turn, f"session {index} question {turn}: " + "context " * 12, steps=3)
        turn += 1
    events = b.events[:n_events]
    # cut at a point the log rules accept: a prefix of a valid log is valid
    return events


def chunks(events: Sequence[Envelope], size: int) -> list[list[Envelope]]:
    return [list(events[i : i + size]) for i in range(0, len(events), size)]


def write_sessions(
    bootstrap: str,
    topic: str,
    logs: dict[str, list[Envelope]],
    *,
    batch: int,
    partitions: int,
    threads: int = 8,
    pause_s: float = 0.0,
    stop: threading.Event | None = None,
) -> int:
    """Append every log in batches of ``batch`` events with ``threads`` writers; returns events written.

    Sessions are interleaved (round robin over a writer's sessions), so every partition keeps receiving
    events for the whole run.
    """
    ids = sorted(logs)
    shares = [ids[k::threads] for k in range(threads)]

    def work(k: int) -> int:
        written = 0
        log = KafkaEventLog(bootstrap, topic=topic, partitions=partitions, max_writers=1024)
        try:
            pending = {sid: chunks(logs[sid], batch) for sid in shares[k]}
            pos = dict.fromkeys(shares[k], 0)
            while pending:
                for sid in list(pending):
                    if stop is not None and stop.is_set():
                        return written
                    part = pending[sid].pop(0)
                    log.append(sid, pos[sid], part)
                    pos[sid] += len(part)
                    written += len(part)
                    if not pending[sid]:
                        del pending[sid]
                    if pause_s:
                        time.sleep(pause_s)
            return written
        finally:
            log.close()

    with ThreadPoolExecutor(threads) as pool:  # the first writer's error, if any, is raised here
        return sum(pool.map(work, range(threads)))


def fresh_fold(log: KafkaEventLog, session_id: str, epoch: int) -> FoldState:
    return fold_state(Session(session_id, log.read(session_id)), epoch)


def wait_until(predicate: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:g}s waiting for {what}")
        time.sleep(0.05)


def all_applied(store: RedisFoldStore, heads: dict[str, int]) -> bool:
    seqs = store.applied_seqs(list(heads))
    return all(seqs[sid] >= head - 1 for sid, head in heads.items())


def journal_problems(journal: list[str], head: int, *, rebuilds_allowed: bool = False) -> list[str]:
    """Check that the change journal applies every seq in ``0..head-1`` exactly once (``p:`` = rebuild)."""
    problems: list[str] = []
    applied = -1
    for entry in journal:
        kind, *nums = entry.split(":")
        if kind == "a":
            first, last = int(nums[0]), int(nums[1])
            if first != applied + 1:
                problems.append(f"{entry} after seq {applied}: {'skipped' if first > applied + 1 else 'applied twice'}")
            applied = last
        elif kind == "p":
            if not rebuilds_allowed:
                problems.append(f"unexpected rebuild {entry}")
            applied = max(applied, int(nums[0]))
    if applied != head - 1:
        problems.append(f"journal ends at seq {applied}, the log at {head - 1}")
    return problems


@dataclass
class Topic:
    bootstrap: str
    name: str
    partitions: int

    def log(self) -> KafkaEventLog:
        return KafkaEventLog(self.bootstrap, topic=self.name, partitions=self.partitions)


@contextmanager
def kafka_topic(bootstrap: str, partitions: int, label: str = "projector") -> Iterator[Topic]:
    name = f"test.{label}.{uuid.uuid4().hex[:10]}"
    topic = Topic(bootstrap, name, partitions)
    creator = topic.log()  # the log creates its topics (events, index, dlq) on first use
    creator.head("topic-creation")
    creator.close()
    try:
        yield topic
    finally:
        admin = AdminClient({"bootstrap.servers": bootstrap})
        existing = admin.list_topics(timeout=10).topics
        doomed = [t for t in (name, name + ".index", name + ".dlq") if t in existing]
        if doomed:
            for fut in admin.delete_topics(doomed, operation_timeout=10).values():
                fut.result(timeout=20)


def worker_settings(
    topic: Topic,
    *,
    redis_url: str | None = None,
    prefix: str | None = None,
    group: str | None = None,
    journal: bool = False,
    **overrides: Any,
) -> WorkerSettings:
    """An in-process projector's settings on ``topic``: the local Redis unless ``redis_url``, the folds under
    ``prefix``, a group of its own unless ``group``, and ``overrides`` as ``Config.overridden`` takes them
    (e.g. ``projector__max_batch=40``)."""
    fields: dict[str, Any] = {
        "kafka__bootstrap": topic.bootstrap,
        "kafka__topic": topic.name,
        "kafka__projector_group": group or f"test-projector-{uuid.uuid4().hex[:8]}",
        "redis__url": redis_url or env_or_fail("FOLDLINE_REDIS_URL"),
        "kafka__partitions": topic.partitions,
    }
    if prefix is not None:
        fields["folds__prefix"] = prefix
    return WorkerSettings(Config().overridden(**fields, **overrides), journal=journal)


def all_marked(marks: PartitionMarks, topic: Topic) -> bool:
    """Whether every partition of ``topic`` is marked done (the store holds the folds of what was consumed)."""
    parts = list(range(topic.partitions))
    return marks.marks(topic.name, parts) == dict.fromkeys(parts, MARK_DONE)


def drop_prefix(url: str, prefix: str) -> None:
    client = redis.Redis.from_url(url)
    try:
        keys = list(client.scan_iter(match=f"{prefix}*", count=1000))
        for i in range(0, len(keys), 500):
            client.delete(*keys[i : i + 500])
    except redis.RedisError:
        pass  # a private server that is already gone
    finally:
        client.close()


@dataclass
class WorkerProcess:
    """``python -m foldline.projector`` (or another worker ``module`` announcing ``<kind> ready``) as a child
    process (the shipped entry point, not a test double)."""

    args: list[str]
    env: dict[str, str]
    module: str = "foldline.projector"
    proc: subprocess.Popen[str] | None = None
    lines: list[str] = field(default_factory=list)
    starts: int = 0
    _reader: threading.Thread | None = None
    _stderr: IO[str] | None = None
    _ready: threading.Event = field(default_factory=threading.Event)

    def start(self, ready_timeout_s: float = 60.0, *, wait: bool = True) -> WorkerProcess:
        """Start the process; with ``wait``, return once it announced it is ready."""
        self.lines = []
        self.starts += 1
        self._stderr = tempfile.TemporaryFile("w+")  # noqa: SIM115 - closed in kill()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", self.module, *self.args],
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            text=True,
            env=self.env,
            cwd=REPO,
        )
        ready = threading.Event()
        proc = self.proc

        def read() -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                self.lines.append(line)
                if line.startswith(f"{self.kind} ready"):
                    ready.set()

        self._reader = threading.Thread(target=read, daemon=True)
        self._reader.start()
        self._ready = ready
        if wait:
            self.wait_ready(ready_timeout_s)
        return self

    def wait_ready(self, ready_timeout_s: float = 60.0) -> WorkerProcess:
        if not self._ready.wait(ready_timeout_s):
            stderr = self.stderr()
            self.kill()
            raise AssertionError(f"{self.kind} did not report ready in {ready_timeout_s:g}s: {stderr[-2000:]}")
        return self

    @property
    def kind(self) -> str:
        return self.module.rsplit(".", 1)[-1]

    def stderr(self) -> str:
        if self._stderr is None:
            return ""
        self._stderr.seek(0)
        return self._stderr.read()

    def kill(self) -> None:
        """SIGKILL: no shutdown code runs (the crash the tests are about)."""
        proc = self.proc
        if proc is None:
            return
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)
        if self._reader is not None:
            self._reader.join(10)
        if proc.stdout is not None:
            proc.stdout.close()
        if self._stderr is not None:
            self._stderr.close()
            self._stderr = None
        self.proc = None


def worker_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "services"), str(REPO), env.get("PYTHONPATH", "")])
    env.update(extra or {})
    return env


def env_or_fail(name: str) -> str:
    import pytest

    value = os.environ.get(name)
    if not value:
        pytest.fail(f"{name} is unset: run `bash deploy/local/up.sh` and `source .local/env.sh` (make test does both)")
    return value


def fold_mismatches(log: KafkaEventLog, store: RedisFoldStore, heads: dict[str, int], epoch: int) -> list[str]:
    """Sessions whose fold differs from a fresh fold of their log (by field, for a readable failure)."""
    bad: list[str] = []
    for sid in heads:
        fresh = fresh_fold(log, sid, epoch)
        got = store.get(sid)
        if got != fresh:
            if got is None:
                bad.append(f"{sid}: no fold")
                continue
            fields = [f.name for f in dataclasses.fields(FoldState) if getattr(got, f.name) != getattr(fresh, f.name)]
            bad.append(f"{sid}: {', '.join(fields)} differ (applied {got.applied_seq}, log head {fresh.applied_seq})")
    return bad


def fold_mismatches_parallel(
    topic: Topic, store: RedisFoldStore, heads: dict[str, int], epoch: int, threads: int = 8
) -> list[str]:
    """:func:`fold_mismatches` over many sessions, reading the log with ``threads`` log instances at once."""
    ids = sorted(heads)

    def work(k: int) -> list[str]:
        log = topic.log()
        try:
            return fold_mismatches(log, store, {sid: heads[sid] for sid in ids[k::threads]}, epoch)
        finally:
            log.close()

    with ThreadPoolExecutor(threads) as pool:
        return sorted(m for part in pool.map(work, range(threads)) for m in part)
