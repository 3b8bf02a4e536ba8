"""Test a change to an agent against recorded sessions before it ships.

Run it with ``python examples/replay_change.py [DATA_DIR]``. It

1. records three sessions of a small agent with two tools on the embedded default (the local emulator answers);
2. replays them through the agent unchanged: every request is byte-identical to the recorded one (a CI job's
   exit status 0), with the recorded answers and tool results standing in for the model and the tools;
3. replays them with a reworded system prompt: each session diverges at its first request, in ``system``,
   with the byte where the bodies part and the prompt-cache cost of the change — the agent's prefix the later
   sessions read from the provider's cache is written again (a CI job's exit status 1);
4. prints the same check as a command: ``foldline replay --all --system-file FILE --data-dir DATA_DIR``.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from foldline import CallConfig, Change, Config, open_stores, replay_sessions
from foldline.loop import Agent, AgentOptions, Toolset
from foldline.providers.emulated import emulated_provider
from foldline.providers.emulator import Emulator

POLICY = "\n".join(
    f"Policy {i}: orders in region {i} ship within {i + 1} days; a late order gets a {5 * i}% voucher." for i in range(60)
)
PROMPT = "You answer questions about orders. Look the order up before you answer; never guess a status.\n" + POLICY
NEW_PROMPT = "You answer questions about orders. Always look the order up first; quote its status exactly.\n" + POLICY
QUESTIONS = {
    "orders-1": ["Where is order 1042?", "And order 7?"],
    "orders-2": ["Has order 3 shipped?"],
    "orders-3": ["Cancel order 12, please.", "Is it cancelled now?"],
}

tools = Toolset()


@tools.tool
def order_status(order: int) -> str:
    """Look an order up and return its status."""
    return f"order {order}: shipped" if order % 2 == 0 else f"order {order}: packing"


@tools.tool
def cancel(order: int) -> str:
    """Cancel an order that has not shipped yet."""
    return f"order {order}: cancelled"


async def record(data_dir: Path) -> None:
    """The recorded sessions: what the agent did in production."""
    stores = open_stores(Config(data_dir=data_dir))
    options = AgentOptions(config=CallConfig("anthropic", "claude-emulated", max_tokens=256), system=PROMPT, tools=tools)
    emulator = Emulator()  # one provider account: the sessions share the agent's cached prefix
    try:
        for session, questions in QUESTIONS.items():
            provider = emulated_provider(emulator=emulator)
            agent = Agent(session, stores.log, provider, options, attachments=stores.attachments)
            for question in questions:
                await agent.run_turn(question)
            await provider.aclose()
    finally:
        stores.close()


def main(data_dir: Path) -> int:
    asyncio.run(record(data_dir))
    stores = open_stores(Config(data_dir=data_dir), read_only=True)
    try:
        sessions = stores.log.sessions()
        unchanged = replay_sessions(sessions, stores=stores)
        for s in unchanged.sessions:
            print(f"unchanged: {s.summary()}")
        changed = replay_sessions(sessions, Change(system=NEW_PROMPT), stores=stores)
        for s in changed.sessions:
            print(f"new prompt: {s.summary()}")
        cost = changed.cost
        print(
            f"the new prompt costs {cost.cache_write_tokens} cache-write tokens over {cost.sessions} sessions "
            f"({cost.per_1000_sessions:,.0f} per 1,000 sessions)"
        )
    finally:
        stores.close()
    prompt_file = data_dir / "new-prompt.txt"
    prompt_file.write_text(NEW_PROMPT)
    print(f"the same from the command line: foldline replay --all --system-file {prompt_file} --data-dir {data_dir}")
    every_first_in_system = all(
        s.divergence is not None and s.divergence.request == 0 and [f.path for f in s.divergence.fields] == ["system"]
        for s in changed.sessions
    )
    return 0 if unchanged.identical and every_first_in_system else 1


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1] if len(sys.argv) > 1 else "foldline-data")))
