"""An agent with two tools on the embedded default, answered by the local emulator.

Run it with ``python examples/quickstart.py [DATA_DIR]``; then ``foldline verify --data-dir DATA_DIR``
proves every request it sent from the log alone.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from foldline import Agent, AgentOptions, CallConfig, Config, Toolset, open_stores, verify_events
from foldline.providers import emulated_provider

tools = Toolset()


@tools.tool
def add(a: int, b: int) -> str:
    """Add two integers and return the sum."""
    return str(a + b)


@tools.tool
def shout(text: str) -> str:
    """Return the text in capital letters."""
    return text.upper()


async def main(data_dir: Path) -> int:
    stores = open_stores(Config(data_dir=data_dir))
    provider = emulated_provider()
    options = AgentOptions(
        config=CallConfig("anthropic", "claude-emulated", max_tokens=256), system="Be brief.", tools=tools
    )
    agent = Agent("quickstart", stores.log, provider, options, attachments=stores.attachments)
    try:
        for prompt in ("Add 2 and 3, then shout the answer.", "Now shout 'done'."):
            result = await agent.run_turn(prompt)
            for step in result.steps:
                u = step.usage
                print(f"turn {step.turn} step {step.step}: prompt {u.prompt_tokens} tokens, cache read {u.cache_read}")
            print(f"turn {result.turn} ended ({result.reason}): {result.text}")
        report = verify_events("quickstart", stores.log.read("quickstart"), stores.attachments)
        print(f"verified {report.matched}/{report.checked} requests from the log")
        return 0 if report.ok else 1
    finally:
        await provider.aclose()
        stores.close()


if __name__ == "__main__":
    sys.exit(asyncio.run(main(Path(sys.argv[1] if len(sys.argv) > 1 else "foldline-data"))))
