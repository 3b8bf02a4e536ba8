"""S3 attachment store against the local SeaweedFS server (``bash deploy/local/up.sh s3``; ``source .local/env.sh``).

Targets (issue 7):

* 1 MiB objects put + get: >= 50 MB/s (10^6 bytes/s; one thread, every get verified: checksum + re-hash).
* 10,000 puts of 200 distinct objects leave exactly 200 objects under the prefix (counted with
  ListObjectsV2). All 10,000 are real ``put`` calls (each a conditional PutObject; 9,800 end in 412), run
  from a thread pool of 32.
"""

from __future__ import annotations

import hashlib
import os
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

from foldline.adapters.s3_attachments import MIB
from foldline.config import Config, S3Config
from foldline.config.factories import attachment_store

__all__ = ["run"]

OBJECTS_1MIB = 64
THROUGHPUT_TARGET = 50.0  # MB/s
PUTS = 10_000
DISTINCT = 200
THREADS = 32


@contextmanager
def _bucket() -> Iterator[tuple[str, str]]:
    endpoint = os.environ.get("FOLDLINE_S3_ENDPOINT")
    if not endpoint:
        raise SystemExit("FOLDLINE_S3_ENDPOINT is unset: run `bash deploy/local/up.sh s3 && source .local/env.sh`")
    admin = attachment_store(Config(s3=S3Config("unused", endpoint=endpoint))).client
    bucket = f"foldline-bench-{uuid.uuid4().hex[:10]}"
    admin.create_bucket(Bucket=bucket)
    try:
        yield bucket, endpoint
    finally:
        for page in admin.get_paginator("list_objects_v2").paginate(Bucket=bucket):
            for obj in page.get("Contents", []):
                admin.delete_object(Bucket=bucket, Key=obj["Key"])
        admin.delete_bucket(Bucket=bucket)
        admin.close()


def _payload(i: int, size: int) -> bytes:
    block = hashlib.sha512(i.to_bytes(8, "big")).digest()
    return (block * (size // len(block) + 1))[:size]


def _throughput(bucket: str, endpoint: str) -> tuple[float, float, float]:
    store = attachment_store(Config(s3=S3Config(bucket, prefix="bench-1mib/", endpoint=endpoint)))
    blobs = [_payload(i, MIB) for i in range(OBJECTS_1MIB)]
    t0 = time.perf_counter()
    metas = [store.put(b, "application/octet-stream") for b in blobs]
    t1 = time.perf_counter()
    for m, b in zip(metas, blobs, strict=True):
        if store.get(m.attachment_id, m) != b:
            raise AssertionError(f"{m.attachment_id} came back different")
    t2 = time.perf_counter()
    store.close()
    total = OBJECTS_1MIB * MIB / 1e6
    return total / (t1 - t0), total / (t2 - t1), 2 * total / (t2 - t0)


def _dedupe(bucket: str, endpoint: str) -> tuple[int, int, float]:
    prefix = "bench-dedupe/"
    store = attachment_store(Config(s3=S3Config(bucket, prefix=prefix, endpoint=endpoint, max_connections=THREADS)))
    payloads = [_payload(1_000_000 + i, 1024) for i in range(DISTINCT)]
    order = [payloads[(i * 7919) % DISTINCT] for i in range(PUTS)]  # every object 50 times, interleaved

    def put(data: bytes) -> str:
        return store.put(data, "application/octet-stream").attachment_id

    t0 = time.perf_counter()
    with ThreadPoolExecutor(THREADS) as pool:
        ids = list(pool.map(put, order))
    elapsed = time.perf_counter() - t0
    count = 0
    for page in store.client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        count += len(page.get("Contents", []))
    store.close()
    if len(set(ids)) != DISTINCT:
        raise AssertionError(f"{len(set(ids))} distinct ids from {DISTINCT} distinct payloads")
    return len(ids), count, len(ids) / elapsed


def run() -> list[dict[str, Any]]:
    with _bucket() as (bucket, endpoint):
        put_rate, get_rate, both_rate = _throughput(bucket, endpoint)
        calls, objects, put_calls_rate = _dedupe(bucket, endpoint)
    target = f"≥ {THROUGHPUT_TARGET:.0f} MB/s"
    return [
        {
            "name": f"S3 put, {OBJECTS_1MIB} x 1 MiB objects, 1 thread",
            "value": round(put_rate, 1),
            "unit": "MB/s",
            "target": target,
            "ok": put_rate >= THROUGHPUT_TARGET,
        },
        {
            "name": f"S3 get (verified), {OBJECTS_1MIB} x 1 MiB objects, 1 thread",
            "value": round(get_rate, 1),
            "unit": "MB/s",
            "target": target,
            "ok": get_rate >= THROUGHPUT_TARGET,
        },
        {
            "name": f"S3 put + get, {OBJECTS_1MIB} x 1 MiB objects (bytes moved / total time)",
            "value": round(both_rate, 1),
            "unit": "MB/s",
            "target": target,
            "ok": both_rate >= THROUGHPUT_TARGET,
        },
        {
            "name": f"S3 put() calls made ({DISTINCT} distinct 1 KiB objects, {THREADS} threads)",
            "value": calls,
            "unit": "calls",
            "target": f"= {PUTS:,}",
            "ok": calls == PUTS,
        },
        {
            "name": f"S3 objects left under the prefix after {PUTS:,} puts (ListObjectsV2)",
            "value": objects,
            "unit": "objects",
            "target": f"= {DISTINCT}",
            "ok": objects == DISTINCT,
        },
        {
            "name": f"S3 put() rate, {PUTS:,} calls on {DISTINCT} distinct objects, {THREADS} threads",
            "value": round(put_calls_rate),
            "unit": "puts/s",
            "target": "reported",
            "ok": True,
        },
    ]


if __name__ == "__main__":  # pragma: no cover
    for row in run():
        mark = "ok" if row["ok"] else "MISSED"
        print(f"{row['name']}: {row['value']} {row['unit']}  (target {row['target']}) {mark}")
