"""Building a request from a Redis fold (issue 6 target: p99 <= 2 ms for a 200-message session).

The session is the one of ``bench_serialize``: a ~4 KB system prompt, 5 tools and 200 messages (user
questions, assistant text with tool calls, ~1.5 KB tool results), about 150 KB of folded message bytes.
Its fold is written once to the local Redis through :class:`~foldline.adapters.redis_folds.RedisFoldStore`
(a unique key prefix, deleted afterwards). One sample is exactly what a dispatcher does before the
invariant check and serialization: ``store.get(session)`` (one pipelined round trip: meta hash + message
list), decode the header and the 200 messages, and build the frozen, marked loop request
(:func:`~foldline.dispatcher.request_from_fold`).

Two figures: **cold** — every message decoded, as for a dispatcher's first step of a session (this is the
target row); **warm** — with the dispatcher's decode cache holding the session's messages, as for a
dispatcher that served the session's previous step (the cache is keyed by the exact bytes fetched, so the
fetch is still paid in full).

Nine rounds of 400 samples each; the figure is the median of the rounds' p99, with the spread (min..max)
beside it, since this 2-core machine is shared.

    source .local/env.sh && python -m benchmarks.bench_dispatcher
"""

from __future__ import annotations

import os
import statistics
import time
import uuid
from typing import Any

from foldline.config import Config, FoldsConfig, RedisConfig
from foldline.config.factories import fold_store
from foldline.core.fold import FoldState, encode_header, encode_message
from foldline.dispatcher import request_from_fold
from foldline.dispatcher.decode import MessageCache

from .bench_serialize import realistic_request

TARGET_P99_MS = 2.0
ROUNDS = 9
SAMPLES = 400
WARMUP = 50


def _percentile(sorted_values: list[float], q: float) -> float:
    index = min(len(sorted_values) - 1, max(0, round(q * (len(sorted_values) - 1))))
    return sorted_values[index]


def measure(redis_url: str, *, warm: bool = False) -> dict[str, Any]:
    request = realistic_request()
    prefix = f"bench:fold:{uuid.uuid4().hex[:10]}:"
    store = fold_store(Config(redis=RedisConfig(redis_url), folds=FoldsConfig(prefix)))
    session = "bench-session"
    messages = tuple(encode_message(m) for m in request.messages)
    state = FoldState(session, 2 * len(messages), 1, 0, encode_header(request.header), 0, messages)
    try:
        assert store.put(state).status == "applied"
        check = request_from_fold(store.get(session) or state)
        assert check.same_as(request), "the fold read back from Redis must build the same request"
        cache = MessageCache() if warm else None
        p50s: list[float] = []
        p99s: list[float] = []
        for _ in range(ROUNDS):
            for _ in range(WARMUP):
                request_from_fold(store.get(session) or state, cache)
            samples: list[float] = []
            for _ in range(SAMPLES):
                start = time.perf_counter()
                fetched = store.get(session)
                assert fetched is not None
                request_from_fold(fetched, cache)
                samples.append((time.perf_counter() - start) * 1000)
            samples.sort()
            p50s.append(_percentile(samples, 0.50))
            p99s.append(_percentile(samples, 0.99))
    finally:
        store.delete(session)
        store.close()
    return {
        "bytes": sum(len(m) for m in messages),
        "p50": statistics.median(p50s),
        "p99": statistics.median(p99s),
        "p99_min": min(p99s),
        "p99_max": max(p99s),
    }


def run() -> list[dict[str, Any]]:
    url = os.environ.get("FOLDLINE_REDIS_URL")
    if not url:
        raise RuntimeError(
            "FOLDLINE_REDIS_URL is unset: run `bash deploy/local/up.sh redis` and `source .local/env.sh`"
        )
    rows: list[dict[str, Any]] = []
    for warm in (False, True):
        m = measure(url, warm=warm)
        what = "warm decode cache" if warm else "cold: every message decoded"
        rows.append(
            {
                "name": (
                    f"request from a Redis fold, 200 messages ({m['bytes'] / 1024:.0f} KB), {what}: fetch + decode + "
                    f"build, p99 (median of {ROUNDS} rounds; spread {m['p99_min']:.2f}..{m['p99_max']:.2f} ms; "
                    f"p50 {m['p50']:.2f} ms)"
                ),
                "value": round(m["p99"], 3),
                "unit": "ms",
                "target": f"<= {TARGET_P99_MS:.0f} ms",
                "ok": m["p99"] <= TARGET_P99_MS,
            }
        )
    return rows


if __name__ == "__main__":
    for row in run():
        mark = "ok" if row["ok"] else "MISSED"
        print(f"{row['value']:>8} {row['unit']}  (target {row['target']})  {mark}  {row['name']}")
