"""Answers as typed objects: a turn asks for an output type, and its final answer comes back validated.

Run it with ``python examples/structured_output.py [DATA_DIR]``. The output type's JSON Schema is part of the logged
call config (a ``request/header`` snapshot carries it), the adapter sends it with the provider's own structured-output
field (Anthropic ``output_config.format`` here), and ``foldline verify --data-dir DATA_DIR`` proves every request.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Literal

import pydantic

from foldline import Agent, AgentOptions, CallConfig, Config, OutputType, Toolset, open_stores, verify_events
from foldline.providers import emulated_provider

tools = Toolset()


@tools.tool
def lookup(city: str) -> str:
    """Tomorrow's weather in a city."""
    return f"{city}: clear, 14 °C, wind 3 m/s from the west"


class Wind(pydantic.BaseModel):
    speed: float
    bearing: int


class Forecast(pydantic.BaseModel):
    city: str
    conditions: Literal["clear", "cloudy", "rain", "snow"]
    temperature: int
    wind: Wind


async def main(data_dir: Path) -> int:
    stores = open_stores(Config(data_dir=data_dir))
    provider = emulated_provider()
    options = AgentOptions(
        config=CallConfig("anthropic", "claude-emulated", max_tokens=512),
        system="You report forecasts.",
        tools=tools,  # AgentOptions(output=OutputType(...)) would ask it of every turn
    )
    agent = Agent("structured", stores.log, provider, options, attachments=stores.attachments)
    try:
        # this turn's answer must be a Forecast: a wrong one is sent back with what was wrong, twice at most, then
        # OutputInvalid is raised (retries=0: at once)
        result = await agent.run_turn("Tomorrow in Bergen?", output=OutputType(Forecast, retries=2))
        forecast: Forecast = result.output
        print(f"{forecast.city}: {forecast.conditions}, {forecast.temperature} °C, wind {forecast.wind.speed} m/s")
        chat = await agent.run_turn("Thanks!")  # free text again: the schema leaves the config (a logged change)
        print(f"then free text: {chat.text[:60]!r}")
        report = verify_events("structured", stores.log.read("structured"), stores.attachments)
        print(f"verified {report.matched}/{report.checked} requests from the log")
        return 0 if report.ok else 1
    finally:
        await provider.aclose()
        stores.close()


if __name__ == "__main__":
    sys.exit(asyncio.run(main(Path(sys.argv[1] if len(sys.argv) > 1 else "foldline-data"))))
