"""A session that lives for weeks: 1,000 turns, each followed by an idle period, with the archiver running.

The distributed backend as a user runs it (real Kafka, Redis and SeaweedFS from ``deploy/local``; ``source
.local/env.sh``), with the archive on and every other setting at its default (the invariant on, four
segments per session before a merge, a grace period of an hour): a projector, a dispatcher with its
emulator and an archiver run as ``foldline`` processes; this process is the session's writer — a loop with
the demo's tools whose every step is handed to the dispatcher. The archive's idle threshold is lowered to
0.2 s (``FOLDLINE_ARCHIVE_IDLE``) and the writer waits 0.35 s after each turn, so each turn becomes a segment
of its own, as a person's reply a minute later would make it, and the archiver merges them as they come.

At turn 50 and at turn 1,000, once the archiver has caught up (the archive holds every event, no merge is
announced and not committed):

* **cold read** — the whole archived session read with nothing cached (a process's reader, its manifest
  forgotten before each read and no segment kept, as ``bench_archive`` reads), 15 times: p50, and the S3
  GETs each read costs (the manifest and the segments);
* **resume** — ``foldline resume long-0 --steps 1`` as a new process, three times (the median): it takes the
  session over, reads it, runs one step against the emulator and verifies what it sent.

**The writer's turn time** is ``run_turn``'s, p50 over 20 turns: turns 51-70 and 981-1,000 (one run). The
resumes at turn 50 take the session from the writer, which opens it again as a new loop instance; the Kafka
log then writes it on the session's own producer, one transaction per append (docs/KAFKA.md, "Sessions taken
from another instance"), which costs a turn more than the group writer did before. Both windows come after
that, so they compare the session's age and nothing else; turns 31-50 (before it) are a reference row.

Targets: cold read p50 <= 100 ms and at most 5 GETs at 1,000 turns; resume and the turn time at 1,000 turns
within 20 % of the same at 50. Reference rows: segments, bytes per event, merges, the parts of a turn. The
machine is shared: the figures are indicative; each is printed next to its target.

    source .local/env.sh && python -m benchmarks.run long_session
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka.admin import AdminClient

from foldline.adapters.archive import SessionArchive
from foldline.adapters.s3_archive import S3ArchiveStore
from foldline.config import Config, Stores
from foldline.config.factories import archive_store, open_stores
from foldline.core import CallConfig
from foldline.demo import PROMPTS, SYSTEM_PROMPT, demo_toolset
from foldline.loop import Agent, AgentOptions
from foldline.loop.options import StepRecord
from foldline.ports.archive import ArchiveStore, StoredObject
from foldline.ports.step_dispatch import StepDispatcher
from foldline.providers.emulated import emulated_provider
from foldline.worker_processes import WorkerProcesses, worker_processes

__all__ = ["run"]

SESSION = "long-0"
TURNS = 1000
EARLY = 50
WINDOW = 20  # turns whose p50 is the turn time: the 20 after the first resumes, the 20 before the end
IDLE_S = 0.2  # FOLDLINE_ARCHIVE_IDLE
PAUSE_S = 0.35  # the writer's wait after each turn: longer than the idle threshold
READS = 15
RESUMES = 5
READ_TARGET_MS = 100.0
GET_TARGET = 5
GROWTH_TARGET = 1.2
_CLI = "from foldline.cli.main import main; main()"


class CountingStore(ArchiveStore):
    """The S3 store, counting the GETs of a read (manifest reads and segment fetches)."""

    def __init__(self, inner: ArchiveStore) -> None:
        self.inner = inner
        self.gets = 0
        self._lock = threading.Lock()

    def create(self, key: str, data: bytes) -> bool:
        return self.inner.create(key, data)

    def replace(self, key: str, data: bytes, expected: str | None) -> str:
        return self.inner.replace(key, data, expected)

    def delete(self, key: str) -> None:
        self.inner.delete(key)

    def read(self, key: str) -> StoredObject | None:
        with self._lock:
            self.gets += 1
        return self.inner.read(key)

    def fetch(self, key: str) -> bytes | None:
        with self._lock:
            self.gets += 1
        return self.inner.fetch(key)

    def keys(self, prefix: str = "", start_after: str = "") -> Iterator[str]:
        return self.inner.keys(prefix, start_after)

    def where(self, key: str) -> str:
        return self.inner.where(key)


@dataclass
class Mark:
    """What was measured at one point of the session's life."""

    turns: int
    events: int
    read_ms: list[float] = field(default_factory=list)
    gets: list[int] = field(default_factory=list)
    resume_s: list[float] = field(default_factory=list)
    segments: int = 0
    archive_bytes: int = 0
    retired: int = 0


