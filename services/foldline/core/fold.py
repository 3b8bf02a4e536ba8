"""The fold a projector keeps per session, as plain data: what a fold store holds and how a batch changes it.

A :class:`FoldState` is everything a dispatcher needs to build a request without the log: the folded
header snapshot, the derived messages as canonical bytes (one entry per visible message, in order), the
last applied seq, the writer epoch of the last applied batch and the surface generation.

:func:`fold_delta` turns one session's batch of envelopes into a :class:`FoldDelta` — appended message
bytes and the latest header, each tagged with its seq so a store can skip what it already applied.
A batch containing a surface replace (compaction, trim) cannot be applied as a delta: the positions it
replaces depend on the session's whole surface, so :func:`fold_delta` returns ``None`` and the caller
rebuilds the fold from the log with :func:`fold_state`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import Any, assert_never

from ..errors import FormatError
from . import codec
from .events import (
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
from .header import EpochHeader
from .projection import Message, Session, derive_event_message
from .sealing import refuse_sealed
from .wire import block_from_json, block_to_json, header_from_json, header_to_json

__all__ = [
    "FoldDelta",
    "FoldState",
    "decode_header",
    "decode_message",
    "encode_header",
    "encode_message",
    "fold_delta",
    "fold_state",
]


def encode_message(message: Message) -> bytes:
    """Canonical bytes of one derived message (sorted keys, no whitespace)."""
    return codec.canonical_json({"role": message.role, "content": [block_to_json(b) for b in message.content]})


_ROLES = frozenset({"user", "assistant", "tool"})


def decode_message(raw: bytes) -> Message:
    """The message of :func:`encode_message`'s bytes; FormatError naming the block that is wrong."""
    try:
        value: Any = codec.loads(raw)
    except ValueError as exc:
        raise FormatError("format", f"a fold message is not JSON: {exc}") from exc
    role = value.get("role") if type(value) is dict else None
    content = value.get("content") if role in _ROLES and len(value) == 2 else None
    if type(content) is not list:
        raise FormatError(
            "format", f"a fold message must be {{role, content}} as written by encode_message, got {raw[:80]!r}"
        )
    return Message(role, tuple([block_from_json(b, f"content[{i}]") for i, b in enumerate(content)]))  # type: ignore[arg-type]


def encode_header(header: EpochHeader) -> bytes:
    return codec.canonical_json(header_to_json(header))


def decode_header(raw: bytes) -> EpochHeader:
    return header_from_json(codec.loads(raw), "header")


@dataclass(frozen=True, slots=True)
class FoldState:
    """One session's fold. ``applied_seq`` is -1 for an empty fold."""

    session_id: str
    applied_seq: int
    epoch: int
    generation: int
    header: bytes | None  # encode_header of the folded header
    header_seq: int | None
    messages: tuple[bytes, ...]  # encode_message of each visible message, in order

    def decoded_header(self) -> EpochHeader | None:
        return None if self.header is None else decode_header(self.header)

    def decoded_messages(self) -> tuple[Message, ...]:
        return tuple(decode_message(m) for m in self.messages)


@dataclass(frozen=True, slots=True)
class FoldDelta:
    """An append-only change to a fold: events ``first_seq..last_seq`` of one writer epoch.

    ``messages`` holds ``(seq, bytes)`` for each surface-appending event; ``header`` the latest
    ``request/header`` of the batch as ``(seq, bytes)``. A store skips entries with ``seq`` at or below
    what it already applied, so a redelivered or overlapping batch is a no-op for the overlap.
    """

    first_seq: int
    last_seq: int
    epoch: int
    messages: tuple[tuple[int, bytes], ...]
    header: tuple[int, bytes] | None

    def __post_init__(self) -> None:
        if not 0 <= self.first_seq <= self.last_seq:
            raise ValueError(
                f"a fold delta covers seqs first..last with 0 <= first <= last, got {self.first_seq}..{self.last_seq}"
            )


def fold_delta(events: Sequence[Envelope], epoch: int) -> FoldDelta | None:
    """The delta of a contiguous batch of one session's events; ``None`` if it holds a surface replace."""
    if not events:
        raise ValueError("fold_delta needs at least one event")
    for prev, cur in pairwise(events):
        if cur.seq != prev.seq + 1:
            raise ValueError(f"fold_delta needs contiguous seqs; {prev.seq} is followed by {cur.seq}")
    messages: list[tuple[int, bytes]] = []
    header: tuple[int, bytes] | None = None
    for env in events:
        if env.sealed is not None:  # erased content never reaches a fold
            refuse_sealed(env)
        data = env.data
        match data:
            case UserMessage() | AssistantMessage() | ToolResult():
                if data.surface_op != "append":
                    return None
                message = derive_event_message(env)
                assert message is not None
                messages.append((env.seq, encode_message(message)))
            case RequestHeader():
                header = (env.seq, encode_header(data.header))
            case (
                TurnStart()
                | TurnEnd()
                | StepStart()
                | StepEnd()
                | ToolCall()
                | RequestDispatch()
                | SessionEndSeed()
                | CompactionStart()
                | CompactionSummary()
                | CompactionEnd()
                | AttachmentQuarantine()
                | LlmRetry()
                | AssistantChunk()
                | SessionErased()
                | ControlEvent()
                | UnknownEvent()
            ):
                pass
            case _:
                assert_never(data)
    return FoldDelta(events[0].seq, events[-1].seq, epoch, tuple(messages), header)


def fold_state(session: Session, epoch: int) -> FoldState:
    """The full fold of a session (the rebuild path after a replace, a flush or a gap)."""
    header = session.header()
    return FoldState(
        session_id=session.id,
        applied_seq=session.next_seq - 1,
        epoch=epoch,
        generation=session.surface_generation,
        header=None if header is None else encode_header(header),
        header_seq=session.header_seq,
        messages=tuple(encode_message(m) for m in session.derive_messages()),
    )
