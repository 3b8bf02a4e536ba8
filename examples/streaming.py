"""An answer shown while the model writes it: a turn read as typed events, on the embedded default.

Run it with ``python examples/streaming.py [DATA_DIR]``. The text arrives piece by piece, tool calls as they are
made and run; a cut answer that is asked for again says so (its pieces are void). The log is what
``agent.run_turn`` would have written, and ``foldline verify --data-dir DATA_DIR`` proves every request.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from foldline import Agent, AgentOptions, CallConfig, Config, Toolset, open_stores, verify_events
from foldline.loop import (
    AttemptDiscarded,
    ReasoningDelta,
    StepFinished,
    TextDelta,
    ToolCallFinished,
    ToolCallResult,
    TurnFinished,
)
from foldline.providers import emulated_provider

tools = Toolset()


@tools.tool
def forecast(city: str) -> str:
    """Tomorrow's weather in a city."""
    return f"{city}: clear, 14 °C"


async def main(data_dir: Path) -> int:
    stores = open_stores(Config(data_dir=data_dir))
    provider = emulated_provider()
    options = AgentOptions(
        config=CallConfig("anthropic", "claude-emulated", max_tokens=512, stream=True),  # stream=True: pieces
        system="Be brief.",
        tools=tools,
    )
    agent = Agent("streaming", stores.log, provider, options, attachments=stores.attachments)
    try:
        async for event in agent.stream("Will it rain in Bergen tomorrow?"):
            match event:
                case TextDelta(text=text):
                    print(text, end="", flush=True)
                case ReasoningDelta():
                    pass  # a reasoning model's thoughts, as they come
                case AttemptDiscarded(attempt=attempt):
                    print(f"\n[attempt {attempt} was cut; it is sent again — discard what was shown]")
                case ToolCallFinished(name=name, arguments=arguments):
                    print(f"\n-> {name}({arguments})")
                case ToolCallResult(content=content):
                    print(f"<- {''.join(getattr(part, 'text', '') for part in content)}")
                case StepFinished(step=step, usage=usage):
                    print(f"\n[step {step}: {usage.output} output tokens]")
                case TurnFinished(result=result):
                    print(f"turn ended: {result.reason}")
        report = verify_events("streaming", stores.log.read("streaming"), stores.attachments)
        print(f"verified {report.matched}/{report.checked} requests from the log")
        return 0 if report.ok else 1
    finally:
        await provider.aclose()
        stores.close()


if __name__ == "__main__":
    sys.exit(asyncio.run(main(Path(sys.argv[1] if len(sys.argv) > 1 else "foldline-data"))))
