"""A recorded session, read as the script a replay follows.

:class:`Recording` is a session's events and the attachment store its images live in, taken from a log
(:meth:`Recording.from_log`) or an export file (:meth:`Recording.from_export`, checked exactly as an import).

:func:`script_of` reads the events once into what the replayed agent is given and what it is compared with:

* **turns and steps** — each step's *inputs* (the ``user/message`` events its opening entered, with their
  sources: whatever was typed, injected, returned by a hook or a tool's additional context), its
  ``request/dispatch`` (the digest the changed agent's body is compared with), its answer and its tool results;
  a turn's end reason; which turns open a new loop instance (a ``request/header`` with reason ``initial`` or
  ``resume`` in their first step);
* **pressure actions** — the trims and compactions the recorded loop made before a step, each with the
  numbers a :class:`~foldline.loop.pressure.PressurePolicy` needs to make the same one;
* **calls** — every provider call in log order: the loop requests and the compactions' summarize one-shots;
* **the seed** — a fork child's events up to and including its ``session/end-seed`` and what the fork wrote
  after it. They are its parent's history, not its own: the replay starts from them, as the child's first loop
  instance did, and replays the child's own requests. (Replay the parent for the others.)

Anything a loop does not write in the replayed part (a ``request/header`` outside a step, a message outside a
step's opening) or cannot be made to write again (an answer cut off by a cancelled stream) is
:class:`~foldline.errors.NotReplayable`, naming the seq.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, assert_never

from ..core.events import (
    AssistantChunk,
    AssistantMessage,
    AttachmentQuarantine,
    CompactionEnd,
    CompactionStart,
    CompactionSummary,
    ControlEvent,
    Envelope,
    LlmRetry,
    RequestDispatch,
    RequestHeader,
    SessionEndSeed,
    SessionErased,
    StepEnd,
    StepStart,
    ToolCall,
    ToolResult,
    TurnEnd,
    TurnStart,
    UnknownEvent,
    UserMessage,
)
from ..core.header import EpochHeader, HeaderReason
from ..errors import InputError, NothingToReplay, NotReplayable, SessionNotFound
from ..loop.inbox import InboxItem
from ..ports.attachments import AttachmentStore
from ..ports.event_log import EventLog

__all__ = [
    "PressureAction",
    "RecordedCall",
    "RecordedCompaction",
    "RecordedStep",
    "RecordedTrims",
    "RecordedTurn",
    "Recording",
    "Script",
    "script_of",
]

#: User-message sources the loop writes itself (never fed to the replayed agent: it writes them again).
LOOP_SOURCES = frozenset({"refusal-reset", "compaction"})


@dataclass(frozen=True, slots=True)
class Recording:
    """A recorded session: its id, its events, where its attachment objects are, and where it came from."""

    session_id: str
    events: Sequence[Envelope]
    attachments: AttachmentStore | None = None
    origin: str = "log"

    @classmethod
    def from_log(cls, log: EventLog, session_id: str, attachments: AttachmentStore | None = None) -> Recording:
        events = log.read(session_id)
        if not events:
            raise SessionNotFound(session_id)
        return cls(session_id, events, attachments, "log")

    @classmethod
    def from_export(
        cls, path: Path, *, attachments_dir: Path | None = None, attachments: AttachmentStore | None = None
    ) -> Recording:
        """The session of an export file (``foldline export``), checked line by line as an import is.

        Images come from ``attachments_dir`` (a directory in the embedded store's layout, as ``export
        --attachments`` writes) or ``attachments``; without either, a session with images cannot be serialized.
        """
        from ..adapters.fs_attachments import FilesystemAttachmentStore
        from ..adapters.memory_attachments import MemoryAttachmentStore
        from ..adapters.memory_log import MemoryEventLog
        from ..errors import ImportFailed
        from ..export import import_session

        log = MemoryEventLog()
        store: AttachmentStore = attachments if attachments is not None else MemoryAttachmentStore()
        bundle: AttachmentStore | None = None
        if attachments_dir is not None:
            if not attachments_dir.is_dir():
                raise InputError(f"--attachments {attachments_dir} is not a directory of attachment objects")
            bundle = FilesystemAttachmentStore(attachments_dir, read_only=True)
            store = MemoryAttachmentStore()
        try:
            with path.open("rb") as fp:
                summary = import_session(log, fp, attachments=store, bundle=bundle)
        except ImportFailed as exc:
            raise InputError(f"export {path}: line {exc.line}: {exc.reason}; it cannot be replayed") from None
        except IsADirectoryError:
            raise InputError(f"export {path} is a directory; pass an export file (foldline export)") from None
        except OSError as exc:
            raise InputError(f"cannot read export {path}: {exc.strerror or exc}") from None
        return cls(summary.session_id, log.read(summary.session_id), store, str(path))


# ---------------------------------------------------------------------------- the script


@dataclass(slots=True)
class RecordedStep:
    """One recorded step: what entered it, its request's digest, its answer and its tool results."""

    turn: int
    step: int
    start_seq: int
    opening_end: int  # the seq after its opening's last step/start, user/message or request/header
    inputs: list[InboxItem] = field(default_factory=list)
    header_reason: HeaderReason | None = None
    header: EpochHeader | None = None  # the header snapshot its opening wrote, if any
    dispatch_seq: int | None = None
    dispatch: RequestDispatch | None = None
    request_index: int | None = None  # its position among the replayed requests
    quarantine_seq: int | None = None
    answer_seq: int | None = None
    answer: AssistantMessage | None = None
    results: list[ToolResult] = field(default_factory=list)

    @property
    def boundary(self) -> int:
        """The seq its request is built at: its dispatch (or quarantine), else the end of what it logged."""
        if self.dispatch_seq is not None:
            return self.dispatch_seq
        if self.quarantine_seq is not None:
            return self.quarantine_seq
        return self.opening_end