def _env(name: str) -> str:
    value = os.environ.get(name)
    if not value:
        raise RuntimeError(f"{name} is not set; run deploy/local/up.sh and source .local/env.sh")
    return value


@contextmanager
def _deployment(data_dir: Path) -> Iterator[tuple[Config, dict[str, str], Stores, WorkerProcesses]]:
    """The distributed backend with the archive on: its settings (a unique topic, bucket prefix, fold prefix and
    step stream), the writer's stores, and the projector, dispatcher (+ emulator) and archiver processes."""
    run_id = uuid.uuid4().hex[:10]
    env = {
        **os.environ,
        "FOLDLINE_BACKEND": "distributed",
        "FOLDLINE_DATA_DIR": str(data_dir),
        "FOLDLINE_KAFKA_BOOTSTRAP": _env("FOLDLINE_KAFKA_BOOTSTRAP"),
        "FOLDLINE_KAFKA_TOPIC": f"bench.long.{run_id}",
        "FOLDLINE_FOLD_PREFIX": f"bench:long:{run_id}:",
        "FOLDLINE_DISPATCH_STREAM": f"bench:long:{run_id}",
        "FOLDLINE_S3_ENDPOINT": _env("FOLDLINE_S3_ENDPOINT"),
        "FOLDLINE_ARCHIVE": "s3",
        "FOLDLINE_ARCHIVE_PREFIX": f"bench-long-{run_id}/",
        "FOLDLINE_ARCHIVE_IDLE": str(IDLE_S),
    }
    for name in ("FOLDLINE_ARCHIVE_MAX_SEGMENTS", "FOLDLINE_ARCHIVE_GRACE", "FOLDLINE_ARCHIVE_SEGMENT_EVENTS"):
        env.pop(name, None)  # the defaults a user gets
    config = Config.from_env(env)
    stores = open_stores(config, writer=True)
    archiver: subprocess.Popen[bytes] | None = None
    log_path = data_dir / "logs" / "archiver.log"
    try:
        with worker_processes(config, stores, projectors=1, dispatchers=1) as workers:
            log_path.parent.mkdir(parents=True, exist_ok=True)
            with log_path.open("wb") as out:
                archiver = subprocess.Popen(
                    [sys.executable, "-c", _CLI, "archiver"], env={**env, **config.to_env()}, stdout=out, stderr=out
                )
                deadline = time.monotonic() + 90
                while "archiver ready" not in log_path.read_text(errors="replace"):
                    if archiver.poll() is not None or time.monotonic() > deadline:
                        raise RuntimeError(f"the archiver did not start: {log_path.read_text()[-2000:]}")
                    time.sleep(0.05)
                yield config, {**env, **config.to_env()}, stores, workers
    finally:
        if archiver is not None:
            archiver.terminate()
            try:
                archiver.wait(20)
            except subprocess.TimeoutExpired:
                archiver.kill()
        stores.close()
        _clean(config)


def _clean(config: Config) -> None:
    """Delete what the run wrote: its topics, its archive objects, its folds and stream."""
    store = archive_store(config)
    if store is not None:
        for key in list(store.keys()):
            store.delete(key)
        store.close()
    admin = AdminClient({"bootstrap.servers": config.kafka.bootstrap})
    topic = config.kafka.topic
    existing = admin.list_topics(timeout=10).topics
    doomed = [t for t in (topic, topic + ".index", topic + ".dlq") if t in existing]
    if doomed:
        for fut in admin.delete_topics(doomed, operation_timeout=10).values():
            fut.result(timeout=30)
    import redis

    client = redis.Redis.from_url(config.redis.url)
    try:
        keys = list(client.scan_iter(match=config.folds.prefix + "*", count=1000))
        if keys:
            client.delete(*keys)
        client.delete(config.dispatch.stream)
    finally:
        client.close()


