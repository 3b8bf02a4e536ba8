"""What a replay reports: per session identical or the first divergence (what differs, where, what it costs),
and over all sessions a status for CI (exit 0 / 1), JSON and JUnit XML.

A divergence is one of:

* ``header`` — the changed request's header differs: every differing field by its logged name
  (``system``, ``config.model``, ``tools[1].description``, ``tools[0].inputSchema.properties.q.type``), with
  the system prompt's unified diff and the tools added, removed or changed by name;
* ``messages`` — the header is the same, a message differs: its index and its first differing field;
* ``body`` — header and messages are equal and the wire bytes still differ (a serializer or an image);
* ``compaction`` — a compaction's summarize one-shot differs (fields by their wire paths);
* ``sequence`` — the changed agent made another kind of call than the recording at that point (it compacted
  where the recording did not, or the other way round).

Each carries the byte offset of the first difference in the body, with context, and — for a loop request —
the cost of the change (:mod:`.cost`). ``cause`` is ``change`` when a second run of the same agent diverged
identically, ``nondeterministic`` when the two runs of the same agent built different requests: ``unstable``
then names the fields that changed between them (a timestamp in the system prompt, a random id in a schema).
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from typing import Any, Literal

from ..core import codec
from ..core.content import Usage
from ..core.diff import diff_headers
from ..core.request_diff import (
    ByteDifference,
    FieldChange,
    first_byte_difference,
    first_message_change,
    header_changes,
    json_changes,
)
from ..core.wire import usage_to_json
from .change import Change
from .cost import ChangeCost, CostSummary, change_cost, summarize_costs
from .engine import Found, recorded_body
from .recording import Recording

__all__ = [
    "Divergence",
    "DivergenceKind",
    "LiveResult",
    "ReplayReport",
    "SessionReplay",
    "divergence_of",
    "unstable_fields",
]

DivergenceKind = Literal["header", "messages", "body", "compaction", "sequence"]
#: Lines of the system prompt's unified diff a divergence's detail shows (the JSON has every line).
_SYSTEM_DIFF_LINES = 12
#: Wire-path changes listed for a summarize one-shot that differs.
_WIRE_CHANGES = 8


@dataclass(frozen=True, slots=True)
class Divergence:
    """The first recorded call the changed agent did not make identically."""

    kind: DivergenceKind
    seq: int  # the recorded request/dispatch (or compaction/start)
    turn: int | None
    step: int | None
    request: int | None  # the recorded loop request's index among the session's replayed ones (0: its first)
    fields: tuple[FieldChange, ...] = ()
    message_index: int | None = None
    system_diff: tuple[str, ...] = ()
    tools_added: tuple[str, ...] = ()
    tools_removed: tuple[str, ...] = ()
    tools_changed: tuple[str, ...] = ()
    byte: ByteDifference | None = None
    cost: ChangeCost | None = None
    note: str | None = None
    cause: Literal["change", "nondeterministic"] = "change"
    unstable: tuple[FieldChange, ...] = ()

    @property
    def where(self) -> str:
        if self.turn is not None and self.step is not None:
            return f"turn {self.turn} step {self.step} (seq {self.seq})"
        return f"the compaction at seq {self.seq}"

    def summary(self) -> str:
        """One line: where, what differs, and at which byte."""
        if self.kind == "sequence":
            what = self.note or "another call than the recording's"
        elif self.kind == "messages" and self.fields:
            what = f"message {self.message_index} differs at {self.fields[0].path}"
        elif self.kind == "body":
            what = "the body differs (header and messages are equal)"
        else:
            paths = [f.path for f in self.fields]
            shown = ", ".join(paths[:4]) + (f" and {len(paths) - 4} more" if len(paths) > 4 else "")
            what = f"{'the summarize one-shot' if self.kind == 'compaction' else 'header'} differs in {shown}"
        at = f"; body byte {self.byte.offset}" if self.byte is not None else ""
        cause = ""
        if self.cause == "nondeterministic":
            cause = "; NOT DETERMINISTIC: two runs of the same agent differ in " + ", ".join(
                f.path for f in self.unstable
            )
        return f"{self.where}: {what}{at}{cause}"

    def lines(self) -> list[str]:
        """The detail, one fact a line."""
        out = [self.summary()]
        if self.kind == "header":
            for f in self.fields:
                if f.path != "system":
                    out.append(f"  {f.describe()}")
            if self.system_diff:
                out.append("  system prompt:")
                out += [f"    {line}" for line in self.system_diff[:_SYSTEM_DIFF_LINES]]
                if len(self.system_diff) > _SYSTEM_DIFF_LINES:
                    out.append(
                        f"    … {len(self.system_diff) - _SYSTEM_DIFF_LINES} more lines (the JSON report has all)"
                    )
        elif self.fields:
            out += [f"  {f.describe()}" for f in self.fields]
        if self.byte is not None:
            b = self.byte
            out.append(f"  body byte {b.offset} (of {b.old_length} recorded, {b.new_length} changed):")
            out.append(f"    recorded: …{b.old_context.decode('utf-8', 'replace')}…")
            out.append(f"    changed:  …{b.new_context.decode('utf-8', 'replace')}…")
        if self.cost is not None:
            c = self.cost
            source = "provider counts" if c.measured else "estimates"
            out.append(
                f"  cacheable prefix: {c.prefix.share:.1%} of the request ({c.prefix.shared_tokens} of "
                f"{c.prefix.total_tokens} estimated tokens, {c.prefix.shared_bytes} of {c.prefix.total_bytes} bytes"
                + (f", up to {c.prefix.stops_at}" if c.prefix.stops_at else "")
                + ")"
            )
            out.append(
                f"  cache writes the change costs here: {c.cache_write_tokens} tokens ({source}: read "
                f"{c.cache_read_tokens}, still cacheable {c.cacheable_tokens})"
            )
        for f in self.unstable:
            out.append(f"  differs between two runs of the same agent: {f.describe()}")
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "seq": self.seq,
            "turn": self.turn,
            "step": self.step,
            "request": self.request,
            "fields": [f.to_json() for f in self.fields],
            "messageIndex": self.message_index,
            "systemDiff": list(self.system_diff),
            "toolsAdded": list(self.tools_added),
            "toolsRemoved": list(self.tools_removed),
            "toolsChanged": list(self.tools_changed),
            "byte": self.byte.to_json() if self.byte is not None else None,
            "cost": self.cost.to_json() if self.cost is not None else None,
            "note": self.note,
            "cause": self.cause,
            "unstable": [f.to_json() for f in self.unstable],
            "summary": self.summary(),
        }


@dataclass(frozen=True, slots=True)
class LiveResult:
    """The continuation past a divergence: a fork child of the recorded session, run against a provider."""

    child: str
    parent: str
    seed_length: int
    written: bool  # True: in the configured log; False: in memory only
    turns: int
    steps: int
    usage: Usage
    verified: int
    checked: int

    def to_json(self) -> dict[str, Any]:
        return {
            "child": self.child,
            "parent": self.parent,
            "seedLength": self.seed_length,
            "written": self.written,
            "turns": self.turns,
            "steps": self.steps,
            "usage": usage_to_json(self.usage),
            "verified": self.verified,
            "checked": self.checked,
        }


@dataclass(frozen=True, slots=True)
class SessionReplay:
    """One session's replay: identical through all its recorded requests, or its first divergence."""

    session: str
    origin: str  # "log", or the export file
    status: Literal["identical", "diverged", "skipped"]
    requests: int  # recorded loop requests in the replayed part
    compared: int  # of them, built identically before the divergence (all of them when identical)
    seconds: float
    parent: str | None = None  # a fork child's parent: its seed is the parent's history
    divergence: Divergence | None = None
    live: LiveResult | None = None
    skipped: str | None = None

    def summary(self) -> str:
        if self.status == "skipped":
            return f"{self.session}: skipped: {self.skipped}"
        if self.divergence is None:
            return f"{self.session}: identical ({self.compared}/{self.requests} requests)"
        return f"{self.session}: diverged at {self.divergence.summary()}"

    def to_json(self) -> dict[str, Any]:
        return {
            "session": self.session,
            "origin": self.origin,
            "status": self.status,
            "requests": self.requests,
            "identical": self.compared,
            "seconds": round(self.seconds, 6),
            "parent": self.parent,
            "divergence": self.divergence.to_json() if self.divergence is not None else None,
            "live": self.live.to_json() if self.live is not None else None,
            "skipped": self.skipped,
        }


