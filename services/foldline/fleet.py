"""``foldline fleet``: many concurrent loops in this process against external projectors and dispatchers.

The loops are the demo's scripted agents (its system prompt, tools and prompts) on the distributed backend:
every step is handed over to the ``foldline dispatcher`` processes serving the configured Redis stream, and
its request is built from the folds that ``foldline projector`` processes keep. Nothing is started here: the
workers are the operator's. First the log is warmed (:meth:`~foldline.ports.event_log.EventLog.warm`: its
writers, session creators and inbox started, as a long-running loop process has them before its first session;
timed apart).
The run then has three phases, each timed:

1. **open**: every session is created (a new session costs no take-over: docs/KAFKA.md) and its loop
   opened, all at once — the new sessions per second of one process. With ``--ramp`` the sessions arrive
   over time instead, as a fleet's do: each one is opened when it arrives, its first step right after, and
   the opening counts in the run;
2. **run**: every session runs its steps concurrently; each step's seconds are broken down (``append``,
   ``handover``, ``fold_wait``, ``build``, ``check``, ``queue``, ``send``, ``answer``, ``total``:
   :attr:`~foldline.loop.agent.StepRecord.timings`);
3. **verify**: every session is read back from the log and each request rebuilt byte for byte.

A session that fails is reported with its typed error and the run exits non-zero; so does any request that
does not verify.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .config import Config, Stores
from .core.content import TextBlock
from .core.header import CallConfig
from .demo import PROMPTS, SYSTEM_PROMPT, demo_toolset
from .errors import ConfigError
from .loop import Agent, AgentOptions
from .loop.agent import StepRecord
from .ports.step_dispatch import StepDispatcher
from .providers.retry import RetryingSender
from .replay.verify import VerifyReport, verify_events

if TYPE_CHECKING:
    from .adapters.kafka.writer import WriterTimes

__all__ = ["PHASES", "FleetResult", "SessionOutcome", "percentile", "run_fleet"]

#: the parts of a dispatched step's seconds, in the order a step spends them
PHASES = ("append", "handover", "fold_wait", "build", "check", "queue", "send", "answer", "total")


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-quantile (0..1) of ``values`` by the nearest-rank rule (0.0 for no values)."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = max(1, min(len(ordered), round(q * len(ordered) + 0.5)))
    return ordered[rank - 1]


@dataclass
class SessionOutcome:
    id: str
    steps: list[StepRecord] = field(default_factory=list)
    error: str | None = None  # "ErrorType: message" of a failed session
    open_s: float | None = None  # how long opening it took (creating it, loading its loop)
    verify: VerifyReport = field(default_factory=VerifyReport)


@dataclass
class FleetResult:
    sessions: list[SessionOutcome]
    steps_per_session: int
    open_s: float  # opening every session
    run_s: float  # running every step
    verify_s: float
    gc_s: float = 0.0  # of run_s, in the garbage collector
    ramp_s: float = 0.0  # the sessions' first steps spread over this long
    log_times: dict[str, float | int] | None = None  # the run's appends: where the group writers spent the time
    #: this process's CPU seconds in each phase (open, run, verify): the figures a step costs are open + run;
    #: verify reads every session back and rebuilds every request, a check no fleet runs on its own path
    cpu_s: dict[str, float] = field(default_factory=dict)
    #: during the run, how late this process's event loop ran a callback that was due (seconds, each probe):
    #: the queue every reply, hand-over answer and acknowledgement waits in before its session goes on
    loop_lag_s: list[float] = field(default_factory=list)
    invariant: bool = True  # whether each loop checked its requests against the log (AgentOptions.invariant)
    warm_s: float = 0.0  # warming the log before the first session (EventLog.warm)

    @property
    def failed(self) -> list[SessionOutcome]:
        return [s for s in self.sessions if s.error is not None]

    @property
    def steps(self) -> int:
        return sum(len(s.steps) for s in self.sessions)

    @property
    def verified(self) -> int:
        return sum(s.verify.matched for s in self.sessions)

    @property
    def checked(self) -> int:
        return sum(s.verify.checked for s in self.sessions)

    @property
    def ok(self) -> bool:
        return (
            not self.failed
            and all(s.verify.ok for s in self.sessions)
            and self.checked == self.steps
            and self.steps == len(self.sessions) * self.steps_per_session
        )

    def phase(self, name: str) -> list[float]:
        """Each step's seconds in ``name`` (one of :data:`PHASES`, or ``overhead``: total minus send)."""
        if name == "overhead":
            return [r.timings.get("total", 0.0) - r.timings.get("send", 0.0) for s in self.sessions for r in s.steps]
        return [r.timings.get(name, 0.0) for s in self.sessions for r in s.steps]

    def overhead_by_place(self) -> dict[str, list[float]]:
        """Each step's added seconds (total minus send), by its place in its session: its ``first`` step (the
        session's start is behind it: created, its key made, its first hand-over) and the ``later`` ones."""
        places: dict[str, list[float]] = {"first": [], "later": []}
        for s in self.sessions:
            for i, r in enumerate(s.steps):
                places["first" if i == 0 else "later"].append(r.timings.get("total", 0.0) - r.timings.get("send", 0.0))
        return places

    def to_json(self) -> dict[str, object]:
        return {
            "sessions": len(self.sessions),
            "steps_per_session": self.steps_per_session,
            "steps": self.steps,
            "failed": [{"id": s.id, "error": s.error} for s in self.failed],
            "warm_s": round(self.warm_s, 4),
            "open_s": round(self.open_s, 4),
            "open_ms": _quantiles_ms([s.open_s for s in self.sessions if s.open_s is not None]),
            "new_sessions_per_s": round(len(self.sessions) / self.open_s, 1) if self.open_s else None,
            "run_s": round(self.run_s, 4),
            "steps_per_s": round(self.steps / self.run_s, 1) if self.run_s else None,
            "verify_s": round(self.verify_s, 4),
            "gc_s": round(self.gc_s, 4),
            "ramp_s": self.ramp_s,
            "invariant": self.invariant,
            "log_times": self.log_times,
            "cpu_s": {name: round(seconds, 4) for name, seconds in self.cpu_s.items()},
            "loop_lag_ms": (
                {
                    "probes": len(self.loop_lag_s),
                    **{q: round(percentile(self.loop_lag_s, f) * 1000, 2) for q, f in _LAG_QUANTILES},
                }
                if self.loop_lag_s
                else None
            ),
            "verified": self.verified,
            "checked": self.checked,
            "ok": self.ok,
            "step_seconds": {
                name: {
                    "p50": round(percentile(v, 0.5), 6),
                    "p99": round(percentile(v, 0.99), 6),
                    "mean": round(sum(v) / len(v), 6),
                }
                for name in (*PHASES, "overhead")
                if (v := self.phase(name))
            },
            "overhead_by_place_ms": {
                place: {"steps": len(v), **(_quantiles_ms(v) or {})}
                for place, v in self.overhead_by_place().items()
                if v
            },
        }


