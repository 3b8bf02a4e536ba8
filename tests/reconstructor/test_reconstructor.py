"""The independent reconstructor (written from docs/FORMAT.md, importing nothing of foldline) matches every
digest of the golden logs and of fresh demo logs."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from foldline.config import Config, open_stores
from foldline.demo import run_demo

from ..golden_logs.layout import ATTACHMENTS_DIR, SESSIONS, jsonl_path
from ..golden_logs.ordered import ORDERED_DIR, ORDERED_SESSIONS
from ..golden_logs.reasoning import REASONING_DIR, REASONING_SESSIONS
from ..golden_logs.sealed import KEYS, STORED
from . import reconstruct as reconstructor
from .reconstruct import Opener, body_bytes, reconstruct


def export_lines(path: Path) -> list[bytes]:
    return path.read_bytes().split(b"\n")[1:-1]


def test_canonical_json_follows_section_1() -> None:
    cases = [
        (0.7, "0.7"), (1.0, "1.0"), (0.0, "0.0"), (-0.0, "-0.0"), (0.00001, "0.00001"), (1e15, "1000000000000000.0"),
        (0.1 + 0.2, "0.30000000000000004"), (1e16, "1e+16"), (1.5e300, "1.5e+300"), (1e-6, "1e-6"), (5e-324, "5e-324"),
    ]  # fmt: skip
    for value, text in cases:
        assert body_bytes(value).decode() == text
    assert (
        body_bytes({"b": "\u007f\u2028/", "a": "\x01\t", "é": 1})
        == '{"a":"\\u0001\\t","b":"\u007f\u2028/","é":1}'.encode()
    )


def test_every_digest_of_the_v0_golden_logs() -> None:
    kinds = set()
    for session in SESSIONS:
        checks = reconstruct(export_lines(jsonl_path(session)), ATTACHMENTS_DIR)
        assert checks, session
        assert [c for c in checks if not c.ok] == [], session
        kinds |= {c.what for c in checks}
    assert kinds == {"dispatch", "summarize"}


def test_every_digest_of_the_reasoning_golden_logs() -> None:
    kinds = set()
    for session in REASONING_SESSIONS:
        checks = reconstruct(export_lines(REASONING_DIR / f"{session}.jsonl"))
        assert [c for c in checks if not c.ok] == [], session
        kinds |= {c.what for c in checks}
    assert kinds == {"dispatch", "summarize"}


def test_every_digest_of_the_ordered_golden_logs() -> None:
    """The versions that keep the author's key order (§1.9, §9.8, §9.9): ordered schemas in the events and in the
    bodies, DeepSeek's documented shapes."""
    for session in ORDERED_SESSIONS:
        checks = reconstruct(export_lines(ORDERED_DIR / f"{session}.jsonl"))
        assert len(checks) == 4, session
        assert [c for c in checks if not c.ok] == [], session


def test_every_digest_of_the_sealed_golden_log() -> None:
    """The stored form of golden-anthropic, opened with its key as §3.5 says, rebuilds every digest."""
    keys = {k["kid"]: bytes.fromhex(k["key"]) for k in json.loads(KEYS.read_text()).values()}
    lines = STORED.read_bytes().split(b"\n")[:-1]
    assert all(b'"text":"' not in line or b'"sealed":{' in line for line in lines)
    checks = reconstruct(lines, ATTACHMENTS_DIR, Opener("golden-anthropic", keys))
    assert [c for c in checks if not c.ok] == []
    assert {c.what for c in checks} == {"dispatch", "summarize"}
    assert len(checks) == len(reconstruct(export_lines(jsonl_path("golden-anthropic")), ATTACHMENTS_DIR))