@dataclass(frozen=True)
class ReplayReport:
    """Every replayed session and the verdict: ``identical`` (exit 0) or ``diverged`` (exit 1)."""

    sessions: tuple[SessionReplay, ...]
    change: Change = field(default_factory=Change)

    @property
    def status(self) -> Literal["identical", "diverged"]:
        return "diverged" if any(s.status == "diverged" for s in self.sessions) else "identical"

    @property
    def exit_code(self) -> int:
        return 1 if self.status == "diverged" else 0

    @property
    def identical(self) -> bool:
        return self.status == "identical"

    @property
    def cost(self) -> CostSummary:
        replayed = [s for s in self.sessions if s.status != "skipped"]
        return summarize_costs(len(replayed), (s.divergence.cost for s in replayed if s.divergence is not None))

    def session(self, session_id: str) -> SessionReplay:
        return next(s for s in self.sessions if s.session == session_id)

    def assert_identical(self) -> None:
        """Raise ``AssertionError`` with every divergence when a session diverged (for test suites)."""
        if not self.identical:
            detail = [line for s in self.sessions if s.divergence is not None for line in _session_lines(s)]
            raise AssertionError("replay diverged:\n" + "\n".join(detail))

    def to_json(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "change": self.change.to_json(),
            "sessions": [s.to_json() for s in self.sessions],
            "cost": self.cost.to_json(),
        }

    def junit_xml(self) -> bytes:
        """A JUnit XML report: one test case per session; a divergence is a failure, a skip a skipped case."""
        failures = sum(1 for s in self.sessions if s.status == "diverged")
        skipped = sum(1 for s in self.sessions if s.status == "skipped")
        total = f"{sum(s.seconds for s in self.sessions):.6f}"
        counts = {"tests": str(len(self.sessions)), "failures": str(failures), "errors": "0", "time": total}
        root = ET.Element("testsuites", {"name": "foldline replay", **counts})
        suite = ET.SubElement(root, "testsuite", {"name": "foldline replay", **counts, "skipped": str(skipped)})
        props = ET.SubElement(suite, "properties")
        ET.SubElement(
            props, "property", {"name": "change", "value": codec.canonical_json(self.change.to_json()).decode()}
        )
        for s in self.sessions:
            case = ET.SubElement(
                suite, "testcase", {"classname": "foldline.replay", "name": s.session, "time": f"{s.seconds:.6f}"}
            )
            if s.status == "skipped":
                ET.SubElement(case, "skipped", {"message": s.skipped or ""})
            elif s.divergence is not None:
                failure = ET.SubElement(case, "failure", {"type": "divergence", "message": s.divergence.summary()})
                failure.text = "\n".join(_session_lines(s))
            else:
                ET.SubElement(case, "system-out").text = s.summary()
        xml: bytes = ET.tostring(root, encoding="utf-8", xml_declaration=True)
        return xml + b"\n"


