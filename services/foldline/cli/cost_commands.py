"""``foldline cost``: what sessions spent, what caching saved and what each cause of a cache-read drop cost.

Read from the log alone (read-only, like the audit commands) and priced with the price table
(:mod:`foldline.config.prices`; ``FOLDLINE_PRICES`` over the shipped one); the arithmetic is
:mod:`foldline.core.cost`. Amounts in ``--json`` are exact decimal numbers; a figure that holds a step of a model
without a price is ``null`` and ``unpriced`` names the model — never 0.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from decimal import Decimal
from typing import Annotated, Any, Literal

import orjson
import typer
from rich.table import Table

from ..config.prices import load_price_table
from ..core.cost import CostFigures, PricedStep, PriceTable, cost_groups
from ..core.drops import DROP_CAUSES, StepVerdict, classify_session
from ..errors import SessionNotFound
from .options import BackendOpt, DataDirOpt, JsonOpt, config_for, session_ids, stores_for
from .output import console, err_console, fail_on_errors, literal, write_json

__all__ = ["amount_json", "figures_json", "money", "register", "step_note"]

GroupBy = Literal["session", "model", "cause", "day"]


def register(app: typer.Typer) -> None:
    app.command("cost")(fail_on_errors(cost))


def amount_json(value: Decimal | None) -> Any:
    """An exact amount as a JSON number (its decimal digits as they are), or null."""
    return None if value is None else orjson.Fragment(format(value, "f").encode())


def money(value: Decimal | None, currency: str) -> str:
    """An amount for people: six decimals (the JSON keeps every digit)."""
    if value is None:
        return "unknown"
    sign = "-" if value < 0 else ""
    symbol = "$" if currency == "USD" else f"{currency} "
    return f"{sign}{symbol}{abs(value):.6f}"


def figures_json(f: CostFigures) -> dict[str, Any]:
    known = f.known
    causes = [*DROP_CAUSES, *sorted(k for k in f.drops_by_cause if k not in DROP_CAUSES)]  # header-change:<fields>

    def amount(v: Decimal) -> Any:
        return amount_json(v if known else None)

    return {
        "steps": f.steps,
        "spend": amount(f.spend),
        "noCache": amount(f.no_cache),
        "saved": amount(f.saved),
        "drops": f.drops,
        "dropCost": amount(f.drop_cost),
        "dropCostByCause": {k: amount(f.by_cause.get(k, Decimal(0))) for k in causes},
        "dropsByCause": {k: f.drops_by_cause.get(k, 0) for k in causes},
        "spendByClass": {k: amount(v) for k, v in f.by_class.items()},
        "tokens": dict(f.tokens),
        "unpriced": dict(f.unpriced),
    }


def step_note(priced: PricedStep, currency: str) -> str:
    """A step's cost in words, for transcripts: spend and saved, or why it is unknown."""
    if priced.cost is None:
        return f"cost unknown (no price for {priced.name})"
    note = f"cost {money(priced.cost.spend, currency)} saved {money(priced.cost.saved, currency)}"
    if priced.drop_cost is not None:
        note += f" drop {money(priced.drop_cost, currency)}"
    return note


@contextlib.contextmanager
def _progress(total: int) -> Iterator[Callable[[], None]]:
    """A progress bar of the sessions read, on stderr when it is a terminal (else nothing)."""
    if not err_console.is_terminal:
        yield lambda: None
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=err_console, transient=True) as progress:
        task = progress.add_task("sessions", total=total or None)
        yield lambda: progress.advance(task)


def _verdicts(log: Any, ids: list[str]) -> Iterator[StepVerdict]:
    for sid in ids:
        events = log.read(sid)
        if not events:
            raise SessionNotFound(sid)
        yield from classify_session(sid, events)


def cost(
    sessions: Annotated[list[str] | None, typer.Argument(help="Sessions to price (default: all).")] = None,
    by: Annotated[
        str, typer.Option("--by", help="Group by session, model, cause (the drops' causes) or day (UTC).")
    ] = "session",
    data_dir: DataDirOpt = None,
    backend: BackendOpt = None,
    json: JsonOpt = False,
) -> None:
    """What each session spent, what the same requests would have cost with no cache hit (saved), and what the
    cache-read drops cost by cause — per group and for the whole fleet.

    Prices come from the shipped table and FOLDLINE_PRICES (README "Cost"); a model without a price makes every
    figure that holds it unknown, naming the model. A header change is reported by the fields it changed
    (header-change:system).
    """
    if by not in ("session", "model", "cause", "day"):
        raise typer.BadParameter("--by must be session, model, cause or day")
    session_ids(*(sessions or ()))
    config = config_for(data_dir, backend)
    table: PriceTable = load_price_table(config.prices)
    with stores_for(config, read_only=True) as stores:
        ids = list(sessions or stores.log.sessions())
        with _progress(len(ids)) as advance:

            def each() -> Iterator[StepVerdict]:
                for sid in ids:
                    yield from _verdicts(stores.log, [sid])
                    advance()

            groups, fleet = cost_groups(each(), table, by)
    if json:
        write_json(
            {
                "by": by,
                "currency": table.currency,
                "prices": {"checked": table.checked, "user": str(config.prices) if config.prices else None},
                "groups": [{by: g.key} | figures_json(g.figures) for g in groups],
                "fleet": {"sessions": len(ids)} | figures_json(fleet),
            }
        )
        return
    cur = table.currency
    title = f"cost of {len(ids)} session(s) by {by} — prices checked {table.checked or 'unknown'}"
    out = Table(title=literal(title))
    out.add_column(by)
    for col in ("steps", "spend", "no cache", "saved", "drops", "drop cost"):
        out.add_column(col, justify="right")
    out.add_column("drop cost by cause")

    def row(key: str, f: CostFigures, style: str = "", *, steps: bool = True) -> None:
        known = f.known
        causes = ", ".join(
            f"{k} {money(f.by_cause.get(k, Decimal(0)) if known else None, cur)}" for k in f.drops_by_cause
        )
        # a cause's row holds its drops only: its steps are in the fleet's row
        spent = (
            (str(f.steps), *(money(v if known else None, cur) for v in (f.spend, f.no_cache, f.saved)))
            if steps
            else ("", "", "", "")
        )
        out.add_row(
            literal(key, style),
            *spent,
            str(f.drops),
            money(f.drop_cost if known else None, cur),
            literal(causes),
        )

    for g in groups:
        row(g.key, g.figures, steps=by != "cause")
    row("fleet", fleet, "bold")
    console.print(out)
    for name, steps in fleet.unpriced.items():
        console.print(
            literal(
                f"unknown: no price for {name} ({steps} step(s)); add its rows to a FOLDLINE_PRICES file "
                "(README, Cost)",
                "yellow",
            )
        )
