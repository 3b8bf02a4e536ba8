"""A loop process for the kill tests: ``python -m tests.loop.pause_child MODE DATA_DIR [TEXT]``.

Modes: ``run`` (a new turn: the model calls ``transfer``, which needs approval), ``continue`` (the open turn),
``inject`` (put TEXT into the session's inbox, then die by SIGKILL before any claim), ``turn`` (a new turn with
TEXT as its prompt, tools without approval).

The environment steers it: ``KILL_AFTER=N`` — SIGKILL this process right after its N-th append is durable;
``KILL_BEFORE_REMOVE=1`` — SIGKILL when the inbox would drop taken entries (after the claim's append);
``KILL_IN_TOOL=1`` — SIGKILL inside the tool once it did its work; ``APPROVAL_WAIT`` — seconds the loop waits for
a decision before pausing; ``ON_CRASH`` — ``end`` or ``continue``. The tool appends its call id to ``ran.txt`` in
the data directory, so the tests can tell a call that ran twice from one that never ran. The outcome is printed
as one JSON line.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from foldline.adapters.sqlite_log import SqliteEventLog
from foldline.core import CallConfig
from foldline.core.events import Envelope
from foldline.loop import Agent, AgentOptions, Toolset
from foldline.loop.calls import current_call
from foldline.ports.event_log import WriterLease
from foldline.providers.emulated import emulated_provider
from foldline.providers.emulator import Emulator, ToolLoopScript

SESSION = "s"
CONFIG = CallConfig("anthropic", "claude-emulated", max_tokens=256)


def die() -> None:
    sys.stdout.flush()
    os.kill(os.getpid(), signal.SIGKILL)


class KillingLog(SqliteEventLog):
    """The embedded log, killed by SIGKILL right after its ``KILL_AFTER``-th append is durable."""

    appends = 0

    def append(
        self, session_id: str, expected_seq: int, events: Sequence[Envelope], *, lease: WriterLease | None = None
    ) -> int:
        head = super().append(session_id, expected_seq, events, lease=lease)
        KillingLog.appends += 1
        if str(KillingLog.appends) == os.environ.get("KILL_AFTER"):
            die()
        return head


def tools(data: Path, *, approval: bool) -> Toolset:
    toolset = Toolset()

    @toolset.tool(approval=approval)
    def transfer(amount: int, to: str) -> str:
        """Move money to an account."""
        with (data / "ran.txt").open("a") as fp:
            fp.write(current_call().call_id + "\n")
            fp.flush()
            os.fsync(fp.fileno())
        if os.environ.get("KILL_IN_TOOL"):
            die()
        return f"moved {amount} to {to}"

    return toolset


def main(mode: str, data: Path, text: str = "") -> dict[str, Any]:
    log = KillingLog(data)
    if os.environ.get("KILL_BEFORE_REMOVE"):
        log.inbox().remove = lambda *a, **k: die()  # type: ignore[method-assign]
    provider = emulated_provider(emulator=Emulator(ToolLoopScript(tool_steps=1)))
    options = AgentOptions(
        config=CONFIG,
        system="You move money carefully.",
        tools=tools(data, approval=mode != "turn"),
        approval_wait_s=float(os.environ.get("APPROVAL_WAIT", "0")),
        on_crash="continue" if os.environ.get("ON_CRASH") == "continue" else "end",
    )
    agent = Agent(SESSION, log, provider, options)

    async def run() -> dict[str, Any]:
        try:
            if mode == "inject":
                entry = agent.inject(text)
                print(json.dumps({"entry": entry}), flush=True)
                die()
            if mode == "continue":
                if not agent.turn_open:
                    return {"reason": None}
                result = await agent.continue_turn()
            else:
                result = await agent.run_turn(text or "pay 50 to acct-7")
            return {"reason": result.reason, "pending": [p.call_id for p in result.pending]}
        finally:
            await provider.aclose()

    try:
        return asyncio.run(run())
    finally:
        log.close()


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], Path(sys.argv[2]), *sys.argv[3:])), flush=True)
