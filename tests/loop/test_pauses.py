"""Pauses in one process: approvals that pause a turn, the durable inbox, turns continued after a crash, sub-agents.

The processes-and-kills side (SIGKILL while an approval is pending, between inject() and the claim, and between
every pair of an approval's events) is in ``test_pause_processes.py``.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from foldline.adapters.memory_log import MemoryEventLog
from foldline.adapters.sqlite_log import SqliteEventLog
from foldline.core import CallConfig, TextBlock, ToolResult, TurnEnd
from foldline.core.content import ToolCallBlock
from foldline.core.events import (
    ApprovalDecision,
    ApprovalRequest,
    AssistantMessage,
    Envelope,
    InboxClaim,
    SessionEndSeed,
    SessionParent,
    StepEnd,
    ToolCall,
    TurnRecovery,
    TurnStart,
    UserMessage,
)
from foldline.core.lineage import lineage
from foldline.core.pauses import DENIED, arguments_digest, open_turn, pending_approvals
from foldline.core.repair import INTERRUPTED_RESULT
from foldline.core.validation import check_log
from foldline.errors import (
    AlreadyDecided,
    ApprovalNotPending,
    InputError,
    NoOpenTurn,
    SessionNotFound,
    TurnOpen,
    ValidationError,
    WriteNotAllowed,
)
from foldline.loop import Agent, AgentOptions, Toolset
from foldline.loop.approvals import decide, pending
from foldline.loop.fork import fork_session
from foldline.loop.inbox import inject
from foldline.loop.subagents import child_session_id, run_subagent
from foldline.ports.event_log import EventLog
from foldline.providers.emulated import emulated_provider
from foldline.providers.emulator import Conversation, Emulator, Reply, ScriptedCall, ToolCallPart, ToolResultPart
from foldline.replay.verify import verify_events
from tests.factories import CapturingProvider

CONFIG = CallConfig("anthropic", "claude-emulated", max_tokens=256)
SYSTEM = "You are a careful agent."


class Rounds:
    """An emulated model that makes the given rounds of calls (one answer each), then answers in text."""

    def __init__(self, *rounds: Sequence[tuple[str, dict[str, Any]]]) -> None:
        self.rounds = rounds

    def reply(self, conversation: Conversation) -> Reply:
        done = 0
        for turn in reversed(conversation.turns):
            if turn.role == "user" and not any(isinstance(p, ToolResultPart) for p in turn.parts):
                break  # the turn's prompt: count the rounds since
            if turn.role == "assistant":
                if any(isinstance(p, ToolCallPart) for p in turn.parts):
                    done += 1
                else:
                    break
        if done < len(self.rounds):
            return Reply(f"round {done + 1}", tuple(ScriptedCall(n, a) for n, a in self.rounds[done]))
        return Reply(f"done after {done} rounds")


class Ran:
    """What the tools did, in order."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []


def toolset(ran: Ran, *, policy: Any = True, idempotent: bool = False) -> Toolset:
    tools = Toolset()

    @tools.tool(approval=policy, idempotent=idempotent)
    def transfer(amount: int, to: str) -> str:
        """Move money to an account."""
        ran.calls.append(("transfer", {"amount": amount, "to": to}))
        return f"moved {amount} to {to}"

    @tools.tool
    def lookup(topic: str) -> str:
        """Look a topic up."""
        ran.calls.append(("lookup", {"topic": topic}))
        return f"notes on {topic}"

    return tools


def agent_on(
    log: EventLog, ran: Ran, *rounds: Sequence[tuple[str, dict[str, Any]]], sid: str = "s", **options: Any
) -> tuple[Agent, CapturingProvider]:
    provider = CapturingProvider(emulated_provider(emulator=Emulator(Rounds(*rounds))))
    traits = {k: options.pop(k) for k in ("policy", "idempotent") if k in options}
    tools = options.pop("tools", None) or toolset(ran, **traits)
    agent = Agent(sid, log, provider, AgentOptions(config=CONFIG, system=SYSTEM, tools=tools, **options))
    return agent, provider


