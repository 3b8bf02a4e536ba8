"""The dispatcher's own cost per step against session length, on the real Redis fold store.

Two sessions grow step by step, one to 50 steps and one to 1,000, as a loop that hands its steps to a
dispatcher writes them (the chat step of the LangGraph comparison, :mod:`benchmarks.vs_langgraph.shape`:
a ~200-character user message, a ~400-character answer, no system prompt and no tools). Per step:

1. the step's opening — ``turn/start``, ``step/start``, the ``user/message`` (and the ``request/header``
   at the first step) — is appended to a SQLite event log and folded into the local Redis through the
   projector's own apply path (:class:`~foldline.projector.BatchProjector` on a
   :class:`~foldline.adapters.redis_folds.RedisFoldStore`: one ``apply_many`` round trip, as
   ``foldline projector`` does for a consumed batch);
2. :meth:`Dispatcher.prepare <foldline.dispatcher.Dispatcher.prepare>` is called for the boundary, on a
   dispatcher built by :func:`~foldline.dispatcher.factory.open_dispatcher` with the configuration's
   defaults (no attachment store: the messages hold no images);
3. ``request/dispatch`` with the prepared digest is appended and folded, and
   :meth:`Dispatcher.send <foldline.dispatcher.Dispatcher.send>` sends the prepared body to a provider
   that answers at once with the ~400-character text (so the body lives as long as it does in
   production: until it is sent);
4. the step's close — the answer as an ``assistant/message``, ``step/end``, ``turn/end`` — is appended
   and folded the same way.

What is measured is prepare's wall time minus its fold wait (``PreparedStep.timings["fold_wait"]``: the
watcher's poll rounds, which read the new messages from Redis, and its hand-over to the event loop), i.e.
what the dispatcher itself spends on a step: the session's lock and concurrency slot, decoding the fold's
new messages into its view, building the request and serializing it through the incremental body
(``timings["build"]``, also reported). The fold is always at the boundary before prepare is called, so
the wait is one poll round; it is excluded because it measures the projector and the poll interval, not
the dispatcher. Send's own cost (its wall time minus the provider's) is reported beside it, as a
reference.

Figures: p50 and p99 over the 40 steps before step 50 and before step 1,000; the target is the ratio of
the two p50s. Seven rounds (fresh sessions, Redis key prefix and dispatcher each), run one after another
on this shared machine; each figure is the median of the rounds, with the spread. The garbage
collector's share of the measured time is reported beside it (``gc.callbacks``). The measured steps of the
two sessions alternate on one dispatcher (the 1,000-step session is grown to 960 steps and the 50-step
one to 10, then each takes its last 40 steps in turn with the other), so both windows run under the
same load.

Decoding, building and the incremental serialization (encode the new messages, extend the digest) do
not grow with the session, and neither does handing the body over: prepare keeps it in parts
(:class:`~foldline.providers.base.BodyParts`), the blocks of the session's cached prefix, which each step
shares with the one before, and one fresh part with the prefix's open block (under 32 KiB), the new
messages and the tail. No step copies the whole body (~700 KB at 1,000 steps of this shape) into one
object; what grows is the number of parts, a tuple of references (22 at 1,000 steps).

    source .local/env.sh && python -m benchmarks.run dispatcher_steps
"""

from __future__ import annotations

import asyncio
import gc
import os
import statistics
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from foldline.adapters.kafka import ConsumedEvent
from foldline.adapters.sqlite_log import SqliteEventLog
from foldline.config import Config, FoldsConfig, RedisConfig
from foldline.config.factories import fold_store
from foldline.core import CallConfig, TextBlock
from foldline.core.events import (
    AssistantMessage,
    Envelope,
    EventData,
    RequestDispatch,
    RequestHeader,
    StepEnd,
    StepStart,
    TurnEnd,
    TurnStart,
    UserMessage,
)
from foldline.core.header import make_header
from foldline.dispatcher import Dispatcher, StepHandoff
from foldline.dispatcher.factory import open_dispatcher
from foldline.projector import BatchProjector

from .loop_session import _ChatProvider
from .vs_langgraph.measure import GcClock
from .vs_langgraph.shape import DEFAULT_TAIL, question_text

__all__ = ["LENGTHS", "ROUNDS", "measure_round", "run"]

LENGTHS = (50, 1000)
ROUNDS = 7
TARGET_GROWTH = 1.5
EPOCH = 1
CONFIG = CallConfig("anthropic", "claude-bench", max_tokens=1024)


