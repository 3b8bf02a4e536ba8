"""The console tests' sessions: one full of hostile text, imported with ``foldline import``; a tampered copy of a
demo session (one logged word changed after the fact, so its requests no longer match their recorded digests)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import msgspec
from typer.testing import CliRunner

from foldline.adapters.sqlite_log import SqliteEventLog
from foldline.cli.main import app
from foldline.config import Config, open_stores
from foldline.core.content import TextBlock
from foldline.core.events import Envelope, UserMessage

runner = CliRunner()

#: A session id a browser would act on if it were markup (ids are printable text: this one is valid).
HOSTILE_ID = "<img src=x onerror=\"window.__pwned='id'\">&amp;'\""
#: Log text that would run, navigate or reorder itself if a page took it for HTML or a terminal for controls.
HOSTILE_TEXT = (
    "<script>window.__pwned='message'</script> "
    "<a href=\"javascript:window.__pwned='link'\">click</a> javascript:alert(1) "
    "\u202eevil-rtl\u202c \x1b[31mred\x1b[0m \u2028next <style>body{display:none}</style> {{ 7*7 }}"
)
HOSTILE_SYSTEM = "</script><script>window.__pwned='system'</script><!-- {% raw %} -->"
HOSTILE_TOOL_OUTPUT = "<img src=x onerror=\"window.__pwned='tool'\"> javascript:void(0) \u202etluser"
TAMPERED_ID = "tampered-001"


def hostile_session(scratch: Path) -> Path:
    """A session written by a real loop with hostile text in its system prompt, message and tool result; exported."""
    from foldline import Agent, AgentOptions, CallConfig, Toolset
    from foldline.providers import emulated_provider

    tools = Toolset()

    @tools.tool
    def lookup(topic: str) -> str:
        """Look a topic up."""
        return HOSTILE_TOOL_OUTPUT + f" ({topic})"

    stores = open_stores(Config(data_dir=scratch))
    try:
        agent = Agent(
            HOSTILE_ID,
            stores.log,
            emulated_provider(),
            AgentOptions(
                config=CallConfig("anthropic", "claude-emulated", max_tokens=256), system=HOSTILE_SYSTEM, tools=tools
            ),
            attachments=stores.attachments,
        )
        asyncio.run(agent.run_turn(HOSTILE_TEXT))
        asyncio.run(agent.run_turn(HOSTILE_TEXT + " again"))
    finally:
        stores.close()
    out = scratch / "hostile.jsonl"
    res = runner.invoke(app, ["export", HOSTILE_ID, "--out", str(out), "--data-dir", str(scratch)])
    assert res.exit_code == 0, res.output
    return out


def tamper(data: Path, source: str, target: str) -> int:
    """Copy ``source`` as ``target`` with the text of its first user message changed; returns that event's seq."""
    with SqliteEventLog(data) as log:
        events = log.read(source)
        changed: list[Envelope] = []
        at = -1
        for e in events:
            if at < 0 and isinstance(e.data, UserMessage):
                blocks = tuple(
                    msgspec.structs.replace(b, text=b.text.replace("What", "Which")) if isinstance(b, TextBlock) else b
                    for b in e.data.content
                )
                changed.append(msgspec.structs.replace(e, data=msgspec.structs.replace(e.data, content=blocks)))
                at = e.seq
                continue
            changed.append(e)
        log.create(target, changed)
    return at
