"""Events through their derived codecs: a 10,000-event session of the loop's shapes decoded and encoded.

Every codec here is derived from the record definitions (docs/ARCHITECTURE.md, "Defining a record"): the
canonical JSON lines (``decode_event``, ``decode_canonical``, ``encode_event``), the Kafka records
(``AvroCodec``) and the archive's bodies (the generated binary decoder, compiled when the build could).
Times are the best of several rounds of this process's CPU time.

The A/B against the code before a change is ``python -m benchmarks.ab --base <checkout>`` (same minute,
alternating, each checkout's own interpreter; ``benchmarks/ab.py``). With ``FOLDLINE_BENCH_BASE`` set to such a
checkout this module adds A/B rows beside its own: the figures ``FOLDLINE_BENCH_AB`` names (default ``wire``;
``wire,archive,projector,loop`` for all four, which need the local servers and take several minutes):

    git worktree add ../before <commit> && (cd ../before && make .venv/.installed)
    FOLDLINE_BENCH_BASE=../before FOLDLINE_BENCH_AB=wire,archive,projector,loop make bench

    python -m benchmarks.bench_events
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from foldline.adapters.avro import AvroCodec, decoding, writer_schemas
from foldline.core.wire import decode_canonical, decode_event, encode_event

from .ab import WIRE_SESSION, ab

ROUNDS = 5


def _session() -> tuple[list[Any], list[bytes]]:
    scope: dict[str, Any] = {}
    exec(WIRE_SESSION, scope)  # the very session the A/B decodes
    return scope["EVENTS"], scope["LINES"]


def _best_ms(fn: Callable[[], object]) -> float:
    best = float("inf")
    for _ in range(ROUNDS):
        t0 = time.process_time()
        fn()
        best = min(best, time.process_time() - t0)
    return best * 1000


def _commit(checkout: Path) -> str:
    done = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=checkout, capture_output=True, text=True, check=False
    )
    return done.stdout.strip() or "the other checkout"


def _row(name: str, value: float, unit: str, target: str = "(reference)", ok: bool = True) -> dict[str, Any]:
    return {"name": name, "value": round(value, 2), "unit": unit, "target": target, "ok": ok}


def run() -> list[dict[str, Any]]:
    events, lines = _session()
    n = len(events)
    codec = AvroCodec()
    records = [codec.encode(e) for e in events]
    bodies = b"".join(r[10:] for r in records)
    schema = writer_schemas()[codec.fingerprint]
    rows = [
        _row(
            f"wire decode of a {n:,}-event session (decode_event each)",
            _best_ms(lambda: [decode_event(x) for x in lines]),
            "ms",
        ),
        _row(
            "the same, with each line's canonical bytes (decode_canonical, as import does)",
            _best_ms(lambda: [decode_canonical(x) for x in lines]),
            "ms",
        ),
        _row(
            f"wire encode of the {n:,} events (encode_event each)",
            _best_ms(lambda: [encode_event(e) for e in events]),
            "ms",
        ),
        _row(
            f"Kafka record decode of the {n:,} events (AvroCodec.decode each)",
            _best_ms(lambda: [codec.decode(r) for r in records]),
            "ms",
        ),
        _row(
            f"Kafka record encode of the {n:,} events (AvroCodec.encode each)",
            _best_ms(lambda: [codec.encode(e) for e in events]),
            "ms",
        ),
        _row(
            f"archive bodies decode of the {n:,} events ({decoding.DECODER} generated decoder)",
            _best_ms(lambda: decoding.decode_bodies(bodies, n, schema)),
            "ms",
        ),
    ]
    base = os.environ.get("FOLDLINE_BENCH_BASE")
    if base:
        figures = [f for f in os.environ.get("FOLDLINE_BENCH_AB", "wire").split(",") if f]
        other = _commit(Path(base).resolve())
        for result in ab(Path(base).resolve(), figures, rounds=3):
            unit = result.unit.split(" (")[0]
            rows.append(_row(f"A/B, same minute: {result.name}, this checkout (median of 3)", result.this, unit))
            rows.append(_row(f"A/B, same minute: the same, the code at {other} (median of 3)", result.base, unit))
            slower = result.ratio if "lower is better" in result.unit else 1 / result.ratio
            rows.append(
                _row(
                    f"A/B: {result.figure}, how much slower this checkout is (runs: this {result.this_runs}, base "
                    f"{result.base_runs})",
                    slower,
                    "x",
                    "<= 1.1 (noise)",
                    slower <= 1.1,
                )
            )
    return rows


if __name__ == "__main__":
    for row in run():
        print(f"{row['name']}: {row['value']} {row['unit']} ({row['target']})")