class Writer:
    """The session's writer: one loop instance at a time, every step handed to the dispatcher."""

    def __init__(self, stores: Stores, dispatcher: StepDispatcher) -> None:
        self.stores = stores
        self.dispatcher = dispatcher
        self.provider = emulated_provider("anthropic")
        self.agent: Agent | None = None
        self.turns = 0
        self.times: list[float] = []
        self.parts: list[dict[str, float]] = []  # per turn: the seconds of each part of its steps, summed
        self._turn_parts: dict[str, float] = {}

    async def open(self) -> None:
        options = AgentOptions(
            config=CallConfig("anthropic", "claude-emulated", max_tokens=512),
            system=SYSTEM_PROMPT,
            tools=demo_toolset(),
            dispatcher=self.dispatcher,
        )
        self.agent = await Agent.open(
            SESSION, self.stores.log, self.provider, options, attachments=self.stores.attachments
        )
        self.agent.step_listeners.append(self._step)

    def _step(self, record: StepRecord) -> None:
        for name, seconds in record.timings.items():
            self._turn_parts[name] = self._turn_parts.get(name, 0.0) + seconds

    async def grow(self, to: int) -> None:
        """Turns until the session has ``to`` of this writer's, each followed by an idle period."""
        while self.turns < to:
            assert self.agent is not None
            began = time.perf_counter()
            self._turn_parts = {}
            await self.agent.run_turn(f"[{SESSION}] {PROMPTS[self.turns % len(PROMPTS)]}")
            self.times.append(time.perf_counter() - began)
            self.parts.append(self._turn_parts)
            self.turns += 1
            if self.turns % 100 == 0:
                print(f"  {self.turns} turns, {self.agent.session.next_seq:,} events", flush=True)
            await asyncio.sleep(PAUSE_S)

    def turn_ms(self, first: int) -> float:
        """The p50 of the turn time over the ``WINDOW`` turns from turn ``first`` (counted from 1)."""
        return statistics.median(self.times[first - 1 : first - 1 + WINDOW]) * 1000

    def parts_ms(self, first: int) -> dict[str, float]:
        """The p50 of each part of a turn (its steps' parts summed) over the same turns."""
        window = self.parts[first - 1 : first - 1 + WINDOW]
        names = sorted({n for p in window for n in p})
        return {n: statistics.median(p.get(n, 0.0) for p in window) * 1000 for n in names}


def _caught_up(store: ArchiveStore, head: int, max_segments: int, timeout_s: float = 120.0) -> SessionArchive:
    """Wait until the archive holds the whole session, merged, with no merge announced and not committed."""
    deadline = time.monotonic() + timeout_s
    while True:
        reader = SessionArchive(store, cache_events=0)
        manifest = reader.manifest(SESSION)
        if (
            manifest is not None
            and manifest.next_seq == head
            and manifest.merging is None
            and manifest.pending is None
            and len(manifest.segments) <= max_segments
        ):
            return reader
        if time.monotonic() > deadline:
            got = None if manifest is None else (manifest.next_seq, len(manifest.segments))
            raise RuntimeError(f"the archiver did not catch up with {head} events in {timeout_s:g}s: {got}")
        time.sleep(0.2)


def _measure(config: Config, env: dict[str, str], store: S3ArchiveStore, writer: Writer, head: int) -> Mark:
    mark = Mark(writer.turns, head)
    reader = _caught_up(store, head, config.archive.max_segments)
    manifest = reader.manifest(SESSION)
    assert manifest is not None
    mark.segments, mark.retired = len(manifest.segments), len(manifest.retired)
    mark.archive_bytes = sum(s.size for s in manifest.segments)
    counting = CountingStore(store)
    reader = SessionArchive(counting, cache_events=0)  # a process's reader: its fetch threads stay
    events = reader.read(SESSION, 0, head)  # they start, the client's connections open
    if len(events) != head:
        raise RuntimeError(f"the archive read back {len(events)} events, not {head}")
    for _ in range(READS):
        reader.forget(SESSION)  # the manifest; no segment is kept (cache_events=0)
        counting.gets = 0
        t = time.perf_counter()
        reader.read(SESSION, 0, head)
        mark.read_ms.append((time.perf_counter() - t) * 1000)
        mark.gets.append(counting.gets)
    reader.close()  # its threads (the store is the shared one: not closed)
    for _ in range(RESUMES):
        t = time.perf_counter()
        done = subprocess.run(
            [sys.executable, "-c", _CLI, "resume", SESSION, "--steps", "1", "--json"],
            env=env,
            capture_output=True,
            check=False,
        )
        mark.resume_s.append(time.perf_counter() - t)
        if done.returncode != 0 or not json.loads(done.stdout).get("verified"):
            raise RuntimeError(f"foldline resume failed ({done.returncode}): {done.stderr.decode()[-2000:]}")
    return mark


@dataclass
class Life:
    """The two marks, and the writer's turn times: before the first resumes, after them, at the end."""

    early: Mark
    late: Mark
    windows: dict[str, tuple[int, float, dict[str, float]]]  # name -> (first turn, p50 ms, parts p50 ms)


