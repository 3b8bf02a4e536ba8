"""Pauses across processes and kills: a pending approval survives SIGKILL and is decided from another process,
an injected message survives a kill before its claim, and a kill between any two events of an approval loses
nothing and doubles nothing. Each loop runs in its own process (``tests/loop/pause_child.py``); decisions are
made with the ``foldline`` command, another process again.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from foldline.adapters.sqlite_log import SqliteEventLog
from foldline.core.events import (
    ApprovalDecision,
    ApprovalRequest,
    Envelope,
    InboxClaim,
    ToolCall,
    ToolResult,
    TurnEnd,
    UserMessage,
)
from foldline.core.pauses import open_turn
from foldline.core.repair import INTERRUPTED_RESULT
from foldline.core.validation import check_log
from foldline.loop.approvals import decide, pending
from foldline.replay.verify import verify_events
from tests.adversarial.helpers import cli_env

ROOT = Path(__file__).resolve().parents[2]


def child(mode: str, data: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tests.loop.pause_child", mode, str(data), *args],
        check=False,
        cwd=ROOT,
        env=cli_env(**env),
        capture_output=True,
        text=True,
        timeout=120,
    )


def foldline(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "foldline.cli", *args],
        check=False,
        cwd=ROOT,
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )


def approvals(data: Path) -> list[dict[str, Any]]:
    out = foldline("approvals", "--json", "--data-dir", str(data))
    assert out.returncode == 0, out.stderr
    found: list[dict[str, Any]] = json.loads(out.stdout)
    return found


def events_of(data: Path) -> list[Envelope]:
    log = SqliteEventLog(data, read_only=True)
    try:
        return log.read("s")
    finally:
        log.close()


def ran(data: Path) -> list[str]:
    path = data / "ran.txt"
    return path.read_text().split() if path.exists() else []


def test_a_pending_approval_survives_sigkill_is_decided_elsewhere_and_the_turn_completes_in_a_third(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    waiting = subprocess.Popen(  # a loop that waits for the decision...
        [sys.executable, "-m", "tests.loop.pause_child", "run", str(data)],
        cwd=ROOT,
        env=cli_env(APPROVAL_WAIT="600"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 60
        while not (data / "log.sqlite3").exists() or not approvals(data):
            assert waiting.poll() is None, waiting.communicate()
            assert time.monotonic() < deadline, "the approval was never requested"
            time.sleep(0.1)
    finally:
        waiting.send_signal(signal.SIGKILL)  # ...is killed while it waits
        waiting.communicate()
    assert waiting.returncode == -signal.SIGKILL
    [call] = approvals(data)
    assert call["decision"] is None
    assert ran(data) == []
    decided = foldline("approve", "s", call["callId"], "--allow", "--data-dir", str(data), "--json")
    assert decided.returncode == 0, decided.stderr
    assert approvals(data)[0]["decision"]["verdict"] == "allow"
    third = child("continue", data)
    assert third.returncode == 0, third.stderr
    assert json.loads(third.stdout.splitlines()[-1])["reason"] == "completed"
    assert ran(data) == [call["callId"]]
    events = events_of(data)
    assert [e.data.reason for e in events if isinstance(e.data, TurnEnd)] == ["completed"]
    assert approvals(data) == []
    assert foldline("verify", "--data-dir", str(data)).returncode == 0


def test_a_message_injected_before_a_kill_arrives_exactly_once(tmp_path: Path) -> None:
    data = tmp_path / "data"
    assert child("turn", data, "first").returncode == 0
    killed = child("inject", data, "the message")
    assert killed.returncode == -signal.SIGKILL  # killed between inject() and any claim
    entry = json.loads(killed.stdout.splitlines()[-1])["entry"]
    done = child("turn", data, "second")
    assert done.returncode == 0, done.stderr
    events = events_of(data)
    texts = [b.text for e in events if isinstance(e.data, UserMessage) for b in e.data.content]  # type: ignore[union-attr]
    assert texts.count("the message") == 1
    assert texts.index("the message") == texts.index("second") - 1  # it joined the next step, before the prompt
    assert [e.data.entries for e in events if isinstance(e.data, InboxClaim)] == [(entry,)]
    assert verify_events("s", events).ok


def test_a_kill_after_the_claim_before_the_inbox_drops_the_entry_enters_it_once(tmp_path: Path) -> None:
    data = tmp_path / "data"
    assert child("turn", data, "first").returncode == 0
    foldline("inject", "s", "the message", "--data-dir", str(data))
    killed = child("turn", data, "second", KILL_BEFORE_REMOVE="1")
    assert killed.returncode == -signal.SIGKILL
    log = SqliteEventLog(data)
    try:
        assert len(log.inbox().entries("s")) == 1  # the claim is logged, the entry still in the store
    finally:
        log.close()
    assert child("turn", data, "third").returncode == 0
    events = events_of(data)
    texts = [b.text for e in events if isinstance(e.data, UserMessage) for b in e.data.content]  # type: ignore[union-attr]
    assert texts.count("the message") == 1
    log = SqliteEventLog(data)
    try:
        assert log.inbox().entries("s") == []
    finally:
        log.close()


# ------------------------------------------------------------------ every gap of an approval

#: Where a kill lands: (the process, its environment). The first process starts the turn; decisions come from
#: this test's process; later processes continue the turn. ``KILL_AFTER=N`` is the gap after the process's N-th
#: append: starting, the turn's start, the step's opening, the answer with its approval request; continuing, the
#: decision, the tool's result with step/end, the next opening, the answer, the turn's end. Then a kill while the
#: tool runs, and one after the claim of the decision before the inbox drops it.
GAPS: list[tuple[str, dict[str, str]]] = [
    *[("run", {"KILL_AFTER": str(n)}) for n in (1, 2, 3)],
    *[("continue", {"KILL_AFTER": str(n)}) for n in (1, 2, 3, 4, 5)],
    ("continue", {"KILL_IN_TOOL": "1"}),
    ("continue", {"KILL_BEFORE_REMOVE": "1"}),
]
#: The gaps where the two crash policies part (a call may have run): walked under ``end`` too.
END_GAPS = [g for g in GAPS if g[0] == "continue" and g[1] in ({"KILL_AFTER": "1"}, {"KILL_IN_TOOL": "1"})]
CASES = [(*g, "continue") for g in GAPS] + [(*g, "end") for g in END_GAPS]


def _id(case: tuple[str, dict[str, str], str]) -> str:
    where, kill, policy = case
    return f"{where}-{'-'.join(f'{k}={v}' for k, v in kill.items())}-{policy}"


@pytest.mark.parametrize(("where", "kill", "policy"), CASES, ids=[_id(c) for c in CASES])
def test_a_kill_between_any_two_events_of_an_approval_loses_and_doubles_nothing(
    tmp_path: Path, where: str, kill: dict[str, str], policy: str
) -> None:
    data = tmp_path / "data"
    first = child("run", data, **(kill if where == "run" else {}), ON_CRASH=policy)
    killed = first.returncode == -signal.SIGKILL
    assert killed or first.returncode == 0, first.stderr
    pending_kill = where == "continue"
    for _ in range(8):  # decide what is pending (from this process), continue the turn; until it is over
        if open_turn(events_of(data)) is None:
            break
        log = SqliteEventLog(data)
        try:
            for call, decision in pending(log):
                if decision is None:
                    decide(log, "s", call.call_id, allow=True)
        finally:
            log.close()
        step = child("continue", data, **(kill if pending_kill else {}), ON_CRASH=policy)
        if pending_kill and step.returncode == -signal.SIGKILL:
            killed = True
        else:
            assert step.returncode == 0, step.stderr
        pending_kill = False
    else:
        pytest.fail("the turn never ended")
    assert killed, "the kill point was never reached"
    events = events_of(data)
    check_log(events)  # the log stays valid
    assert verify_events("s", events).ok
    calls = [e.data.call_id for e in events if isinstance(e.data, ToolCall)]
    requested = [e.data.call_id for e in events if isinstance(e.data, ApprovalRequest)]
    decided = [e.data.call_id for e in events if isinstance(e.data, ApprovalDecision)]
    answered = [e.data for e in events if isinstance(e.data, ToolResult)]
    assert sorted(requested) == sorted(set(requested)) == sorted(calls)  # every call asked once
    assert sorted(decided) == sorted(set(requested))  # every request decided once: nothing lost or doubled
    assert sorted(r.call_id for r in answered) == sorted(calls)  # every call answered once
    runs = ran(data)
    assert len(runs) == len(set(runs)), "a call ran twice"
    for result in answered:  # a result that is not "interrupted" is of a run that happened
        interrupted = result.content[0].text == INTERRUPTED_RESULT  # type: ignore[union-attr]
        assert interrupted or result.call_id in runs
    [end] = [e.data.reason for e in events if isinstance(e.data, TurnEnd)]
    before_any_step = (where, kill) == ("run", {"KILL_AFTER": "1"})  # the prompt never reached the log
    assert end == "completed" or (end == "error" and (policy == "end" or before_any_step))
    log = SqliteEventLog(data)
    try:  # nothing left in the inbox that would enter the log (the next claim drops what the log names)
        named = {e.data.entry for e in events if isinstance(e.data, ApprovalDecision)}
        assert {e.id for e in log.inbox().entries("s")} <= named
    finally:
        log.close()