async def _run_one(outcome: SessionOutcome, agent: Agent, steps: int, on_step: Callable[[], None]) -> None:
    def record(r: StepRecord) -> None:
        outcome.steps.append(r)
        on_step()

    agent.step_listeners.append(record)
    turn = 0
    offset = sum(outcome.id.encode())  # sessions share the agent's prefix, not their conversations
    while len(outcome.steps) < steps:
        agent.options.max_steps_per_turn = steps - len(outcome.steps)
        prompt = [TextBlock(f"[{outcome.id}] {PROMPTS[(turn + offset) % len(PROMPTS)]}")]
        ended = await agent.run_turn(prompt)
        if ended.failure is not None:  # the provider kept failing: this session failed
            raise ended.failure
        turn += 1


def _error_line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}".splitlines()[0]


async def run_fleet(
    config: Config,
    stores: Stores,
    dispatcher: StepDispatcher,
    *,
    sessions: int,
    steps: int,
    prefix: str | None = None,
    ramp_s: float = 0.0,
    invariant: bool = True,
    on_phase: Callable[[str, int], None] | None = None,
    on_step: Callable[[], None] | None = None,
) -> FleetResult:
    """Open ``sessions`` new sessions named ``<prefix>-NNNNN``, run ``steps`` steps in each concurrently
    through ``dispatcher``, then verify them all from ``stores.log``.

    ``ramp_s``: session ``i`` starts its first step ``i / sessions * ramp_s`` seconds into the run, as a
    fleet's sessions arrive over time (0: all in the same instant, the first step a burst of ``sessions``).

    ``invariant=False`` runs the loops without their invariant companion (``AgentOptions.invariant``): what the
    check costs, measured; a fleet runs with it.

    ``on_phase(name, total)`` is called as each phase (``open``, ``run``, ``verify``) begins; ``on_step``
    after each step. The caller owns ``stores`` and ``dispatcher``.
    """
    from .providers.emulated import emulated_provider_factory

    if config.backend != "distributed":
        raise ConfigError(
            f"foldline fleet hands every step to external dispatchers: it needs --backend distributed "
            f"(got {config.backend!r})"
        )
    if sessions < 1 or steps < 1:
        raise ConfigError("foldline fleet needs at least one session and one step")
    if ramp_s < 0:
        raise ConfigError(f"foldline fleet: --ramp must be 0 or more seconds (got {ramp_s:g})")
    run = prefix or f"fleet-{uuid.uuid4().hex[:8]}"
    outcomes = [SessionOutcome(f"{run}-{i:05d}") for i in range(sessions)]
    # One provider (it names the provider and serializes; the dispatchers do the sending) and one toolset
    # for every session, as a fleet would share them: building them is no part of opening a session.
    provider = emulated_provider_factory()()
    tools = demo_toolset()
    sender = RetryingSender(settings=config.transport)
    tick = on_step or (lambda: None)

    def options() -> AgentOptions:
        return AgentOptions(
            config=CallConfig("anthropic", "claude-emulated", max_tokens=512),
            system=SYSTEM_PROMPT,
            tools=tools,
            dispatcher=dispatcher,
            sender=sender,
            outage_s=config.outage_s,
            invariant=invariant,
        )

    async def open_one(outcome: SessionOutcome) -> Agent | None:
        began = time.monotonic()
        try:
            return await Agent.open(outcome.id, stores.log, provider, options(), attachments=stores.attachments)
        except Exception as exc:  # reported per session; the others go on
            outcome.error = _error_line(exc)
            return None
        finally:
            outcome.open_s = time.monotonic() - began

    # a loop process serves for hours: what its first sessions would start on first use is started first
    began = time.monotonic()
    await asyncio.to_thread(stores.log.warm)
    warm_s = time.monotonic() - began
    agents: list[Agent | None] = [None] * sessions
    open_s, cpu = 0.0, {"open": 0.0}
    if not ramp_s:  # all in one instant: opened together first, the new sessions per second of one process
        if on_phase is not None:
            on_phase("open", sessions)
        began, cpu_began = time.monotonic(), time.process_time()
        agents[:] = await asyncio.gather(*(open_one(o) for o in outcomes))
        open_s = time.monotonic() - began
        cpu["open"] = time.process_time() - cpu_began

    async def run_one(i: int, outcome: SessionOutcome) -> None:
        if ramp_s:  # a fleet's session is opened when it arrives, and its first step follows at once
            await asyncio.sleep(ramp_s * i / sessions)
            agents[i] = await open_one(outcome)
        agent = agents[i]
        if agent is None:
            return
        try:
            await _run_one(outcome, agent, steps, tick)
        except Exception as exc:
            outcome.error = _error_line(exc)

    if on_phase is not None:
        on_phase("run", sessions * steps)
    # A thousand open sessions are a large heap that lives as long as the run: left to the collector, each of
    # its full collections walks all of it (seconds, with every loop stopped). Frozen, they are not walked;
    # what the steps allocate is collected as usual.
    gc.collect()
    gc.freeze()
    thresholds = gc.get_threshold()
    gc.set_threshold(50_000, 50, 100)  # a young collection per 50,000 allocations, not 700
    pauses = _GcPauses()
    lag = _LoopLag()
    times_before = _writer_times(stores)
    began, cpu_began = time.monotonic(), time.process_time()
    probe = asyncio.create_task(lag.run())
    try:
        await asyncio.gather(*(run_one(i, o) for i, o in enumerate(outcomes)))
    finally:
        run_s = time.monotonic() - began
        cpu["run"] = time.process_time() - cpu_began
        probe.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await probe
        times_after = _writer_times(stores)
        await provider.aclose()
        pauses.close()
        gc.set_threshold(*thresholds)
        gc.unfreeze()

    if on_phase is not None:
        on_phase("verify", sessions)
    began, cpu_began = time.monotonic(), time.process_time()
    for outcome, agent in zip(outcomes, agents, strict=True):
        # read back from the log up to the head this process wrote (a read of known offsets; the store's
        # head may be asked too, but nothing else writes these sessions)
        head = agent.session.next_seq if agent is not None else None
        try:
            events = await stores.log.read_async(outcome.id, 0, head)
            outcome.verify = verify_events(outcome.id, events, stores.attachments)
        except Exception as exc:  # reported per session, like a failed run
            outcome.error = outcome.error or f"verify: {_error_line(exc)}"
    verify_s = time.monotonic() - began
    cpu["verify"] = time.process_time() - cpu_began
    log_times = None
    if times_before is not None and times_after is not None:
        times_after.subtract(times_before)
        log_times = times_after.to_json()
    return FleetResult(
        outcomes,
        steps,
        open_s,
        run_s,
        verify_s,
        pauses.seconds,
        ramp_s,
        log_times,
        cpu,
        lag.late_s,
        invariant,
        warm_s,
    )


