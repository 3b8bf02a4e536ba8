"""Golden bytes: every registered serializer version reproduces its committed wire bodies exactly."""

from __future__ import annotations

import os
from pathlib import Path

import orjson
import pytest

from foldline.adapters.memory_attachments import MemoryAttachmentStore
from foldline.core.codec import canonical_json
from foldline.errors import ProviderError
from foldline.providers import SERIALIZERS

from .golden_cases import (
    DOCUMENTED,
    GOLDEN_DIR,
    ORDERED_VERSIONS,
    REFUSED,
    STREAMING_VERSIONS,
    STRUCTURED_CASES,
    STRUCTURED_VERSIONS,
    cases,
)

UPDATE = os.environ.get("FOLDLINE_UPDATE_GOLDEN") == "1"
CASE_NAMES = sorted(cases(MemoryAttachmentStore()))


def _path(name: str, version: int, case: str) -> Path:
    return GOLDEN_DIR / name / f"v{version}" / f"{case}.json"


@pytest.mark.parametrize("key", sorted(SERIALIZERS), ids=lambda k: f"{k[0]}-v{k[1]}")
@pytest.mark.parametrize("case", CASE_NAMES)
def test_serializer_reproduces_golden_bytes(key: tuple[str, int], case: str) -> None:
    store = MemoryAttachmentStore()
    path = _path(*key, case)
    if case in REFUSED.get(key, ()):
        with pytest.raises(ProviderError):
            SERIALIZERS[key].serialize(cases(store)[case], store)
        assert not path.exists()
        return
    body = SERIALIZERS[key].serialize(cases(store)[case], store)
    if UPDATE:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(body)
    assert path.exists(), f"no golden file {path}; create it with FOLDLINE_UPDATE_GOLDEN=1 (see golden_cases.py)"
    expected = path.read_bytes()
    if body != expected:
        at = next(
            (i for i, (a, b) in enumerate(zip(body, expected, strict=False)) if a != b), min(len(body), len(expected))
        )
        pytest.fail(f"{path.name}: bytes differ from offset {at}: {body[at : at + 60]!r} vs {expected[at : at + 60]!r}")


def test_every_golden_file_belongs_to_a_registered_serializer_and_case() -> None:
    """A stale fixture (renamed case, dropped version) is an error, not silently ignored."""
    known = {_path(*key, case) for key in SERIALIZERS for case in CASE_NAMES if case not in REFUSED.get(key, ())}
    on_disk = set(GOLDEN_DIR.glob("*/v*/*.json"))
    assert on_disk == known


def test_a_body_that_does_not_stream_has_the_same_bytes_as_under_the_version_streaming_extends() -> None:
    """A streaming version only adds streaming: a log written with the version it extends digests the same."""
    for (name, version), base in STREAMING_VERSIONS.items():
        compared = 0
        for case in CASE_NAMES:
            if case in REFUSED.get((name, base), ()) or case in REFUSED.get((name, version), ()):
                continue
            assert _path(name, base, case).read_bytes() == _path(name, version, case).read_bytes(), (name, case)
            compared += 1
        assert compared >= 3


def test_an_ordered_version_changes_nothing_but_key_order() -> None:
    """docs/FORMAT.md §9.8: with every object sorted again, a body of an ordered version is the body of the version
    it extends, byte for byte; and it is not always that body (the ordered case shows the author's order)."""
    for (name, version), base in ORDERED_VERSIONS.items():
        differs = 0
        for case in CASE_NAMES:
            if case in REFUSED.get((name, base), ()) or case in REFUSED.get((name, version), ()):
                continue
            ordered = _path(name, version, case).read_bytes()
            assert canonical_json(orjson.loads(ordered)) == _path(name, base, case).read_bytes(), (name, case)
            differs += ordered != _path(name, base, case).read_bytes()
        assert differs >= 2, name


def test_every_version_that_keeps_the_author_order_sends_the_declared_order() -> None:
    """The pydantic-declared ``zeta, alpha, mid, unit`` reach the wire in that order from every current version,
    and sorted from every earlier one."""
    declared = ["zeta", "alpha", "mid", "unit"]
    for name, version in SERIALIZERS:
        body = orjson.loads(_path(name, version, "ordered_schema").read_bytes())
        tool = body["tools"][0]
        schema = tool.get("input_schema") or tool.get("parameters") or tool["function"]["parameters"]
        ordered = SERIALIZERS[(name, version)].ordered_schemas  # type: ignore[attr-defined]
        assert list(schema["properties"]) == (declared if ordered else sorted(declared)), (name, version)


def test_each_documented_fixture_names_its_provider_documentation_beside_it() -> None:
    """A fixture that follows a provider's documentation where its version departs from the one before has that
    page named on its line of the README.md beside it."""
    for (name, version), documented in DOCUMENTED.items():
        readme = (GOLDEN_DIR / name / f"v{version}" / "README.md").read_text(encoding="utf-8")
        for case, url in documented.items():
            assert _path(name, version, case).exists(), (name, version, case)
            lines = [line for line in readme.splitlines() if f"`{case}.json`" in line]
            assert lines, f"{name}/v{version}/README.md has no line for {case}.json"
            assert url in lines[0], f"{name}/v{version}/README.md names no {url} beside {case}.json"


def test_a_structured_output_version_changes_nothing_without_an_output_schema() -> None:
    """docs/FORMAT.md §9.10: a structured-output version writes the bytes of the version it extends for every request
    without an output schema, so a log written before it verifies the same; every earlier version refuses one."""
    for (name, version), base in STRUCTURED_VERSIONS.items():
        compared = 0
        for case in CASE_NAMES:
            if case in STRUCTURED_CASES:
                assert case in REFUSED.get((name, base), ()), (name, base, case)
                continue
            if case in REFUSED.get((name, base), ()):
                continue
            assert _path(name, base, case).read_bytes() == _path(name, version, case).read_bytes(), (name, case)
            compared += 1
        assert compared >= 8, name


def test_every_structured_output_version_sends_its_native_field_in_the_declared_order() -> None:
    """Each API's own field, the schema's properties in declaration order (not sorted)."""
    declared = ["city", "temperature", "conditions", "wind"]
    for name, version in STRUCTURED_VERSIONS:
        body = orjson.loads(_path(name, version, "structured_output").read_bytes())
        match name:
            case "anthropic-messages":
                fmt = body["output_config"]["format"]
                assert fmt["type"] == "json_schema"
                assert body["output_config"]["effort"] == "low"
                schema = fmt["schema"]
            case "openai-chat":
                fmt = body["response_format"]
                assert fmt["type"] == "json_schema"
                assert fmt["json_schema"]["name"] == "Weather"
                assert fmt["json_schema"]["strict"] is True
                schema = fmt["json_schema"]["schema"]
            case "openai-responses":
                fmt = body["text"]["format"]
                assert (fmt["type"], fmt["name"], fmt["strict"]) == ("json_schema", "Weather", True)
                schema = fmt["schema"]
            case _:
                assert body["response_format"] == {"type": "json_object"}
                system = body["messages"][0]["content"]
                assert system.startswith("You are a careful agent.\n\nAnswer with one JSON object")
                schema = orjson.loads(system[system.index("{") :])
        assert list(schema["properties"]) == declared, name
        assert list(schema["$defs"]["Wind"]["properties"]) == ["speed", "bearing"], name
