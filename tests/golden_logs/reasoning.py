"""Write the golden reasoning logs of ``tests/fixtures/golden-logs/reasoning/`` — once, then commit them.

    .venv/bin/python -m tests.golden_logs.reasoning            # refuses when the fixtures exist
    .venv/bin/python -m tests.golden_logs.reasoning --force    # rewrite them (a reviewed change only)

Three real sessions, one per reasoning wire format, run by :class:`~foldline.loop.Agent` against the in-process
emulator on a clock that advances 250 ms per reading:

* ``reasoning-anthropic`` — a thinking model through ``anthropic-messages`` v2: signed thinking passed back on
  every tool-use continuation, a 1-hour cache TTL, then a header change (effort ``high`` → ``max``) and, after
  an idle hour, a cache-TTL drop; a tool-result trim; a compaction whose region holds thinking blocks;
* ``reasoning-responses`` — ``openai-responses`` v1: encrypted reasoning items, ``prompt_cache_key``;
* ``reasoning-chat`` — ``reasoning-chat`` v1: ``reasoning_content`` passed back (DeepSeek's rule).

Each session is written as its export file (docs/FORMAT.md §8) and its ``foldline verify --json`` report. They
hold no images, so there is no attachment directory.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from foldline.adapters.memory_attachments import MemoryAttachmentStore
from foldline.adapters.memory_log import MemoryEventLog
from foldline.adapters.sqlite_log import SqliteEventLog
from foldline.core.header import CallConfig
from foldline.export import export_session
from foldline.loop import Agent, AgentOptions, Toolset
from foldline.loop.pressure import PressurePolicy
from foldline.providers.emulated import WireFormat, emulated_provider
from foldline.providers.emulator import Emulator

from .generate import SYSTEM, SteppingClock, _verify_json

REASONING_DIR = Path(__file__).resolve().parent.parent / "fixtures" / "golden-logs" / "reasoning"
REASONING_SESSIONS = ("reasoning-anthropic", "reasoning-chat", "reasoning-responses")

NOTES = {
    "kafka": "Events of one session share a partition key, so Kafka keeps them in order.",
    "redis": "Projectors fold events into Redis with one Lua script per batch, fenced by seq.",
}


def tools() -> Toolset:
    toolset = Toolset()

    @toolset.tool
    def lookup(topic: str) -> str:
        """Look a topic up in the team's notes."""
        return NOTES.get(
            topic.strip().lower(), "No notes on that topic. Known topics: " + ", ".join(sorted(NOTES)) * 20
        )

    @toolset.tool
    def word_count(text: str) -> str:
        """Count the words of a text."""
        return f"{len(text.split())} words"

    return toolset


async def _session(
    log: MemoryEventLog,
    emulator: Emulator,
    clock: SteppingClock,
    session_id: str,
    wire: WireFormat,
    config: CallConfig,
    *,
    pressure: PressurePolicy | None = None,
    change: CallConfig | None = None,
) -> None:
    provider = emulated_provider(wire, emulator=emulator)
    options = AgentOptions(config=config, system=SYSTEM, tools=tools(), pressure=pressure)
    agent = Agent(session_id, log, provider, options, attachments=MemoryAttachmentStore(), clock=clock)
    try:
        await agent.run_turn("How do the events of one session stay in order?")
        await agent.run_turn("And how are they folded into Redis?")
        if change is not None:
            agent.on_request(lambda _seed: change)  # a header change: the next step writes a `change` snapshot
            clock.pause(3600)  # idle past the 1-hour cache TTL
        await agent.run_turn("Summarize both answers in one sentence.")
    finally:
        await provider.aclose()


async def run_sessions(log: MemoryEventLog, emulator: Emulator, clock: SteppingClock) -> None:
    thinking = CallConfig(
        "anthropic", "claude-thinking-emulated", max_tokens=4096, reasoning_effort="high", cache_ttl="1h"
    )
    await _session(
        log,
        emulator,
        clock,
        "reasoning-anthropic",
        "anthropic",
        thinking,
        pressure=PressurePolicy(budget_tokens=700, keep_recent_tokens=250, trim_over_tokens=80, summary_max_tokens=120),
        change=thinking.with_overrides(reasoning_effort="max"),
    )
    await _session(
        log,
        emulator,
        clock,
        "reasoning-responses",
        "openai-responses",
        CallConfig("openai", "gpt-reasoning-emulated", max_tokens=4096, reasoning_effort="medium"),
    )
    await _session(
        log,
        emulator,
        clock,
        "reasoning-chat",
        "deepseek",
        CallConfig("deepseek", "deepseek-emulated", max_tokens=4096, reasoning_effort="high"),
    )


def write_fixtures() -> None:
    clock = SteppingClock()
    log = MemoryEventLog()
    emulator = Emulator(clock=clock.seconds)
    asyncio.run(run_sessions(log, emulator, clock))
    assert tuple(log.sessions()) == REASONING_SESSIONS
    REASONING_DIR.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="golden-reasoning-") as tmp:
        data_dir = Path(tmp)
        with SqliteEventLog(data_dir) as imported:
            for sid in REASONING_SESSIONS:
                out = io.BytesIO()
                export_session(log, sid, out)
                (REASONING_DIR / f"{sid}.jsonl").write_bytes(out.getvalue())
                imported.append(sid, 0, log.read(sid))
        for sid in REASONING_SESSIONS:
            (REASONING_DIR / f"{sid}.verify.json").write_bytes(_verify_json(data_dir, sid))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--force", action="store_true", help="overwrite the existing reasoning logs")
    args = parser.parse_args(argv)
    if REASONING_DIR.exists() and any(REASONING_DIR.iterdir()) and not args.force:
        print(f"{REASONING_DIR} exists; the golden logs are written once (use --force after a review)", file=sys.stderr)
        return 1
    write_fixtures()
    print(f"wrote {REASONING_DIR}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