def _writer_times(stores: Stores) -> WriterTimes | None:
    """Where the Kafka log's group writers spent their appends' time so far (None for another log)."""
    from .adapters.kafka import KafkaEventLog  # the distributed backend's log (its extra is installed)

    return stores.log.writer_times() if isinstance(stores.log, KafkaEventLog) else None


_LAG_QUANTILES = (("p50", 0.5), ("p90", 0.9), ("p99", 0.99), ("max", 1.0))


def _quantiles_ms(seconds: Sequence[float]) -> dict[str, float] | None:
    """p50, p99 and mean of ``seconds`` in milliseconds (``None`` for none)."""
    if not seconds:
        return None
    return {
        "p50": round(percentile(seconds, 0.5) * 1000, 2),
        "p99": round(percentile(seconds, 0.99) * 1000, 2),
        "mean": round(sum(seconds) / len(seconds) * 1000, 2),
    }


class _LoopLag:
    """How late the event loop runs a callback that is due: a probe sleeps ``every_s`` and notes by how much its
    wake-up came after the deadline. An idle loop wakes it within a fraction of a millisecond; a busy one only
    once the callbacks ready before it have run — the wait a reply from Redis or Kafka has too."""

    def __init__(self, every_s: float = 0.01) -> None:
        self.every_s = every_s
        self.late_s: list[float] = []

    async def run(self) -> None:
        while True:
            due = time.monotonic() + self.every_s
            await asyncio.sleep(self.every_s)
            self.late_s.append(max(0.0, time.monotonic() - due))


class _GcPauses:
    """Seconds spent in the garbage collector while installed (a ``gc.callbacks`` entry)."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._began = 0.0
        gc.callbacks.append(self._on)

    def _on(self, phase: str, _info: dict[str, int]) -> None:
        if phase == "start":
            self._began = time.perf_counter()
        else:
            self.seconds += time.perf_counter() - self._began

    def close(self) -> None:
        gc.callbacks.remove(self._on)
