"""Where a running process's coroutines wait: its asyncio tasks, grouped by the stack each is suspended at.

A loop process holding a thousand sessions that stops making progress shows nothing useful to a thread
dump (``py-spy dump``): its one event-loop thread sits in ``select`` while every session waits in a coroutine.
:func:`task_stacks` names those waits — each distinct stack once, with how many tasks wait there, most
common first — and :func:`dump_tasks_on_signal` prints them when the process gets ``SIGUSR1``
(``kill -USR1 PID``), leaving it running: ``foldline fleet`` and ``foldline dispatcher`` install it.
"""

from __future__ import annotations

import asyncio
import signal
import sys
from collections import Counter
from typing import Any, TextIO

__all__ = ["dump_tasks_on_signal", "task_stacks"]

#: Frames shown per stack (outermost first); deeper stacks are cut at their inner end.
_FRAMES = 40
#: Distinct stacks shown; the rest are counted in one line.
_STACKS = 30


def _awaits(task: asyncio.Task[Any]) -> tuple[str, ...]:
    """The chain of coroutines ``task`` is suspended in, outermost first, and what the innermost awaits.

    (``Task.get_stack`` gives only the outermost frame of a suspended coroutine; the chain is followed
    through each coroutine's ``cr_await``.)"""
    out: list[str] = []
    awaited: Any = task.get_coro()
    while awaited is not None and len(out) < _FRAMES:
        frame = (
            getattr(awaited, "cr_frame", None)
            or getattr(awaited, "gi_frame", None)
            or getattr(awaited, "ag_frame", None)
        )
        if frame is None:  # a future, a task, or something else that is awaitable
            kind = type(awaited).__qualname__
            out.append("awaiting a Future" if kind in ("FutureIter", "Future") else f"awaiting a {kind}")
            break
        out.append(f"{frame.f_code.co_name} ({frame.f_code.co_filename}:{frame.f_lineno})")
        awaited = (
            getattr(awaited, "cr_await", None)
            or getattr(awaited, "gi_yieldfrom", None)
            or getattr(awaited, "ag_await", None)
        )
    return tuple(out)


def task_stacks(loop: asyncio.AbstractEventLoop | None = None) -> str:
    """Every task of ``loop`` (the running one by default) grouped by where it waits, one block per stack."""
    tasks = asyncio.all_tasks(loop)
    stacks: Counter[tuple[str, ...]] = Counter()
    names: dict[tuple[str, ...], str] = {}
    for task in tasks:
        frames = _awaits(task)
        stacks[frames] += 1
        names.setdefault(frames, task.get_name())
    lines = [f"{len(tasks)} asyncio task(s) in {len(stacks)} distinct stack(s), most common first:"]
    for frames, count in stacks.most_common(_STACKS):
        lines.append(f"{count} task(s), e.g. {names[frames]!r}, waiting at:")
        lines += [f"    {frame}" for frame in frames] or ["    (not started, or done)"]
    if len(stacks) > _STACKS:
        rest = sum(n for _, n in stacks.most_common()[_STACKS:])
        lines.append(f"... and {rest} task(s) in {len(stacks) - _STACKS} other stack(s)")
    return "\n".join(lines) + "\n"


def dump_tasks_on_signal(loop: asyncio.AbstractEventLoop, stream: TextIO | None = None) -> bool:
    """Print :func:`task_stacks` to ``stream`` (stderr) whenever the process gets ``SIGUSR1``; returns whether
    the handler was installed (a platform without ``SIGUSR1`` or signal handlers on its event loop has none)."""
    usr1 = getattr(signal, "SIGUSR1", None)
    if usr1 is None:
        return False

    def dump() -> None:
        out = stream or sys.stderr
        out.write(task_stacks(loop))
        out.flush()

    try:
        loop.add_signal_handler(usr1, dump)
    except (NotImplementedError, RuntimeError, ValueError):  # not the main thread, or no such support
        return False
    return True
