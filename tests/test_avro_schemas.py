"""Schema evolution check (runs in `make test`): every schema in ``schemas/`` must stay FULL_TRANSITIVE
compatible with every version of it ever committed — new readers read old data (backward) and old
readers read new data (forward). The rules are in docs/SCHEMAS.md.

Also checks that every committed version stays decodable at runtime: its single-object fingerprint
must be among the writer schemas the package ships (current file + ``schemas/previous/``).
"""

from __future__ import annotations

import copy
import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import avro.schema
import pytest
from avro.compatibility import ReaderWriterCompatibilityChecker, SchemaCompatibilityType

from foldline.adapters.avro import crc64_avro, load_schema_json, writer_schemas

REPO = Path(__file__).resolve().parent.parent
SCHEMAS = REPO / "schemas"


def _name_at(schema_json: str, location: str) -> str:
    """The named types along a checker location such as ``/fields/4/type/3`` (e.g. ``SessionEvent.TurnEnd``)."""
    node: Any = json.loads(schema_json)
    names = []
    for token in location.strip("/").split("/"):
        if isinstance(node, dict) and "name" in node and node.get("type") in ("record", "enum", "fixed"):
            names.append(node["name"])
        if (
            isinstance(node, dict)
            and node.get("name")
            and "type" in node
            and node.get("type")
            not in (
                "record",
                "enum",
                "fixed",
            )
        ):
            names.append(node["name"])  # a field
        try:
            node = node[int(token)] if isinstance(node, list) else node[token]
        except (KeyError, IndexError, ValueError, TypeError):
            break
    if isinstance(node, dict) and "name" in node:
        names.append(node["name"])
    return ".".join(names)


def compatibility_problems(reader: str, writer: str) -> list[str]:
    """Why data written with ``writer`` cannot be read with ``reader`` (empty when it can)."""
    checker = ReaderWriterCompatibilityChecker()  # type: ignore[no-untyped-call]
    result = checker.get_compatibility(avro.schema.parse(reader), avro.schema.parse(writer))
    if result.compatibility is SchemaCompatibilityType.compatible:
        return []
    return sorted(
        f"{loc} ({_name_at(reader, loc)}): {msg}"
        for loc, msg in zip(sorted(result.locations), sorted(result.messages), strict=False)
    )


def full_problems(new: str, old: str) -> list[str]:
    """Backward (new reads old) and forward (old reads new) problems of one schema change."""
    return [f"backward {p}" for p in compatibility_problems(new, old)] + [
        f"forward {p}" for p in compatibility_problems(old, new)
    ]


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, text=True).stdout


def committed_versions(repo: Path, rel_path: str) -> list[tuple[str, str]]:
    """(commit, text) of every committed version of ``rel_path``, oldest first, following renames.

    Empty when the file has no history yet (new file, or a tree that is not a git checkout).
    """
    if shutil.which("git") is None:
        pytest.fail("git is needed to check schema history; install git")
    try:
        _git(repo, "rev-parse", "--git-dir")
    except subprocess.CalledProcessError:
        return []  # an exported tree without .git: nothing to compare against
    try:
        log = _git(repo, "log", "--follow", "--format=%H", "--name-only", "--", rel_path)
    except subprocess.CalledProcessError:
        return []  # e.g. a repository without any commit yet
    versions: list[tuple[str, str]] = []
    lines = [ln for ln in log.splitlines() if ln.strip()]
    for commit, path in zip(lines[0::2], lines[1::2], strict=False):
        try:
            versions.append((commit, _git(repo, "show", f"{commit}:{path}")))
        except subprocess.CalledProcessError:
            continue  # the commit deleted the file
    return list(reversed(versions))


def history_problems(repo: Path, rel_path: str) -> list[str]:
    """Problems of the working-tree schema and of each committed version against every earlier one."""
    versions = committed_versions(repo, rel_path)
    current = (repo / rel_path).read_text(encoding="utf-8")
    chain = [*versions, ("working tree", current)]
    problems = []
    for i, (rev_new, new) in enumerate(chain):
        for rev_old, old in chain[:i]:
            if new == old:
                continue
            problems += [f"{rel_path} {rev_new[:12]} vs {rev_old[:12]}: {p}" for p in full_problems(new, old)]
    return problems


def _schema_files() -> list[str]:
    return sorted(str(p.relative_to(REPO)) for p in SCHEMAS.glob("*.avsc"))


def test_there_are_schema_files() -> None:
    assert "schemas/foldline.session_event.avsc" in _schema_files()


