"""A fleet of loops against separate worker processes, one dependency failing mid-run, then the audit.

:class:`ChaosRun` owns one run: a Kafka topic, fold prefix, S3 bucket, dispatch stream and data directory of
its own (deleted afterwards), one shared ``foldline emulator`` process, ``foldline projector`` and
``foldline dispatcher`` processes, and ``foldline fleet`` as the loop process. :meth:`ChaosRun.fleet_with`
starts the fleet, waits until a share of its steps reached the emulator, injects the fault, and waits for
the fleet; :meth:`ChaosRun.audit` then checks what every scenario must end with:

* the fleet exited 0 and its report says every session completed and verified;
* ``foldline verify`` rebuilds every logged request byte for byte;
* ``foldline drops --fail-on-unexplained`` finds no unexplained cache-read drop;
* nothing was sent twice unexplained: the emulator received at least one request per logged
  ``request/dispatch`` and at most one more per logged ``llm/retry`` (every re-send is a logged retry).

``FOLDLINE_CHAOS_SESSIONS`` and ``FOLDLINE_CHAOS_STEPS`` shrink a run for local
iteration (default: 64 sessions of 20 steps).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import boto3
import pytest
import redis
from confluent_kafka.admin import AdminClient

from foldline.config import Config, open_stores
from foldline.core.events import LlmRetry, RequestDispatch

if TYPE_CHECKING:
    from mypy_boto3_s3.type_defs import ObjectIdentifierTypeDef

REPO = Path(__file__).resolve().parents[2]
_CLI = "from foldline.cli.main import main; main()"
SESSIONS = int(os.environ.get("FOLDLINE_CHAOS_SESSIONS", "64"))
STEPS = int(os.environ.get("FOLDLINE_CHAOS_STEPS", "20"))
FLEET_TIMEOUT_S = 600.0
READY_TIMEOUT_S = 120.0
# settings of the test process that the workers must not inherit (the emulator's URL is set per run)
_NOT_INHERITED = ("FOLDLINE_METRICS_PORT", "FOLDLINE_METRICS_HOST", "FOLDLINE_ANTHROPIC_URL", "FOLDLINE_OPENAI_URL")
_READY = {"projector": "projector ready", "dispatcher": "dispatcher serving steps", "emulator": "emulator listening"}


def _env_or_fail(name: str) -> str:
    value = os.environ.get(name)
    if not value:
        pytest.fail(f"{name} is unset: run `bash deploy/local/up.sh` and `source .local/env.sh` (make test does both)")
    return value


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def server(name: str, action: str) -> None:
    """``deploy/local/<name>.sh <action>`` (start waits until the server is healthy)."""
    done = subprocess.run(
        ["bash", str(REPO / "deploy" / "local" / f"{name}.sh"), action],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    if done.returncode != 0:
        pytest.fail(f"deploy/local/{name}.sh {action} failed ({done.returncode}):\n{done.stderr[-3000:]}")


def outage(name: str, seconds: float) -> None:
    """Stop the local server ``name`` for ``seconds``; it is started again (and healthy) even on failure."""
    try:
        server(name, "stop")
        time.sleep(seconds)
    finally:
        server(name, "start")


@dataclass
class Child:
    name: str
    args: list[str]
    env: dict[str, str]
    log_path: Path
    process: subprocess.Popen[bytes]
    log_file: IO[bytes]

    def output(self) -> str:
        self.log_file.flush()
        return self.log_path.read_text(errors="replace")

    def tail(self, chars: int = 3000) -> str:
        return self.output()[-chars:]


@dataclass
class Audit:
    fleet: dict[str, Any]
    dispatches: int
    retries: list[str]  # the error type of every logged llm/retry
    stats: dict[str, int]
    verify: dict[str, Any]
    drops: dict[str, Any]
    sessions: list[str] = field(default_factory=list)


class ChaosRun:
    """One scenario's worker processes and stores; :meth:`close` stops the processes and deletes the data."""

    def __init__(self, tmp: Path, label: str) -> None:
        run = uuid.uuid4().hex[:8]
        self.label = label
        self.prefix = f"chaos-{label}-{run}"
        self.logs = tmp / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.redis_url = _env_or_fail("FOLDLINE_REDIS_URL")
        self.bootstrap = _env_or_fail("FOLDLINE_KAFKA_BOOTSTRAP")
        self.s3_endpoint = _env_or_fail("FOLDLINE_S3_ENDPOINT")
        self.emulator_port = _free_port()
        emulator_url = f"http://127.0.0.1:{self.emulator_port}"
        self.env = {k: v for k, v in os.environ.items() if k not in _NOT_INHERITED}
        self.env.update(
            {
                "FOLDLINE_BACKEND": "distributed",
                "FOLDLINE_KAFKA_TOPIC": f"test.chaos.{label}.{run}",
                "FOLDLINE_FOLD_PREFIX": f"test:chaos:{run}:",
                "FOLDLINE_S3_BUCKET": f"foldline-chaos-{run}",
                "FOLDLINE_DISPATCH_STREAM": f"test:chaos:{run}:steps",
                "FOLDLINE_DATA_DIR": str(tmp / "data"),
                "FOLDLINE_ANTHROPIC_URL": emulator_url,
                "FOLDLINE_OPENAI_URL": emulator_url,
            }
        )
        self.children: dict[str, Child] = {}
        self.killed: set[str] = set()  # workers killed and not started again
        self._spawned = 0

    # ------------------------------------------------------------------ processes

    def config(self) -> Config:
        return Config.from_env(self.env)

    def create_stores(self) -> None:
        """The topics and the bucket, before the projectors subscribe to the topic."""
        stores = open_stores(self.config())
        try:
            stores.log.sessions()  # the Kafka log creates its topics on first use
            ensure_bucket = getattr(stores.attachments, "ensure_bucket", None)
            assert ensure_bucket is not None, "the distributed backend keeps attachments in S3"
            ensure_bucket()
        finally:
            stores.close()

    def spawn(self, name: str, args: Sequence[str], *, module: str | None = None) -> Child:
        """Start ``foldline ARGS`` (or ``python -m MODULE ARGS``) as ``name``, its output in a log file."""
        self._spawned += 1
        path = self.logs / f"{name}.{self._spawned}.log"
        out = path.open("wb")
        process = subprocess.Popen(
            [sys.executable, *(["-m", module] if module else ["-c", _CLI]), *args],
            env=self.env,
            cwd=REPO,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        child = Child(name, list(args), self.env, path, process, out)
        old = self.children.get(name)
        if old is not None:
            old.log_file.close()
        self.children[name] = child
        return child

    def start_workers(self, *, projectors: int = 2, dispatchers: int = 1) -> None:
        """The emulator, projectors and dispatchers, all started at once; returns when each says it is ready."""
        self.create_stores()
        self.spawn("emulator", ["emulator", "--port", str(self.emulator_port)])
        for i in range(projectors):
            self.spawn(f"projector-{i}", ["projector"])
        for i in range(dispatchers):
            self.spawn(f"dispatcher-{i}", ["dispatcher", "--consumer", f"dispatcher-{i}"])
        self.wait_ready(list(self.children))

    def wait_ready(self, names: Sequence[str]) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        for name in names:
            child = self.children[name]
            marker = _READY[name.split("-")[0]]
            while marker not in child.output():
                if child.process.poll() is not None:
                    pytest.fail(f"{name} exited with {child.process.returncode}:\n{child.tail()}")
                if time.monotonic() > deadline:
                    pytest.fail(f"{name} was not ready within {READY_TIMEOUT_S:g}s:\n{child.tail()}")
                time.sleep(0.05)

    def kill(self, name: str) -> None:
        """``kill -9`` the worker ``name``."""
        child = self.children[name]
        assert child.process.poll() is None, f"{name} had exited already:\n{child.tail()}"
        child.process.send_signal(signal.SIGKILL)
        child.process.wait(10)
        self.killed.add(name)

    def restart(self, name: str) -> Child:
        """Start ``name`` again with the arguments it had."""
        self.killed.discard(name)
        return self.spawn(name, self.children[name].args)

    def check_workers(self) -> None:
        """Fail if a worker that was not killed on purpose has exited."""
        for name, child in self.children.items():
            worker = name.split("-")[0] in _READY
            if worker and name not in self.killed and child.process.poll() is not None:
                pytest.fail(f"{name} exited with {child.process.returncode}:\n{child.tail()}")

    def stats(self) -> dict[str, int]:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.emulator_port}/stats", timeout=10) as r:
            value: dict[str, int] = json.loads(r.read())
        return value

    # ------------------------------------------------------------------ the scenario

    def fleet_with(
        self, fault: Callable[[ChaosRun], None], *, at: float = 0.3, sessions: int = SESSIONS, steps: int = STEPS
    ) -> dict[str, Any]:
        """Run ``foldline fleet`` and call ``fault(self)`` once ``at`` of its steps reached the emulator; the
        fleet's JSON report (the test fails if it exits non-zero or the fault came after the run)."""
        fleet = self.spawn(
            "fleet", ["fleet", "--sessions", str(sessions), "--steps", str(steps), "--json", "--prefix", self.prefix]
        )
        threshold = max(1, int(sessions * steps * at))
        deadline = time.monotonic() + FLEET_TIMEOUT_S
        while self.stats()["requests"] < threshold:
            if fleet.process.poll() is not None:
                pytest.fail(f"the fleet ended before the fault ({fleet.process.returncode}):\n{fleet.tail()}")
            if time.monotonic() > deadline:
                pytest.fail(f"the fleet sent fewer than {threshold} requests in {FLEET_TIMEOUT_S:g}s:\n{fleet.tail()}")
            time.sleep(0.1)
        fault(self)
        try:
            fleet.process.wait(max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            fleet.process.kill()
            fleet.process.wait(10)
            pytest.fail(f"the fleet did not finish within {FLEET_TIMEOUT_S:g}s:\n{fleet.tail()}")
        lines = [line for line in fleet.output().splitlines() if line.startswith('{"sessions"')]
        assert lines, f"the fleet printed no report ({fleet.process.returncode}):\n{fleet.tail()}"
        report: dict[str, Any] = json.loads(lines[-1])
        failed = f"fleet exited {fleet.process.returncode}; failed sessions: {report['failed'][:5]}\n{fleet.tail()}"
        assert fleet.process.returncode == 0, failed
        assert report["ok"], failed
        assert report["steps"] == sessions * steps
        assert report["verified"] == report["checked"] == report["steps"]
        return report

    def audit(self, fleet: dict[str, Any], *, extra_dispatches: int = 0) -> Audit:
        """``foldline verify`` and ``foldline drops`` on every session of the run, and the send count."""
        verify = self.spawn("verify", ["verify", "--json"])
        drops = self.spawn("drops", ["drops", "--json", "--fail-on-unexplained"])
        stores = open_stores(self.config())
        try:
            sessions = sorted(stores.log.sessions())
            dispatches, retries = 0, []
            for session in sessions:
                for event in stores.log.read(session):
                    if isinstance(event.data, RequestDispatch):
                        dispatches += 1
                    elif isinstance(event.data, LlmRetry):
                        retries.append(event.data.error_type)
        finally:
            stores.close()
        results: dict[str, dict[str, Any]] = {}
        for child in (verify, drops):
            child.process.wait(180)
            lines = [line for line in child.output().splitlines() if line.startswith("{")]
            status = child.process.returncode
            assert status == 0, f"foldline {child.name} exited {status}:\n{child.tail()}"
            assert lines, f"foldline {child.name} printed no JSON:\n{child.tail()}"
            results[child.name] = json.loads(lines[-1])
        stats = self.stats()
        audit = Audit(fleet, dispatches, retries, stats, results["verify"], results["drops"], sessions)

        expected = fleet["steps"] + extra_dispatches
        assert dispatches == expected, f"{dispatches} request/dispatch events logged, {expected} steps run"
        v = audit.verify
        assert v["checked"] == v["matched"] == dispatches, v
        assert not v["mismatched"], v
        assert not v["unreconstructable"], v
        assert audit.drops["counts"]["unexplained"] == 0, audit.drops
        assert stats["faults"] == 0, stats
        # every request the emulator received is a logged dispatch or a logged retry of one
        assert dispatches <= stats["requests"] <= dispatches + len(retries), (
            f"the emulator received {stats['requests']} requests for {dispatches} dispatched steps and "
            f"{len(retries)} logged retries ({sorted(set(retries))})"
        )
        self.check_workers()
        return audit

    # ------------------------------------------------------------------ teardown

    def close(self) -> None:
        for child in self.children.values():
            if child.process.poll() is None:
                child.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 20
        for child in self.children.values():
            try:
                child.process.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                child.process.kill()
                child.process.wait(10)
            child.log_file.close()
        self._drop_data()

    def _drop_data(self) -> None:
        topic = self.env["FOLDLINE_KAFKA_TOPIC"]
        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        doomed = [t for t in admin.list_topics(timeout=30).topics if t == topic or t.startswith(topic + ".")]
        if doomed:
            for fut in admin.delete_topics(doomed, operation_timeout=10).values():
                fut.result(timeout=30)
        r = redis.Redis.from_url(self.redis_url)
        try:
            for pattern in (self.env["FOLDLINE_FOLD_PREFIX"] + "*", self.env["FOLDLINE_DISPATCH_STREAM"] + "*"):
                for key in r.scan_iter(match=pattern, count=1000):
                    r.delete(key)
        finally:
            r.close()
        s3 = boto3.session.Session().client("s3", endpoint_url=self.s3_endpoint)
        bucket = self.env["FOLDLINE_S3_BUCKET"]
        try:
            if any(b["Name"] == bucket for b in s3.list_buckets().get("Buckets", [])):
                for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket):
                    keys: list[ObjectIdentifierTypeDef] = [{"Key": obj["Key"]} for obj in page.get("Contents", [])]
                    if keys:
                        s3.delete_objects(Bucket=bucket, Delete={"Objects": keys, "Quiet": True})
                s3.delete_bucket(Bucket=bucket)
        finally:
            s3.close()
