"""Money from the log: a dated price table, what each step cost, what caching saved, what each drop cost.

Every figure is derived from logged usage through :func:`~foldline.core.usage.normalize_usage` and a
:class:`PriceTable` (docs/FORMAT.md §3.6, README "Cost"):

* **spend** of a step — the sum over its token classes of tokens times the class's price per million tokens;
* **no-cache** — what the same request would have cost had nothing been read from or written to a cache: every
  prompt token at the ``input`` price, the output as spent; **saved** = no-cache minus spend (negative when the cache
  writes cost more than the reads saved);
* **drop cost** — a cache-read drop (:mod:`foldline.core.drops`) lost ``lost_tokens`` that the step would have read.
  Those are the first prompt tokens after what it did read, in the order a prompt holds its classes: its 1-hour
  writes, its short writes, then its uncached input (only tokens the request sent count: a drop whose baseline is
  larger than the prompt, as after a compaction, costs at most everything it did not read). Each lost token cost its
  class's price instead of the ``cache-read`` price; the drop cost is the sum of those differences.

A price is looked up by provider, model and the dispatch time: rows whose provider is the step's and whose model
pattern (``fnmatch`` style, case-sensitive) matches; the most specific pattern wins (an exact name, else the longest
pattern); for each token class, the row with the latest effective date on or before the step's day, and among
long-prompt tiers the highest ``prompt_over`` the request's whole prompt exceeds. ``input`` and ``output`` must be
priced; a missing ``cache-read`` or ``cache-write-5m`` costs the ``input`` price (no discount, no surcharge), a
missing ``cache-write-1h`` the ``cache-write-5m`` price, a missing ``reasoning`` the ``output`` price. A step with
no price has cost *unknown* (it names the provider and model), never 0, and so has every sum that holds it.

Amounts are :class:`~decimal.Decimal` and exact: per-session figures add up to the fleet's to the last digit.
Pure: no I/O, no clock — dates come from envelope timestamps.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Final

from .drops import Drop, StepVerdict, classify_session
from .events import Envelope
from .header import CACHE_TTLS
from .usage import TOKEN_CLASSES, NormalizedUsage, normalize_usage

__all__ = [
    "MILLION",
    "CostFigures",
    "CostGroup",
    "ModelPrices",
    "PriceRow",
    "PriceTable",
    "PriceTableError",
    "PricedStep",
    "StepCost",
    "cost_groups",
    "day_of",
    "drop_cost",
    "drop_key",
    "figures_of",
    "price_step",
    "session_cost",
    "step_cost",
]

MILLION: Final = Decimal(1_000_000)
_DATE: Final = re.compile(r"^(\d{4})-(\d{2})-(\d{2})$")
_CURRENCY: Final = re.compile(r"^[A-Z]{3}$")


class PriceTableError(ValueError):
    """A price row or table that cannot be used (the loader turns it into a ConfigError naming the file)."""


def _days_from_civil(y: int, m: int, d: int) -> int:
    """Days since 1970-01-01 of a proleptic Gregorian date (Hinnant's algorithm)."""
    y -= m <= 2
    era = (y if y >= 0 else y - 399) // 400
    yoe = y - era * 400
    doy = (153 * (m + (-3 if m > 2 else 9)) + 2) // 5 + d - 1
    doe = yoe * 365 + yoe // 4 - yoe // 100 + doy
    return era * 146097 + doe - 719468


def day_of(time_ms: int) -> str:
    """The UTC date (``YYYY-MM-DD``) of an envelope timestamp."""
    z = time_ms // 86_400_000 + 719468
    era = (z if z >= 0 else z - 146096) // 146097
    doe = z - era * 146097
    yoe = (doe - doe // 1460 + doe // 36524 - doe // 146096) // 365
    doy = doe - (365 * yoe + yoe // 4 - yoe // 100)
    mp = (5 * doy + 2) // 153
    d = doy - (153 * mp + 2) // 5 + 1
    m = mp + (3 if mp < 10 else -9)
    y = yoe + era * 400 + (m <= 2)
    return f"{y:04d}-{m:02d}-{d:02d}"


def _day_number(date: str) -> int:
    match = _DATE.match(date)
    if not match:
        raise PriceTableError(f"effective date {date!r} is not YYYY-MM-DD")
    y, m, d = (int(g) for g in match.groups())
    if not (1 <= m <= 12 and 1 <= d <= 31) or day_of(_days_from_civil(y, m, d) * 86_400_000) != date:
        raise PriceTableError(f"effective date {date!r} is not a calendar date")
    return _days_from_civil(y, m, d)


@dataclass(frozen=True, slots=True)
class PriceRow:
    """One price: ``price`` per million tokens of ``token_class`` for the models ``model`` (a pattern) of
    ``provider``, from ``effective`` (a date) on, for requests whose whole prompt exceeds ``prompt_over`` tokens."""

    provider: str
    model: str
    token_class: str
    price: Decimal
    currency: str
    effective: str
    source: str
    prompt_over: int = 0
    note: str = ""
    day: int = field(default=0, compare=False)

    def __post_init__(self) -> None:
        if not self.provider or not self.model:
            raise PriceTableError("a price row needs a provider and a model pattern")
        if self.token_class not in TOKEN_CLASSES:
            raise PriceTableError(
                f"token class {self.token_class!r} is not one of {', '.join(TOKEN_CLASSES)} "
                f"({self.provider}/{self.model})"
            )
        if not self.price.is_finite() or self.price < 0:
            raise PriceTableError(f"price {self.price} of {self.provider}/{self.model} is not a price ≥ 0")
        if not _CURRENCY.match(self.currency):
            raise PriceTableError(f"currency {self.currency!r} is not an ISO 4217 code (e.g. USD)")
        if self.prompt_over < 0:
            raise PriceTableError(f"prompt_over {self.prompt_over} of {self.provider}/{self.model} is negative")
        object.__setattr__(self, "day", _day_number(self.effective))

    @property
    def key(self) -> tuple[str, str, str, str, int]:
        """What a row replaces when a user table gives the same key (docs: ``FOLDLINE_PRICES``)."""
        return (self.provider, self.model, self.token_class, self.effective, self.prompt_over)


@dataclass(frozen=True, slots=True)
class ModelPrices:
    """The price of each token class (per million tokens) for one request, and where they came from."""

    provider: str
    model: str
    pattern: str
    prices: Mapping[str, Decimal]
    currency: str
    sources: tuple[str, ...]

    def rate(self, token_class: str) -> Decimal:
        return self.prices[token_class]


class PriceTable:
    """Price rows of one currency (see the module docstring for the lookup)."""

    def __init__(self, rows: Iterable[PriceRow], *, checked: str | None = None) -> None:
        self.rows = tuple(rows)
        self.checked = checked
        currencies = {r.currency for r in self.rows}
        if len(currencies) > 1:
            raise PriceTableError(
                f"the price table mixes currencies {', '.join(sorted(currencies))}; foldline sums costs in one "
                "currency, so give every row the same one"
            )
        self.currency = currencies.pop() if currencies else "USD"
        self._by_provider: dict[str, list[PriceRow]] = {}
        for row in self.rows:
            self._by_provider.setdefault(row.provider, []).append(row)
        self._cache: dict[tuple[str, str], str | None] = {}
        self._tiers: dict[tuple[str, str], list[int]] = {}  # (provider, pattern) → its prompt_over thresholds
        # (provider, model, day, thresholds the prompt exceeds) → the prices: what the lookup depends on, so a
        # fleet's steps are priced by a dict look-up after the first of each model and day
        self._prices: dict[tuple[str, str, int, int], ModelPrices | None] = {}

    def merged(self, overrides: Iterable[PriceRow]) -> PriceTable:
        """This table with ``overrides``: a row with the key of one of these replaces it, any other is added."""
        extra = list(overrides)
        keys = {r.key for r in extra}
        return PriceTable([*(r for r in self.rows if r.key not in keys), *extra], checked=self.checked)

    def pattern_for(self, provider: str, model: str) -> str | None:
        """The most specific model pattern of ``provider`` matching ``model`` (None: no price)."""
        hit = self._cache.get((provider, model), "")
        if hit != "":
            return hit
        best: tuple[bool, int, str] | None = None
        for row in self._by_provider.get(provider, ()):
            if fnmatch.fnmatchcase(model, row.model):
                exact = not any(c in row.model for c in "*?[")
                rank = (exact, len(row.model), row.model)
                if best is None or rank > best:
                    best = rank
        found = best[2] if best is not None else None
        self._cache[(provider, model)] = found
        return found

    def prices_for(self, provider: str, model: str, time_ms: int, prompt_tokens: int = 0) -> ModelPrices | None:
        """The prices of a request to ``provider``/``model`` dispatched at ``time_ms`` with a prompt of
        ``prompt_tokens`` (every input token, cached or not); None when ``input`` or ``output`` has no price."""
        pattern = self.pattern_for(provider, model)
        if pattern is None:
            return None
        day = time_ms // 86_400_000
        tiers = self._tiers.get((provider, pattern))
        if tiers is None:
            rows = self._by_provider[provider]
            tiers = self._tiers[provider, pattern] = sorted({r.prompt_over for r in rows if r.model == pattern})
        key = (provider, model, day, sum(1 for t in tiers if t < prompt_tokens))  # the thresholds it exceeds
        if key not in self._prices:
            self._prices[key] = self._lookup(provider, model, pattern, day, prompt_tokens)
        return self._prices[key]

    def _lookup(self, provider: str, model: str, pattern: str, day: int, prompt_tokens: int) -> ModelPrices | None:
        chosen: dict[str, PriceRow] = {}
        for row in self._by_provider[provider]:
            if row.model != pattern or row.day > day or (row.prompt_over and prompt_tokens <= row.prompt_over):
                continue
            best = chosen.get(row.token_class)
            if best is None or (row.day, row.prompt_over) > (best.day, best.prompt_over):
                chosen[row.token_class] = row
        if "input" not in chosen or "output" not in chosen:
            return None
        prices = {c: r.price for c, r in chosen.items()}
        prices.setdefault("cache-read", prices["input"])
        prices.setdefault("cache-write-5m", prices["input"])
        prices.setdefault("cache-write-1h", prices["cache-write-5m"])
        prices.setdefault("reasoning", prices["output"])
        sources = tuple(sorted({r.source for r in chosen.values()}))
        return ModelPrices(provider, model, pattern, prices, self.currency, sources)


# ---------------------------------------------------------------------------------------------- per step


@dataclass(frozen=True, slots=True)
class StepCost:
    """What one step cost (``by_class``: the spend per token class), and what it would have cost uncached."""

    spend: Decimal
    no_cache: Decimal
    by_class: Mapping[str, Decimal]

    @property
    def saved(self) -> Decimal:
        return self.no_cache - self.spend


def step_cost(usage: NormalizedUsage, prices: ModelPrices) -> StepCost:
    tokens = usage.by_class()
    by_class = {c: tokens[c] * prices.rate(c) / MILLION for c in TOKEN_CLASSES}
    spend = sum(by_class.values(), Decimal(0))
    no_cache = (
        usage.prompt * prices.rate("input")
        + usage.output * prices.rate("output")
        + usage.reasoning * prices.rate("reasoning")
    ) / MILLION
    return StepCost(spend, no_cache, by_class)


def drop_cost(lost_tokens: int, usage: NormalizedUsage, prices: ModelPrices) -> Decimal:
    """What the ``lost_tokens`` a drop did not read cost over reading them (see the module docstring)."""
    left = max(0, lost_tokens)
    total = Decimal(0)
    read = prices.rate("cache-read")
    for cls, tokens in (
        ("cache-write-1h", usage.cache_write_1h),
        ("cache-write-5m", usage.cache_write_5m),
        ("input", usage.input),
    ):
        take = min(left, tokens)
        total += take * (prices.rate(cls) - read)
        left -= take
    return total / MILLION


def drop_key(drop: Drop) -> str:
    """The cause a drop's cost is reported under: its cause, a header change by the fields it changed
    (``header-change:config.model,system``)."""
    if drop.cause == "header-change" and drop.header_fields:
        return "header-change:" + ",".join(drop.header_fields)
    return drop.cause


# ---------------------------------------------------------------------------------------------- sums


@dataclass(slots=True)
class CostFigures:
    """Sums over steps. ``spend``, ``no_cache`` and ``drop_cost`` are exact sums over the priced steps; the
    figures are *known* only when no step was unpriced (``unpriced``: provider/model → steps)."""

    steps: int = 0
    spend: Decimal = Decimal(0)
    no_cache: Decimal = Decimal(0)
    drops: int = 0
    drop_cost: Decimal = Decimal(0)
    by_cause: dict[str, Decimal] = field(default_factory=dict)
    drops_by_cause: dict[str, int] = field(default_factory=dict)
    by_class: dict[str, Decimal] = field(default_factory=dict)
    tokens: dict[str, int] = field(default_factory=dict)
    unpriced: dict[str, int] = field(default_factory=dict)

    @property
    def known(self) -> bool:
        return not self.unpriced

    @property
    def saved(self) -> Decimal:
        return self.no_cache - self.spend

    def add_step(self, usage: NormalizedUsage, cost: StepCost | None, unpriced_as: str) -> None:
        self.steps += 1
        for cls, n in usage.by_class().items():
            self.tokens[cls] = self.tokens.get(cls, 0) + n
        if cost is None:
            self.unpriced[unpriced_as] = self.unpriced.get(unpriced_as, 0) + 1
            return
        self.spend += cost.spend
        self.no_cache += cost.no_cache
        for cls, amount in cost.by_class.items():
            self.by_class[cls] = self.by_class.get(cls, Decimal(0)) + amount

    def add_drop(self, key: str, amount: Decimal | None) -> None:
        self.drops += 1
        self.drops_by_cause[key] = self.drops_by_cause.get(key, 0) + 1
        if amount is not None:
            self.drop_cost += amount
            self.by_cause[key] = self.by_cause.get(key, Decimal(0)) + amount

    def merge(self, other: CostFigures) -> None:
        self.steps += other.steps
        self.spend += other.spend
        self.no_cache += other.no_cache
        self.drops += other.drops
        self.drop_cost += other.drop_cost
        for mine, theirs in (
            (self.by_cause, other.by_cause),
            (self.by_class, other.by_class),
        ):
            for k, v in theirs.items():
                mine[k] = mine.get(k, Decimal(0)) + v
        for counts, more in (
            (self.drops_by_cause, other.drops_by_cause),
            (self.tokens, other.tokens),
            (self.unpriced, other.unpriced),
        ):
            for k, n in more.items():
                counts[k] = counts.get(k, 0) + n


@dataclass(frozen=True, slots=True)
class CostGroup:
    """The figures of one group (a session, a model, a cause or a day)."""

    key: str
    figures: CostFigures


@dataclass(frozen=True, slots=True)
class PricedStep:
    """A step's verdict with its normalized usage and, when priced, its cost and its drop's cost."""

    verdict: StepVerdict
    usage: NormalizedUsage
    prices: ModelPrices | None
    cost: StepCost | None
    drop_cost: Decimal | None  # None: no drop, or no price

    @property
    def name(self) -> str:
        """``provider/model`` of the step (how an unpriced model is named)."""
        return f"{self.verdict.provider}/{self.verdict.model}"


def price_step(verdict: StepVerdict, table: PriceTable) -> PricedStep:
    """One classified step (:mod:`foldline.core.drops`) priced with ``table``."""
    step = verdict.step
    usage = normalize_usage(step.usage, _ttl_name(step.cache_ttl_seconds))
    prices = table.prices_for(verdict.provider, verdict.model, step.time_ms, usage.prompt)
    if prices is None:
        return PricedStep(verdict, usage, None, None, None)
    dropped = verdict.drop
    lost = drop_cost(dropped.lost_tokens, usage, prices) if dropped is not None else None
    return PricedStep(verdict, usage, prices, step_cost(usage, prices), lost)


def cost_groups(
    verdicts: Iterable[StepVerdict], table: PriceTable, by: str = "session"
) -> tuple[list[CostGroup], CostFigures]:
    """Groups (``by``: ``session``, ``model``, ``cause`` or ``day``, in first-seen order) and the fleet's figures.

    With ``by="cause"`` a group holds the drops of one cause key (:func:`drop_key`) and no steps; every other
    grouping holds each step once, so the groups' figures add up to the fleet's exactly."""
    if by not in ("session", "model", "cause", "day"):
        raise ValueError(f"cost by {by!r}: expected session, model, cause or day")
    groups: dict[str, CostFigures] = {}
    fleet = CostFigures()
    for verdict in verdicts:
        priced = price_step(verdict, table)
        step, dropped = verdict.step, verdict.drop
        fleet.add_step(priced.usage, priced.cost, priced.name)
        if dropped is not None:
            fleet.add_drop(drop_key(dropped), priced.drop_cost)
        if by == "cause":
            if dropped is not None:
                key = drop_key(dropped)
                group = groups.setdefault(key, CostFigures())
                group.add_drop(key, priced.drop_cost)
                if priced.cost is None:
                    group.unpriced[priced.name] = group.unpriced.get(priced.name, 0) + 1
            continue
        key = {"session": verdict.session_id, "model": priced.name, "day": day_of(step.time_ms)}[by]
        group = groups.setdefault(key, CostFigures())
        group.add_step(priced.usage, priced.cost, priced.name)
        if dropped is not None:
            group.add_drop(drop_key(dropped), priced.drop_cost)
    return [CostGroup(k, f) for k, f in groups.items()], fleet


_TTL_NAMES: Final = {seconds: name for name, seconds in CACHE_TTLS.items()}


def _ttl_name(seconds: float | None) -> str | None:
    return _TTL_NAMES.get(seconds) if seconds is not None else None


def figures_of(groups: Sequence[CostGroup]) -> CostFigures:
    """The sum of ``groups`` (for a check that they add up)."""
    total = CostFigures()
    for g in groups:
        total.merge(g.figures)
    return total


def session_cost(session_id: str, events: Iterable[Envelope], table: PriceTable) -> CostFigures:
    """What one session cost, from its whole log (events from seq 0, in order): spend, no-cache and saved, its drops
    and their cost by cause (:func:`drop_key`), spend and tokens by class — the figures ``foldline cost`` gives the
    session. ``figures.known`` is false when a step's model has no price (``figures.unpriced`` names it)."""
    _, figures = cost_groups(classify_session(session_id, events), table)
    return figures