def _session_lines(s: SessionReplay) -> list[str]:
    assert s.divergence is not None
    return [f"{s.session}: diverged at {s.divergence.lines()[0]}", *s.divergence.lines()[1:]]


# ---------------------------------------------------------------------------- building one


def divergence_of(found: Found, recording: Recording) -> Divergence:
    """The divergence a run found, with the recorded side rebuilt from the log and checked against its digest."""
    call = found.call
    step = call.step if call is not None else None
    turn, step_no = (step.turn, step.step) if step is not None else (None, None)
    seq = call.seq if call is not None else 0
    request = step.request_index if step is not None else None
    if found.note is not None:
        return Divergence("sequence", seq, turn, step_no, request, note=found.note)
    if found.sent == "step":
        assert step is not None
        assert found.recorded_request is not None
        assert found.changed_request is not None
        recorded, changed = found.recorded_request, found.changed_request
        byte = first_byte_difference(recorded_body(recording, step, recorded), found.changed_body)
        usage = step.answer.usage if step.answer is not None else None
        cost = change_cost(recorded, changed, usage, found.previous_recorded)
        fields = header_changes(recorded.header, changed.header)
        if fields:
            names = diff_headers(recorded.header, changed.header)
            return Divergence(
                "header",
                seq,
                turn,
                step_no,
                request,
                fields,
                system_diff=names.system,
                tools_added=names.tools_added,
                tools_removed=names.tools_removed,
                tools_changed=names.tools_changed,
                byte=byte,
                cost=cost,
            )
        message = first_message_change(recorded.messages, changed.messages)
        if message is not None:
            index, change = message
            return Divergence("messages", seq, turn, step_no, request, (change,), index, byte=byte, cost=cost)
        return Divergence("body", seq, turn, step_no, request, byte=byte, cost=cost)
    assert found.summarize is not None
    summarize, serializer = found.summarize
    body = serializer.serialize(summarize, recording.attachments)
    wire = json_changes(codec.loads(body), codec.loads(found.changed_body))[:_WIRE_CHANGES]
    return Divergence(
        "compaction", seq, turn, step_no, None, tuple(wire), byte=first_byte_difference(body, found.changed_body)
    )


def unstable_fields(first: Found, second: Found) -> tuple[FieldChange, ...]:
    """What two runs of the same agent built differently at the same call (empty: they built the same)."""
    a, b = first.changed_request, second.changed_request
    if a is not None and b is not None:
        fields = header_changes(a.header, b.header)
        if fields:
            return fields
        message = first_message_change(a.messages, b.messages)
        if message is not None:
            return (message[1],)
    if first.changed_body == second.changed_body:
        return ()
    try:
        return tuple(json_changes(codec.loads(first.changed_body), codec.loads(second.changed_body))[:_WIRE_CHANGES])
    except ValueError:
        return (FieldChange("body", len(first.changed_body), len(second.changed_body)),)
