"""Chaos: a fleet of loops survives one failing dependency at a time, and the log proves it.

Each test runs ``foldline fleet`` (64 sessions of 20 steps by default) against separate ``foldline
projector``, ``foldline dispatcher`` and ``foldline emulator`` processes, injects one fault mid-run, and
then audits the run (:meth:`~tests.chaos.harness.ChaosRun.audit`): every session completed and verified,
``foldline verify`` 100 %, no unexplained cache-read drop, and every request the provider received is a
logged dispatch or a logged retry. The local servers are shared with the rest of the suite: a stopped
server is started again, healthy, whatever the outcome.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis

from .harness import SESSIONS, STEPS, ChaosRun, outage

pytestmark = [pytest.mark.chaos, pytest.mark.slow, pytest.mark.kafka, pytest.mark.redis, pytest.mark.s3]

OpenRun = Callable[..., ChaosRun]
LOST_DATA_STEPS = max(2, STEPS // 4)  # shorter runs: a Redis that lost its data is recovered from within a step or two


@pytest.fixture
def open_run(tmp_path: Path) -> Iterator[OpenRun]:
    runs: list[ChaosRun] = []

    def factory(label: str, *, projectors: int = 2, dispatchers: int = 1) -> ChaosRun:
        run = ChaosRun(tmp_path / label, label)
        runs.append(run)
        run.start_workers(projectors=projectors, dispatchers=dispatchers)
        return run

    yield factory
    for run in runs:
        run.close()


def test_projector_killed_and_restarted(open_run: OpenRun) -> None:
    run = open_run("projector")

    def fault(run: ChaosRun) -> None:
        run.kill("projector-0")
        time.sleep(5)
        run.restart("projector-0")

    audit = run.audit(run.fleet_with(fault))
    assert len(audit.sessions) == SESSIONS


def test_dispatcher_killed_another_takes_over(open_run: OpenRun) -> None:
    """The hand-overs the killed dispatcher held are taken over by the other once idle ``claim_idle_s``
    (the fleet may finish sooner: its loops re-send what went unaccepted); the audit runs after the take-over,
    so a held send served again would show as a request the log does not account for."""
    run = open_run("dispatcher", dispatchers=2)
    config = run.config().dispatch
    r = redis.Redis.from_url(run.redis_url, socket_timeout=10)
    held: list[int] = []

    def kill(run: ChaosRun) -> None:
        run.kill("dispatcher-0")
        held.append(len(r.xpending_range(config.stream, config.group, "-", "+", 10_000, "dispatcher-0")))

    fleet = run.fleet_with(kill)
    deadline = time.monotonic() + config.claim_idle_s * 2 + 30
    while r.xpending_range(config.stream, config.group, "-", "+", 10_000, "dispatcher-0"):
        assert time.monotonic() < deadline, "the killed dispatcher's hand-overs were never taken over"
        time.sleep(0.5)
    audit = run.audit(fleet)
    assert len(audit.sessions) == SESSIONS
    taken = run.children["dispatcher-1"].output().count("taking over hand-over")
    assert taken >= held[0], f"{held[0]} hand-overs held at the kill, {taken} taken over"


def test_only_dispatcher_killed_and_restarted(open_run: OpenRun) -> None:
    run = open_run("dispatcher-restart")

    def fault(run: ChaosRun) -> None:
        run.kill("dispatcher-0")
        time.sleep(2)
        run.restart("dispatcher-0")

    audit = run.audit(run.fleet_with(fault))
    assert len(audit.sessions) == SESSIONS


def test_redis_flushall(open_run: OpenRun) -> None:
    """Every fold, hand-over, reply and taken mark is lost at once: the projectors re-read their partitions,
    the dispatchers recreate their group, the loops hand over again what was lost."""
    run = open_run("flushall")

    def fault(run: ChaosRun) -> None:
        r = redis.Redis.from_url(run.redis_url)
        try:
            assert r.flushall()
        finally:
            r.close()

    audit = run.audit(run.fleet_with(fault, steps=LOST_DATA_STEPS))
    assert len(audit.sessions) == SESSIONS
    assert any("re-reading offsets" in run.children[f"projector-{i}"].output() for i in range(2))


def test_redis_restarted_without_its_data(open_run: OpenRun) -> None:
    run = open_run("redis-restart")
    audit = run.audit(run.fleet_with(lambda _run: outage("redis", 2), steps=LOST_DATA_STEPS))
    assert len(audit.sessions) == SESSIONS


def test_kafka_stopped_for_ten_seconds(open_run: OpenRun) -> None:
    run = open_run("kafka-down")
    audit = run.audit(run.fleet_with(lambda _run: outage("kafka", 10)))
    assert len(audit.sessions) == SESSIONS


def test_s3_stopped_for_ten_seconds(open_run: OpenRun) -> None:
    run = open_run("s3-down")
    audit = run.audit(run.fleet_with(lambda _run: outage("s3", 10)))
    assert len(audit.sessions) == SESSIONS


def test_two_loops_resume_one_session_at_once(open_run: OpenRun, tmp_path: Path) -> None:
    """Two loop processes open one session; released together, the older instance is fenced with a clean
    ``FencedError`` before it writes anything and the newer one completes, while the fleet runs."""
    run = open_run("resume-race")
    seed = run.spawn("seed", ["fleet", "--sessions", "1", "--steps", "2", "--json", "--prefix", f"{run.prefix}-race"])
    assert seed.process.wait(180) == 0, seed.tail()
    session = f"{run.prefix}-race-00000"
    go = tmp_path / "go"
    racers = []
    for name in ("older", "newer"):  # the newer opens (becomes the writer) after the older one did
        racer = run.spawn(name, [session, "4", str(go)], module="tests.chaos.resume_race")
        deadline = time.monotonic() + 120
        while "opened" not in racer.output():
            assert racer.process.poll() is None, racer.tail()
            assert time.monotonic() < deadline, racer.tail()
            time.sleep(0.05)
        racers.append(racer)

    def fault(_run: ChaosRun) -> None:
        go.touch()
        for racer in racers:
            racer.process.wait(180)

    fleet = run.fleet_with(fault)
    older, newer = racers
    assert newer.process.returncode == 0, newer.tail()
    assert "completed 4" in newer.output(), newer.tail()
    assert older.process.returncode == 3, older.tail()
    assert older.output().strip().splitlines()[-1].startswith("FencedError: "), older.tail()
    assert "outcome unknown" not in older.output(), older.tail()
    audit = run.audit(fleet, extra_dispatches=2 + 4)
    assert len(audit.sessions) == SESSIONS + 1
