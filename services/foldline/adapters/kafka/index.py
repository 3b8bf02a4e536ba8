"""The session index (``<topic>.index``): entry and chunk codec, and the session state an entry describes.

A session's entry holds its lease epoch, its owner (the transactional id allowed to write it) and where
its events are: the offsets of the first ``sealed`` events in ``chunks`` chunk records
(``<session>\\xff<n>``, runs ``[start, count]`` of offsets, written once), the rest as a ``tail`` of runs,
then a ``pending`` batch (entries of older writers, found by a short scan). An entry therefore stays
small however long the session grows. docs/KAFKA.md, "Reading one session: the index".
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ...core import codec as canonical
from ...errors import FormatError

__all__ = [
    "CHUNK_MARK",
    "CHUNK_RUNS",
    "IndexEntry",
    "PendingBatch",
    "SessionState",
    "chunk_key",
    "decode_chunk",
    "decode_index",
    "encode_chunk",
    "encode_index",
    "expand",
    "next_entry",
    "runs",
]

CHUNK_RUNS = 32  # runs in an entry's tail before they are sealed into a chunk record
CHUNK_MARK = b"\xff"  # never in UTF-8: chunk keys cannot collide with a session id


@dataclass(slots=True)
class PendingBatch:
    """A batch an index entry was committed with, without its offsets (entries of older writers)."""

    batch: str
    min_offset: int
    count: int


@dataclass(slots=True)
class IndexEntry:
    """A session's index entry: epoch, owner, and where its events are (see the module docstring)."""

    epoch: int = 0
    next_seq: int = 0
    owner: str | None = None
    chunks: int = 0
    sealed: int = 0
    tail: list[list[int]] = field(default_factory=list)
    pending: PendingBatch | None = None


@dataclass(slots=True)
class SessionState:
    """A session's state with every event's data offset (by seq): what reads and the owner work with."""

    epoch: int = 0
    offsets: list[int] = field(default_factory=list)
    owner: str | None = None
    chunks: int = 0
    sealed: int = 0
    tail: list[list[int]] = field(default_factory=list)

    @property
    def next_seq(self) -> int:
        return len(self.offsets)

    def entry(self, epoch: int | None = None, owner: str | None = None) -> IndexEntry:
        return IndexEntry(
            self.epoch if epoch is None else epoch,
            len(self.offsets),
            self.owner if owner is None else owner,
            self.chunks,
            self.sealed,
            [list(r) for r in self.tail],
        )


def runs(offsets: Sequence[int], into: list[list[int]] | None = None) -> list[list[int]]:
    """``offsets`` as runs ``[start, count]``, appended to ``into`` (whose last run may grow)."""
    out = into if into is not None else []
    for off in offsets:
        if out and out[-1][0] + out[-1][1] == off:
            out[-1][1] += 1
        else:
            out.append([off, 1])
    return out


def expand(offset_runs: Iterable[Sequence[int]]) -> list[int]:
    out: list[int] = []
    for start, count in offset_runs:
        out.extend(range(start, start + count))
    return out


def chunk_key(session_id: str, n: int) -> bytes:
    return session_id.encode() + CHUNK_MARK + str(n).encode()


def encode_index(entry: IndexEntry) -> bytes:
    pending = entry.pending
    value: dict[str, Any] = {
        "v": 2,
        "epoch": entry.epoch,
        "nextSeq": entry.next_seq,
        "chunks": entry.chunks,
        "sealed": entry.sealed,
        "offsets": entry.tail,
        "pending": None
        if pending is None
        else {"batch": pending.batch, "minOffset": pending.min_offset, "count": pending.count},
    }
    if entry.owner is not None:
        value["owner"] = entry.owner
    return canonical.canonical_json(value)


def encode_chunk(n: int, offset_runs: list[list[int]]) -> bytes:
    return canonical.canonical_json({"v": 2, "chunk": n, "offsets": offset_runs})


def _runs_of(value: Any) -> list[list[int]]:
    out = [[int(start), int(count)] for start, count in value]
    if any(count < 1 or start < 0 for start, count in out):
        raise ValueError("bad offset run")
    return out


def decode_index(raw: bytes) -> IndexEntry:
    try:
        value = canonical.loads(raw)
        tail = _runs_of(value["offsets"])
        p = value["pending"]
        pending = None if p is None else PendingBatch(str(p["batch"]), int(p["minOffset"]), int(p["count"]))
        owner = value.get("owner")
        chunks, sealed = int(value.get("chunks", 0)), int(value.get("sealed", 0))  # v1 entries have neither
        next_seq = int(value["nextSeq"])
        if next_seq != sealed + sum(c for _, c in tail) + (pending.count if pending else 0):
            raise ValueError("nextSeq disagrees with the offsets")
        return IndexEntry(
            int(value["epoch"]), next_seq, None if owner is None else str(owner), chunks, sealed, tail, pending
        )
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise FormatError("kafka-index", f"malformed session index entry: {exc}") from exc


def decode_chunk(raw: bytes) -> list[list[int]]:
    try:
        return _runs_of(canonical.loads(raw)["offsets"])
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise FormatError("kafka-index", f"malformed session index chunk: {exc}") from exc


def next_entry(
    base: SessionState, epoch: int, owner: str, offsets: Sequence[int]
) -> tuple[IndexEntry, list[list[int]] | None]:
    """The entry after appending ``offsets`` to ``base``, and the chunk to seal with it (if any)."""
    # only the last run can grow: the others are shared with the base entry, never changed
    tail = runs(offsets, [*base.tail[:-1], list(base.tail[-1])] if base.tail else [])
    next_seq = base.next_seq + len(offsets)
    if len(tail) > CHUNK_RUNS:
        return IndexEntry(epoch, next_seq, owner, base.chunks + 1, next_seq, []), tail
    return IndexEntry(epoch, next_seq, owner, base.chunks, base.sealed, tail), None
