"""A tool whose parameters pydantic describes — a typed function, a function taking a pydantic model, an explicit spec
generated from a model — reaches the wire with its properties in declaration order, through every adapter's default
serializer, and ``foldline verify`` rebuilds every body byte for byte (docs/FORMAT.md §1.9,
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
from foldline.core.events import RequestDispatch, ToolCall
from foldline.core.header import CallConfig, ToolSpec
from foldline.loop import Agent, AgentOptions, Toolset
from foldline.providers.emulated import WireFormat, emulated_provider
from foldline.providers.emulator import Emulator

from ..factories import CapturingProvider, ThinkingPlan


class Reading(pydantic.BaseModel):
    """A probe reading; its fields are declared out of alphabetical order."""

    zeta: str
    alpha: int
    mid: list[float] | None = None


DECLARED = ["zeta", "alpha", "mid"]

#: wire format → (the provider its config names, the serializer version its adapter sends with)
WIRES: dict[WireFormat, tuple[str, tuple[str, int]]] = {
    "anthropic": ("anthropic", ("anthropic-messages", 5)),
    "openai": ("openai", ("openai-chat", 4)),
    "openai-responses": ("openai", ("openai-responses", 4)),
    "deepseek": ("deepseek", ("reasoning-chat", 4)),
}


def toolset() -> Toolset:
    """Three tools whose schemas pydantic writes in declaration order: a typed function (the Toolset generates its
    schema from the signature), one taking a pydantic model (its fields in ``$defs``), and an explicit spec."""
    tools = Toolset()

    @tools.tool
    def note(zeta: str, alpha: int, mid: list[float] | None = None) -> str:
        """Note a probe reading."""
        return f"noted {zeta} {alpha} {mid}"

    @tools.tool
    def file(reading: Reading) -> str:
        """File a probe reading."""
        return f"filed {reading.zeta}"

    def record(zeta: str, alpha: int, mid: list[float] | None = None) -> str:
        return f"recorded {zeta} {alpha} {mid}"

    schema = pydantic.TypeAdapter(Reading).json_schema()
    assert list(schema["properties"]) == DECLARED
    tools.add(record, ToolSpec("record", "Record a probe reading.", schema))
    return tools


#: One round calling every tool.
PLAN: list[list[tuple[str, dict[str, Any]]]] = [
    [
        ("note", {"zeta": "z", "alpha": 1, "mid": [0.5]}),
        ("file", {"reading": {"zeta": "z", "alpha": 2, "mid": None}}),
        ("record", {"zeta": "z", "alpha": 3}),
    ]
]


def wire_schemas(body: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Each tool's schema as the body carries it, by tool name."""
    out: dict[str, dict[str, Any]] = {}
    for tool in body["tools"]:
        function = tool.get("function", tool)
        out[function["name"]] = tool.get("input_schema") or function["parameters"]
    return out


def declared_objects(schemas: dict[str, dict[str, Any]]) -> list[list[str]]:
    """The property lists that must come in declaration order: each tool's own, and the model's in ``$defs``."""
    return [
        list(schemas["note"]["properties"]),
        list(schemas["file"]["$defs"]["Reading"]["properties"]),
        list(schemas["record"]["properties"]),
    ]


def call_inputs(body: dict[str, Any]) -> list[list[str]]:
    """The argument keys of every tool call the body carries, in the body's order (Messages ``tool_use.input``)."""
    keys: list[list[str]] = []
    for message in body.get("messages", ()):
        content = message.get("content")
        if isinstance(content, list):
            keys += [list(b["input"]) for b in content if isinstance(b, dict) and b.get("type") == "tool_use"]
    return keys


@pytest.mark.parametrize("wire", list(WIRES))
def test_a_pydantic_tool_reaches_every_wire_in_declaration_order_and_verifies(wire: WireFormat, tmp_path: Path) -> None:
    provider_name, serializer = WIRES[wire]
    provider = CapturingProvider(emulated_provider(wire, emulator=Emulator(ThinkingPlan(PLAN))))
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
        calls = [e.data for e in log.read("ordered") if isinstance(e.data, ToolCall)]
    assert len(provider.bodies) == len(dispatches) == 2  # the round of calls, then the answer
    assert {(d.serializer, d.serializer_version) for d in dispatches} == {serializer}
    for body in provider.bodies:
        assert declared_objects(wire_schemas(orjson.loads(body))) == [DECLARED] * 3, wire
    if wire == "anthropic":  # the model's own calls go back with their keys in the order of the logged arguments text
        written = [list(orjson.loads(c.arguments)) for c in calls]
        assert len(written) == 3
        assert call_inputs(orjson.loads(provider.bodies[1])) == written
    # the log holds the schema in that order too, byte for byte what the header event says
    db = sqlite3.connect(tmp_path / "log.sqlite3")
    try:
        rows = [bytes(r[0]) for r in db.execute("SELECT body FROM events ORDER BY seq")]
        headers = [r for r in rows if b'"type":"request/header"' in r]
    finally:
        db.close()
    assert headers
    assert all(h.count(b'"properties":{"zeta":') == 3 for h in headers)
    out = CliRunner().invoke(app, ["verify", "ordered", "--data-dir", str(tmp_path), "--json"])
    assert out.exit_code == 0, out.output
    report = orjson.loads(out.stdout_bytes)
    assert (report["checked"], report["matched"], report["mismatched"]) == (2, 2, [])
