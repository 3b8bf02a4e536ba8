"""What the console shows, folded from a session's events: a session's summary (one row of the sessions list) and
its page (turns, steps, the chart, drops, header snapshots, compactions and trims).

Both are incremental — :meth:`SessionSummary.feed` and :meth:`SessionPage.feed` take the events after the ones
already seen — so an append costs the new events, not the session's history. Every figure comes from the
functions the commands use: :class:`~foldline.core.drops.DropTracker` (``foldline drops``),
:func:`~foldline.core.cost.price_step` and :class:`~foldline.core.cost.CostFigures` (``foldline cost``),
:func:`~foldline.core.diff.header_snapshots` and :func:`~foldline.core.diff.diff_headers` (``foldline diff``),
:func:`~foldline.core.fork.lineage` (forks). Nothing here does I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Final

from ..core.content import ImageBlock, ImageRef, ToolResultBlock
from ..core.cost import CostFigures, PricedStep, PriceTable, drop_key, price_step
from ..core.diff import HeaderDiff, diff_headers, header_snapshots
from ..core.drops import DropTracker
from ..core.events import (
    AssistantMessage,
    AttachmentQuarantine,
    CompactionEnd,
    CompactionStart,
    CompactionSummary,
    Envelope,
    LlmRetry,
    ReplaceOp,
    RequestDispatch,
    RequestHeader,
    SessionEndSeed,
    StepEnd,
    StepStart,
    ToolCall,
    ToolResult,
    TurnEnd,
    TurnStart,
    UserMessage,
)
from ..core.fork import lineage
from ..core.header import EpochHeader

__all__ = [
    "BUCKET_MS",
    "LINEAGE_KINDS",
    "Bucket",
    "CompactionRow",
    "DropRow",
    "HeaderRow",
    "LineageLink",
    "SessionPage",
    "SessionSummary",
    "StepRow",
    "TrimRow",
    "TurnRow",
    "cache_read_ratio",
    "lineage_links",
]

#: Width of one bucket of the fleet's figures over time (an hour of dispatch timestamps).
BUCKET_MS: Final = 3_600_000
#: How one session descends from another. A fork child's log starts with its parent's prefix and a
#: ``session/end-seed`` naming the parent; another kind of link (a sub-agent's session naming the session that
#: started it) is one more entry here and one more case in :func:`lineage_links`.
LINEAGE_KINDS: Final = ("fork",)


@dataclass(frozen=True, slots=True)
class LineageLink:
    """``child`` descends from ``parent`` (``kind``: one of :data:`LINEAGE_KINDS`); ``at``: the parent's events
    the child started from (a fork's seed length)."""

    kind: str
    parent: str
    at: int | None


def lineage_links(events: Sequence[Envelope]) -> list[LineageLink]:
    """The links that make the session of ``events`` a descendant of another (its own, not its ancestors')."""
    seed = lineage(events)
    if seed is None or seed.parent_id is None:
        return []
    return [LineageLink("fork", seed.parent_id, seed.seed_length)]


@dataclass(slots=True)
class Bucket:
    """One hour of a session's steps: spend over its priced steps, prompt and cache-read tokens."""

    steps: int = 0
    spend: Decimal = Decimal(0)
    unpriced: int = 0
    prompt: int = 0
    cache_read: int = 0
    drop_cost: Decimal = Decimal(0)  # over its priced drops
    unexplained: int = 0

    def add(self, other: Bucket) -> None:
        self.steps += other.steps
        self.spend += other.spend
        self.unpriced += other.unpriced
        self.prompt += other.prompt
        self.cache_read += other.cache_read
        self.drop_cost += other.drop_cost
        self.unexplained += other.unexplained


def cache_read_ratio(figures: CostFigures) -> float | None:
    """Cache-read tokens over every prompt token (cached or not) of ``figures``' steps."""
    tokens = figures.tokens
    prompt = sum(tokens.get(c, 0) for c in ("cache-read", "cache-write-1h", "cache-write-5m", "input"))
    return tokens.get("cache-read", 0) / prompt if prompt else None


@dataclass(frozen=True, slots=True)
class DropRow:
    """One drop, as the pages list it."""

    session_id: str
    dispatch_seq: int
    turn: int
    step: int
    time_ms: int
    cause: str
    causes: tuple[str, ...]
    header_fields: tuple[str, ...]
    cache_read: int
    baseline: int
    lost: int
    cost: Decimal | None
    cost_key: str
    request_id: str | None
    message_id: str | None
    previous_message_id: str | None

    @property
    def explained(self) -> bool:
        return self.cause != "unexplained"


def _drop_row(priced: PricedStep) -> DropRow | None:
    drop = priced.verdict.drop
    if drop is None:
        return None
    s = drop.step
    return DropRow(
        drop.session_id,
        s.dispatch_seq,
        s.turn,
        s.step,
        s.time_ms,
        drop.cause,
        drop.causes,
        drop.header_fields,
        s.usage.cache_read,
        drop.baseline_tokens,
        drop.lost_tokens,
        priced.drop_cost,
        drop_key(drop),
        s.request_id,
        s.message_id,
        drop.previous.message_id if drop.previous is not None else None,
    )


# ---------------------------------------------------------------------------------------------- the list


@dataclass(slots=True)
class SessionSummary:
    """One session as the sessions list and the fleet page see it, kept up to date by :meth:`feed`."""

    session_id: str
    table: PriceTable
    head: int = 0
    first_ms: int | None = None
    last_ms: int | None = None
    provider: str | None = None
    model: str | None = None
    models: set[str] = field(default_factory=set)
    turns: int = 0
    open_turn: int | None = None
    last_reason: str | None = None
    figures: CostFigures = field(default_factory=CostFigures)
    unexplained: list[DropRow] = field(default_factory=list)
    buckets: dict[int, Bucket] = field(default_factory=dict)
    links: list[LineageLink] = field(default_factory=list)
    tracker: DropTracker | None = None

    def __post_init__(self) -> None:
        self.tracker = DropTracker(self.session_id)

    @property
    def status(self) -> str:
        """``running`` while a turn is open, else how the last turn ended (``completed``, ``aborted``, …), or
        ``idle`` before any turn."""
        if self.open_turn is not None:
            return "running"
        return self.last_reason or "idle"

    @property
    def spend(self) -> Decimal | None:
        return self.figures.spend if self.figures.known else None

    @property
    def drop_cost(self) -> Decimal | None:
        return self.figures.drop_cost if self.figures.known else None

    @property
    def cache_read_ratio(self) -> float | None:
        return cache_read_ratio(self.figures)

    @property
    def unexplained_count(self) -> int:
        return len(self.unexplained)

    def feed(self, events: Sequence[Envelope], priced: Sequence[PricedStep] | None = None) -> None:
        """Take the session's next events (from seq :attr:`head` on); ``priced``: the steps they complete,
        when the caller classified and priced them already (else this summary's own tracker does)."""
        if not events:
            return
        if self.first_ms is None:
            self.first_ms = events[0].time
        for e in events:
            data = e.data
            if isinstance(data, RequestHeader):
                self.provider, self.model = data.header.config.provider, data.header.config.model
                self.models.add(self.model)
            elif isinstance(data, TurnStart):
                self.turns += 1
                self.open_turn = data.turn
            elif isinstance(data, TurnEnd):
                self.open_turn = None
                self.last_reason = data.reason
            elif isinstance(data, SessionEndSeed) and data.parent_id is not None:
                self.links = [LineageLink("fork", data.parent_id, data.seed_length)]
        if priced is None:
            assert self.tracker is not None
            priced = [price_step(v, self.table) for v in self.tracker.feed(events)]
        else:
            self.tracker = None  # the caller classifies from now on
        for step in priced:
            self._add(step)
        self.head = events[-1].seq + 1
        self.last_ms = max(self.last_ms or 0, events[-1].time)

    def _add(self, priced: PricedStep) -> None:
        verdict = priced.verdict
        self.figures.add_step(priced.usage, priced.cost, priced.name)
        bucket = self.buckets.setdefault(verdict.step.time_ms // BUCKET_MS, Bucket())
        bucket.steps += 1
        bucket.prompt += priced.usage.prompt
        bucket.cache_read += priced.usage.cache_read
        if priced.cost is None:
            bucket.unpriced += 1
        else:
            bucket.spend += priced.cost.spend
        row = _drop_row(priced)
        if row is not None and verdict.drop is not None:
            self.figures.add_drop(row.cost_key, row.cost)
            if row.cost is not None:
                bucket.drop_cost += row.cost
            if not row.explained:
                bucket.unexplained += 1
                self.unexplained.append(row)


# ---------------------------------------------------------------------------------------------- one session


@dataclass(slots=True)
class StepRow:
    """One step of the timeline: its span of the log, and once answered its usage, cost and drop."""

    index: int  # 0-based, in log order
    turn: int
    step: int
    start_seq: int
    start_ms: int
    end_seq: int | None = None
    dispatch_seq: int | None = None
    serializer: str | None = None
    digest: str | None = None
    body_bytes: int | None = None
    priced: PricedStep | None = None
    drop: DropRow | None = None
    tools: list[str] = field(default_factory=list)
    retries: int = 0
    quarantined: bool = False

    def chart_point(self) -> list[float | int | None]:
        """``[index, input, cache-read, cache-write, output, spend]`` (spend in the table's currency; None when
        the step is unanswered or unpriced)."""
        p = self.priced
        if p is None:
            return [self.index, None, None, None, None, None]
        u = p.usage
        spend = float(p.cost.spend) if p.cost is not None else None
        return [self.index, u.input, u.cache_read, u.cache_write, u.completion, spend]


@dataclass(slots=True)
class TurnRow:
    turn: int
    start_seq: int
    start_ms: int
    first_step: int  # index of its first step row
    end_seq: int | None = None
    reason: str | None = None
    steps: int = 0


@dataclass(frozen=True, slots=True)
class HeaderRow:
    seq: int
    reason: str
    header: EpochHeader
    diff: HeaderDiff
    step_index: int  # the next step row's index: the snapshot holds from that step on


@dataclass(slots=True)
class CompactionRow:
    start_seq: int
    start: int
    end: int
    estimated_tokens: int
    summary: str | None = None
    model: str | None = None
    replace_seq: int | None = None
    end_seq: int | None = None
    step_index: int = 0


@dataclass(frozen=True, slots=True)
class TrimRow:
    seq: int
    index: int  # the message replaced (its surface index)
    call_id: str
    name: str
    step_index: int


class SessionPage:
    """A session's page, folded incrementally from its events (:meth:`feed`)."""

    def __init__(self, session_id: str, table: PriceTable) -> None:
        self.session_id = session_id
        self.table = table
        self.summary = SessionSummary(session_id, table)
        self.tracker = DropTracker(session_id)
        self.steps: list[StepRow] = []
        self.turns: list[TurnRow] = []
        self.headers: list[HeaderRow] = []
        self.compactions: list[CompactionRow] = []
        self.trims: list[TrimRow] = []
        self.images: dict[str, ImageRef] = {}  # by attachment id: every image the log references
        self.quarantines: list[tuple[int, str, str]] = []  # (seq, attachment, failure)
        self.links: list[LineageLink] = []
        self._by_key: dict[tuple[int, int], StepRow] = {}
        self._header: EpochHeader | None = None

    @property
    def head(self) -> int:
        return self.summary.head

    def feed(self, events: Sequence[Envelope]) -> list[StepRow]:
        """Take the next events; returns the step rows they opened or changed (for a live page)."""
        if not events:
            return []
        touched: dict[int, StepRow] = {}
        for snap in header_snapshots(events):
            self.headers.append(
                HeaderRow(snap.seq, snap.reason, snap.header, diff_headers(self._header, snap.header), len(self.steps))
            )
            self._header = snap.header
        for e in events:
            self._one(e, touched)
        priced: list[PricedStep] = []
        for verdict in self.tracker.feed(events):
            one = price_step(verdict, self.table)
            priced.append(one)
            row = self._by_key.get((verdict.step.turn, verdict.step.step))
            if row is None:
                continue
            row.priced = one
            row.drop = _drop_row(one)
            touched[row.index] = row
        seed = lineage_links(events)
        if seed:
            self.links = seed
        self.summary.feed(events, priced)
        return [touched[i] for i in sorted(touched)]

    def _one(self, e: Envelope, touched: dict[int, StepRow]) -> None:
        data = e.data
        current = self.steps[-1] if self.steps else None
        row: StepRow | None
        match data:
            case TurnStart():
                self.turns.append(TurnRow(data.turn, e.seq, e.time, len(self.steps)))
            case TurnEnd():
                if self.turns and self.turns[-1].turn == data.turn:
                    self.turns[-1].end_seq, self.turns[-1].reason = e.seq, data.reason
            case StepStart():
                row = StepRow(len(self.steps), data.turn, data.step, e.seq, e.time)
                self.steps.append(row)
                self._by_key[(data.turn, data.step)] = row
                if self.turns:
                    self.turns[-1].steps += 1
                touched[row.index] = row
            case StepEnd():
                row = self._by_key.get((data.turn, data.step))
                if row is not None:
                    row.end_seq = e.seq
                    touched[row.index] = row
            case RequestDispatch():
                row = self._by_key.get((data.turn, data.step))
                if row is not None:
                    row.dispatch_seq, row.serializer, row.digest = (
                        e.seq,
                        f"{data.serializer} v{data.serializer_version}",
                        data.digest,
                    )
                    row.body_bytes = data.bytes
                    touched[row.index] = row
            case ToolCall():
                row = self._by_key.get((data.turn, data.step))
                if row is not None:
                    row.tools.append(data.name)
            case LlmRetry():
                row = self._by_key.get((data.turn, data.step))
                if row is not None:
                    row.retries += 1
            case AttachmentQuarantine():
                self.quarantines.append((e.seq, data.attachment_id, data.failure))
                if current is not None:
                    current.quarantined = True
            case CompactionStart():
                self.compactions.append(
                    CompactionRow(e.seq, data.start, data.end, data.estimated_tokens, step_index=len(self.steps))
                )
            case CompactionSummary():
                if self.compactions:
                    self.compactions[-1].summary, self.compactions[-1].model = data.summary, data.model
            case CompactionEnd():
                if self.compactions:
                    self.compactions[-1].end_seq = e.seq
            case UserMessage():
                self._images(data.content)
                if isinstance(data.surface_op, ReplaceOp) and data.source == "compaction" and self.compactions:
                    self.compactions[-1].replace_seq = e.seq
            case AssistantMessage():
                self._images(data.content)
            case ToolResult():
                for part in data.content:
                    if isinstance(part, ImageBlock):
                        self.images[part.image.attachment_id] = part.image
                op = data.surface_op
                if isinstance(op, ReplaceOp) and op.start == op.end:
                    self.trims.append(TrimRow(e.seq, op.start, data.call_id, data.name, len(self.steps)))
            case _:
                pass

    def _images(self, content: Iterable[object]) -> None:
        for block in content:
            if isinstance(block, ImageBlock):
                self.images[block.image.attachment_id] = block.image
            elif isinstance(block, ToolResultBlock):
                for part in block.content:
                    if isinstance(part, ImageBlock):
                        self.images[part.image.attachment_id] = part.image

    def chart(self) -> dict[str, object]:
        """The chart's data: one column per series (uPlot's layout), each drop's step and cause."""
        points = [row.chart_point() for row in self.steps]
        columns: list[list[float | int | None]] = [[p[i] for p in points] for i in range(6)]
        drops = [
            {"x": row.index, "cause": row.drop.cause, "explained": row.drop.explained}
            for row in self.steps
            if row.drop is not None
        ]
        return {"columns": columns, "drops": drops, "currency": self.table.currency}