def types(events: Sequence[Envelope]) -> list[str]:
    return [e.type for e in events]


def user_texts(events: Sequence[Envelope]) -> list[str]:
    return [
        b.text for e in events if isinstance(e.data, UserMessage) for b in e.data.content if isinstance(b, TextBlock)
    ]


def results(events: Sequence[Envelope]) -> dict[str, ToolResult]:
    return {e.data.call_id: e.data for e in events if isinstance(e.data, ToolResult)}


TRANSFER = ("transfer", {"amount": 50, "to": "acct-7"})


# ------------------------------------------------------------------ approvals


def test_a_call_that_needs_approval_pauses_the_turn_and_an_allow_finishes_it() -> None:
    log, ran = MemoryEventLog(), Ran()
    agent, provider = agent_on(log, ran, [TRANSFER])
    paused = asyncio.run(agent.run_turn("pay acct-7"))
    assert paused.paused
    assert paused.reason == "paused"
    [waiting] = paused.pending
    assert (waiting.name, waiting.arguments) == ("transfer", '{"amount":50,"to":"acct-7"}')
    assert waiting.arguments_digest == arguments_digest(waiting.arguments)
    assert ran.calls == []  # nothing ran
    events = log.read("s")
    assert types(events)[-3:] == ["assistant/message", "tool/call", "approval/request"]
    assert events[-1].ignorable
    assert open_turn(events) is not None
    assert agent.turn_open
    assert [p.call_id for p, _ in pending(log)] == [waiting.call_id]

    entry = decide(log, "s", waiting.call_id, allow=True, by="ops")
    assert [p.call_id for p, d in pending(log) if d is not None and d.id == entry.id] == [waiting.call_id]
    done = asyncio.run(agent.continue_turn())
    assert done.reason == "completed"
    assert not agent.turn_open
    assert ran.calls == [TRANSFER]
    events = log.read("s")
    decision = [e.data for e in events if isinstance(e.data, ApprovalDecision)]
    assert decision == [ApprovalDecision(waiting.call_id, "allow", entry.id, None, None, "ops", entry.time)]
    result = results(events)[waiting.call_id]
    assert not result.is_error
    assert result.content == (TextBlock("moved 50 to acct-7"),)
    # the order of the pause: answer, its calls and requests; decision; results and step/end; the next step
    assert types(events)[5:12] == [
        "assistant/message",
        "tool/call",
        "approval/request",
        "approval/decision",
        "tool/result",
        "step/end",
        "step/start",
    ]
    assert pending(log) == []
    assert log.inbox().entries("s") == []
    assert verify_events("s", events).ok
    assert len(provider.bodies) == 2  # one request before the pause, one after


def test_a_denial_reaches_the_model_as_an_error_result_with_the_reason() -> None:
    log, ran = MemoryEventLog(), Ran()
    agent, provider = agent_on(log, ran, [TRANSFER])
    paused = asyncio.run(agent.run_turn("pay"))
    decide(log, "s", paused.pending[0].call_id, allow=False, reason="the account is frozen")
    assert asyncio.run(agent.continue_turn()).reason == "completed"
    assert ran.calls == []
    result = results(log.read("s"))[paused.pending[0].call_id]
    assert result.is_error
    assert result.content == (TextBlock(f"{DENIED}. Reason: the account is frozen"),)
    assert "the account is frozen" in provider.bodies[-1].decode()  # the model reads the reason


def test_an_allow_with_changed_arguments_runs_them_and_is_logged_as_such() -> None:
    log, ran = MemoryEventLog(), Ran()
    agent, _ = agent_on(log, ran, [TRANSFER])
    paused = asyncio.run(agent.run_turn("pay"))
    call = paused.pending[0].call_id
    decide(log, "s", call, allow=True, arguments={"to": "acct-7", "amount": 5})
    asyncio.run(agent.continue_turn())
    assert ran.calls == [("transfer", {"amount": 5, "to": "acct-7"})]
    events = log.read("s")
    [decision] = [e.data for e in events if isinstance(e.data, ApprovalDecision)]
    assert decision.arguments == '{"amount":5,"to":"acct-7"}'
    [logged_call] = [e.data for e in events if isinstance(e.data, ToolCall)]
    assert logged_call.arguments == '{"amount":50,"to":"acct-7"}'  # the model's call stays as it was
    content = results(events)[call].content
    note = '[an approver changed this call\'s arguments; it ran with: {"amount":5,"to":"acct-7"}]'
    assert content[0] == TextBlock(note)
    assert content[1] == TextBlock("moved 5 to acct-7")


