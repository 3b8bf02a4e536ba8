"""One LangGraph session, measured step by step; prints one JSON object. Runs in .bench/langgraph only.

    .bench/langgraph/bin/python -m benchmarks.vs_langgraph.graph_session --steps 1000 --variant sqlite

The graph is the smallest agent LangGraph offers: a messages state and one ``model`` node that answers at
once (:mod:`.shape`: a 200-character question, a 400-character answer), compiled with a ``SqliteSaver``
on a file, so every ``invoke`` loads the thread's latest checkpoint and writes its new ones. Variants:

* ``sqlite`` — ``messages: Annotated[list, add_messages]``: each checkpoint stores the whole list.
* ``delta`` — ``messages: Annotated[list, DeltaChannel(_messages_delta_reducer)]`` (langgraph >= 1.1,
  beta): checkpoints store only the writes, with a full snapshot every 100 updates (the default), and a
  read replays the writes since the last snapshot. ``_messages_delta_reducer`` is the batch reducer
  LangGraph's own ``DeltaChannel`` example uses for messages.

The connection runs ``PRAGMA synchronous=NORMAL``, the durability of foldline's SQLite log (a commit
survives a process crash, not a power loss); ``sqlite3``'s default, ``FULL``, fsyncs every commit and is
slower still. Per step: the wall time of ``invoke`` minus the time inside the model node, the time the
garbage collector ran inside it, and at each window the database plus WAL size after a ``TRUNCATE``
checkpoint before the last ``--tail`` steps and after them — the same figures as
:mod:`benchmarks.loop_session`. This module imports only the standard library, LangGraph and
:mod:`.shape` (foldline is not installed here).
"""

from __future__ import annotations

import argparse
import gc
import json
import sqlite3
import sys
import tempfile
import time
from pathlib import Path
from typing import Annotated, Any, TypedDict

from langchain_core.messages import AIMessage, HumanMessage  # type: ignore[import-not-found]
from langgraph.channels import DeltaChannel  # type: ignore[import-not-found]
from langgraph.checkpoint.sqlite import SqliteSaver  # type: ignore[import-not-found]
from langgraph.graph import END, START, StateGraph  # type: ignore[import-not-found]
from langgraph.graph.message import _messages_delta_reducer, add_messages  # type: ignore[import-not-found]

from .measure import GcClock, db_size, memory
from .shape import DEFAULT_TAIL, answer_text, question_text

__all__ = ["main", "run_session"]


class _Whole(TypedDict):
    messages: Annotated[list[Any], add_messages]


class _Delta(TypedDict):
    messages: Annotated[list[Any], DeltaChannel(_messages_delta_reducer)]


def run_session(steps: int, variant: str, windows: tuple[int, ...] = (), tail: int = DEFAULT_TAIL) -> dict[str, Any]:
    """Run one thread of ``steps`` invocations and return its measurements."""
    if variant not in ("sqlite", "delta"):
        raise ValueError(f"unknown variant {variant!r}; use sqlite or delta")
    windows = tuple(sorted(set(windows) | {steps}))
    marks = {w - tail: w for w in windows if w - tail >= 0}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "checkpoints.sqlite3"
        conn = sqlite3.connect(str(path), check_same_thread=False)
        conn.execute("PRAGMA synchronous=NORMAL")
        saver = SqliteSaver(conn)
        model_ns = 0
        answered = 0

        def model(state: dict[str, Any]) -> dict[str, Any]:
            nonlocal model_ns, answered
            t = time.perf_counter_ns()
            answered += 1
            reply = {"messages": [AIMessage(answer_text(answered))]}
            model_ns += time.perf_counter_ns() - t
            return reply

        builder = StateGraph(_Whole if variant == "sqlite" else _Delta)
        builder.add_node("model", model)
        builder.add_edge(START, "model")
        builder.add_edge("model", END)
        app = builder.compile(checkpointer=saver)
        config = {"configurable": {"thread_id": "bench"}}

        clock = GcClock()
        step_us: list[float] = []
        gc_us: list[float] = []
        sizes: dict[int, list[int]] = {}

        def mark() -> None:
            done = len(step_us)
            if done in marks:
                sizes.setdefault(marks[done], []).append(db_size(path))
            if done in windows:
                sizes.setdefault(done, []).append(db_size(path))

        start_memory = memory()
        gc.callbacks.append(clock)
        t0 = time.perf_counter()
        try:
            for n in range(1, steps + 1):
                mark()
                question = question_text(n)
                model_ns = 0
                gc0 = clock.ns
                t = time.perf_counter_ns()
                app.invoke({"messages": [HumanMessage(question)]}, config)
                step_us.append((time.perf_counter_ns() - t - model_ns) / 1000)
                gc_us.append((clock.ns - gc0) / 1000)
            mark()
        finally:
            gc.callbacks.remove(clock)
        seconds = time.perf_counter() - t0
        messages = app.get_state(config).values["messages"]
        if len(messages) != 2 * steps or messages[-1].content != answer_text(steps):
            raise AssertionError(f"the thread holds {len(messages)} messages after {steps} steps, not {2 * steps}")
        result = {
            "steps": steps,
            "variant": variant,
            "seconds": seconds,
            "step_us": step_us,
            "gc_us": gc_us,
            "db_bytes": {str(w): v for w, v in sizes.items()},
            "log_bytes": db_size(path),
            "gc_collections": clock.collections,
            "memory_start": start_memory,
            "memory": memory(),
            "gc_tracked_objects": len(gc.get_objects()),
        }
        conn.close()
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.vs_langgraph.graph_session")
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--variant", choices=("sqlite", "delta"), required=True)
    parser.add_argument("--windows", default="", help="comma-separated session lengths to measure growth at")
    parser.add_argument("--tail", type=int, default=DEFAULT_TAIL)
    args = parser.parse_args(argv)
    windows = tuple(int(w) for w in args.windows.split(",") if w)
    json.dump(run_session(args.steps, args.variant, windows, args.tail), sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
