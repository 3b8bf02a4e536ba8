"""The cyclic garbage collector paused while a process builds many long-lived objects at once.

Decoding a session's archive or folding a loaded session builds tens of thousands of objects that all live
on (events, messages) and hold no reference cycles: the collector's passes over them — and over everything
else the process holds — find nothing, and cost a 20,000-event fold or read tens of milliseconds, at times
over a hundred. :func:`collector_paused` turns it off for the duration (nested and threaded uses share one
pause) and back on when the last one ends, unless the process had turned it off itself. Reference counting
frees as before.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["collector_paused"]


class _Pause:
    """The one pause of the process: how many blocks are inside it, and whether to turn the collector back on."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.depth = 0
        self.resume = False

    @contextmanager
    def __call__(self) -> Iterator[None]:
        with self.lock:
            if self.depth == 0:
                self.resume = gc.isenabled()
                gc.disable()
            self.depth += 1
        try:
            yield
        finally:
            with self.lock:
                self.depth -= 1
                if self.depth == 0 and self.resume:
                    gc.enable()


collector_paused = _Pause()
"""``with collector_paused():`` — the cyclic collector off inside the block (see the module docstring)."""