def test_every_digest_of_a_fresh_demo(tmp_path: Path) -> None:
    config = Config(data_dir=tmp_path)
    stores = open_stores(config)
    try:
        result = run_demo(stores, config.data_dir, config.backend, 4, 24, quiet=True)
    finally:
        stores.close()
    assert result.verified_ok
    db = sqlite3.connect(tmp_path / "log.sqlite3")
    try:
        sessions = [row[0] for row in db.execute("SELECT id FROM sessions ORDER BY id")]
        assert {"demo-think", "demo-responses", "demo-structured"} <= set(sessions)
        # the data keys, from the key store's file as FORMAT.md §3.5 lays it out
        keys_db = sqlite3.connect(tmp_path / "keys.sqlite3")
        keys = {str(kid): bytes(key) for kid, key in keys_db.execute("SELECT kid, material FROM keys")}
        keys_db.close()
        kinds = set()
        for session in sessions:
            rows = db.execute("SELECT body FROM events WHERE session_id=? ORDER BY seq", (session,)).fetchall()
            assert any(b'"sealed":{' in bytes(r[0]) for r in rows), session  # the demo's content is stored sealed
            opener = Opener(session, keys)
            checks = reconstruct([bytes(r[0]) for r in rows], tmp_path / "attachments", opener)
            assert checks, session
            assert [c for c in checks if not c.ok] == [], session
            kinds |= {c.what for c in checks}
        assert kinds == {"dispatch", "summarize"}
    finally:
        db.close()


def test_every_golden_wire_body(tmp_path: Path) -> None:
    """Every example body of tests/fixtures/golden (every serializer version, every case it does not refuse) is what
    the reconstructor writes for that request — the new versions' key order, null content, joined texts and thinking
    switch included (docs/FORMAT.md §9.8, §9.9)."""
    import orjson

    from foldline.adapters.fs_attachments import FilesystemAttachmentStore
    from foldline.core.codec import canonical_json
    from foldline.core.wire import block_to_json, header_to_json
    from foldline.providers import SERIALIZERS

    from ..providers.golden_cases import GOLDEN_DIR, REFUSED, cases

    requests = cases(FilesystemAttachmentStore(tmp_path))
    objects = reconstructor.Objects(tmp_path)
    compared = 0
    for name, version in SERIALIZERS:
        for case, request in requests.items():
            event = {
                "type": "request/header",
                "data": {"header": orjson.loads(canonical_json(header_to_json(request.header)))},
            }
            header = reconstructor.mark_ordered(event)["data"]["header"]
            messages = [
                {"role": m.role, "content": orjson.loads(canonical_json([block_to_json(b) for b in m.content]))}
                for m in request.messages
            ]
            serialize = reconstructor.SERIALIZERS[(name, version)]
            if case in REFUSED.get((name, version), ()):
                if case.startswith("structured"):  # §9.10: a version before structured output refuses one
                    with pytest.raises(reconstructor.Refused):
                        serialize(header, messages, objects)
                continue
            body = body_bytes(serialize(header, messages, objects))
            assert body == (GOLDEN_DIR / name / f"v{version}" / f"{case}.json").read_bytes(), (name, version, case)
            compared += 1
    assert compared == len(list(GOLDEN_DIR.glob("*/v*/*.json")))  # every fixture, none skipped


ARGUMENT_CASES = [
    '{"x": NaN}',
    '{"x": Infinity}',
    '{"x": 18446744073709551615}',
    '{"x": 18446744073709551616}',
    '{"x": -9223372036854775808}',
    '{"x": -9223372036854775809}',
    '{"x": 1e400}',
    '{"x": -1e400}',
    '{"x": ' + "9" * 400 + "}",
    '{"a": 1, "a": 2}',
    '{"x": 1E2, "y": 0.1e-6, "z": 1.0}',
    '{"b": {"d": 1, "c": "\\u00e9"}, "a": [1, 2.5]}',
    "[1, 2]",
    "not json",
]


@pytest.mark.parametrize("arguments", ARGUMENT_CASES)
def test_tool_arguments_become_the_input_foldline_sends(arguments: str) -> None:
    """docs/FORMAT.md §9.1 "Arguments → input" (NaN, integers beyond 64 bits, 1e400, duplicate keys): the
    reconstructor, written from the page, writes the same ``input`` bytes as foldline's serializer, or refuses
    what it refuses."""
    from foldline.core.codec import canonical_json
    from foldline.errors import ProviderError
    from foldline.providers.encoding import tool_input_object

    try:
        expected: bytes | None = canonical_json(tool_input_object(arguments, "c", "anthropic"))
    except ProviderError:
        expected = None
    try:
        got: bytes | None = reconstructor.canonical(reconstructor.tool_input(arguments)).encode()
    except reconstructor.Refused:
        got = None
    assert got == expected
