"""The in-process fold store and partition marks: the embedded default, and the reference the Redis ones are
tested against."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Sequence

from ..core.fold import FoldDelta, FoldState
from ..ports.fold_store import ERASED, ApplyResult, FoldStore
from ..ports.partition_marks import PartitionMarks

__all__ = ["MemoryFoldStore", "MemoryPartitionMarks"]


class MemoryFoldStore(FoldStore):
    def __init__(self) -> None:
        self._folds: dict[str, FoldState] = {}
        self._lock = threading.Lock()

    def apply(self, session_id: str, delta: FoldDelta) -> ApplyResult:
        with self._lock:
            cur = self._folds.get(session_id)
            applied = -1 if cur is None else cur.applied_seq
            epoch = -1 if cur is None else cur.epoch
            if delta.last_seq <= applied:
                return ApplyResult("duplicate", applied)
            if delta.first_seq > applied + 1:
                return ApplyResult("gap", applied, applied + 1)
            if delta.epoch < epoch:
                return ApplyResult("fenced", applied)
            messages = (() if cur is None else cur.messages) + tuple(m for s, m in delta.messages if s > applied)
            header, header_seq = (None, None) if cur is None else (cur.header, cur.header_seq)
            if delta.header is not None and delta.header[0] > applied:
                header_seq, header = delta.header
            self._folds[session_id] = FoldState(
                session_id,
                delta.last_seq,
                max(epoch, delta.epoch),
                0 if cur is None else cur.generation,
                header,
                header_seq,
                messages,
            )
            return ApplyResult("applied", delta.last_seq, previous_seq=applied)

    def raise_epoch(self, session_id: str, epoch: int) -> None:
        with self._lock:
            cur = self._folds.get(session_id)
            if cur is not None and epoch > cur.epoch:
                self._folds[session_id] = dataclasses.replace(cur, epoch=epoch)

    def put(self, state: FoldState) -> ApplyResult:
        with self._lock:
            cur = self._folds.get(state.session_id)
            if cur is not None:
                if state.epoch < cur.epoch:
                    return ApplyResult("fenced", cur.applied_seq)
                if state.applied_seq < cur.applied_seq:
                    return ApplyResult("duplicate", cur.applied_seq)
            self._folds[state.session_id] = state
            return ApplyResult("applied", state.applied_seq)

    def get(self, session_id: str) -> FoldState | None:
        with self._lock:
            return self._folds.get(session_id)

    def applied_seq(self, session_id: str) -> int:
        with self._lock:
            cur = self._folds.get(session_id)
            return -1 if cur is None else cur.applied_seq

    def delete(self, session_id: str) -> None:
        with self._lock:
            self._folds.pop(session_id, None)

    def erase(self, session_id: str) -> None:
        with self._lock:
            self._folds[session_id] = FoldState(session_id, ERASED, ERASED, 0, None, None, ())


class MemoryPartitionMarks(PartitionMarks):
    def __init__(self) -> None:
        self._marks: dict[tuple[str, int], str] = {}
        self._lock = threading.Lock()

    def marks(self, topic: str, partitions: Sequence[int]) -> dict[int, str]:
        with self._lock:
            return {p: self._marks[(topic, p)] for p in partitions if (topic, p) in self._marks}

    def set_mark(self, topic: str, partition: int, mark: str, *, expect: str | None = None) -> bool:
        with self._lock:
            if expect is not None and self._marks.get((topic, partition)) != expect:
                return False
            self._marks[(topic, partition)] = mark
            return True
