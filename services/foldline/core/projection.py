"""From events to what the model sees: per-event projection, the surface fold and the cached Session.

``derive_event_message`` is the one public per-event function. ``fold_messages`` folds it over a log
prefix with no cache (what an external reconstructor or the invariant companion runs);
``Session`` caches the same fold — each surface entry is projected once, when first seen, and a surface
replace rebuilds the list under a new generation. Both paths share ``derive_event_message`` and the
surface rules, so they cannot disagree.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Literal, assert_never, overload

from .content import ContentBlock, ToolResultBlock
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
from .sealing import refuse_sealed
from .validation import LogRules

__all__ = [
    "Message",
    "MessageSequence",
    "Session",
    "derive_event_message",
    "fold_messages",
    "fold_request_header",
]

Role = Literal["user", "assistant", "tool"]


@dataclass(frozen=True, slots=True)
class Message:
    """One model-visible message. Tool results are messages of role ``tool`` with one result block."""

    role: Role
    content: tuple[ContentBlock, ...]


def derive_event_message(event: Envelope) -> Message | None:
    """Project one event to the message it contributes; non-surface events project to nothing.

    An event whose content is still sealed (its key was erased) is :class:`~foldline.errors.ContentErased`:
    no message is ever made of a sealed token."""
    if event.sealed is not None:
        refuse_sealed(event)
    data = event.data
    match data:
        case UserMessage():
            return Message("user", data.content)
        case AssistantMessage():
            return Message("assistant", data.content)
        case ToolResult():
            return Message("tool", (ToolResultBlock(data.call_id, data.content, data.is_error),))
        case (
            TurnStart()
            | TurnEnd()
            | StepStart()
            | StepEnd()
            | ToolCall()
            | RequestHeader()
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
            return None
        case _:
            assert_never(data)


class MessageSequence(Sequence[Message]):
    """An immutable snapshot of a message list: O(1) to create, shares the frozen messages.

    It views the first ``length`` items of a list that is only ever appended to while this generation
    lives (a surface replace builds a new list), so the snapshot never changes under its holder.
    """

    __slots__ = ("_items", "_len")
    _items: list[Message]
    _len: int

    def __init__(self, items: list[Message], length: int) -> None:
        object.__setattr__(self, "_items", items)
        object.__setattr__(self, "_len", length)

    def __setattr__(self, name: str, value: object) -> None:
        raise TypeError("MessageSequence is immutable")

    def __len__(self) -> int:
        return self._len

    @overload
    def __getitem__(self, index: int) -> Message: ...
    @overload
    def __getitem__(self, index: slice) -> tuple[Message, ...]: ...
    def __getitem__(self, index: int | slice) -> Message | tuple[Message, ...]:
        if isinstance(index, slice):
            return tuple(self._items[: self._len][index])
        if index < 0:
            index += self._len
        if not 0 <= index < self._len:
            raise IndexError("message index out of range")
        return self._items[index]

    def __iter__(self) -> Iterator[Message]:
        items = self._items
        for i in range(self._len):
            yield items[i]

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Sequence) and not isinstance(other, str | bytes):
            return len(other) == self._len and all(a == b for a, b in zip(self, other, strict=False))
        return NotImplemented

    def __hash__(self) -> int:
        return hash(tuple(self))

    def __repr__(self) -> str:
        return f"MessageSequence(len={self._len})"

    def to_tuple(self) -> tuple[Message, ...]:
        return tuple(self._items[: self._len])

    def backing_list(self) -> object:
        """Identity of the list this snapshot views: equal for snapshots of one surface generation."""
        return self._items


def fold_messages(events: Iterable[Envelope]) -> tuple[Message, ...]:
    """Fresh, uncached fold of a log prefix into its messages (validates as it goes)."""
    session = Session("fold")
    session.extend(events)
    return session.derive_messages().to_tuple()


def fold_request_header(events: Iterable[Envelope]) -> EpochHeader | None:
    """The latest ``request/header`` snapshot in ``events``, or None."""
    latest: EpochHeader | None = None
    for e in events:
        if isinstance(e.data, RequestHeader):
            refuse_sealed(e)
            latest = e.data.header
    return latest


class Session:
    """A session's message and header folds, kept up to date as its events arrive.

    ``extend`` validates a batch all-or-nothing and projects each new surface entry once.
    ``derive_messages`` returns a fresh immutable snapshot in O(1). The events themselves are not kept
    (the log has them): a long session holds its derived messages and the rules' small state, nothing more.
    """

    __slots__ = ("_header", "_header_seq", "_messages", "_rules", "id", "projections")

    def __init__(self, session_id: str, events: Iterable[Envelope] = ()) -> None:
        self.id = session_id
        self._rules = LogRules()
        self._messages: list[Message] = []
        self._header: EpochHeader | None = None
        self._header_seq: int | None = None
        self.projections = 0  # how many times derive_event_message ran (observability + tests)
        self.extend(events)

    # -------------------------------------------------------------- reading

    @property
    def next_seq(self) -> int:
        return self._rules.next_seq

    @property
    def surface_generation(self) -> int:
        return self._rules.surface_generation

    @property
    def rules(self) -> LogRules:
        return self._rules

    def derive_messages(self) -> MessageSequence:
        return MessageSequence(self._messages, len(self._messages))

    def header(self) -> EpochHeader | None:
        """``fold_request_header`` of the whole log (cached)."""
        return self._header

    @property
    def header_seq(self) -> int | None:
        return self._header_seq

    # -------------------------------------------------------------- writing

    def extend(self, events: Iterable[Envelope], *, values_checked: bool = False) -> None:
        """Validate and fold ``events`` (``values_checked``: see :meth:`LogRules.check_batch`)."""
        batch = list(events)
        if not batch:
            return
        for env in batch:
            if env.sealed is not None:  # erased content: nothing a model sees may be built from it
                refuse_sealed(env, self.id)
        changes = self._rules.check_batch(batch, values_checked=values_checked)
        # Rules accepted the whole batch: project it. Projection itself cannot fail.
        for env, change in zip(batch, changes, strict=True):
            if isinstance(env.data, RequestHeader):
                self._header = env.data.header
                self._header_seq = env.seq
            if change is None:
                continue
            message = derive_event_message(env)
            self.projections += 1
            assert message is not None
            start, end = change
            if start == end == len(self._messages):
                self._messages.append(message)
            else:
                # A replace: new generation, new list (old snapshots keep the old list).
                self._messages = [*self._messages[:start], message, *self._messages[end + 1 :]]

    def append(self, event: Envelope) -> None:
        self.extend((event,))
