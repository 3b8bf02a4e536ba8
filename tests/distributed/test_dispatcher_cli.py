"""`foldline dispatcher` as a process: metrics and health endpoints, a clean stop on SIGTERM."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator

import boto3
import pytest
import redis

pytestmark = [pytest.mark.redis, pytest.mark.kafka]


def _start(env: dict[str, str]) -> tuple[subprocess.Popen[str], str]:
    """A `foldline dispatcher --metrics-port 0` process and the base URL of its endpoint."""
    proc = subprocess.Popen(
        [sys.executable, "-c", "from foldline.cli.main import main; main()", "dispatcher", "--metrics-port", "0"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stderr is not None
    url = None
    deadline = time.monotonic() + 30
    while url is None and time.monotonic() < deadline:
        line = proc.stderr.readline()
        found = re.search(r"metrics: (http://\S+)/metrics", line)
        url = found.group(1) if found else None
        assert line or proc.poll() is None, "the dispatcher exited early"
    assert url is not None
    return proc, url


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return int(r.status), r.read().decode()
    except urllib.error.HTTPError as exc:
        body = exc.read().decode()
        exc.close()
        return exc.code, body


def _stop(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.communicate()


@pytest.fixture
def dispatcher_env() -> Iterator[dict[str, str]]:
    if not os.environ.get("FOLDLINE_REDIS_URL"):
        pytest.fail("FOLDLINE_REDIS_URL is unset: run `bash deploy/local/up.sh` and `source .local/env.sh`")
    run = uuid.uuid4().hex[:10]
    env = {
        **os.environ,
        "FOLDLINE_KAFKA_TOPIC": f"test.dispatcher-cli.{run}",
        "FOLDLINE_FOLD_PREFIX": f"test:cli:{run}:",
        "FOLDLINE_S3_BUCKET": f"foldline-cli-{run}",
        "FOLDLINE_DISPATCH_STREAM": f"test:dispatch:{run}",
    }
    s3 = boto3.session.Session().client("s3", endpoint_url=os.environ["FOLDLINE_S3_ENDPOINT"])
    s3.create_bucket(Bucket=env["FOLDLINE_S3_BUCKET"])
    try:
        yield env
    finally:
        s3.delete_bucket(Bucket=env["FOLDLINE_S3_BUCKET"])
        s3.close()
        r = redis.Redis.from_url(os.environ["FOLDLINE_REDIS_URL"])
        r.delete(env["FOLDLINE_DISPATCH_STREAM"])
        r.close()


def test_dispatcher_process_serves_health_and_metrics_and_stops_on_sigterm(dispatcher_env: dict[str, str]) -> None:
    proc, url = _start(dispatcher_env)
    try:
        assert _get(url + "/readyz") == (200, "ok\n")
        with urllib.request.urlopen(url + "/metrics", timeout=5) as r:
            body = r.read().decode()
        assert "foldline_dispatcher_fold_wait_seconds_count 0.0" in body
        assert "foldline_dispatch_duration_seconds" in body
        proc.send_signal(signal.SIGTERM)
        _, rest = proc.communicate(timeout=30)
        assert proc.returncode == 0, rest
        assert "dispatcher stopped after sending 0 step(s)" in rest
    finally:
        _stop(proc)


def test_readyz_names_s3_when_it_does_not_answer_or_lacks_the_bucket(dispatcher_env: dict[str, str]) -> None:
    """A dispatcher reads every image and archived body from S3: while S3 does not answer (nothing listens at
    its endpoint) or the bucket is not there, it is not ready, and /readyz says S3 is why (Redis answers)."""
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        closed = sock.getsockname()[1]
    for env, why in (
        ({"FOLDLINE_S3_ENDPOINT": f"http://127.0.0.1:{closed}"}, "did not answer"),
        ({"FOLDLINE_S3_BUCKET": dispatcher_env["FOLDLINE_S3_BUCKET"] + "-absent"}, "HTTP 404"),
    ):
        proc, url = _start({**dispatcher_env, **env})
        try:
            status, body = _get(url + "/readyz")
            assert status == 503, body
            lines = body.splitlines()
            assert len(lines) == 1, body
            assert lines[0].startswith("s3: StoreUnavailable: HeadBucket s3://"), body
            assert why in lines[0]
            assert _get(url + "/healthz") == (200, "ok\n")  # alive: it waits for S3, it is not wedged
        finally:
            _stop(proc)
