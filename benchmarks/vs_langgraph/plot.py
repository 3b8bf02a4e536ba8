"""Draws the comparison: per-step time and bytes per step against session length. Runs in .bench/langgraph.

    .bench/langgraph/bin/python -m benchmarks.vs_langgraph.plot figures.json docs/images/loop-vs-langgraph.png

``figures.json`` is ``{"title": str, "series": [{"label", "lengths", "step_us", "bytes_per_step"}]}`` as
``benchmarks/bench_langgraph.py`` writes it. Both axes are logarithmic: the systems differ by orders of
magnitude, and a straight line's slope is the exponent of the growth.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import matplotlib  # type: ignore[import-not-found]

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # type: ignore[import-not-found]

__all__ = ["draw", "main"]

_STYLE = {
    "foldline, invariant on (default)": ("tab:blue", "o", "-"),
    "foldline, invariant off": ("tab:cyan", "o", "--"),
    "LangGraph SqliteSaver": ("tab:red", "s", "-"),
    "LangGraph DeltaChannel": ("tab:orange", "s", "--"),
}


def draw(figures: dict[str, Any], out: Path) -> None:
    fig, (time_ax, bytes_ax) = plt.subplots(1, 2, figsize=(11, 4.4), constrained_layout=True)
    for series in figures["series"]:
        color, marker, line = _STYLE.get(series["label"], ("tab:gray", "x", ":"))
        kw = {"color": color, "marker": marker, "linestyle": line, "label": series["label"]}
        time_ax.plot(series["lengths"], [us / 1000 for us in series["step_us"]], **kw)
        bytes_ax.plot(series["lengths"], series["bytes_per_step"], **kw)
    lengths = sorted({n for series in figures["series"] for n in series["lengths"]})
    for ax in (time_ax, bytes_ax):
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xticks(lengths, [f"{n:,}" for n in lengths])
        ax.minorticks_off()
        ax.set_xlabel("steps in the session")
        ax.grid(True, which="both", alpha=0.3)
    time_ax.set_ylabel("wall time per step, p50 of the last 40 steps (ms)")
    time_ax.set_title("time per step (provider call excluded)")
    bytes_ax.set_ylabel("bytes added to the SQLite file per step")
    bytes_ax.set_title("database growth per step (WAL checkpointed)")
    time_ax.legend(fontsize="small")
    fig.suptitle(figures["title"], fontsize="medium")
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110, metadata={"Software": None})
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m benchmarks.vs_langgraph.plot FIGURES.json OUT.png", file=sys.stderr)
        return 2
    draw(json.loads(Path(args[0]).read_text(encoding="utf-8")), Path(args[1]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