@dataclass(slots=True)
class RecordedTurn:
    turn: int
    start_seq: int
    steps: list[RecordedStep] = field(default_factory=list)
    end_reason: str | None = None  # None: the recording ends inside it

    @property
    def opens_instance(self) -> bool:
        """Whether a new loop instance began with it (its first step wrote an ``initial``/``resume`` header)."""
        return bool(self.steps) and self.steps[0].header_reason in ("initial", "resume")


@dataclass(frozen=True, slots=True)
class RecordedCompaction:
    """A compaction: its ``compaction/start`` and its summary (None when the summarize call failed)."""

    seq: int
    start: int
    end: int
    estimated_tokens: int
    summary: CompactionSummary | None


@dataclass(frozen=True, slots=True)
class RecordedTrims:
    """One batch of tool-result trims: (seq, event) of each single-entry replace."""

    seq: int
    trims: tuple[tuple[int, ToolResult], ...]


PressureAction = RecordedCompaction | RecordedTrims


@dataclass(frozen=True, slots=True)
class RecordedCall:
    """One provider call: a loop request (``step``) or a compaction's summarize one-shot (``compaction``)."""

    kind: Literal["step", "summarize"]
    seq: int
    step: RecordedStep | None = None
    compaction: RecordedCompaction | None = None


@dataclass(slots=True)
class Script:
    session_id: str
    events: Sequence[Envelope]
    seed_end: int  # events[:seed_end] are a fork child's seed (0: none)
    turns: list[RecordedTurn]
    actions: dict[tuple[int, int], PressureAction]  # (turn, step index) → the action taken before that step
    calls: list[RecordedCall]
    requests: int  # loop requests (request/dispatch records) replayed

    @property
    def parent(self) -> SessionEndSeed | None:
        if self.seed_end == 0:
            return None
        return next(e.data for e in reversed(self.events[: self.seed_end]) if isinstance(e.data, SessionEndSeed))


def _seed_end(events: Sequence[Envelope]) -> int:
    """Where a fork child's own events begin: its first ``turn/start`` after its last ``session/end-seed``."""
    last = next((i for i in range(len(events) - 1, -1, -1) if isinstance(events[i].data, SessionEndSeed)), None)
    if last is None:
        return 0
    return next((i for i in range(last + 1, len(events)) if isinstance(events[i].data, TurnStart)), len(events))