@dataclass(slots=True)
class StepTimes:
    """One step's prepare, in microseconds."""

    own: float  # wall time minus the fold wait
    build: float  # timings["build"]: request and serialization
    wait: float  # timings["fold_wait"]
    gc: float  # garbage collection inside the prepare call
    send: float  # send's wall time minus the provider's
    body: int  # the prepared body's bytes


class _Session:
    """One session as its loop writes it: appends each batch to the log, folds it through the projector's
    apply path, and hands each step to the dispatcher."""

    def __init__(self, session_id: str, log: SqliteEventLog, projector: BatchProjector) -> None:
        self.session_id = session_id
        self.log = log
        self.projector = projector
        self.seq = 0
        self.offset = 0
        self.now = 1_700_000_000_000
        self.times: list[StepTimes] = []

    def write(self, *events: EventData) -> None:
        batch = []
        for data in events:
            self.now += 1
            batch.append(Envelope(self.seq, self.now, data))
            self.seq += 1
        self.log.append(self.session_id, batch[0].seq, batch)
        consumed = []
        for envelope in batch:
            consumed.append(ConsumedEvent(self.session_id, envelope, EPOCH, 0, self.offset))
            self.offset += 1
        report = self.projector.project(consumed)
        if report.applied != len(batch) or report.rebuilt or report.gaps or report.fenced:
            raise RuntimeError(f"the projector did not apply the batch as a delta: {report}")

    async def step(self, dispatcher: Dispatcher, clock: GcClock) -> None:
        n = len(self.times) + 1
        turn = n - 1
        header = (RequestHeader(make_header(CONFIG), "initial"),) if n == 1 else ()
        user = UserMessage(f"u{self.seq + 2}", (TextBlock(question_text(n)),))
        self.write(TurnStart(turn), StepStart(turn, 0), user, *header)
        handoff = StepHandoff(self.session_id, self.seq, turn, 0, EPOCH)
        gc0 = clock.ns
        t = time.perf_counter()
        prepared = await dispatcher.prepare(handoff)
        wall = time.perf_counter() - t
        gc_us = (clock.ns - gc0) / 1000
        wait = prepared.timings["fold_wait"]
        self.write(
            RequestDispatch(turn, 0, prepared.serializer, prepared.serializer_version, prepared.digest, prepared.bytes)
        )
        t = time.perf_counter()
        answer = await dispatcher.send(handoff, prepared)
        sent = time.perf_counter() - t - answer.timings["send"]
        self.times.append(
            StepTimes(
                (wall - wait) * 1e6, prepared.timings["build"] * 1e6, wait * 1e6, gc_us, sent * 1e6, prepared.bytes
            )
        )
        reply = AssistantMessage(f"a{self.seq}", answer.content, answer.usage, answer.stop_reason)
        self.write(reply, StepEnd(turn, 0), TurnEnd(turn, "completed"))


async def _round(redis_url: str, data_dir: Path) -> tuple[list[StepTimes], list[StepTimes]]:
    """One short and one long session on one dispatcher; their measured steps alternate (same load)."""
    prefix = f"bench:dsteps:{uuid.uuid4().hex[:10]}:"
    config = Config(redis=RedisConfig(redis_url), folds=FoldsConfig(prefix))
    folds = fold_store(config)  # the projector's store
    dispatcher_folds = fold_store(config)  # the dispatcher's own client, as in its own process
    log = SqliteEventLog(data_dir)
    provider = _ChatProvider()
    dispatcher = open_dispatcher(config, dispatcher_folds, None, providers_by_name={provider.name: provider})
    projector = BatchProjector(folds, log)
    sessions = [_Session(f"bench-dispatcher-{n}-steps", log, projector) for n in LENGTHS]
    clock = GcClock()
    gc.callbacks.append(clock)
    try:
        for session, n in zip(sessions, LENGTHS, strict=True):
            while len(session.times) < n - DEFAULT_TAIL:
                await session.step(dispatcher, clock)
        for _ in range(DEFAULT_TAIL):
            for session in sessions:
                await session.step(dispatcher, clock)
    finally:
        gc.callbacks.remove(clock)
        await dispatcher.aclose()
        for session in sessions:
            folds.delete(session.session_id)
        dispatcher_folds.close()
        folds.close()
        log.close()
    return sessions[0].times, sessions[1].times


def measure_round(redis_url: str) -> tuple[list[StepTimes], list[StepTimes]]:
    """Each step's times of a 50-step and a 1,000-step session (see the module docstring)."""
    with tempfile.TemporaryDirectory() as tmp:
        return asyncio.run(_round(redis_url, Path(tmp)))


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


