"""A tool whose parameters are a pydantic model reaches the wire with its properties in declaration order, through
every adapter's default serializer, and ``foldline verify`` rebuilds every body byte for byte (docs/FORMAT.md §1.9,
§9.8, §9.9)."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path
from typing import Any

import orjson
import pydantic
import pytest
from typer.testing import CliRunner

from foldline.adapters.fs_attachments import FilesystemAttachmentStore
from foldline.adapters.sqlite_log import SqliteEventLog
from foldline.cli.main import app
from foldline.core.content import TextBlock
from foldline.core.events import RequestDispatch
from foldline.core.header import CallConfig, ToolSpec
from foldline.loop import Agent, AgentOptions, Toolset
from foldline.providers.emulated import WireFormat, emulated_provider
from foldline.providers.emulator import Emulator, ToolLoopScript

from ..factories import CapturingProvider


class Reading(pydantic.BaseModel):
    """A probe reading; its fields are declared out of alphabetical order."""

    zeta: str
    alpha: int
    mid: list[float] | None = None


DECLARED = ["zeta", "alpha", "mid"]

#: wire format → (the provider its config names, the serializer version its adapter sends with)
WIRES: dict[WireFormat, tuple[str, tuple[str, int]]] = {
    "anthropic": ("anthropic", ("anthropic-messages", 4)),
    "openai": ("openai", ("openai-chat", 3)),
    "openai-responses": ("openai", ("openai-responses", 3)),
    "deepseek": ("deepseek", ("reasoning-chat", 3)),
}


def toolset() -> Toolset:
    tools = Toolset()

    def record(zeta: str, alpha: int, mid: list[float] | None = None) -> str:
        """Record a probe reading."""
        return f"recorded {zeta} {alpha} {mid}"

    schema = pydantic.TypeAdapter(Reading).json_schema()
    assert list(schema["properties"]) == DECLARED
    tools.add(record, ToolSpec("record", "Record a probe reading.", schema))
    return tools


def wire_schema(body: dict[str, Any]) -> dict[str, Any]:
    tool = body["tools"][0]
    found: dict[str, Any] = tool.get("input_schema") or tool.get("parameters") or tool["function"]["parameters"]
    return found


@pytest.mark.parametrize("wire", list(WIRES))
def test_a_pydantic_tool_reaches_every_wire_in_declaration_order_and_verifies(wire: WireFormat, tmp_path: Path) -> None:
    provider_name, serializer = WIRES[wire]
    provider = CapturingProvider(emulated_provider(wire, emulator=Emulator(ToolLoopScript(tool_steps=2))))
    config = CallConfig(provider_name, f"{wire}-emulated", max_tokens=512, reasoning_effort="high")
    with SqliteEventLog(tmp_path) as log:
        agent = Agent(
            "ordered",
            log,
            provider,
            AgentOptions(config=config, system="You record readings.", tools=toolset()),
            attachments=FilesystemAttachmentStore(tmp_path / "attachments"),
        )
        result = asyncio.run(agent.run_turn([TextBlock("Context: the probe is new."), TextBlock("Take a reading.")]))
        assert result.reason == "completed"
        dispatches = [e.data for e in log.read("ordered") if isinstance(e.data, RequestDispatch)]
    assert len(provider.bodies) == len(dispatches) == 3  # two tool rounds, then the answer
    assert {(d.serializer, d.serializer_version) for d in dispatches} == {serializer}
    for body in provider.bodies:
        assert list(wire_schema(orjson.loads(body))["properties"]) == DECLARED, wire
    # the log holds the schema in that order too, byte for byte what the header event says
    db = sqlite3.connect(tmp_path / "log.sqlite3")
    try:
        rows = [bytes(r[0]) for r in db.execute("SELECT body FROM events ORDER BY seq")]
        headers = [r for r in rows if b'"type":"request/header"' in r]
    finally:
        db.close()
    assert headers
    assert all(b'"properties":{"zeta":' in h for h in headers)
    out = CliRunner().invoke(app, ["verify", "ordered", "--data-dir", str(tmp_path), "--json"])
    assert out.exit_code == 0, out.output
    report = orjson.loads(out.stdout_bytes)
    assert (report["checked"], report["matched"], report["mismatched"]) == (3, 3, [])
