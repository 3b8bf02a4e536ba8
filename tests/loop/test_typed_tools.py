"""Typed tools: the JSON Schema pydantic generates from a signature (and logs in the header), the docstring's
descriptions, arguments validated before the tool runs, and what a tool may return."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import pytest
from pydantic import BaseModel, Field
from typing_extensions import TypedDict

from foldline.adapters.memory_attachments import MemoryAttachmentStore
from foldline.core.content import ImageBlock, TextBlock
from foldline.core.header import ToolSpec
from foldline.demo import demo_png
from foldline.errors import ToolDefinitionError
from foldline.loop.tool_runner import ToolRun, ToolRunSettings
from foldline.loop.tools import ImageData, ToolOutput, Toolset, schema_for


class Point(BaseModel):
    """A point on the map."""

    x: int
    y: int = 0


@dataclass
class Box:
    width: float
    height: float


class Filters(TypedDict):
    tags: list[str]
    since: str


class Opaque:
    """No JSON Schema describes it."""


class Report(BaseModel):
    title: str
    counts: dict[str, int]


def test_the_schema_covers_every_kind_of_parameter_in_declaration_order() -> None:
    def place(
        count: Annotated[int, Field(description="how many, at least one", ge=1)],
        at: Point,
        box: Box,
        filters: Filters,
        mode: Literal["fast", "exact"] = "fast",
        label: str | None = None,
    ) -> str:
        """Place things on the map.

        Args:
            count: ignored, the Annotated description wins.
            at: where to put them.
            box: the space they take.
            filters: which things.
            mode: how hard to try.
        """
        return ""

    spec = schema_for(place)
    assert spec.name == "place"
    assert spec.description == "Place things on the map."
    schema: Any = _thaw(spec.input_schema)
    assert list(schema["properties"]) == ["count", "at", "box", "filters", "mode", "label"]
    assert schema["properties"]["count"] == {"description": "how many, at least one", "minimum": 1, "type": "integer"}
    assert schema["properties"]["at"] == {"$ref": "#/$defs/Point", "description": "where to put them."}
    assert schema["properties"]["mode"] == {
        "default": "fast",
        "description": "how hard to try.",
        "enum": ["fast", "exact"],
        "type": "string",
    }
    assert schema["required"] == ["count", "at", "box", "filters"]
    assert schema["additionalProperties"] is False
    assert set(schema["$defs"]) == {"Point", "Box", "Filters"}
    assert schema["$defs"]["Point"]["description"] == "A point on the map."
    assert "title" not in schema
    assert "title" not in schema["properties"]["count"]


def _thaw(value: object) -> object:
    from collections.abc import Mapping, Sequence

    if isinstance(value, Mapping):
        return {k: _thaw(v) for k, v in value.items()}
    if isinstance(value, Sequence) and not isinstance(value, str):
        return [_thaw(v) for v in value]
    return value


@pytest.mark.parametrize(
    "doc",
    [
        "Search the notes.\n\nArgs:\n    query: the words to look for.\n    limit: at most this many.\n",
        "Search the notes.\n\nParameters\n----------\nquery : str\n    the words to look for.\nlimit : int\n"
        "    at most this many.\n",
        "Search the notes.\n\n:param query: the words to look for.\n:param limit: at most this many.\n",
    ],
    ids=["google", "numpy", "sphinx"],
)
def test_argument_descriptions_come_from_each_docstring_style(doc: str) -> None:
    def search(query: str, limit: int = 5) -> str:
        return ""

    search.__doc__ = doc
    spec = schema_for(search)
    assert spec.description == "Search the notes."
    assert spec.input_schema["properties"]["query"]["description"] == "the words to look for."
    assert spec.input_schema["properties"]["limit"]["description"] == "at most this many."


def test_a_demo_tool_keeps_the_schema_it_had() -> None:
    """A tool of plain string parameters is described as before typed tools (the golden logs hold such headers)."""

    def lookup(topic: str) -> str:
        """Look a topic up in the team's notes and return what they say about it."""
        return topic

    spec = schema_for(lookup)
    assert _thaw(spec.input_schema) == {
        "additionalProperties": False,
        "properties": {"topic": {"type": "string"}},
        "required": ["topic"],
        "type": "object",
    }


def test_functions_that_cannot_be_tools_are_typed_errors() -> None:
    def untyped(x) -> str:  # type: ignore[no-untyped-def]
        """Untyped."""
        return ""

    def nodoc(x: int) -> str:
        return ""

    def star(*xs: int) -> str:
        """Star."""
        return ""

    def opaque(x: Opaque) -> str:
        """Opaque."""
        return ""

    cases: list[tuple[Any, str]] = [
        (untyped, "needs a type annotation"),
        (nodoc, "add a docstring"),
        (star, "cannot be described to a model"),
        (opaque, "cannot be described as JSON Schema"),
    ]
    for fn, message in cases:
        with pytest.raises(ToolDefinitionError, match=message):
            Toolset().add(fn)

    def fine(x: int) -> str:
        """Fine."""
        return ""

    tools = Toolset()
    tools.add(fine, name="ok_name")
    with pytest.raises(ToolDefinitionError, match="registered already"):
        tools.add(fine, name="ok_name")
    with pytest.raises(ToolDefinitionError, match="letters, digits"):
        tools.add(fine, name="has space")


