"""A turn the last loop instance left open mid-step (a crash, a kill): what a new instance does with it on load.

The policy is the agent's (``AgentOptions.on_crash``), and both the choice and what happened are logged — the
first event the new instance appends is ``turn/recover``:

* ``end`` (the default, and what every earlier version did): every call of the open step's answer without a
  result is answered — a denied one with its denial, any other as interrupted (whether the tool ran is unknown,
  and it is not run again) — then ``step/end`` and ``turn/end`` (``error``). One append, at load.
* ``continue``: ``turn/recover`` lists the calls to answer as interrupted and those to run again (tools
  registered ``idempotent``: running one twice does no more than once); it is appended at load, and the turn
  stays open. :meth:`~foldline.loop.Agent.continue_turn` then appends the results (in call order) and
  ``step/end``, and the turn goes on with its next step — the model sees the interrupted results and carries on.
  An open step whose request was never answered is closed (``step/end``) and the next step asks again. A turn
  that opened no step is ended whatever the policy: its prompt, held by the caller that died, never reached the
  log, so there is nothing to continue.

A turn paused on approvals is not a crash: no tool of its answer ran, and it waits for decisions instead
(:mod:`foldline.core.pauses`).
"""

from __future__ import annotations

from collections.abc import Sequence

from ..core.events import CompactionEnd, Envelope, EventData, RecoveryPolicy, TurnRecovery, UserMessage
from ..core.pauses import OpenTurn, denied_result
from ..core.repair import closing_events
from .tools import Toolset

__all__ = ["recovery_events"]


def recovery_events(
    loaded: Sequence[Envelope], state: OpenTurn, tools: Toolset, policy: RecoveryPolicy
) -> list[EventData]:
    """The events a new instance appends on load for the interrupted turn ``state`` of ``loaded``."""
    if state.steps == 0:
        policy = "end"  # no step opened: the turn's prompt never reached the log, so there is nothing to go on with
    step = state.step
    unanswered = step.unanswered if step is not None else ()
    denied = {c: d for c, d in step.decided.items() if d.verdict == "deny"} if step is not None else {}
    runnable = [c for c in unanswered if c.id not in denied]
    answers = {c.id: denied_result(c.id, c.name, denied[c.id].reason) for c in unanswered if c.id in denied}
    closing = closing_events(loaded, "error", answers)
    # a compaction the crash cut short is finished first (its replacement must follow its summary at once, and
    # compaction/end), exactly as closing does; then the choice
    cut = next((i for i, e in enumerate(closing) if not isinstance(e, UserMessage | CompactionEnd)), len(closing))
    compaction, rest = closing[:cut], closing[cut:]
    if policy == "end":
        return [*compaction, TurnRecovery(state.turn, "end", tuple(c.id for c in runnable)), *rest]
    rerun = tuple(c.id for c in runnable if tools.settings(c.name).idempotent)
    interrupted = tuple(c.id for c in runnable if c.id not in rerun)
    return [*compaction, TurnRecovery(state.turn, "continue", interrupted, rerun)]  # the step is answered on continue