@pytest.mark.parametrize("rel_path", _schema_files())
def test_schema_is_compatible_with_every_committed_version(rel_path: str) -> None:
    problems = history_problems(REPO, rel_path)
    assert not problems, "incompatible schema change (see docs/SCHEMAS.md):\n" + "\n".join(problems)


@pytest.mark.parametrize("rel_path", _schema_files())
def test_every_committed_version_stays_decodable(rel_path: str) -> None:
    shipped = writer_schemas()
    missing = []
    for rev, text in committed_versions(REPO, rel_path):
        fp = crc64_avro(avro.schema.parse(text).canonical_form.encode()).to_bytes(8, "little")
        if fp not in shipped:
            missing.append(f"{rev[:12]} (fingerprint {fp.hex()})")
    assert not missing, (
        f"records written with these committed versions of {rel_path} could no longer be decoded; copy each into "
        "schemas/previous/<name>.<fingerprint>.avsc:\n" + "\n".join(missing)
    )


# ---------------------------------------------------------------- the checker catches breaking changes


def _current() -> dict[str, Any]:
    return load_schema_json()


def _record(schema: dict[str, Any], name: str) -> dict[str, Any]:
    for branch in next(f for f in schema["fields"] if f["name"] == "data")["type"]:
        if isinstance(branch, dict) and branch.get("name") == name:
            return branch
    raise KeyError(name)


def test_checker_accepts_an_optional_field_with_default() -> None:
    old = _current()
    new = copy.deepcopy(old)
    _record(new, "TurnStart")["fields"].append({"name": "note", "type": ["null", "string"], "default": None})
    assert full_problems(json.dumps(new), json.dumps(old)) == []


def test_checker_rejects_a_new_field_without_default() -> None:
    old = _current()
    new = copy.deepcopy(old)
    _record(new, "TurnStart")["fields"].append({"name": "note", "type": "string"})
    problems = full_problems(json.dumps(new), json.dumps(old))
    assert problems
    assert all(p.startswith("backward") and "TurnStart" in p for p in problems), problems


def test_checker_rejects_a_removed_field_without_default() -> None:
    old = _current()
    new = copy.deepcopy(old)
    _record(new, "TurnEnd")["fields"] = [f for f in _record(new, "TurnEnd")["fields"] if f["name"] != "reason"]
    problems = full_problems(json.dumps(new), json.dumps(old))
    assert problems
    assert all(p.startswith("forward") and "TurnEnd" in p for p in problems), problems


def test_checker_rejects_a_new_event_branch_for_old_readers() -> None:
    old = _current()
    new = copy.deepcopy(old)
    data = next(f for f in new["fields"] if f["name"] == "data")
    data["type"].append({"type": "record", "name": "Brand", "fields": [{"name": "x", "type": "long"}]})
    problems = full_problems(json.dumps(new), json.dumps(old))
    assert problems
    assert all(p.startswith("forward") for p in problems), problems


def test_history_check_finds_a_breaking_commit_in_a_fresh_repository(tmp_path: Path) -> None:
    repo = tmp_path / "r"
    (repo / "schemas").mkdir(parents=True)
    _git(repo, "init", "-q")
    _git(repo, "config", "user.email", "t@example.invalid")
    _git(repo, "config", "user.name", "t")
    rel = "schemas/foldline.session_event.avsc"
    target = repo / rel
    assert committed_versions(repo, rel) == []  # no commit yet: nothing to compare, no failure
    v1 = _current()
    target.write_text(json.dumps(v1))
    assert history_problems(repo, rel) == []  # uncommitted new file
    _git(repo, "add", rel)
    _git(repo, "commit", "-q", "-m", "v1")
    v2 = copy.deepcopy(v1)
    _record(v2, "TurnStart")["fields"].append({"name": "note", "type": ["null", "string"], "default": None})
    target.write_text(json.dumps(v2))
    _git(repo, "commit", "-q", "-am", "v2 compatible")
    assert [rev for rev, _ in committed_versions(repo, rel)] == _git(repo, "log", "--format=%H").split()[::-1]
    assert history_problems(repo, rel) == []
    v3 = copy.deepcopy(v2)
    _record(v3, "TurnStart")["fields"][0]["type"] = "string"  # turn: long -> string
    target.write_text(json.dumps(v3))
    uncommitted = history_problems(repo, rel)
    assert uncommitted
    assert all("working tree" in p for p in uncommitted)
    _git(repo, "commit", "-q", "-am", "v3 breaking")
    target.write_text(json.dumps(v2))  # even reverting the file does not hide the bad commit in history
    bad_rev = _git(repo, "rev-parse", "HEAD").strip()[:12]
    problems = history_problems(repo, rel)
    assert problems
    assert all(bad_rev in p and "TurnStart" in p for p in problems), problems
