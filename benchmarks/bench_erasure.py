"""What sealed content costs: append throughput, fold throughput and the loop's per-step overhead, with
encryption on (content sealed under the session's key, docs/ERASURE.md) against off, same code, same machine,
runs interleaved.

* **Append**: the embedded SQLite log, 100,000 realistic events (:func:`benchmarks.bench_embedded.session_events`)
  in batches of 10 over 100 sessions; sealing is AES-256-GCM per content field with a random nonce, plus the
  key lookup (cached) and the larger rows.
* **Fold**: a projector's path per event — decode the Kafka record (Avro), open the content (the key cached),
  check the log rules, fold it into the (in-memory) fold store through :class:`BatchProjector` — 50,000 events of
  500 sessions, in batches of 5,000 as the confluent runtime takes them.
* **Loop**: the loop benchmark's 1,000-step session (:mod:`benchmarks.loop_session`, its default configuration,
  invariant on) with the log sealing and without; per-step overhead excluding the provider call, p50 of the last
  40 steps, in fresh interpreters.

The targets are the acceptance the design argues for (docs/ERASURE.md, "What it costs"): encryption on may cost at
most a third of the append and fold throughput and at most 25 % of the loop's step overhead. Figures on a shared
machine are indicative.

    python -m benchmarks.run erasure
"""

from __future__ import annotations

import gc
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from foldline.adapters.avro import AvroCodec
from foldline.adapters.kafka.records import ConsumedEvent
from foldline.adapters.memory_folds import MemoryFoldStore
from foldline.adapters.memory_keys import MemoryKeyStore
from foldline.adapters.memory_log import MemoryEventLog
from foldline.adapters.sealing import ContentSealer
from foldline.adapters.sqlite_keys import KEYS_NAME, SqliteKeyStore
from foldline.adapters.sqlite_log import SqliteEventLog
from foldline.core import Envelope
from foldline.projector.fold_apply import BatchProjector

from .bench_embedded import BATCH, session_events
from .loop_session import spawn

__all__ = ["run"]

APPEND_EVENTS = 100_000
APPEND_SESSIONS = 100
FOLD_EVENTS = 50_000
FOLD_SESSIONS = 500
FOLD_BATCH = 5_000
RUNS = 3
LOOP_STEPS = 1000
LOOP_RUNS = 3
TAIL = 40
MAX_THROUGHPUT_LOSS = 1 / 3
MAX_STEP_OVERHEAD = 0.25


def _append_rate(sealed: bool) -> float:
    per_session = APPEND_EVENTS // APPEND_SESSIONS
    events = session_events(per_session)
    batches = [events[i : i + BATCH] for i in range(0, per_session, BATCH)]
    with tempfile.TemporaryDirectory(prefix="foldline-bench-") as tmp:
        sealer = ContentSealer(SqliteKeyStore(Path(tmp) / KEYS_NAME)) if sealed else None
        with SqliteEventLog(Path(tmp), sealer=sealer) as log:
            ids = [f"session-{i:04d}" for i in range(APPEND_SESSIONS)]
            gc.collect()
            start = time.perf_counter()
            for batch in batches:
                expected = batch[0].seq
                for sid in ids:
                    log.append(sid, expected, batch)
            elapsed = time.perf_counter() - start
            assert sum(log.head(sid) for sid in ids) == per_session * APPEND_SESSIONS
            if sealed:
                assert log.read_stored(ids[0])[3].sealed is not None
        if sealer is not None:
            sealer.close()
    return per_session * APPEND_SESSIONS / elapsed