async def _life(config: Config, env: dict[str, str], stores: Stores, workers: WorkerProcesses) -> Life:
    store = archive_store(config)
    assert isinstance(store, S3ArchiveStore)
    dispatcher = workers.dispatcher()
    writer = Writer(stores, dispatcher)
    marks: list[Mark] = []
    try:
        for upto in (EARLY, TURNS):
            await writer.open()  # again after the first resumes: a new loop instance
            await writer.grow(upto)
            assert writer.agent is not None
            head = writer.agent.session.next_seq
            mark = await asyncio.get_running_loop().run_in_executor(None, _measure, config, env, store, writer, head)
            print(
                f"  at {upto} turns ({head:,} events): cold read p50 {statistics.median(mark.read_ms):.1f} ms "
                f"({max(mark.gets)} GETs), resume {statistics.median(mark.resume_s):.2f} s",
                flush=True,
            )
            marks.append(mark)
            workers.check_children()
    finally:
        await dispatcher.aclose()
        await writer.provider.aclose()
        store.close()
    windows = {}
    for name, first in (("before", EARLY - WINDOW + 1), ("early", EARLY + 1), ("late", TURNS - WINDOW + 1)):
        windows[name] = (first, writer.turn_ms(first), writer.parts_ms(first))
        print(
            f"  turns {first}-{first + WINDOW - 1}: p50 {windows[name][1]:.0f} ms; parts p50 (ms): "
            + ", ".join(f"{n} {v:.1f}" for n, v in windows[name][2].items()),
            flush=True,
        )
    return Life(marks[0], marks[1], windows)


def _row(name: str, value: float, unit: str, target: str, ok: bool, digits: int = 1) -> dict[str, Any]:
    return {"name": name, "value": round(value, digits), "unit": unit, "target": target, "ok": ok}


def rows(life: Life, max_segments: int) -> list[dict[str, Any]]:
    early, late = life.early, life.late
    read_p50 = statistics.median(late.read_ms)
    resume_early, resume_late = statistics.median(early.resume_s), statistics.median(late.resume_s)
    (first_b, before_ms, _), (first_e, early_ms, _), (first_l, late_ms, parts) = (
        life.windows["before"],
        life.windows["early"],
        life.windows["late"],
    )
    turn_ratio, resume_ratio = late_ms / early_ms, resume_late / resume_early
    size = f"{late.turns:,} turns ({late.events:,} events)"
    return [
        _row(
            f"cold read of the archived session at {size}, {late.segments} segments, nothing cached, p50 of {READS}",
            read_p50,
            "ms",
            f"≤ {READ_TARGET_MS:g} ms",
            read_p50 <= READ_TARGET_MS,
        ),
        _row(
            "S3 GETs per cold read (manifest + segments), the most of any read",
            max(late.gets),
            "GETs",
            f"≤ {GET_TARGET}",
            max(late.gets) <= GET_TARGET,
            0,
        ),
        _row(
            f"`foldline resume --steps 1` at {size} / at {early.turns} turns "
            f"({resume_late:.2f} s / {resume_early:.2f} s, medians of {RESUMES})",
            resume_ratio,
            "x",
            f"≤ {GROWTH_TARGET:g}",
            resume_ratio <= GROWTH_TARGET,
            2,
        ),
        _row(
            f"the writer's turn time, p50 of turns {first_l}-{first_l + WINDOW - 1} / of turns "
            f"{first_e}-{first_e + WINDOW - 1} ({late_ms:.0f} ms / {early_ms:.0f} ms)",
            turn_ratio,
            "x",
            f"≤ {GROWTH_TARGET:g}",
            turn_ratio <= GROWTH_TARGET,
            2,
        ),
        _row(
            f"the writer's turn time before the first resumes (turns {first_b}-{first_b + WINDOW - 1}, the group "
            "writer), p50",
            before_ms,
            "ms",
            "(reference)",
            True,
            0,
        ),
        {
            "name": f"parts of a turn at turns {first_l}-{first_l + WINDOW - 1}, p50 (its steps' parts summed)",
            "value": ", ".join(f"{n} {v:.1f}" for n, v in parts.items()),
            "unit": "ms",
            "target": "(reference)",
            "ok": True,
        },
        _row(
            f"cold read at {early.turns} turns ({early.events:,} events, {early.segments} segments), p50",
            statistics.median(early.read_ms),
            "ms",
            "(reference)",
            True,
        ),
        _row(f"segments of the session at {size}", late.segments, "segments", f"≤ {max_segments} (reference)", True, 0),
        _row(
            "archive bytes per event (its live segments)",
            late.archive_bytes / late.events,
            "bytes",
            "(reference)",
            True,
        ),
        _row(
            "segments merges replaced, kept for readers of older manifests (deleted after the grace period)",
            late.retired,
            "segments",
            "(reference)",
            True,
            0,
        ),
    ]


def run() -> list[dict[str, Any]]:
    with (
        tempfile.TemporaryDirectory(prefix="foldline-bench-long-") as tmp,
        _deployment(Path(tmp)) as (config, env, stores, workers),
    ):
        life = asyncio.run(_life(config, env, stores, workers))
    return rows(life, config.archive.max_segments)


if __name__ == "__main__":
    for r in run():
        print(r)