def test_a_policy_of_the_arguments_holds_back_only_the_calls_it_says() -> None:
    log, ran = MemoryEventLog(), Ran()
    agent, _ = agent_on(
        log,
        ran,
        [("transfer", {"amount": 5, "to": "a"})],
        [("transfer", {"amount": 500, "to": "b"})],
        policy=lambda args: args["amount"] > 100,
    )
    paused = asyncio.run(agent.run_turn("pay twice"))
    assert paused.paused
    assert ran.calls == [("transfer", {"amount": 5, "to": "a"})]
    assert [
        paused.pending[0].arguments,
    ] == ['{"amount":500,"to":"b"}']
    assert sum(isinstance(e.data, ApprovalRequest) for e in log.read("s")) == 1


def test_no_call_of_an_answer_runs_before_every_approval_of_it_is_decided() -> None:
    log, ran = MemoryEventLog(), Ran()
    agent, _ = agent_on(log, ran, [("lookup", {"topic": "fees"}), TRANSFER, ("transfer", {"amount": 1, "to": "x"})])
    paused = asyncio.run(agent.run_turn("look, then pay"))
    first, second = (p.call_id for p in paused.pending)
    decide(log, "s", first, allow=True)
    again = asyncio.run(agent.continue_turn())
    assert again.paused
    assert [p.call_id for p in again.pending] == [second]
    assert ran.calls == []
    decide(log, "s", second, allow=False, reason="no")
    assert asyncio.run(agent.continue_turn()).reason == "completed"
    assert ran.calls == [("lookup", {"topic": "fees"}), TRANSFER]  # in call order, the denied one not at all
    events = log.read("s")
    calls = [e.data.call_id for e in events if isinstance(e.data, ToolCall)]
    assert [e.data.call_id for e in events if isinstance(e.data, ToolResult)] == calls  # results in call order
    assert verify_events("s", events).ok


def test_a_loop_waiting_on_a_decision_takes_one_made_by_another_process() -> None:
    log, ran = MemoryEventLog(), Ran()
    agent, _ = agent_on(log, ran, [TRANSFER], approval_wait_s=30.0)

    def decider() -> None:
        while not pending(log):
            threading.Event().wait(0.01)
        decide(log, "s", pending(log)[0][0].call_id, allow=True)

    thread = threading.Thread(target=decider)
    thread.start()
    result = asyncio.run(agent.run_turn("pay"))
    thread.join()
    assert result.reason == "completed"
    assert ran.calls == [TRANSFER]


def test_cancelling_a_loop_that_waits_for_a_decision_leaves_the_turn_paused() -> None:
    log, ran = MemoryEventLog(), Ran()
    agent, _ = agent_on(log, ran, [TRANSFER], approval_wait_s=60.0)

    async def cancelled() -> None:
        task = asyncio.create_task(agent.run_turn("pay"))
        while not pending(log):
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(cancelled())
    events = log.read("s")
    assert not any(isinstance(e.data, TurnEnd) for e in events)
    state = open_turn(events)
    assert state is not None
    assert state.paused
    fresh, _ = agent_on(log, ran, [TRANSFER])
    decide(log, "s", pending(log)[0][0].call_id, allow=True)
    assert asyncio.run(fresh.continue_turn()).reason == "completed"


