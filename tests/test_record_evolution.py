"""Schema evolution stays explicit: the record definitions against their committed field list and Avro schema.

``schemas/fields.v<SESSION_FORMAT_VERSION>.txt`` lists every logged field of the format version. A field of the
list that the definitions no longer have, or have with another type, is refused (a removal or a type change
needs a new format version); a field of the definitions the list does not have is refused until its line (its
evolution entry) is added — and only an optional field may be added to a record within a format version. A record
that is new as a whole (an event type added always ignorable, docs/SCHEMAS.md rule 4) may have required fields: no
earlier log holds one, and a reader that predates it skips it. The committed ``.avsc`` must be the one the
definitions give.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from foldline.adapters.avro.layout import event_schema, schema_text
from foldline.adapters.avro.schemas import load_schema_json
from foldline.core.events import EVENT_TYPES, SESSION_FORMAT_VERSION
from foldline.core.records import field_signatures
from foldline.core.sealing import SEAL_VERSION, content_fields

ROOT = Path(__file__).resolve().parents[1]
FIELDS = ROOT / "schemas" / f"fields.v{SESSION_FORMAT_VERSION}.txt"
SEALED = ROOT / "schemas" / f"sealed.v{SEAL_VERSION}.txt"


def committed_fields(path: Path = FIELDS) -> list[str]:
    lines = [line.split("  #", 1)[0].rstrip() for line in path.read_text(encoding="utf-8").splitlines()]
    return [line for line in lines if line and not line.startswith("#")]


def evolution_problems(committed: list[str], current: list[str]) -> list[str]:
    """What is wrong between the committed field list and the definitions (empty: nothing)."""
    problems = []
    for line in committed:
        if line not in current:
            name = line.split(":", 1)[0]
            now = next((c for c in current if c.split(":", 1)[0] == name), None)
            what = f"changed to {now.split(': ', 1)[1]!r}" if now else "removed"
            problems.append(
                f"{line!r} was {what}: a removal or a type change needs a new format version "
                "(SESSION_FORMAT_VERSION + 1, its own fields file and golden logs; docs/SCHEMAS.md)"
            )
    known_records = {c.split(".", 1)[0] for c in committed}
    for line in current:
        if line not in committed:
            record = line.split(".", 1)[0]
            if line.endswith("?") or record not in known_records:
                problems.append(
                    f"{line!r} is new: add it to {FIELDS.name} (its evolution entry), then regenerate the Avro "
                    "schema (python -m foldline.adapters.avro) and add golden Avro logs of the new schema"
                )
            elif line.split(":", 1)[0] not in {c.split(":", 1)[0] for c in committed}:
                problems.append(
                    f"{line!r} is new and required: a field added to a record of the format version must be optional "
                    "(a record new as a whole, an always-ignorable event type, may have required fields)"
                )
    return problems


def test_the_definitions_hold_every_committed_field_and_no_other() -> None:
    assert evolution_problems(committed_fields(), field_signatures(*EVENT_TYPES)) == []


def test_a_removed_field_a_changed_type_and_a_required_addition_are_refused() -> None:
    committed = committed_fields()
    current = field_signatures(*EVENT_TYPES)
    removed = [c for c in current if not c.startswith("AssistantMessage.providerMessageId")]
    assert any("was removed" in p for p in evolution_problems(committed, removed))
    changed = [c.replace("TurnStart.turn: int", "TurnStart.turn: string") for c in current]
    assert any("changed to 'string'" in p for p in evolution_problems(committed, changed))
    required = [*current, "Usage.flops: int"]
    assert any("must be optional" in p for p in evolution_problems(committed, required))
    optional = [*current, "Usage.flops: int?"]
    assert any("is new: add it" in p for p in evolution_problems(committed, optional))
    assert evolution_problems([*committed, "Usage.flops: int?"], optional) == []
    new_record = [*current, "TurnPause.turn: int"]  # a new always-ignorable event type: required fields allowed
    assert [p for p in evolution_problems(committed, new_record) if "must be optional" in p] == []
    assert any("is new: add it" in p for p in evolution_problems(committed, new_record))
    assert evolution_problems([*committed, "TurnPause.turn: int"], new_record) == []


def sealing_problems(committed: list[str], current: list[str]) -> list[str]:
    """What is wrong between the committed content fields of the sealing version and the content marks."""
    problems = [
        f"{line!r} is no longer marked content: unmarking a logged field needs a new sealing version "
        "(SEAL_VERSION + 1 and its own schemas/sealed.v<N>.txt; docs/SCHEMAS.md)"
        for line in committed
        if line not in current
    ]
    problems += [
        f"{line!r} is marked content but not in {SEALED.name}: add its line if the field is new (its old events do "
        "not have it); marking a field that is already logged needs a new sealing version"
        for line in current
        if line not in committed
    ]
    return problems


def test_the_content_marks_are_the_committed_content_fields_of_the_sealing_version() -> None:
    assert sealing_problems(committed_fields(SEALED), content_fields(*EVENT_TYPES)) == []


def test_a_changed_content_mark_is_refused() -> None:
    committed = committed_fields(SEALED)
    current = content_fields(*EVENT_TYPES)
    assert any("no longer marked" in p for p in sealing_problems(committed, current[1:]))
    assert any("is marked content" in p for p in sealing_problems(committed, [*current, "Usage.input"]))


def test_the_committed_avro_schema_is_the_one_the_definitions_give() -> None:
    """A definition changed: run ``python -m foldline.adapters.avro`` (it keeps the previous schema in
    ``schemas/previous/``) and commit both."""
    assert load_schema_json() == event_schema()
    assert (ROOT / "schemas" / "foldline.session_event.avsc").read_text(encoding="utf-8") == schema_text()


@pytest.mark.parametrize("path", sorted((ROOT / "schemas" / "previous").glob("*.avsc")), ids=lambda p: p.name)
def test_every_previous_schema_is_valid_json(path: Path) -> None:
    assert json.loads(path.read_text(encoding="utf-8"))["name"] == "SessionEvent"
