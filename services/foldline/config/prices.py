"""The price table: the one shipped with the package (``prices.csv`` beside this module), and a user's file.

Both are CSV with the columns ``provider, model, token_class, price_per_mtok, currency, effective, source,
prompt_over, note`` (``#`` lines are comments; ``# checked: YYYY-MM-DD`` dates the table). ``FOLDLINE_PRICES``
(:attr:`foldline.config.Config.prices`) names a user file: its rows replace the shipped rows with the same provider,
model pattern, token class, effective date and ``prompt_over``, and add to the others. A file that cannot be read or
a row that is not a price is a :class:`~foldline.errors.ConfigError` naming the file and line. The arithmetic is
:mod:`foldline.core.cost`.
"""

from __future__ import annotations

import csv
from decimal import Decimal, InvalidOperation
from importlib import resources
from pathlib import Path
from typing import Final

from ..core.cost import PriceRow, PriceTable, PriceTableError
from ..errors import ConfigError

__all__ = ["COLUMNS", "builtin_price_table", "load_price_table", "read_price_rows"]

COLUMNS: Final = ("provider", "model", "token_class", "price_per_mtok", "currency", "effective", "source")
OPTIONAL_COLUMNS: Final = ("prompt_over", "note")
_CHECKED: Final = "# checked:"


def read_price_rows(text: str, origin: str) -> tuple[list[PriceRow], str | None]:
    """The rows of a price file and its ``# checked:`` date; ConfigError naming ``origin`` and the line."""
    checked: str | None = None
    header: list[str] | None = None
    rows: list[PriceRow] = []
    for number, line in enumerate(text.splitlines(), 1):
        if line.startswith(_CHECKED):
            checked = line.removeprefix(_CHECKED).strip()
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        cells = [c.strip() for c in next(csv.reader([line]))]
        if header is None:
            missing = [c for c in COLUMNS if c not in cells]
            if missing:
                raise ConfigError(
                    f"{origin}:{number}: the price table's header has no column(s) {', '.join(missing)}; it must "
                    f"name {', '.join(COLUMNS)} (and optionally {', '.join(OPTIONAL_COLUMNS)})"
                )
            header = cells
            continue
        if len(cells) != len(header):
            raise ConfigError(f"{origin}:{number}: {len(cells)} cells for the header's {len(header)} columns")
        record = dict(zip(header, cells, strict=True))
        try:
            over = record.get("prompt_over", "")
            rows.append(
                PriceRow(
                    provider=record["provider"],
                    model=record["model"],
                    token_class=record["token_class"],
                    price=Decimal(record["price_per_mtok"]),
                    currency=record["currency"],
                    effective=record["effective"],
                    source=record["source"],
                    prompt_over=int(over) if over else 0,
                    note=record.get("note", ""),
                )
            )
        except (InvalidOperation, ValueError) as exc:
            detail = str(exc) if isinstance(exc, PriceTableError) else f"{type(exc).__name__}: {exc}"
            raise ConfigError(f"{origin}:{number}: not a price row ({detail})") from exc
    return rows, checked


def builtin_price_table() -> PriceTable:
    """The table shipped with the package."""
    text = resources.files("foldline.config").joinpath("prices.csv").read_text(encoding="utf-8")
    rows, checked = read_price_rows(text, "foldline/config/prices.csv")
    return PriceTable(rows, checked=checked)


def load_price_table(user_file: Path | None = None) -> PriceTable:
    """The shipped table, with ``user_file``'s rows over it (``FOLDLINE_PRICES``)."""
    table = builtin_price_table()
    if user_file is None:
        return table
    try:
        text = user_file.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(
            f"FOLDLINE_PRICES={str(user_file)!r} cannot be read ({exc.strerror or exc}); point it at a CSV price "
            "table or unset it"
        ) from exc
    rows, _ = read_price_rows(text, str(user_file))
    try:
        return table.merged(rows)
    except PriceTableError as exc:
        raise ConfigError(f"{user_file}: {exc}") from exc