def script_of(session_id: str, events: Sequence[Envelope]) -> Script:
    """Read a recorded session into the script of its replay (see the module docstring)."""
    seed_end = _seed_end(events)
    if not any(isinstance(e.data, RequestDispatch) for e in events[seed_end:]):
        where = " after its fork seed" if seed_end else ""
        raise NothingToReplay(
            session_id, f"it holds no request/dispatch record{where}, so there is no recorded request to compare with"
        )
    turns: list[RecordedTurn] = []
    actions: dict[tuple[int, int], PressureAction] = {}
    calls: list[RecordedCall] = []
    turn: RecordedTurn | None = None
    step: RecordedStep | None = None
    opening = False  # inside a step's opening (before its dispatch)
    compaction: tuple[int, CompactionStart] | None = None
    summary: CompactionSummary | None = None
    trims: list[tuple[int, ToolResult]] = []
    requests = 0

    def refuse(seq: int, why: str) -> NotReplayable:
        return NotReplayable(session_id, seq, why)

    def slot(seq: int, what: str) -> tuple[int, int]:
        if turn is None or step is not None:
            raise refuse(seq, f"{what} outside a turn's steps: the loop makes one only between two steps of a turn")
        key = (turn.turn, len(turn.steps))
        if key in actions:
            raise refuse(seq, f"a second pressure action before turn {key[0]} step {key[1]}; the loop makes one")
        return key

    def flush_trims() -> None:
        if trims:
            first = trims[0][0]
            actions[slot(first, "a tool-result trim")] = RecordedTrims(first, tuple(trims))
            trims.clear()

    for e in events[seed_end:]:
        data, seq = e.data, e.seq
        if trims and not (isinstance(data, ToolResult) and data.surface_op != "append"):
            flush_trims()
        match data:
            case TurnStart():
                turn = RecordedTurn(data.turn, seq)
                turns.append(turn)
                step = None
            case TurnEnd():
                if turn is not None:
                    turn.end_reason = data.reason
                turn, step = None, None
            case StepStart():
                if turn is None:
                    raise refuse(seq, "a step/start outside a turn")
                step = RecordedStep(data.turn, data.step, seq, seq + 1)
                turn.steps.append(step)
                opening = True
            case UserMessage():
                if data.source == "compaction":
                    continue  # the replacing message of a compaction (the loop writes it again)
                if step is None or not opening:
                    raise refuse(seq, "a user/message outside a step's opening, which no loop writes")
                step.opening_end = seq + 1
                if data.source not in LOOP_SOURCES:
                    step.inputs.append(InboxItem(data.content, data.source))
            case RequestHeader():
                if step is None or not opening:
                    raise refuse(seq, "a request/header outside a step, which no loop writes")
                if data.reason in ("initial", "resume") and step.step != 0:
                    raise refuse(seq, f"a {data.reason} header in step {step.step}; a loop instance writes it first")
                step.header_reason, step.header, step.opening_end = data.reason, data.header, seq + 1
            case RequestDispatch():
                if step is None or not opening:
                    raise refuse(seq, "a request/dispatch outside a step's opening")
                step.dispatch_seq, step.dispatch, step.request_index = seq, data, requests
                requests += 1
                opening = False
                calls.append(RecordedCall("step", seq, step=step))
            case AttachmentQuarantine():
                if compaction is not None:
                    calls[:] = [c for c in calls if c.seq != compaction[0]]  # its one-shot was never sent
                elif step is not None:
                    step.quarantine_seq = seq
                    opening = False
            case AssistantMessage():
                if step is None:
                    raise refuse(seq, "an assistant/message outside a step")
                if data.stop_reason == "interrupted":
                    raise refuse(
                        seq,
                        "the answer was cut off by a cancelled turn; a replay cannot cancel the changed agent at "
                        "the same byte, so it cannot follow the recording past it",
                    )
                step.answer_seq, step.answer = seq, data
            case ToolResult():
                if data.surface_op != "append":
                    trims.append((seq, data))
                elif step is None:
                    raise refuse(seq, "a tool/result outside a step")
                else:
                    step.results.append(data)
            case StepEnd():
                step = None
            case CompactionStart():
                compaction = (seq, data)
                summary = None
                calls.append(RecordedCall("summarize", seq))
            case CompactionSummary():
                summary = data
            case CompactionEnd():
                if compaction is not None:
                    start_seq, start = compaction
                    done = RecordedCompaction(start_seq, start.start, start.end, start.estimated_tokens, summary)
                    actions[slot(start_seq, "a compaction")] = done
                    calls[:] = [
                        RecordedCall("summarize", c.seq, compaction=done) if c.seq == start_seq else c for c in calls
                    ]
                compaction = None
            case SessionEndSeed():
                raise refuse(seq, "a session/end-seed after the session's own events began")
            case ToolCall() | LlmRetry() | AssistantChunk() | SessionErased() | ControlEvent() | UnknownEvent():
                pass  # the tool calls are the answer's blocks; retries, chunks, erasure marks, approvals, inbox
                # claims, recoveries and lineage are not model-visible (a claim's messages are the step's inputs)
            case _:
                assert_never(data)
    flush_trims()
    return Script(session_id, events, seed_end, turns, actions, calls, requests)