def _fold_rate(sealed: bool) -> float:
    """Events/s through decode (Avro) + open + the projector's batch fold into an in-memory store."""
    per_session = FOLD_EVENTS // FOLD_SESSIONS
    events = session_events(per_session)
    keys = MemoryKeyStore()
    sealer = ContentSealer(keys) if sealed else None
    codec = AvroCodec()
    records: list[tuple[str, bytes]] = []
    for i in range(FOLD_SESSIONS):
        sid = f"session-{i:04d}"
        stored = sealer.seal(sid, events) if sealer is not None else events
        records += [(sid, codec.encode(e)) for e in stored]
    # the consumer reads the topic interleaved: one batch at a time of every session
    order = sorted(range(len(records)), key=lambda k: (k % per_session, k // per_session))
    records = [records[k] for k in order]
    projector = BatchProjector(MemoryFoldStore(), MemoryEventLog(sealer=sealer))
    gc.collect()
    start = time.perf_counter()
    for at in range(0, len(records), FOLD_BATCH):
        items = []
        for sid, value in records[at : at + FOLD_BATCH]:
            env: Envelope = codec.decode(value)
            if env.sealed is not None:
                assert sealer is not None
                env = sealer.open(sid, [env])[0]
            items.append(ConsumedEvent(sid, env, 1, 0, 0))
        report = projector.project(items)
        assert report.applied == len(items), report
    return len(records) / (time.perf_counter() - start)


def _rate_rows(what: str, measure: Any, unit_desc: str) -> list[dict[str, Any]]:
    on: list[float] = []
    off: list[float] = []
    for _ in range(RUNS):  # interleaved: the host's speed drifts
        off.append(measure(False))
        on.append(measure(True))
    m_on, m_off = statistics.median(on), statistics.median(off)
    loss = 1 - m_on / m_off
    return [
        {
            "name": f"{what}, encryption off: {unit_desc}; median of {RUNS} runs "
            f"(spread {min(off):,.0f}..{max(off):,.0f})",
            "value": round(m_off),
            "unit": "events/s",
            "target": "(reference)",
            "ok": True,
        },
        {
            "name": f"{what}, encryption on (sealed content): the same; median of {RUNS} runs "
            f"(spread {min(on):,.0f}..{max(on):,.0f})",
            "value": round(m_on),
            "unit": "events/s",
            "target": "(reference)",
            "ok": True,
        },
        {
            "name": f"{what}: throughput lost to sealing (1 - on/off)",
            "value": round(100 * loss, 1),
            "unit": "%",
            "target": f"≤ {100 * MAX_THROUGHPUT_LOSS:.0f} %",
            "ok": loss <= MAX_THROUGHPUT_LOSS,
        },
    ]


def _loop_rows() -> list[dict[str, Any]]:
    on: list[float] = []
    off: list[float] = []
    for _ in range(LOOP_RUNS):
        for sealed, into in ((False, off), (True, on)):
            result = spawn(LOOP_STEPS, sealed=sealed)
            assert result["sealed"] is sealed
            into.append(statistics.median(result["step_us"][LOOP_STEPS - TAIL : LOOP_STEPS]))
    m_on, m_off = statistics.median(on), statistics.median(off)
    extra = m_on / m_off - 1
    session = f"{LOOP_STEPS:,}-step session (invariant on), p50 of the last {TAIL} steps, median of {LOOP_RUNS} runs"
    return [
        {
            "name": f"loop overhead per step excl. provider call, encryption off, {session} "
            f"(spread {min(off):.0f}..{max(off):.0f} us)",
            "value": round(m_off, 1),
            "unit": "us",
            "target": "(reference)",
            "ok": True,
        },
        {
            "name": f"same, encryption on (sealed content) (spread {min(on):.0f}..{max(on):.0f} us)",
            "value": round(m_on, 1),
            "unit": "us",
            "target": "(reference)",
            "ok": True,
        },
        {
            "name": "loop overhead per step added by sealing (on/off - 1)",
            "value": round(100 * extra, 1),
            "unit": "%",
            "target": f"≤ {100 * MAX_STEP_OVERHEAD:.0f} %",
            "ok": extra <= MAX_STEP_OVERHEAD,
        },
    ]


def run() -> list[dict[str, Any]]:
    rows = _rate_rows(
        "SQLite append",
        _append_rate,
        f"{APPEND_EVENTS:,} events in batches of {BATCH}, {APPEND_SESSIONS} sessions",
    )
    rows += _rate_rows(
        "fold (decode + open + rules + fold apply, in-memory store)",
        _fold_rate,
        f"{FOLD_EVENTS:,} Avro records of {FOLD_SESSIONS} sessions in batches of {FOLD_BATCH:,}",
    )
    rows += _loop_rows()
    return rows


if __name__ == "__main__":  # pragma: no cover
    for row in run():
        print(row)
