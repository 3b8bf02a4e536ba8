"""Everything the console reads, from the stores the configuration names: the session index, session pages
(cached by session and brought forward by the events after their head), proofs and attachments.

Reads only: the stores are opened read-only (:func:`~foldline.config.open_stores`), and every answer is rebuilt
from the log with the functions the commands use — ``foldline verify``'s :func:`~foldline.replay.verify.verify_events`,
``foldline requests``'s :func:`~foldline.replay.verify.rebuild_requests` and the serializer a dispatch names,
:func:`~foldline.core.request_diff.first_byte_difference` for where a mismatched body parts from the archived
original. Folds (the distributed backend's Redis) are a cache the page reports on, never a source.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import orjson

from ..config import Stores
from ..core import codec
from ..core.content import ImageRef
from ..core.cost import PriceTable
from ..core.events import Envelope, RequestDispatch, StepStart
from ..core.request_diff import ByteDifference, first_byte_difference
from ..errors import AttachmentError, FoldlineError, SessionNotFound
from ..replay.verify import VerifyReport, rebuild_requests, verify_events
from .index import SessionIndex
from .model import SessionPage

__all__ = ["ConsoleData", "FoldStatus", "RequestProof", "SAFE_IMAGE_TYPES"]

#: Image types served as themselves; any other media type is refused (an SVG could carry script).
SAFE_IMAGE_TYPES = frozenset({"image/png", "image/jpeg", "image/gif", "image/webp"})


@dataclass(frozen=True, slots=True)
class RequestProof:
    """One loop request rebuilt from the log: its body (pretty-printed for reading), digests and verify status."""

    session_id: str
    seq: int
    turn: int
    step: int
    serializer: str
    recorded_digest: str
    recorded_bytes: int
    digest: str | None
    length: int | None
    pretty: str | None
    status: str  # verified | mismatched | unreconstructable
    reason: str | None = None  # why it is unreconstructable
    difference: ByteDifference | None = None  # first differing byte against the archived original
    original_archived: bool = False


@dataclass(frozen=True, slots=True)
class FoldStatus:
    """The distributed backend's fold of a session: the last seq applied (-1: no fold), against the log's head."""

    applied: int
    head: int

    @property
    def behind(self) -> int:
        """Events the log holds that the fold has not applied yet."""
        return max(0, self.head - 1 - self.applied)


K = TypeVar("K")
V = TypeVar("V")


class _Lru(Generic[K, V]):
    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._items: OrderedDict[K, V] = OrderedDict()

    def get(self, key: K) -> V | None:
        value = self._items.get(key)
        if value is not None:
            self._items.move_to_end(key)
        return value

    def put(self, key: K, value: V) -> None:
        self._items[key] = value
        self._items.move_to_end(key)
        while len(self._items) > self.capacity:
            self._items.popitem(last=False)


class ConsoleData:
    """The console's reads over one set of stores (thread-safe: pages are served from a thread pool)."""

    def __init__(self, stores: Stores, table: PriceTable, *, pages: int = 16, min_refresh_s: float = 0.25) -> None:
        self.stores = stores
        self.table = table  # the one the index prices with: the list and a session's page agree to the digit
        self.index = SessionIndex(stores.log, table, min_refresh_s=min_refresh_s)
        self._pages: _Lru[str, SessionPage] = _Lru(pages)
        self._reports: _Lru[tuple[str, int], VerifyReport] = _Lru(pages * 4)
        self._lock = threading.RLock()
        self._session_locks: dict[str, threading.Lock] = {}

    def close(self) -> None:
        self.stores.close()

    def _session_lock(self, session_id: str) -> threading.Lock:
        with self._lock:
            return self._session_locks.setdefault(session_id, threading.Lock())

    def head(self, session_id: str) -> int:
        return self.stores.log.head(session_id)

    def page(self, session_id: str) -> SessionPage:
        """The session's page at the log's head (SessionNotFound when it has no events)."""
        with self._session_lock(session_id):
            head = self.stores.log.head(session_id)
            if head == 0:
                raise SessionNotFound(session_id)
            with self._lock:
                page = self._pages.get(session_id)
            if page is None or page.head > head:
                page = SessionPage(session_id, self.table)
            if page.head < head:
                page.feed(self.stores.log.read(session_id, page.head, head))
            with self._lock:
                self._pages.put(session_id, page)
            return page

    def children(self, session_id: str) -> list[tuple[str, str]]:
        """The sessions that descend from ``session_id`` (the index brought up to date first)."""
        self.index.refresh()
        return self.index.children(session_id)

    def events(self, session_id: str, from_seq: int, to_seq: int | None = None) -> list[Envelope]:
        return self.stores.log.read(session_id, from_seq, to_seq)

    def step_events(self, session_id: str, turn: int, step: int) -> list[Envelope]:
        """The events of one step: its ``step/start`` through its ``step/end`` (or the log's end)."""
        page = self.page(session_id)
        row = next((r for r in page.steps if r.turn == turn and r.step == step), None)
        if row is None:
            raise SessionNotFound(f"{session_id} has no step {turn}.{step}")
        end = row.end_seq + 1 if row.end_seq is not None else None
        events = self.stores.log.read(session_id, row.start_seq, end)
        return [e for e in events if e.seq == row.start_seq or not isinstance(e.data, StepStart)]

    def verify(self, session_id: str) -> VerifyReport:
        """``foldline verify`` of the session at its head (cached by head)."""
        head = self.head(session_id)
        if head == 0:
            raise SessionNotFound(session_id)
        with self._lock:
            report = self._reports.get((session_id, head))
        if report is None:
            events = self.stores.log.read(session_id, 0, head)
            report = verify_events(session_id, events, self.stores.attachments)
            with self._lock:
                self._reports.put((session_id, head), report)
        return report

    def request(self, session_id: str, seq: int) -> RequestProof:
        """The loop request dispatched at ``seq``, rebuilt as ``foldline requests`` rebuilds it, with its status
        from ``foldline verify``'s report and, on a mismatch, the first byte where it parts from the original."""
        from ..providers.base import serializer_for

        events = self.stores.log.read(session_id, 0, seq + 1)
        if not events:
            raise SessionNotFound(session_id)
        last = events[-1]
        if last.seq != seq or not isinstance(last.data, RequestDispatch):
            raise SessionNotFound(f"{session_id} has no request/dispatch at seq {seq}")
        dispatch = last.data
        report = self.verify(session_id)
        base: dict[str, Any] = {
            "session_id": session_id,
            "seq": seq,
            "turn": dispatch.turn,
            "step": dispatch.step,
            "serializer": f"{dispatch.serializer} v{dispatch.serializer_version}",
            "recorded_digest": dispatch.digest,
            "recorded_bytes": dispatch.bytes,
        }
        problem = next((u for u in report.unreconstructable if u.seq == seq), None)
        try:
            request = next(r for d, s, r in rebuild_requests(session_id, events) if s == seq)
            body = serializer_for(dispatch.serializer, dispatch.serializer_version).serialize(
                request, self.stores.attachments
            )
        except (AttachmentError, FoldlineError) as exc:
            reason = problem.reason if problem is not None else f"{type(exc).__name__}: {exc}"
            return RequestProof(
                **base, digest=None, length=None, pretty=None, status="unreconstructable", reason=reason
            )
        digest = codec.digest_bytes(body)
        pretty = orjson.dumps(orjson.loads(body), option=orjson.OPT_INDENT_2).decode()
        mismatched = any(m.seq == seq for m in report.mismatched)
        if problem is not None:
            return RequestProof(
                **base,
                digest=digest,
                length=len(body),
                pretty=pretty,
                status="unreconstructable",
                reason=problem.reason,
            )
        if not mismatched:
            return RequestProof(**base, digest=digest, length=len(body), pretty=pretty, status="verified")
        original = self._original(dispatch.digest)
        difference = first_byte_difference(original, body) if original is not None else None
        return RequestProof(
            **base,
            digest=digest,
            length=len(body),
            pretty=pretty,
            status="mismatched",
            difference=difference,
            original_archived=original is not None,
        )

    def _original(self, digest: str) -> bytes | None:
        """The body that was sent, when the loop archived it (``archive_requests``) under its digest."""
        attachments = self.stores.attachments
        try:
            if not attachments.exists(digest):
                return None
            return attachments.get(digest)
        except AttachmentError:
            return None

    def image(self, session_id: str, attachment_id: str) -> tuple[ImageRef, bytes]:
        """An image the session's log references, read and verified against its logged metadata."""
        page = self.page(session_id)
        ref = page.images.get(attachment_id)
        if ref is None:
            raise SessionNotFound(f"{session_id} references no image {attachment_id}")
        return ref, self.stores.attachments.get(attachment_id, ref)

    def fold_status(self, session_id: str) -> FoldStatus | None:
        """Where the session's Redis fold stands (distributed backend only)."""
        folds = self.stores.folds
        if folds is None:
            return None
        try:
            applied = folds.applied_seq(session_id)
        except FoldlineError:
            return None
        return FoldStatus(applied, self.head(session_id))