def test_deciding_twice_a_call_that_is_not_pending_or_an_unknown_session_is_refused() -> None:
    log, ran = MemoryEventLog(), Ran()
    agent, _ = agent_on(log, ran, [TRANSFER])
    call = asyncio.run(agent.run_turn("pay")).pending[0].call_id
    with pytest.raises(SessionNotFound):
        decide(log, "nobody", call, allow=True)
    with pytest.raises(ApprovalNotPending, match="pending: '" + call):
        decide(log, "s", "no-such-call", allow=True)
    with pytest.raises(InputError, match="not valid JSON"):
        decide(log, "s", call, allow=True, arguments='{"amount": ')
    with pytest.raises(InputError, match="JSON object"):
        decide(log, "s", call, allow=True, arguments="[1]")
    with pytest.raises(InputError, match="denial carries no arguments"):
        decide(log, "s", call, allow=False, arguments="{}")
    decide(log, "s", call, allow=True)
    with pytest.raises(AlreadyDecided, match="waiting in the inbox"):
        decide(log, "s", call, allow=False)
    asyncio.run(agent.continue_turn())
    with pytest.raises(AlreadyDecided, match="decided already"):
        decide(log, "s", call, allow=True)
    assert sum(isinstance(e.data, ApprovalDecision) for e in log.read("s")) == 1


