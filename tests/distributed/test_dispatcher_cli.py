"""`foldline dispatcher` as a process: metrics and health endpoints, a clean stop on SIGTERM."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
import uuid

import pytest

pytestmark = [pytest.mark.redis, pytest.mark.kafka]


def test_dispatcher_process_serves_health_and_metrics_and_stops_on_sigterm() -> None:
    if not os.environ.get("FOLDLINE_REDIS_URL"):
        pytest.fail("FOLDLINE_REDIS_URL is unset: run `bash deploy/local/up.sh` and `source .local/env.sh`")
    run = uuid.uuid4().hex[:10]
    env = {
        **os.environ,
        "FOLDLINE_KAFKA_TOPIC": f"test.dispatcher-cli.{run}",
        "FOLDLINE_FOLD_PREFIX": f"test:cli:{run}:",
        "FOLDLINE_S3_BUCKET": "unused-by-this-test",
        "FOLDLINE_DISPATCH_STREAM": f"test:dispatch:{run}",
    }
    proc = subprocess.Popen(
        [sys.executable, "-c", "from foldline.cli.main import main; main()", "dispatcher", "--metrics-port", "0"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stderr is not None
        url = None
        deadline = time.monotonic() + 30
        while url is None and time.monotonic() < deadline:
            line = proc.stderr.readline()
            found = re.search(r"metrics: (http://\S+)/metrics", line)
            url = found.group(1) if found else None
            assert line or proc.poll() is None, "the dispatcher exited early"
        assert url is not None
        with urllib.request.urlopen(url + "/readyz", timeout=5) as r:
            assert r.status == 200
        with urllib.request.urlopen(url + "/metrics", timeout=5) as r:
            body = r.read().decode()
        assert "foldline_dispatcher_fold_wait_seconds_count 0.0" in body
        assert "foldline_dispatch_duration_seconds" in body
        proc.send_signal(signal.SIGTERM)
        _, rest = proc.communicate(timeout=30)
        assert proc.returncode == 0, rest
        assert "dispatcher stopped after sending 0 step(s)" in rest
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        import redis

        r = redis.Redis.from_url(os.environ["FOLDLINE_REDIS_URL"])
        r.delete(env["FOLDLINE_DISPATCH_STREAM"])
        r.close()
