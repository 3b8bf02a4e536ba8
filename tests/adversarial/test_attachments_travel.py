"""``export`` names or carries the attachment objects a session needs, and ``import`` takes them.

An export of a session with images used to leave the objects out, so the import elsewhere could not
verify; nothing said so.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from foldline.adapters.sqlite_log import SqliteEventLog
from foldline.core.content import ImageBlock
from foldline.core.events import UserMessage
from tests.adversarial.helpers import assert_one_line_error, demo, invoke


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    data = tmp_path_factory.mktemp("images") / "data"
    assert demo(data, sessions=2, steps=3).code == 0  # demo-001 opens with a PNG
    return data


def image_ids(data: Path, session: str) -> list[str]:
    with SqliteEventLog(data, read_only=True) as log:
        return [
            b.image.attachment_id
            for e in log.read(session)
            if isinstance(e.data, UserMessage)
            for b in e.data.content
            if isinstance(b, ImageBlock)
        ]


def test_an_export_names_the_objects_it_does_not_carry(source: Path, tmp_path: Path) -> None:
    out = invoke("export", "demo-001", "-o", tmp_path / "s.jsonl", "--data-dir", source)
    assert out.code == 0
    assert "references 1 attachment object(s)" in out.stderr
    assert "--attachments DIR" in out.stderr
    summary = json.loads(
        invoke("export", "demo-001", "-o", tmp_path / "t.jsonl", "--data-dir", source, "--json").stdout
    )
    assert summary["attachments"] == image_ids(source, "demo-001")
    assert summary["copiedAttachments"] == 0
    plain = invoke("export", "demo-000", "-o", tmp_path / "u.jsonl", "--data-dir", source)
    assert "attachment" not in plain.stderr  # nothing to say about a session without images


def test_the_bundle_travels_with_the_export_and_the_copy_verifies(source: Path, tmp_path: Path) -> None:
    bundle = tmp_path / "bundle"
    out = invoke("export", "demo-001", "-o", tmp_path / "s.jsonl", "--attachments", bundle, "--data-dir", source)
    assert out.code == 0, out.stderr
    assert "1 copied to" in out.stderr
    (hexd,) = (i.removeprefix("sha256:") for i in image_ids(source, "demo-001"))
    assert (bundle / "objects" / hexd[:2] / hexd).is_file()
    elsewhere = tmp_path / "elsewhere"
    out = invoke("import", tmp_path / "s.jsonl", "--attachments", bundle, "--data-dir", elsewhere, "--json")
    assert out.code == 0, out.stderr
    assert json.loads(out.stdout)["copiedAttachments"] == 1
    assert invoke("verify", "--data-dir", elsewhere).code == 0
    # to stdout, the summary goes to stderr so the export stays clean
    out = invoke("export", "demo-001", "-o", "-", "--attachments", bundle, "--data-dir", source, "--json")
    assert out.stdout.startswith('{"digest":')
    assert json.loads(out.stderr)["attachments"] == image_ids(source, "demo-001")


def test_an_import_without_its_objects_says_so_and_verify_tells_unreconstructable(source: Path, tmp_path: Path) -> None:
    export = tmp_path / "s.jsonl"
    assert invoke("export", "demo-001", "-o", export, "--data-dir", source).code == 0
    elsewhere = tmp_path / "elsewhere"
    out = invoke("import", export, "--data-dir", elsewhere)
    assert out.code == 0
    assert "1 of the 1 attachment object(s)" in out.stderr
    assert "are not in this data directory's store" in out.stderr
    assert invoke("verify", "--data-dir", elsewhere).code == 3


def test_a_damaged_object_in_the_bundle_fails_the_import_and_writes_no_session(source: Path, tmp_path: Path) -> None:
    bundle = tmp_path / "bundle"
    export = tmp_path / "s.jsonl"
    assert invoke("export", "demo-001", "-o", export, "--attachments", bundle, "--data-dir", source).code == 0
    (obj,) = [p for p in (bundle / "objects").rglob("*") if p.is_file() and not p.name.endswith(".json")]
    data = bytearray(obj.read_bytes())
    data[len(data) // 2] ^= 0xFF
    obj.write_bytes(bytes(data))
    elsewhere = tmp_path / "elsewhere"
    out = invoke("import", export, "--attachments", bundle, "--data-dir", elsewhere)
    assert_one_line_error(out, "ImportFailed", "AttachmentCorrupt", "Nothing was imported")
    with SqliteEventLog(elsewhere, read_only=True) as log:
        assert log.sessions() == []


def test_a_bundle_missing_an_object_imports_and_names_it(source: Path, tmp_path: Path) -> None:
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    export = tmp_path / "s.jsonl"
    assert invoke("export", "demo-001", "-o", export, "--data-dir", source).code == 0
    elsewhere = tmp_path / "elsewhere"
    out = invoke("import", export, "--attachments", bundle, "--data-dir", elsewhere, "--json")
    assert out.code == 0
    assert json.loads(out.stdout)["missingAttachments"] == image_ids(source, "demo-001")
    assert invoke("verify", "--data-dir", elsewhere).code == 3


def test_bad_bundle_paths(source: Path, tmp_path: Path) -> None:
    afile = tmp_path / "afile"
    afile.write_text("x")
    out = invoke("export", "demo-001", "-o", tmp_path / "s.jsonl", "--attachments", afile, "--data-dir", source)
    assert_one_line_error(out, "InputError", "is a file")
    assert invoke("export", "demo-001", "-o", tmp_path / "s.jsonl", "--data-dir", source).code == 0
    out = invoke("import", tmp_path / "s.jsonl", "--attachments", tmp_path / "none", "--data-dir", tmp_path / "d")
    assert_one_line_error(out, "InputError", "does not exist")