def test_decisions_racing_from_many_threads_count_once() -> None:
    log, ran = MemoryEventLog(), Ran()
    agent, _ = agent_on(log, ran, [TRANSFER])
    call = asyncio.run(agent.run_turn("pay")).pending[0].call_id
    outcomes: list[str] = []
    go = threading.Barrier(8)

    def one(n: int) -> None:
        go.wait()
        try:
            decide(log, "s", call, allow=n % 2 == 0, reason=None if n % 2 == 0 else "no")
            outcomes.append("ok")
        except AlreadyDecided:
            outcomes.append("refused")

    threads = [threading.Thread(target=one, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(outcomes) == ["ok"] + ["refused"] * 7
    asyncio.run(agent.continue_turn())
    assert sum(isinstance(e.data, ApprovalDecision) for e in log.read("s")) == 1


def test_a_read_only_log_refuses_a_decision_with_a_typed_error(tmp_path: Path) -> None:
    log, ran = SqliteEventLog(tmp_path), Ran()
    agent, _ = agent_on(log, ran, [TRANSFER])
    call = asyncio.run(agent.run_turn("pay")).pending[0].call_id
    log.close()
    reader = SqliteEventLog(tmp_path, read_only=True)
    try:
        with pytest.raises(WriteNotAllowed, match="read-only"):
            decide(reader, "s", call, allow=True)
        with pytest.raises(ApprovalNotPending):  # what is wrong with the call is said first
            decide(reader, "s", "other", allow=True)
        with pytest.raises(WriteNotAllowed):
            inject(reader, "s", "hello")
    finally:
        reader.close()


def test_a_new_turn_waits_for_the_open_one_and_continuing_needs_one() -> None:
    log, ran = MemoryEventLog(), Ran()
    agent, _ = agent_on(log, ran, [TRANSFER])
    with pytest.raises(NoOpenTurn):
        asyncio.run(agent.continue_turn())
    asyncio.run(agent.run_turn("pay"))
    with pytest.raises(TurnOpen, match="continue it first"):
        asyncio.run(agent.run_turn("something else"))
    again = asyncio.run(agent.continue_turn())  # no decision yet: it pauses again, nothing written
    assert again.paused
    assert sum(isinstance(e.data, TurnEnd) for e in log.read("s")) == 0


def test_a_paused_turn_survives_a_new_instance_which_continues_it(tmp_path: Path) -> None:
    log, ran = SqliteEventLog(tmp_path), Ran()
    agent, _ = agent_on(log, ran, [TRANSFER])
    call = asyncio.run(agent.run_turn("pay")).pending[0].call_id
    log.close()
    log = SqliteEventLog(tmp_path)
    decide(log, "s", call, allow=True)
    second, _ = agent_on(log, ran, [TRANSFER])
    assert second.turn_open
    head = log.head("s")
    assert log.head("s") == head  # a paused turn is not repaired on load
    assert asyncio.run(second.continue_turn()).reason == "completed"
    events = log.read("s")
    assert ran.calls == [TRANSFER]
    assert [e.data.reason for e in events if e.type == "request/header"] == ["initial", "resume"]  # type: ignore[union-attr]
    assert verify_events("s", events).ok
    log.close()


def test_the_log_refuses_a_second_decision_and_a_request_for_an_answered_call() -> None:
    log, ran = MemoryEventLog(), Ran()
    agent, _ = agent_on(log, ran, [TRANSFER])
    call = asyncio.run(agent.run_turn("pay")).pending[0].call_id
    decide(log, "s", call, allow=True)
    asyncio.run(agent.continue_turn())
    head = log.head("s")
    again = Envelope(head, 1, ApprovalDecision(call, "deny", "other-entry"), True)
    with pytest.raises(ValidationError, match="decided already"):
        log.append("s", head, [again])
    request = Envelope(head, 1, ApprovalRequest(0, 0, call, "transfer", arguments_digest("{}")), True)
    with pytest.raises(ValidationError, match="already has"):
        log.append("s", head, [request])
    with pytest.raises(ValidationError, match="ignorable"):
        log.append("s", head, [Envelope(head, 1, InboxClaim(("x",)))])


# ------------------------------------------------------------------ the durable inbox


def test_an_injected_message_is_durable_and_its_claim_is_logged(tmp_path: Path) -> None:
    log, ran = SqliteEventLog(tmp_path), Ran()
    agent, _provider = agent_on(log, ran)
    entry = agent.inject("also check the fees")
    assert [e.id for e in log.inbox().entries("s")] == [entry]  # durable before the claim
    asyncio.run(agent.run_turn("pay acct-7"))
    events = log.read("s")
    claim = next(e for e in events if isinstance(e.data, InboxClaim))
    assert claim.data == InboxClaim((entry,))
    after = [e.data for e in events[claim.seq + 1 : claim.seq + 3]]
    assert after == [
        UserMessage(f"u{claim.seq + 1}", (TextBlock("also check the fees"),), "inject"),
        UserMessage(f"u{claim.seq + 2}", (TextBlock("pay acct-7"),), "user"),
    ]
    assert log.inbox().entries("s") == []
    log.close()


def test_a_message_put_by_another_process_joins_the_next_step_once(tmp_path: Path) -> None:
    log, ran = SqliteEventLog(tmp_path), Ran()
    agent, _ = agent_on(log, ran, [("lookup", {"topic": "x"})])
    asyncio.run(agent.run_turn("first"))
    other = SqliteEventLog(tmp_path)  # another process's view of the data directory
    inject(other, "s", "from the other process")
    other.close()
    asyncio.run(agent.run_turn("second"))
    asyncio.run(agent.run_turn("third"))
    texts = user_texts(log.read("s"))
    assert texts.count("from the other process") == 1
    assert texts.index("from the other process") == texts.index("second") - 1
    log.close()


def test_an_injection_after_the_claim_joins_a_later_request() -> None:
    log, ran = MemoryEventLog(), Ran()
    agent, provider = agent_on(log, ran, [("lookup", {"topic": "x"})])

    def late(config: CallConfig) -> CallConfig:
        if not agent.inbox.store.entries("s"):
            agent.inject("late")
        return config

    agent.on_request(late)
    asyncio.run(agent.run_turn("go"))
    first, second = provider.bodies[0].decode(), provider.bodies[1].decode()
    assert '"late"' not in first
    assert '"late"' in second


def test_a_claim_the_log_names_is_never_entered_again() -> None:
    log, ran = MemoryEventLog(), Ran()
    agent, _ = agent_on(log, ran)
    entry = agent.inject("once")
    original = log.inbox().remove
    log.inbox().remove = lambda *a, **k: None  # type: ignore[method-assign]  # the removal is lost (a crash)
    asyncio.run(agent.run_turn("go"))
    log.inbox().remove = original  # type: ignore[method-assign]
    assert [e.id for e in log.inbox().entries("s")] == [entry]  # still in the store
    again, _ = agent_on(log, ran)  # a new instance: the log names the entry
    asyncio.run(again.run_turn("next"))
    texts = user_texts(log.read("s"))
    assert texts.count("once") == 1
    assert log.inbox().entries("s") == []  # removed now


def test_a_tools_additional_context_is_put_before_the_step_closes_and_enters_once() -> None:
    log = MemoryEventLog()
    tools = Toolset()

    @tools.tool
    def hint(topic: str) -> Any:
        """Answer and leave context for later."""
        from foldline.loop import ToolOutput

        return ToolOutput(f"hint {topic}", additional_context=f"context {topic}")

    agent, _ = agent_on(log, Ran(), [("hint", {"topic": "t"})], tools=tools)
    asyncio.run(agent.run_turn("go"))
    events = log.read("s")
    claims = [e.data for e in events if isinstance(e.data, InboxClaim)]
    assert len(claims) == 1
    assert claims[0].entries[0].startswith("context-")
    texts = user_texts(events)
    assert texts.count("context t") == 1


# ------------------------------------------------------------------ turns that continue after a crash


def crashed_mid_tool(log: EventLog, ran: Ran, **options: Any) -> str:
    """A session whose loop died while the answer's tools ran: the answer is logged, its results are not."""
    agent, _ = agent_on(log, ran, [("lookup", {"topic": "a"}), TRANSFER], policy=False, **options)

    async def die(call: Any, arguments: str) -> Any:
        raise SystemExit("killed")  # stands for kill -9: nothing after the answer is written

    agent.options.tools.call = die  # type: ignore[method-assign,assignment]
    with pytest.raises(SystemExit):
        asyncio.run(agent.run_turn("pay"))
    return "s"


def test_the_end_policy_answers_interrupted_calls_and_logs_its_choice() -> None:
    log, ran = MemoryEventLog(), Ran()
    crashed_mid_tool(log, ran)
    before = log.head("s")
    agent, _ = agent_on(log, ran, [], policy=False)
    events = log.read("s")[before:]
    assert types(events) == ["turn/recover", "tool/result", "tool/result", "step/end", "turn/end"]
    recovery = events[0].data
    assert isinstance(recovery, TurnRecovery)
    assert recovery.policy == "end"
    assert len(recovery.interrupted) == 2
    assert all(r.content == (TextBlock(INTERRUPTED_RESULT),) for r in results(events).values())
    assert not agent.turn_open


def test_the_continue_policy_gives_the_model_the_interrupted_results_and_goes_on() -> None:
    log, ran = MemoryEventLog(), Ran()
    crashed_mid_tool(log, ran)
    before = log.head("s")
    agent, provider = agent_on(log, ran, [("lookup", {"topic": "a"}), TRANSFER], policy=False, on_crash="continue")
    assert agent.turn_open
    [recovery] = [e.data for e in log.read("s")[before:]]
    assert isinstance(recovery, TurnRecovery)
    assert recovery.policy == "continue"
    assert recovery.rerun == ()
    with pytest.raises(TurnOpen):
        asyncio.run(agent.run_turn("new"))
    done = asyncio.run(agent.continue_turn())
    assert done.reason == "completed"
    assert ran.calls == []
    events = log.read("s")
    assert all(r.content == (TextBlock(INTERRUPTED_RESULT),) for r in results(events).values())
    assert sum(isinstance(e.data, TurnStart) for e in events) == 1  # the same turn
    assert INTERRUPTED_RESULT in provider.bodies[-1].decode()  # the model saw what happened
    assert verify_events("s", events).ok


def test_an_idempotent_tool_is_run_again_instead() -> None:
    log, ran = MemoryEventLog(), Ran()
    crashed_mid_tool(log, ran, idempotent=True)
    agent, _ = agent_on(log, ran, [], policy=False, idempotent=True, on_crash="continue")
    recovery = next(e.data for e in log.read("s") if isinstance(e.data, TurnRecovery))
    assert len(recovery.rerun) == 1
    assert len(recovery.interrupted) == 1
    asyncio.run(agent.continue_turn())
    assert ran.calls == [TRANSFER]
    by_id = results(log.read("s"))
    assert by_id[recovery.rerun[0]].content == (TextBlock("moved 50 to acct-7"),)
    assert by_id[recovery.interrupted[0]].content == (TextBlock(INTERRUPTED_RESULT),)


def test_a_step_whose_request_was_never_answered_asks_again() -> None:
    log, ran = MemoryEventLog(), Ran()
    agent, _ = agent_on(log, ran, [("lookup", {"topic": "a"})])

    async def no_answer(*_: Any, **__: Any) -> Any:
        raise SystemExit("killed while the request was out")

    agent.sender.send = no_answer  # type: ignore[method-assign]
    with pytest.raises(SystemExit):
        asyncio.run(agent.run_turn("go"))
    again, _ = agent_on(log, ran, [("lookup", {"topic": "a"})], on_crash="continue")
    assert asyncio.run(again.continue_turn()).reason == "completed"
    events = log.read("s")
    check_log(events)
    assert [e.data.step for e in events if isinstance(e.data, StepEnd)] == [0, 1, 2]
    assert verify_events("s", events).ok


# ------------------------------------------------------------------ sub-agents


def research_tools(child_rounds: Sequence[Sequence[tuple[str, dict[str, Any]]]] = ()) -> Toolset:
    tools = Toolset()

    @tools.tool
    async def research(question: str) -> Any:
        """Ask a research sub-agent."""
        child = AgentOptions(config=CONFIG, system="You research.", tools=toolset(Ran(), policy=False))
        return await run_subagent(f"research: {question}", child, provider=emulated_provider())

    return tools


def test_a_sub_agent_runs_in_its_own_session_and_both_logs_name_each_other() -> None:
    log = MemoryEventLog()
    agent, _ = agent_on(log, Ran(), [("research", {"question": "fees"})], tools=research_tools())
    assert asyncio.run(agent.run_turn("find out")).reason == "completed"
    events = log.read("s")
    [call] = [e.data for e in events if isinstance(e.data, ToolCall)]
    child_id = child_session_id("s", call.call_id)
    assert results(events)[call.call_id].child_session_id == child_id
    child = log.read(child_id)
    assert child[0].data == SessionParent("s", call.call_id, "research")
    assert child[0].ignorable
    found = lineage(child)
    assert found is not None
    assert found.kind == "subagent"
    assert any(e.type == "request/header" for e in child)  # its own header
    result = results(events)[call.call_id]
    child_answer = [e.data for e in child if isinstance(e.data, AssistantMessage)][-1]
    assert result.content == child_answer.content
    assert verify_events("s", events, read=log.read).ok
    assert verify_events(child_id, child, read=log.read).ok


def test_verify_finds_a_link_the_other_log_does_not_confirm() -> None:
    log = MemoryEventLog()
    agent, _ = agent_on(log, Ran(), [("research", {"question": "fees"})], tools=research_tools())
    asyncio.run(agent.run_turn("find out"))
    call = next(e.data.call_id for e in log.read("s") if isinstance(e.data, ToolCall))
    impostor = MemoryEventLog()
    for sid in log.sessions():
        impostor.append(sid, 0, log.read(sid))
    lonely = [Envelope(0, 1, SessionParent("s", "no-such-call", "research"), True), Envelope(1, 2, TurnStart(0))]
    impostor.append("orphan", 0, lonely)
    report = verify_events("orphan", lonely, read=impostor.read)
    assert [u.reason for u in report.unreconstructable] == ["lineage: its parent 's' has no tool/call 'no-such-call'"]
    gone = MemoryEventLog()
    gone.append("s", 0, log.read("s"))  # the child session is missing
    report = verify_events("s", log.read("s"), read=gone.read)
    assert "which is not in the log" in report.unreconstructable[0].reason
    assert child_session_id("s", call) in report.unreconstructable[0].reason


def test_a_fork_child_and_a_sub_agent_child_are_told_apart() -> None:
    log = MemoryEventLog()
    agent, _ = agent_on(log, Ran(), [("research", {"question": "fees"})], tools=research_tools())
    asyncio.run(agent.run_turn("find out"))
    child_id = next(s for s in log.sessions() if s != "s")
    end = max(e.seq for e in log.read(child_id) if isinstance(e.data, TurnEnd))
    fork = fork_session(log, child_id, end, "fork-of-child")
    forked = log.read(fork.child_id)
    assert lineage(log.read(child_id)).kind == "subagent"  # type: ignore[union-attr]
    found = lineage(forked)
    assert found is not None
    assert (found.kind, found.parent_id) == ("fork", child_id)
    assert any(isinstance(e.data, SessionEndSeed) for e in forked)
    assert verify_events(fork.child_id, forked, read=log.read).ok  # the copied session/parent is the parent's


def test_a_sub_agent_run_again_finds_its_finished_work() -> None:
    log = MemoryEventLog()
    agent, _ = agent_on(log, Ran(), [("research", {"question": "fees"})], tools=research_tools())
    asyncio.run(agent.run_turn("find out"))
    child_id = next(s for s in log.sessions() if s != "s")
    head = log.head(child_id)
    call = next(e.data.call_id for e in log.read("s") if isinstance(e.data, ToolCall))

    async def again() -> Any:
        from foldline.loop.calls import CURRENT_CALL, ToolCallContext

        token = CURRENT_CALL.set(ToolCallContext("s", call, "research", 0, 0, log, agent.provider, None, lambda: 5))
        try:
            return await run_subagent("research: fees", AgentOptions(config=CONFIG, system="You research."))
        finally:
            CURRENT_CALL.reset(token)

    output = asyncio.run(again())
    assert output.child_session == child_id
    assert log.head(child_id) == head
    assert not output.is_error


def test_pending_approvals_come_from_the_open_turn_only() -> None:
    log, ran = MemoryEventLog(), Ran()
    agent, _ = agent_on(log, ran, [TRANSFER])
    call = asyncio.run(agent.run_turn("pay")).pending[0].call_id
    assert [p.call_id for p in pending_approvals("s", log.read("s"))] == [call]
    decide(log, "s", call, allow=False)
    asyncio.run(agent.continue_turn())
    assert pending_approvals("s", log.read("s")) == []
    blocks = [b for e in log.read("s") if isinstance(e.data, AssistantMessage) for b in e.data.content]
    assert any(isinstance(b, ToolCallBlock) for b in blocks)


def test_allowed_calls_run_together_in_the_tool_runner_with_the_changed_arguments() -> None:
    log, ran = MemoryEventLog(), Ran()
    tools = Toolset()
    arrived: list[str] = []
    together = asyncio.Event()

    async def meet(who: str) -> str:
        arrived.append(who)
        if len(arrived) == 3:
            together.set()
        await together.wait()  # only returns when all three calls run at once
        return f"met as {who}"

    @tools.tool(timeout_s=5)
    async def gather(who: str) -> str:
        """Wait for the others."""
        return await meet(who)

    @tools.tool(timeout_s=5, approval=lambda args: args.get("who") != "nobody")
    async def gated(who: str) -> str:
        """Wait for the others, once allowed."""
        return await meet(who)

    rounds = [("gather", {"who": "a"}), ("gated", {"who": "b"}), ("gather", {"who": "c"})]
    agent, _ = agent_on(log, ran, rounds, tools=tools)
    paused = asyncio.run(agent.run_turn("meet"))
    [held] = paused.pending
    assert arrived == []  # the runner started none of the answer's calls before the decision
    decide(log, "s", held.call_id, allow=True, arguments={"who": "B"})
    assert asyncio.run(agent.continue_turn()).reason == "completed"
    assert sorted(arrived) == ["B", "a", "c"]
    done = results(log.read("s"))
    assert [not r.is_error for r in done.values()] == [True, True, True]
    gated_result = done[held.call_id]
    texts = [b.text for b in gated_result.content if isinstance(b, TextBlock)]
    assert texts[-1] == "met as B"
    assert '{"who":"B"}' in texts[0]  # the result says it ran with the approver's arguments
