"""The session index: one :class:`~foldline.console.model.SessionSummary` per session, kept in memory and brought
up to date from the log's heads, so that listing 10,000 sessions reads no session's events.

Each :meth:`SessionIndex.refresh` asks the log for every session's head in one call
(:meth:`~foldline.ports.event_log.EventLog.heads`); a session whose head moved is fed only the events after the
ones its summary has seen (a session whose head went back — a log replaced under the console — is read again
from seq 0). The first refresh reads every session once. Filtering, sorting and paging then run over the
summaries; the fleet's figures are sums of theirs. Money comes from :mod:`foldline.core.cost` with the console's price
table: each summary prices its steps once, as it is fed (so a page of the list prices nothing), and its figures are
the ones ``foldline cost`` gives the session. Sorting and the range filter go by spend; a session whose spend is
unknown (a model without a price) matches no cost range and sorts below every known amount.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Final, Literal

from ..core.cost import CostFigures, PriceTable
from ..ports.event_log import EventLog
from .model import BUCKET_MS, Bucket, DropRow, SessionSummary, cache_read_ratio

__all__ = ["PAGE_SIZES", "SORTS", "Fleet", "ListQuery", "ListResult", "SessionIndex"]

SORTS: Final = ("activity", "cost", "drops", "drop-cost", "id")
PAGE_SIZES: Final = (25, 50, 100, 200)
Sort = Literal["activity", "cost", "drops", "drop-cost", "id"]


@dataclass(frozen=True, slots=True)
class ListQuery:
    """What the sessions list shows: filters, the order, and the page."""

    model: str | None = None
    status: str | None = None
    unexplained: bool = False
    min_cost: Decimal | None = None
    max_cost: Decimal | None = None
    text: str | None = None  # a part of the session id
    sort: Sort = "activity"
    descending: bool = True
    page: int = 1
    per_page: int = 50

    def matches(self, s: SessionSummary) -> bool:
        if self.model is not None and self.model not in s.models:
            return False
        if self.status is not None and s.status != self.status:
            return False
        if self.unexplained and not s.unexplained:
            return False
        if self.text and self.text not in s.session_id:
            return False
        if self.min_cost is not None or self.max_cost is not None:
            spend = s.spend
            if spend is None:
                return False
            if self.min_cost is not None and spend < self.min_cost:
                return False
            if self.max_cost is not None and spend > self.max_cost:
                return False
        return True


@dataclass(frozen=True, slots=True)
class ListResult:
    rows: list[SessionSummary]
    total: int  # sessions that match
    sessions: int  # sessions in the log
    page: int
    pages: int


_NONE_LAST: Final = Decimal("-Infinity")


def _key(sort: Sort) -> Callable[[SessionSummary], object]:
    match sort:
        case "activity":
            return lambda s: s.last_ms or 0
        case "cost":
            return lambda s: s.spend if s.spend is not None else _NONE_LAST
        case "drops":
            return lambda s: (s.unexplained_count, s.figures.drops)
        case "drop-cost":
            return lambda s: s.drop_cost if s.drop_cost is not None else _NONE_LAST
        case "id":
            return lambda s: s.session_id


@dataclass(slots=True)
class Fleet:
    """The fleet page's figures: spend and cache-read ratio per hour, the unexplained drops, the sessions whose
    drops cost most."""

    sessions: int
    figures: CostFigures = field(default_factory=CostFigures)  # every session's, merged: ``foldline cost``'s fleet
    buckets: list[tuple[int, Bucket]] = field(default_factory=list)  # (hour start ms, figures), in time order
    unexplained: list[DropRow] = field(default_factory=list)  # newest first
    top_by_drop_cost: list[SessionSummary] = field(default_factory=list)
    unranked: int = 0  # sessions with drops whose cost is unknown (a model without a price): not in the ranking
    currency: str = "USD"

    @property
    def spend(self) -> Decimal | None:
        return self.figures.spend if self.figures.known else None

    @property
    def drop_cost(self) -> Decimal | None:
        return self.figures.drop_cost if self.figures.known else None

    @property
    def unpriced_steps(self) -> int:
        return sum(self.figures.unpriced.values())

    @property
    def cache_read_ratio(self) -> float | None:
        return cache_read_ratio(self.figures)


class SessionIndex:
    """Every session's summary, refreshed from the log's heads (see the module docstring)."""

    def __init__(self, log: EventLog, table: PriceTable, *, min_refresh_s: float = 0.25) -> None:
        self.log = log
        self.table = table
        self.min_refresh_s = min_refresh_s
        self._summaries: dict[str, SessionSummary] = {}
        self._children: dict[str, list[tuple[str, str]]] = {}  # parent → [(child, kind)]
        self._lock = threading.Lock()
        self._refreshed = float("-inf")
        self.reads = 0  # sessions read (whole or in part) since start: what a test of the index counts

    def refresh(self, *, force: bool = False) -> None:
        """Bring every summary up to the log's heads (at most every ``min_refresh_s`` unless ``force``)."""
        with self._lock:
            now = time.monotonic()
            if not force and now - self._refreshed < self.min_refresh_s:
                return
            heads = self.log.heads()
            relinked = False
            for sid, head in heads.items():
                summary = self._summaries.get(sid)
                if summary is not None and summary.head == head:
                    continue
                if summary is None or summary.head > head:
                    summary = self._summaries[sid] = SessionSummary(sid, self.table)
                links_before = list(summary.links)
                events = self.log.read(sid, summary.head)
                self.reads += 1
                summary.feed(events)
                relinked = relinked or summary.links != links_before
            gone = [sid for sid in self._summaries if sid not in heads]
            for sid in gone:
                del self._summaries[sid]
            if relinked or gone:
                self._relink()
            self._refreshed = time.monotonic()

    def _relink(self) -> None:
        children: dict[str, list[tuple[str, str]]] = {}
        for s in self._summaries.values():
            for link in s.links:
                children.setdefault(link.parent, []).append((s.session_id, link.kind))
        for kids in children.values():
            kids.sort()
        self._children = children

    def get(self, session_id: str) -> SessionSummary | None:
        self.refresh()
        return self._summaries.get(session_id)

    def children(self, session_id: str) -> list[tuple[str, str]]:
        """The sessions that descend from ``session_id``: (child, kind), by id."""
        return list(self._children.get(session_id, ()))

    def __len__(self) -> int:
        return len(self._summaries)

    def summaries(self) -> list[SessionSummary]:
        self.refresh()
        return list(self._summaries.values())

    def models(self, every: Iterable[SessionSummary] | None = None) -> list[str]:
        """Every model the sessions used (of ``every``, one refresh's summaries, else the index brought up to date)."""
        return sorted({m for s in (self.summaries() if every is None else every) for m in s.models})

    def statuses(self, every: Iterable[SessionSummary] | None = None) -> list[str]:
        return sorted({s.status for s in (self.summaries() if every is None else every)})

    def query(self, q: ListQuery, every: list[SessionSummary] | None = None) -> ListResult:
        """The page of the list ``q`` asks for, over ``every`` (else the index brought up to date)."""
        every = self.summaries() if every is None else every
        matching = [s for s in every if q.matches(s)]
        matching.sort(key=_key(q.sort), reverse=q.descending)  # type: ignore[arg-type]
        pages = max(1, -(-len(matching) // q.per_page))
        page = min(max(1, q.page), pages)
        start = (page - 1) * q.per_page
        return ListResult(matching[start : start + q.per_page], len(matching), len(every), page, pages)

    def fleet(self, *, top: int = 20, unexplained: int = 200) -> Fleet:
        every = self.summaries()
        return fleet_of(every, self.table.currency, top=top, unexplained=unexplained)


def fleet_of(summaries: Iterable[SessionSummary], currency: str, *, top: int = 20, unexplained: int = 200) -> Fleet:
    """The fleet's figures over ``summaries`` (see :class:`Fleet`)."""
    listed = list(summaries)
    buckets: dict[int, Bucket] = {}
    drops: list[DropRow] = []
    fleet = Fleet(len(listed), currency=currency)
    for s in listed:
        fleet.figures.merge(s.figures)
        drops.extend(s.unexplained)
        for hour, b in s.buckets.items():
            into = buckets.setdefault(hour, Bucket())
            into.add(b)
    fleet.buckets = [(hour * BUCKET_MS, buckets[hour]) for hour in sorted(buckets)]
    drops.sort(key=lambda d: (d.time_ms, d.session_id, d.dispatch_seq), reverse=True)
    fleet.unexplained = drops[:unexplained]
    priced = [s for s in listed if s.figures.drops and s.drop_cost is not None]
    priced.sort(key=lambda s: (s.drop_cost, s.session_id), reverse=True)
    fleet.top_by_drop_cost = priced[:top]
    fleet.unranked = sum(1 for s in listed if s.figures.drops and s.drop_cost is None)
    return fleet
