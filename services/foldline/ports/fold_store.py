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
* ``wait_for(session, seq, timeout_s)`` returns the fold once ``A >= seq``, or raises
  :class:`~foldline.errors.FoldTimeout` after ``timeout_s`` — a bounded wait, never a hang.
"""

from __future__ import annotations

import abc
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from ..core.fold import FoldDelta, FoldState
from ..errors import FoldTimeout

__all__ = ["ApplyResult", "ApplyStatus", "FoldStore"]

ApplyStatus = Literal["applied", "duplicate", "gap", "fenced"]


@dataclass(frozen=True, slots=True)
class ApplyResult:
    status: ApplyStatus
    applied_seq: int  # the store's applied seq after the call
    expected_seq: int | None = None  # for a gap: the seq the store needed next
    previous_seq: int | None = None  # for an apply: the applied seq before it (events past it were new)


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

    @abc.abstractmethod
    def applied_seq(self, session_id: str) -> int:
        """The last applied seq of the session, -1 if the store has no fold for it."""

    @abc.abstractmethod
    def delete(self, session_id: str) -> None:
        """Forget one session's fold (it will be rebuilt from the log)."""

    def wait_for(self, session_id: str, seq: int, timeout_s: float) -> FoldState:
        """Block until the fold has applied ``seq``; :class:`FoldTimeout` after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        pause = 0.0005
        while True:
            if self.applied_seq(session_id) >= seq:
                state = self.get(session_id)
                if state is not None and state.applied_seq >= seq:
                    return state
            now = time.monotonic()
            if now >= deadline:
                raise FoldTimeout(
                    f"session {session_id!r}: the fold has applied seq {self.applied_seq(session_id)}, not {seq}, "
                    f"after {timeout_s:.3f}s; check that a projector is running and consuming the session's partition"
                )
            time.sleep(min(pause, deadline - now))
            pause = min(pause * 2, 0.02)

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release resources."""
