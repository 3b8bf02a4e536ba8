"""``foldline verify``: rebuild every loop request from the log and prove it against its digest.

The walk uses exactly the loop's functions: the same :class:`~foldline.core.Session` fold,
:func:`~foldline.core.build_request`, and the serializer named (with its version) in each
``request/dispatch`` event. A step whose attachment could not be read is *unreconstructable*, with
the reason — never a match.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from .core import codec
from .core.events import AttachmentQuarantine, Envelope, RequestDispatch, StepStart
from .core.projection import Session
from .core.request import GenerateOptions, build_request
from .errors import AttachmentError, FoldlineError
from .ports.attachments import AttachmentStore
from .providers.base import serializer_for

__all__ = ["Mismatch", "Unreconstructable", "VerifyReport", "rebuild_requests", "verify_events"]


@dataclass(frozen=True, slots=True)
class Mismatch:
    session: str
    turn: int
    step: int
    seq: int
    recorded: str
    rebuilt: str
    first_diff_offset: int | None  # None when the original body was not archived

    def to_json(self) -> dict[str, object]:
        return {
            "session": self.session,
            "turn": self.turn,
            "step": self.step,
            "seq": self.seq,
            "recorded": self.recorded,
            "rebuilt": self.rebuilt,
            "firstDiffOffset": self.first_diff_offset,
        }


@dataclass(frozen=True, slots=True)
class Unreconstructable:
    session: str
    turn: int
    step: int
    seq: int
    reason: str

    def to_json(self) -> dict[str, object]:
        return {"session": self.session, "turn": self.turn, "step": self.step, "seq": self.seq, "reason": self.reason}


@dataclass
class VerifyReport:
    checked: int = 0
    matched: int = 0
    mismatched: list[Mismatch] = field(default_factory=list)
    unreconstructable: list[Unreconstructable] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.mismatched and not self.unreconstructable and self.checked == self.matched

    def merge(self, other: VerifyReport) -> None:
        self.checked += other.checked
        self.matched += other.matched
        self.mismatched += other.mismatched
        self.unreconstructable += other.unreconstructable

    def to_json(self) -> dict[str, object]:
        return {
            "checked": self.checked,
            "matched": self.matched,
            "mismatched": [m.to_json() for m in self.mismatched],
            "unreconstructable": [u.to_json() for u in self.unreconstructable],
        }


def rebuild_requests(
    session_id: str, events: Iterable[Envelope]
) -> Iterable[tuple[RequestDispatch, int, GenerateOptions]]:
    """Yield (dispatch event, its seq, the request rebuilt from the prefix before it)."""
    session = Session(session_id)
    for e in events:
        if isinstance(e.data, RequestDispatch):
            header = session.header()
            if header is None:
                raise FoldlineError(f"session {session_id!r}: request/dispatch at seq {e.seq} has no header before it")
            yield e.data, e.seq, build_request(session.derive_messages(), header)
        session.append(e)


def verify_events(
    session_id: str, events: Iterable[Envelope], attachments: AttachmentStore | None = None
) -> VerifyReport:
    report = VerifyReport()
    session = Session(session_id)
    step_at: tuple[int, int] = (0, 0)
    for e in events:
        data = e.data
        if isinstance(data, StepStart):
            step_at = (data.turn, data.step)
        elif isinstance(data, AttachmentQuarantine):
            report.checked += 1
            report.unreconstructable.append(
                Unreconstructable(session_id, *step_at, e.seq, f"attachment {data.attachment_id}: {data.failure}")
            )
        elif isinstance(data, RequestDispatch):
            report.checked += 1
            header = session.header()
            if header is None:
                report.unreconstructable.append(
                    Unreconstructable(session_id, data.turn, data.step, e.seq, "no request/header before this request")
                )
            else:
                request = build_request(session.derive_messages(), header)
                try:
                    body = serializer_for(data.serializer, data.serializer_version).serialize(request, attachments)
                except (AttachmentError, FoldlineError) as exc:
                    report.unreconstructable.append(
                        Unreconstructable(session_id, data.turn, data.step, e.seq, f"{type(exc).__name__}: {exc}")
                    )
                else:
                    digest = codec.digest_bytes(body)
                    if digest == data.digest and len(body) == data.bytes:
                        report.matched += 1
                    else:
                        report.mismatched.append(
                            Mismatch(
                                session_id,
                                data.turn,
                                data.step,
                                e.seq,
                                data.digest,
                                digest,
                                _first_diff(body, data.digest, attachments),
                            )
                        )
        session.append(e)
    return report


def _first_diff(body: bytes, recorded: str, attachments: AttachmentStore | None) -> int | None:
    """Offset of the first differing byte against the archived original, when it was archived."""
    if attachments is None or not attachments.exists(recorded):
        return None
    try:
        original = attachments.get(recorded)
    except AttachmentError:
        return None
    for i, (a, b) in enumerate(zip(original, body, strict=False)):
        if a != b:
            return i
    return min(len(original), len(body))