@dataclass(slots=True)
class _Window:
    p50: float
    p99: float
    build_p50: float
    wait_p50: float
    gc_share: float
    send_p50: float


def _window(times: list[StepTimes], length: int) -> _Window:
    tail = times[length - DEFAULT_TAIL : length]
    own = [t.own for t in tail]
    return _Window(
        _pct(own, 0.50),
        _pct(own, 0.99),
        _pct([t.build for t in tail], 0.50),
        _pct([t.wait for t in tail], 0.50),
        sum(t.gc for t in tail) / max(sum(own), 1e-9),
        _pct([t.send for t in tail], 0.50),
    )


def _spread(values: list[float]) -> str:
    return f"spread {min(values):,.0f}..{max(values):,.0f} us"


def run() -> list[dict[str, Any]]:
    url = os.environ.get("FOLDLINE_REDIS_URL")
    if not url:
        raise RuntimeError(
            "FOLDLINE_REDIS_URL is unset: run `bash deploy/local/up.sh redis` and `source .local/env.sh`"
        )
    rounds = [measure_round(url) for _ in range(ROUNDS)]
    windows = {n: [_window(times[i], n) for times in rounds] for i, n in enumerate(LENGTHS)}
    rows: list[dict[str, Any]] = []
    p50 = {}
    for n in LENGTHS:
        ws = windows[n]
        p50[n] = statistics.median(w.p50 for w in ws)
        p99 = statistics.median(w.p99 for w in ws)
        build = statistics.median(w.build_p50 for w in ws)
        wait = statistics.median(w.wait_p50 for w in ws)
        gc_share = statistics.median(w.gc_share for w in ws)
        what = (
            f"dispatcher prepare at step {n:,} of a chat session on Redis, own cost (wall minus fold wait: "
            f"decode the fold's new messages, build, serialize), p50 of the last {DEFAULT_TAIL} steps "
            f"(median of {ROUNDS} rounds; {_spread([w.p50 for w in ws])}; of it build+serialize p50 {build:,.0f} us; "
            f"GC {100 * gc_share:.0f}%; fold wait excluded, p50 {wait:,.0f} us)"
        )
        rows.append({"name": what, "value": round(p50[n], 1), "unit": "us", "target": "(reference)", "ok": True})
        rows.append(
            {
                "name": f"dispatcher prepare at step {n:,}, own cost, p99 of the last {DEFAULT_TAIL} steps "
                f"(median of {ROUNDS} rounds; {_spread([w.p99 for w in ws])})",
                "value": round(p99, 1),
                "unit": "us",
                "target": "(reference)",
                "ok": True,
            }
        )
    bodies = {n: statistics.median(times[i][n - 1].body for times in rounds) for i, n in enumerate(LENGTHS)}
    rows.append(
        {
            "name": f"the prepared body at step {LENGTHS[0]:,} / at step {LENGTHS[1]:,}, KB",
            "value": " / ".join(f"{bodies[n] / 1024:,.0f}" for n in LENGTHS),
            "unit": "KB",
            "target": "(reference)",
            "ok": True,
        }
    )
    sends = {n: statistics.median(w.send_p50 for w in windows[n]) for n in LENGTHS}
    rows.append(
        {
            "name": "dispatcher send, own cost (wall minus the provider's time), p50 of the last "
            f"{DEFAULT_TAIL} steps at step {LENGTHS[0]:,} / at step {LENGTHS[1]:,}, us (median of {ROUNDS} rounds)",
            "value": " / ".join(f"{sends[n]:,.0f}" for n in LENGTHS),
            "unit": "us",
            "target": "(reference)",
            "ok": True,
        }
    )
    short, long = LENGTHS
    ratios = [b.p50 / a.p50 for a, b in zip(windows[short], windows[long], strict=True)]
    ratio = p50[long] / p50[short]
    rows.append(
        {
            "name": (
                f"dispatcher own cost per step (fold wait excluded), p50 at step {long:,} / p50 at step {short:,} "
                f"(medians of {ROUNDS} rounds; per-round ratios {min(ratios):.2f}..{max(ratios):.2f})"
            ),
            "value": round(ratio, 2),
            "unit": "x",
            "target": f"<= {TARGET_GROWTH}x",
            "ok": ratio <= TARGET_GROWTH,
        }
    )
    return rows


if __name__ == "__main__":
    for row in run():
        mark = "ok" if row["ok"] else "MISSED"
        print(f"{row['value']:>8} {row['unit']}  (target {row['target']})  {mark}  {row['name']}")
