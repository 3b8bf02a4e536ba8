"""The FoldStore port: per-session folds (header, derived message bytes, applied seq, epoch, generation).

A fold store is a cache. Correctness never depends on it surviving: a flushed or lost fold is rebuilt
from the event log (:func:`foldline.core.fold.fold_state`).

Contract (``tests/contracts/fold_store.py`` runs it against every adapter):

* ``apply(session, delta)`` is atomic and idempotent, fenced by seq and writer epoch. Let ``A`` be the
  applied seq (-1 for none):

  - ``delta.last_seq <= A`` → ``duplicate``; nothing changes (redelivery).
  - ``delta.first_seq > A + 1`` → ``gap``; nothing changes; ``expected_seq`` is ``A + 1``. Gaps are
    reported, never papered over — the caller rebuilds from the log.
  - ``delta.epoch`` below the stored epoch → ``fenced``; nothing changes (a stale writer's events).
  - otherwise → ``applied``: entries with ``seq <= A`` are skipped, the rest appended, the header
    replaced if the delta carries a newer one, ``A`` becomes ``delta.last_seq`` and the epoch
    ``max(stored, delta.epoch)``.
* ``put(state)`` replaces the whole fold (the rebuild path after a surface replace, a flush or a gap) if
  ``state.applied_seq >= A`` and ``state.epoch >=`` the stored epoch, else returns ``duplicate`` /
  ``fenced`` and changes nothing.
* ``apply_many([(session, delta), ...])`` is ``apply`` for each pair, in order, with one result each;
  adapters batch the round trips (each session's delta stays atomic on its own).
* ``raise_epoch(session, epoch)`` records a writer lease seen in the log: the fold's epoch becomes
  ``max(stored, epoch)`` so a later event of an older epoch is ``fenced``; no-op without a fold.
* ``get`` returns the whole fold or ``None``; ``applied_seq`` returns ``A`` (-1 when unknown).
* ``tail(session, generation=g, known=k)`` is ``get`` for a caller that already holds the first ``k``
  messages of the fold at surface generation ``g``: while the fold is still at generation ``g`` and holds
  at least ``k`` messages (a fold only appends between surface replaces, so those ``k`` are unchanged) it
  returns only the messages after them (``offset = k``); otherwise all of them (``offset = 0``).

* ``erase(session)`` replaces the fold by a tombstone that holds no content (no header, no message) with
  applied seq and epoch :data:`ERASED`: every later ``apply`` of the session is ``duplicate`` and every ``put``
  ``fenced``, so a projector still holding the session's key (for up to its cache time) cannot fold its
  content back in. ``get`` returns the tombstone (``applied_seq == ERASED``).
* ``notices()`` (optional) is a subscription to the sessions whose folds changed: an adapter that can push
  them (Redis pub/sub) answers an :class:`AppliedNotices`; ``None`` (the default) means none are sent and a
  waiter polls. Notices are a hint, never the truth: one may be lost (a dropped subscription, a restart), so a
  waiter still looks at the fold itself, and looks again after a bounded pause when no notice came.

What is not a fold store lives elsewhere: the projectors' partition marks, kept beside the folds, are their
own port (:mod:`foldline.ports.partition_marks`); waiting until a fold reaches a seq is the dispatcher's
(:class:`foldline.dispatcher.FoldWatcher` for many sessions at once, :func:`foldline.dispatcher.wait_for_fold`
for one).
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from ..core.fold import FoldDelta, FoldState

__all__ = ["ERASED", "AppliedNotices", "ApplyResult", "ApplyStatus", "FoldStore", "FoldTail"]

#: The applied seq and epoch of an erased session's fold (2^53: exact in a Lua number, beyond any real seq).
ERASED = 1 << 53

ApplyStatus = Literal["applied", "duplicate", "gap", "fenced"]


@dataclass(frozen=True, slots=True)
class ApplyResult:
    status: ApplyStatus
    applied_seq: int  # the store's applied seq after the call
    expected_seq: int | None = None  # for a gap: the seq the store needed next
    previous_seq: int | None = None  # for an apply: the applied seq before it (events past it were new)


@dataclass(frozen=True, slots=True)
class FoldTail:
    """A fold as :meth:`FoldStore.tail` returns it: everything but the messages before ``offset``."""

    session_id: str
    applied_seq: int
    epoch: int
    generation: int
    header: bytes | None
    header_seq: int | None
    offset: int  # the fold's messages before this index are the ones the caller said it holds
    messages: tuple[bytes, ...]  # the fold's messages from ``offset`` on

    @staticmethod
    def of(state: FoldState, generation: int, known: int) -> FoldTail:
        offset = known if state.generation == generation and len(state.messages) >= known else 0
        return FoldTail(
            state.session_id,
            state.applied_seq,
            state.epoch,
            state.generation,
            state.header,
            state.header_seq,
            offset,
            state.messages[offset:],
        )


class AppliedNotices(abc.ABC):
    """A subscription to the sessions whose folds a store changed (:meth:`FoldStore.notices`).

    ``start(on_applied)`` calls ``on_applied(session_ids)`` from a thread of the subscription for each notice,
    and ``on_applied(None)`` whenever notices may have been missed (the subscription was (re)established):
    the subscriber then looks at every fold it waits for. Delivery is at most once."""

    @abc.abstractmethod
    def start(self, on_applied: Callable[[Sequence[str] | None], None]) -> None:
        """Begin delivering notices to ``on_applied``."""

    @abc.abstractmethod
    def close(self) -> None:
        """Stop delivering (bounded: returns within a few seconds)."""


class FoldStore(abc.ABC):
    @abc.abstractmethod
    def apply(self, session_id: str, delta: FoldDelta) -> ApplyResult:
        """Apply an append-only delta (see the module contract)."""

    def apply_many(self, deltas: Sequence[tuple[str, FoldDelta]]) -> list[ApplyResult]:
        """``apply`` each ``(session, delta)`` in order; one result per pair."""
        return [self.apply(session_id, delta) for session_id, delta in deltas]

    @abc.abstractmethod
    def raise_epoch(self, session_id: str, epoch: int) -> None:
        """A newer writer leased the session: fence older epochs from now on (no-op without a fold)."""

    def raise_epochs(self, epochs: Mapping[str, int]) -> None:
        """``raise_epoch`` for each session; adapters batch the round trips."""
        for session_id, epoch in epochs.items():
            self.raise_epoch(session_id, epoch)

    @abc.abstractmethod
    def put(self, state: FoldState) -> ApplyResult:
        """Replace a session's whole fold (rebuild), fenced by seq and epoch."""

    @abc.abstractmethod
    def get(self, session_id: str) -> FoldState | None:
        """The session's fold, or None if the store has none."""

    def tail(self, session_id: str, *, generation: int, known: int) -> FoldTail | None:
        """The fold minus the ``known`` messages of ``generation`` the caller holds (see the module contract).

        Default: through :meth:`get`; adapters fetch only the messages past ``known``."""
        state = self.get(session_id)
        return None if state is None else FoldTail.of(state, generation, known)

    def tails(self, requests: Sequence[tuple[str, int, int]]) -> list[FoldTail | None]:
        """:meth:`tail` for many ``(session, generation, known)`` at once; adapters batch the round trips."""
        return [self.tail(sid, generation=generation, known=known) for sid, generation, known in requests]

    def applied_seqs(self, session_ids: Sequence[str]) -> dict[str, int]:
        """:meth:`applied_seq` of many sessions at once (-1 without a fold); adapters batch the round trips."""
        return {sid: self.applied_seq(sid) for sid in session_ids}

    @abc.abstractmethod
    def applied_seq(self, session_id: str) -> int:
        """The last applied seq of the session, -1 if the store has no fold for it."""

    @abc.abstractmethod
    def delete(self, session_id: str) -> None:
        """Forget one session's fold (it will be rebuilt from the log)."""

    @abc.abstractmethod
    def erase(self, session_id: str) -> None:
        """Replace the session's fold by the erased tombstone (see the module contract)."""

    def notices(self) -> AppliedNotices | None:
        """A new subscription to the sessions whose folds change, or None when this store sends none."""
        return None

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release resources."""
