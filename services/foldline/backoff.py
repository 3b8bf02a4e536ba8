"""Back-off: how long to wait before trying again something that failed or is not there yet, written once.

A :class:`Backoff` is a schedule with explicit limits: the first pause ``initial_s``, each next one ``factor``
times the last, never more than ``cap_s``; with ``jitter`` above 0 each pause is cut by a random fraction of
up to ``jitter`` of it (drawn from the ``rng`` a caller passes, so a test can fix it; the process's shared
random source otherwise). :meth:`Backoff.pause` is the pause after a number of failures in a row. One run of
waits is either

* :meth:`Backoff.pauses` — no deadline (a worker that keeps retrying until it is stopped): :meth:`Pauses.next`
  is the pause before the next attempt, :meth:`Pauses.reset` starts again from ``initial_s`` after a success;
* :meth:`Backoff.until` — under a deadline: :meth:`Waits.next` is the pause before the next attempt, or
  ``None`` when that attempt would begin after the deadline (an outage waited out for ``outage_s``: the
  caller gives up and raises what it caught). With ``clip=True`` (a wait for something that will come, such
  as a fold reaching a seq) the last pause is cut to end at the deadline, so the last look happens then, and
  ``None`` comes once the deadline has passed.

Nothing here sleeps: the caller sleeps the pause its own way (``time.sleep``, ``asyncio.sleep``, or an
``Event.wait`` that a stop interrupts). The clock of :meth:`Backoff.until` is injectable too.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field

__all__ = ["OUTAGE", "Backoff", "Pauses", "Waits"]


@dataclass(frozen=True, slots=True)
class Backoff:
    """Pauses of ``initial_s``, times ``factor`` after each failure, at most ``cap_s``, each cut at random by up
    to ``jitter`` of it (see the module docstring)."""

    initial_s: float
    cap_s: float
    factor: float = 2.0
    jitter: float = 0.0
    _steps_to_cap: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not 0 <= self.initial_s <= self.cap_s:
            raise ValueError(f"a back-off needs 0 <= initial_s <= cap_s, got {self.initial_s!r} and {self.cap_s!r}")
        if self.factor < 1:
            raise ValueError(f"a back-off's factor must be at least 1, got {self.factor!r}")
        if not 0 <= self.jitter <= 1:
            raise ValueError(f"a back-off's jitter must be within [0, 1], got {self.jitter!r}")
        steps = 0
        if self.factor > 1 and 0 < self.initial_s < self.cap_s:
            steps = math.ceil(math.log(self.cap_s / self.initial_s, self.factor))
        object.__setattr__(self, "_steps_to_cap", steps)  # past this many, every pause is the cap

    def pause(self, failures: int, rng: random.Random | None = None) -> float:
        """The pause after ``failures`` failed attempts in a row (1: ``initial_s``)."""
        base = min(self.cap_s, self.initial_s * self.factor ** min(max(failures - 1, 0), self._steps_to_cap))
        if self.jitter:
            base *= 1.0 - self.jitter * (rng.random() if rng is not None else random.random())
        return base

    def pauses(self, *, rng: random.Random | None = None) -> Pauses:
        """One run with no deadline."""
        return Pauses(self, rng)

    def until(
        self,
        deadline_s: float,
        *,
        clip: bool = False,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
    ) -> Waits:
        """One run that ends ``deadline_s`` seconds from now (by ``clock``)."""
        return Waits(self, deadline_s, clip=clip, clock=clock, rng=rng)


#: A dependency that does not answer (Kafka, Redis, S3, the log): 50 ms, doubling, at most 2 s between tries.
OUTAGE = Backoff(initial_s=0.05, cap_s=2.0)


class Pauses:
    """One run of a :class:`Backoff` with no deadline."""

    __slots__ = ("_backoff", "_failures", "_rng", "last")

    def __init__(self, backoff: Backoff, rng: random.Random | None = None) -> None:
        self._backoff = backoff
        self._rng = rng
        self._failures = 0
        self.last = 0.0  # the pause the last :meth:`next` answered

    @property
    def failures(self) -> int:
        """Failures since the start or the last :meth:`reset`."""
        return self._failures

    def next(self) -> float:
        """Count a failure; the pause before the next attempt."""
        self._failures += 1
        self.last = self._backoff.pause(self._failures, self._rng)
        return self.last

    def reset(self) -> None:
        """An attempt succeeded: the next failure pauses ``initial_s`` again."""
        self._failures = 0


class Waits:
    """One run of a :class:`Backoff` under a deadline (see the module docstring)."""

    __slots__ = ("_clip", "_clock", "_deadline", "_pauses")

    def __init__(
        self,
        backoff: Backoff,
        deadline_s: float,
        *,
        clip: bool = False,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
    ) -> None:
        self._pauses = Pauses(backoff, rng)
        self._clip = clip
        self._clock = clock
        self._deadline = clock() + deadline_s

    @property
    def failures(self) -> int:
        return self._pauses.failures

    def remaining(self) -> float:
        """Seconds left until the deadline (negative once it passed)."""
        return self._deadline - self._clock()

    def next(self) -> float | None:
        """Count a failure; the pause before the next attempt, or ``None``: give up (the deadline)."""
        pause = self._pauses.next()
        left = self.remaining()
        if self._clip:
            return min(pause, left) if left > 0 else None
        return pause if pause <= left else None

    def reset(self) -> None:
        """An attempt succeeded: the next failure pauses ``initial_s`` again (the deadline stays)."""
        self._pauses.reset()
