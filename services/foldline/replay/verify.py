"""``foldline verify``: rebuild every loop request from the log and prove it against its digest.

The walk uses exactly the loop's functions: the same :class:`~foldline.core.Session` fold, the same
:func:`~foldline.replay.step.request_at`, the loop's incremental body cache and the serializer named
(with its version) in each ``request/dispatch`` event. A step whose attachment could not be read is
*unreconstructable*, with the reason — never a match.

Compactions are rechecked too (they are not loop requests, so they do not count as checked): the
logged ``estimatedTokens`` must equal the estimate of the messages at ``compaction/start``; the
summarize one-shot's input is rebuilt by the same pure code from the logged region and serialized for
the logged provider (so every image it references is resolved and verified); and the replacing
``user/message`` must replace exactly the logged range with the content derived from the logged
summary. A compaction that fails any of these is reported as unreconstructable with the reason.

A session whose content was erased (its key destroyed: its events come back sealed, docs/ERASURE.md) is
reported ``erased``: no request of it can be rebuilt, and that is neither a mismatch nor a fault; its
``request/dispatch`` digests are counted, and stay in the log.

Given the log (``read``), the session's sub-agent links are checked at both ends (:mod:`.lineage`); a link the
other log does not confirm is reported as unreconstructable, its reason starting ``lineage:``.

Failed attempts (``llm/retry``) are counted, and each must belong to the request still awaiting its answer —
the last ``request/dispatch`` of the same turn and step, with no answer yet — because every attempt sent that
dispatch's bytes; one anywhere else is reported as unreconstructable.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Literal

from ..collector import collector_paused
from ..core import codec
from ..core import compaction as cc
from ..core.events import (
    AssistantMessage,
    AttachmentQuarantine,
    CompactionEnd,
    CompactionStart,
    CompactionSummary,
    Envelope,
    LlmRetry,
    ReplaceOp,
    RequestDispatch,
    StepEnd,
    StepStart,
    UserMessage,
)
from ..core.header import CallConfig
from ..core.projection import Message, Session
from ..core.request import GenerateOptions
from ..errors import AttachmentError, FoldlineError, ReconstructionError
from ..ports.attachments import AttachmentStore
from ..providers.base import SERIALIZERS, Serializer, serializer_for
from ..providers.framing import IncrementalBody
from .lineage import lineage_problems
from .step import session_request

__all__ = [
    "VERIFY_EXIT_STATUS",
    "Mismatch",
    "Unreconstructable",
    "VerifyReport",
    "VerifyStatus",
    "rebuild_requests",
    "summarize_serializer",
    "verify_events",
]


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


VerifyStatus = Literal["verified", "mismatched", "unreconstructable", "not-verifiable", "erased"]
#: ``foldline verify``'s exit status for each outcome (the worst outcome of any session wins; 2 is an error).
VERIFY_EXIT_STATUS: dict[VerifyStatus, int] = {
    "verified": 0,
    "mismatched": 1,
    "unreconstructable": 3,
    "not-verifiable": 4,
    "erased": 5,
}


@dataclass
class VerifyReport:
    checked: int = 0
    matched: int = 0
    mismatched: list[Mismatch] = field(default_factory=list)
    unreconstructable: list[Unreconstructable] = field(default_factory=list)
    retries: int = 0  # failed attempts (llm/retry events) of the checked requests
    erased: list[str] = field(default_factory=list)  # sessions whose content was erased: nothing to rebuild
    erased_dispatches: int = 0  # the request/dispatch records of those sessions (their digests stay)

    @property
    def ok(self) -> bool:
        return not self.mismatched and not self.unreconstructable and self.checked == self.matched

    @property
    def status(self) -> VerifyStatus:
        """``mismatched`` if any request differs from its digest, else ``unreconstructable`` if any could not
        be rebuilt, else ``not-verifiable`` if nothing was checked (no ``request/dispatch`` records), else
        ``verified``."""
        if self.mismatched:
            return "mismatched"
        if self.unreconstructable:
            return "unreconstructable"
        if self.erased:
            return "erased"
        if self.checked == 0:
            return "not-verifiable"
        return "verified"

    def merge(self, other: VerifyReport) -> None:
        self.checked += other.checked
        self.matched += other.matched
        self.mismatched += other.mismatched
        self.unreconstructable += other.unreconstructable
        self.retries += other.retries
        self.erased += other.erased
        self.erased_dispatches += other.erased_dispatches

    def to_json(self) -> dict[str, object]:
        """The report; ``retries`` appears when some request needed more than one attempt."""
        out: dict[str, object] = {
            "checked": self.checked,
            "matched": self.matched,
            "mismatched": [m.to_json() for m in self.mismatched],
            "unreconstructable": [u.to_json() for u in self.unreconstructable],
        }
        if self.retries:
            out["retries"] = self.retries
        if self.erased:
            out["erased"] = list(self.erased)
        return out


def rebuild_requests(
    session_id: str, events: Iterable[Envelope]
) -> Iterable[tuple[RequestDispatch, int, GenerateOptions]]:
    """Yield (dispatch event, its seq, the request rebuilt from the prefix before it).

    A dispatch with no ``request/header`` before it raises :class:`~foldline.errors.MissingHeader`.
    """
    session = Session(session_id)
    for e in events:
        if isinstance(e.data, RequestDispatch):
            yield e.data, e.seq, session_request(session)
        session.append(e)


def verify_events(
    session_id: str,
    events: Iterable[Envelope],
    attachments: AttachmentStore | None = None,
    *,
    from_seq: int = 0,
    values_checked_before: bool = False,
    read: Callable[[str], list[Envelope]] | None = None,
) -> VerifyReport:
    """Rebuild every loop request of ``events`` (a whole session) and prove it against its recorded digest.

    ``from_seq``: only the requests, compactions and retries at or after it are checked — the events before it
    are folded, not checked (what one loop instance that started there sent: ``foldline resume``);
    ``values_checked_before``: the caller's own load checked the values of those very envelopes (the session
    rules still run on them); ``read`` (a log's ``read``): the session's lineage is checked too — both ends of
    each sub-agent link (:mod:`.lineage`)."""
    with collector_paused():
        return _walk(session_id, events, attachments, from_seq, values_checked_before, read)


def _walk(
    session_id: str,
    events: Iterable[Envelope],
    attachments: AttachmentStore | None,
    from_seq: int,
    values_checked_before: bool,
    read: Callable[[str], list[Envelope]] | None,
) -> VerifyReport:
    events = list(events)
    if any(e.sealed is not None for e in events):  # erased: structure only, nothing can be rebuilt
        dispatches = sum(1 for e in events if isinstance(e.data, RequestDispatch))
        return VerifyReport(erased=[session_id], erased_dispatches=dispatches)
    report = VerifyReport()
    session = Session(session_id)
    step_at: tuple[int, int] = (0, 0)
    compaction: _Compaction | None = None
    # The loop's own incremental body cache, one per serializer: a request's bytes equal a full
    # serialization (tests hold them together), but only the messages since the last one are encoded.
    bodies: dict[tuple[str, int], IncrementalBody] = {}
    awaiting: tuple[int, int] | None = None  # (turn, step) of the dispatch still awaiting its answer
    for e in events:
        data = e.data
        checking = e.seq >= from_seq
        if isinstance(data, RequestDispatch):
            awaiting = (data.turn, data.step)
        elif isinstance(data, AssistantMessage | StepEnd):
            awaiting = None
        elif isinstance(data, LlmRetry) and checking:
            report.retries += 1
            if awaiting != (data.turn, data.step):
                report.unreconstructable.append(
                    Unreconstructable(
                        session_id,
                        data.turn,
                        data.step,
                        e.seq,
                        f"llm/retry of turn {data.turn} step {data.step} follows no request/dispatch of that step "
                        "awaiting its answer, so no logged bytes were resent",
                    )
                )
        if isinstance(data, StepStart):
            step_at = (data.turn, data.step)
        elif isinstance(data, CompactionStart | CompactionSummary | CompactionEnd) or (
            isinstance(data, UserMessage) and data.source == "compaction"
        ):
            compaction, problem = _recheck_compaction(compaction, e, session, attachments)
            if problem is not None and checking:
                report.unreconstructable.append(Unreconstructable(session_id, *step_at, e.seq, problem))
        elif isinstance(data, AttachmentQuarantine) and checking:
            report.checked += 1
            report.unreconstructable.append(
                Unreconstructable(session_id, *step_at, e.seq, f"attachment {data.attachment_id}: {data.failure}")
            )
        elif isinstance(data, RequestDispatch) and checking:
            report.checked += 1
            try:
                request = session_request(session)
                key = (data.serializer, data.serializer_version)
                incremental = bodies.get(key)
                if incremental is None:
                    incremental = bodies[key] = IncrementalBody(serializer_for(*key))
                digest, length = incremental.digest(request, attachments)
            except (AttachmentError, FoldlineError) as exc:
                report.unreconstructable.append(
                    Unreconstructable(session_id, data.turn, data.step, e.seq, f"{type(exc).__name__}: {exc}")
                )
            else:
                if digest == data.digest and length == data.bytes:
                    report.matched += 1
                else:
                    body = serializer_for(data.serializer, data.serializer_version).serialize(request, attachments)
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
        if checking or not values_checked_before:
            session.append(e)
        else:
            session.extend((e,), values_checked=True)
    if read is not None:
        assert isinstance(events, list)
        for seq, reason in lineage_problems(session_id, events, read):
            report.unreconstructable.append(Unreconstructable(session_id, 0, 0, seq, reason))
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


# ---------------------------------------------------------------------------- compaction recheck

#: The serializer a summarize one-shot was sent with when its ``compaction/summary`` predates the
#: ``serializer`` field: those logs were written when these were the only versions, so they stay pinned.
_PROVIDER_SERIALIZERS = {"anthropic": ("anthropic-messages", 1), "openai": ("openai-chat", 1)}


@dataclass(slots=True)
class _Compaction:
    start_seq: int
    start: int
    end: int
    region: tuple[Message, ...]
    summary: str | None = None


def summarize_serializer(provider: str) -> Serializer:
    """The serializer a summarize one-shot for ``provider`` is rebuilt with when the log does not name it."""
    key = _PROVIDER_SERIALIZERS.get(provider)
    if key is None or key not in SERIALIZERS:
        raise ReconstructionError(
            f"no serializer for provider {provider!r} in this foldline build, and the compaction/summary names none"
        )
    return serializer_for(*key)


def _recheck_compaction(
    pending: _Compaction | None, e: Envelope, session: Session, attachments: AttachmentStore | None
) -> tuple[_Compaction | None, str | None]:
    """Advance the compaction being rechecked by one event; returns the new state and any problem."""
    data = e.data
    where = f"compaction at seq {pending.start_seq}" if pending is not None else f"seq {e.seq}"
    if isinstance(data, CompactionStart):
        messages = session.derive_messages()
        estimate = cc.estimate_tokens(messages)
        if not 0 <= data.start <= data.end < len(messages):
            return None, (
                f"compaction at seq {e.seq}: range {data.start}..{data.end} is outside the {len(messages)} visible "
                "messages"
            )
        state = _Compaction(e.seq, data.start, data.end, tuple(messages[data.start : data.end + 1]))
        if estimate != data.estimated_tokens:
            return state, (
                f"compaction at seq {e.seq}: estimatedTokens {data.estimated_tokens} differs from the estimate "
                f"{estimate} of the logged messages"
            )
        return state, None
    if pending is None:
        return None, f"{where}: {e.type} without a compaction/start before it"
    if isinstance(data, CompactionSummary):
        pending.summary = data.summary
        try:
            config = CallConfig(data.provider, data.model, max_tokens=data.max_tokens)
            request = cc.summarize_request(pending.region, config, data.prompt_version or 1)
            if data.serializer is not None and data.serializer_version is not None:
                serializer = serializer_for(data.serializer, data.serializer_version)
            else:
                serializer = summarize_serializer(data.provider)
            body = serializer.serialize(request, attachments)
        except (FoldlineError, ValueError) as exc:
            return pending, f"{where}: the summarize input cannot be rebuilt: {type(exc).__name__}: {exc}"
        if data.input_digest is not None and codec.digest_bytes(body) != data.input_digest:
            return pending, (
                f"{where}: the rebuilt summarize body has digest {codec.digest_bytes(body)}, the log recorded "
                f"{data.input_digest} for the body that was sent"
            )
        return pending, None
    if isinstance(data, UserMessage):
        if data.surface_op != ReplaceOp(pending.start, pending.end):
            return pending, (
                f"{where}: the replacing user/message at seq {e.seq} does not replace the logged range "
                f"{pending.start}..{pending.end}"
            )
        if pending.summary is None or data.content != cc.summary_content(pending.summary):
            return pending, (
                f"{where}: the replacing user/message at seq {e.seq} is not the content derived from the "
                "logged compaction/summary"
            )
        return pending, None
    return None, None  # compaction/end
