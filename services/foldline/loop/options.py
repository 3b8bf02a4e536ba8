"""What a loop instance is configured with, and what its steps and turns answer."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, TypeAlias

from ..core.content import Usage
from ..core.events import RecoveryPolicy, TurnEndReason
from ..core.header import CallConfig
from ..core.pauses import PendingApproval
from ..errors import ConfigError, FoldlineError
from ..ports.step_dispatch import StepDispatcher
from ..providers.retry import RetryingSender
from ..replay.invariant import DEFAULT_FRESH_GROWTH, DEFAULT_FULL_CHECK_EVERY
from .output import OutputType
from .pressure import PressurePolicy
from .tool_runner import ToolRunSettings
from .tools import MAX_TOOL_RESULT_BYTES, Toolset

__all__ = [
    "CONTEXT_OVERFLOW_FIX",
    "READ_AT_CONSTRUCTION",
    "AgentOptions",
    "StepRecord",
    "SystemSource",
    "TurnOutcome",
    "TurnResult",
    "wall_clock_ms",
]

SystemSource = str | Callable[[], str] | None

#: What a ``context-overflow`` turn end asks the operator to change.
CONTEXT_OVERFLOW_FIX = (
    "the request no longer fits the model's context window: compact earlier — give the loop a PressurePolicy "
    "(AgentOptions.pressure) or lower its budget below the window, with room for the answer — or choose a "
    "model with a larger window"
)


#: Options an Agent reads once, when it is built: assigning them on its options afterwards is refused.
READ_AT_CONSTRUCTION = frozenset(
    {"invariant", "invariant_full_check_every", "invariant_fresh_growth", "on_invariant_violation", "sender"}
)


@dataclass
class AgentOptions:
    """Explicit options of one loop instance.

    ``config`` seeds the first request of this instance (fork overrides and resume reconfiguration
    arrive here); later requests start from the folded header — unless ``config`` is assigned a new value
    while the agent runs: the next request then starts from it (a ``change`` snapshot when it differs from
    the header in force). The other options are read at each step, except those in
    :data:`READ_AT_CONSTRUCTION`, which the Agent reads once: once an Agent was built with these options,
    assigning one of them raises :class:`~foldline.errors.ConfigError` rather than being ignored.
    """

    config: CallConfig
    system: SystemSource = None
    tools: Toolset = field(default_factory=Toolset)
    max_steps_per_turn: int = 16
    invariant: bool = True
    invariant_full_check_every: int = DEFAULT_FULL_CHECK_EVERY  # also a fresh rebuild on every N-th step (0: never)
    invariant_fresh_growth: float = DEFAULT_FRESH_GROWTH  # a fresh rebuild whenever the session grew this much
    on_invariant_violation: Callable[[], None] | None = None  # e.g. a metrics counter; the error still raises
    archive_requests: bool = False  # keep exact wire bodies in the attachment store, keyed by digest
    pressure: PressurePolicy | None = None  # trim / compact between steps when over budget (loop/pressure.py)
    dispatcher: StepDispatcher | None = None  # hand each step's model call to a dispatcher (docs/DISPATCHER.md)
    # retries, backoff and per-provider concurrency; share one across the sessions of a process (None: a
    # sender of this instance's own, with the provider's transport settings)
    sender: RetryingSender | None = None
    reset_after_refusal: bool = True  # remove a refused turn before the next one where the provider asks for it
    # a tool result's text above this many bytes is cut, the whole kept in the attachment store (loop/tools.py)
    max_tool_result_bytes: int = MAX_TOOL_RESULT_BYTES
    outage_s: float = 60.0  # a log that does not answer is retried this long before the step fails
    # a turn a crash left open mid-step, on the next load: "end" it (every unanswered call answered as
    # interrupted, the turn ended error) or "continue" it (the model gets those results — idempotent tools are
    # run again instead — and the turn goes on: Agent.continue_turn). Logged as turn/recover either way.
    on_crash: RecoveryPolicy = "end"
    # how long a step waits for approval decisions (put into the inbox from any process) before the turn pauses
    # and run_turn returns; 0: pause at once. A paused turn waits in the log, however long, for continue_turn.
    approval_wait_s: float = 0.0
    # the calls of one answer run concurrently, at most this many at once (a tool may ask to run alone)
    max_parallel_tools: int = 8
    # a tool call that runs longer is cancelled and answered with an error naming the limit (a tool's own
    # timeout_s overrides it; None: no limit)
    tool_timeout_s: float | None = 300.0
    # the erasure scope the session's content belongs to (docs/ERASURE.md): `foldline erase --subject ID` erases
    # every session opened with it; bound when the session's content key is made (its first sealed event)
    subject: str | None = None
    # the type every turn's final answer must have (structured output, loop/output.py); a turn may ask for its own
    output: OutputType[Any] | None = None

    def tool_run_settings(self) -> ToolRunSettings:
        """What the tool runner allows this step's calls (read at each step)."""
        return ToolRunSettings(self.max_parallel_tools, self.tool_timeout_s, self.max_tool_result_bytes)

    def __setattr__(self, name: str, value: object) -> None:
        if name in READ_AT_CONSTRUCTION and self.__dict__.get("_bound"):
            raise ConfigError(
                f"AgentOptions.{name} is read when the Agent is built and cannot change afterwards; build a new "
                "Agent (Agent.open on the same session resumes it) with the options you want"
            )
        object.__setattr__(self, name, value)

    def bind(self) -> None:
        """Mark these options as read by an Agent (see the class docstring)."""
        self.__dict__["_bound"] = True


@dataclass(frozen=True, slots=True)
class StepRecord:
    turn: int
    step: int
    dispatch_seq: int
    digest: str
    usage: Usage
    header_reason: str | None
    #: where the step's seconds went (a dispatched step: ``append``, ``handover``, ``fold_wait``, ``build``,
    #: ``check``, ``queue``, ``send``, ``answer``, ``total``; a local one: ``append``, ``send``, ``answer``, ``total``)
    timings: Mapping[str, float] = field(default_factory=dict, compare=False)


#: How a call of run_turn or continue_turn came back: the reason its turn ended, or ``paused`` — the turn waits
#: for approval decisions (no ``turn/end``; :attr:`TurnResult.pending` names the calls).
TurnOutcome: TypeAlias = TurnEndReason | Literal["paused"]


@dataclass(frozen=True, slots=True)
class TurnResult:
    turn: int
    reason: TurnOutcome
    steps: tuple[StepRecord, ...]
    text: str
    detail: str | None = None  # what to change (context-overflow), or what failed (error)
    #: the typed error a turn that ended ``error`` without raising stopped on (retries exhausted)
    failure: FoldlineError | None = field(default=None, compare=False)
    pending: tuple[PendingApproval, ...] = ()  # the calls a paused turn waits for decisions on

    @property
    def paused(self) -> bool:
        """The turn waits for approval decisions; decide them (any process), then ``continue_turn``."""
        return self.reason == "paused"

    #: the final answer validated against the turn's output type (structured output); None without one
    output: Any = field(default=None, compare=False)


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000