def test_arguments_are_validated_before_the_tool_runs() -> None:
    calls: list[object] = []
    tools = Toolset()

    @tools.tool
    def plan(n: int, at: Point, box: Box, json: str = "x") -> str:  # a parameter BaseModel also has
        """Plan."""
        calls.append((n, at, box, json))
        return "planned"

    def run(arguments: str) -> ToolOutput:
        return asyncio.run(tools.call("plan", arguments))

    bad = run('{"n": "seven", "at": {"x": 1}, "box": {"width": 1, "height": "tall"}, "extra": 1}')
    assert bad.is_error
    assert calls == []
    assert bad.content == (
        "invalid arguments for plan: argument `n`: Input should be a valid integer, unable to parse string as an "
        'integer (got "seven"); argument `box.height`: Input should be a valid number, unable to parse string as a '
        'number (got "tall"); unexpected argument `extra` (the tool takes n, at, box, json). The tool was not called.'
    )
    assert "argument `at` is missing" in str(run('{"n": 1, "box": {"width": 1, "height": 2}}').content)
    assert "are not valid JSON" in str(run("{not json").content)
    assert "must be a JSON object" in str(run("[1, 2]").content)
    assert calls == []
    good = run('{"n": 3, "at": {"x": 1}, "box": {"width": 1, "height": 2}, "json": "y"}')
    assert good == ToolOutput("planned")
    assert calls == [(3, Point(x=1, y=0), Box(1.0, 2.0), "y")]


def test_a_function_under_an_explicit_spec_needs_no_docstring_and_may_take_the_arguments_as_given() -> None:
    seen: list[dict[str, object]] = []
    spec = ToolSpec("echo", "Echo the arguments.", {"type": "object", "properties": {"a": {"type": "integer"}}})
    tools = Toolset()

    def echo(**kw: object) -> str:
        seen.append(kw)
        return "ok"

    tools.add(echo, spec)
    assert tools.specs()[0] is spec
    assert asyncio.run(tools.call("echo", '{"a": 1, "b": [2]}')) == ToolOutput("ok")
    assert seen == [{"a": 1, "b": [2]}]
    assert asyncio.run(tools.call("echo", "[1]")).is_error
    with pytest.raises(ToolDefinitionError, match="needs a type annotation"):
        Toolset().add(lambda a: a, spec)  # a signature with names is still checked
    with pytest.raises(ToolDefinitionError, match="add a docstring"):
        Toolset().add(lambda **kw: "", name="x")  # without a spec the model would see no description


def test_what_a_tool_may_return() -> None:
    store = MemoryAttachmentStore()
    tools = Toolset()
    png = demo_png(8, 6)

    @tools.tool
    def model() -> Report:
        """A model."""
        return Report(title="t", counts={"b": 2, "a": 1})

    @tools.tool
    async def image() -> list[TextBlock | ImageData]:
        """An image."""
        return [TextBlock("look:"), ImageData(png, "image/png")]

    @tools.tool
    def broken_image() -> ImageData:
        """Bytes that are not a PNG."""
        return ImageData(b"not a png", "image/png")

    @tools.tool
    def number() -> int:
        """A number."""
        return 7

    def run(name: str) -> tuple[object, ...]:
        from foldline.core.content import ToolCallBlock

        ran = asyncio.run(ToolRun([ToolCallBlock("c", name, "{}")], tools, ToolRunSettings(), store).run())
        return ran[0][0].content

    assert run("model") == (TextBlock('{"counts":{"a":1,"b":2},"title":"t"}'),)  # canonical: sorted keys
    text, picture = run("image")
    assert text == TextBlock("look:")
    assert isinstance(picture, ImageBlock)
    assert (picture.image.width, picture.image.height) == (8, 6)
    assert store.get(picture.image.attachment_id) == png
    [note] = run("broken_image")
    assert isinstance(note, TextBlock)
    assert "an image that cannot be used was returned" in note.text
    assert run("number") == (TextBlock("7"),)


_GENERATE = """
import json, sys
sys.path.insert(0, sys.argv[1])
import tool_module
from foldline.core.codec import canonical_json
def thaw(v):
    if hasattr(v, "items"):
        return {k: thaw(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [thaw(x) for x in v]
    return v
spec = tool_module.tools.specs()[0]
schema = thaw(spec.input_schema)
logged = canonical_json([spec.name, spec.description, schema]).decode()
print(json.dumps({"canonical": logged, "ordered": json.dumps(schema)}))
"""

_TOOL_V1 = '''
from typing import Annotated, Any, Literal
from pydantic import BaseModel, Field
from foldline.loop import Toolset

tools = Toolset()

class Where(BaseModel):
    """A place."""
    city: str
    country: str = "NO"

@tools.tool
def forecast(where: Where, days: Annotated[int, Field(ge=1, le=14)] = 3, unit: Literal["c", "f"] = "c") -> str:
    """The weather forecast.

    Args:
        where: the place.
        days: how many days ahead.
    """
    return f"{where.city}: sunny for {days} days"
'''

_TOOL_V2 = (
    "import collections  # a later version of the module: other code around, another body, same signature\n"
    + _TOOL_V1.replace('return f"{where.city}: sunny for {days} days"', "return 'cloudy'")
    + "\n\ndef unrelated() -> int:\n    return 1\n"
)


def test_the_logged_schema_is_the_same_in_every_process_and_tool_version(tmp_path: Path) -> None:
    outputs = []
    for i, source in enumerate([_TOOL_V1, _TOOL_V1, _TOOL_V2, _TOOL_V2]):
        where = tmp_path / f"v{i}"
        where.mkdir()
        (where / "tool_module.py").write_text(textwrap.dedent(source))
        env = {**os.environ, "PYTHONHASHSEED": str(i * 7919 + 1)}
        done = subprocess.run(
            [sys.executable, "-c", _GENERATE, str(where)], capture_output=True, text=True, env=env, check=True
        )
        outputs.append(done.stdout)
    assert len(set(outputs)) == 1, outputs
    ordered = json.loads(json.loads(outputs[0])["ordered"])
    assert list(ordered["properties"]) == ["where", "days", "unit"]
